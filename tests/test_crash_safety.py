"""Crash safety: a real `tracelake ingest` killed with SIGKILL at chosen moments (the lake's
TRACELAKE_CRASH_AT hook: after the n-th commit journal, part rename or source commit, or once the
run's held sources are written as its compacted generation or switched in), or from outside while
it writes, then run again, leaves the same lake as an uninterrupted run: every
table read straight from its Parquet files (no manifest filtering), compared row by row except the
ingest time. Two ingests at once: the second is refused with a message naming the first, and the
lake is still the same."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import REPO, corpus

from pipeline import schema as sch
from pipeline.cli import EXIT_FAILED
from pipeline.lake import Lake

DLRM = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """8 real ranks of one run, a second copy of rank 3 with other bytes (its rank is taken: it
    moves to its own run), and a file that fails."""
    d = tmp_path_factory.mktemp("in") / "dlrm"
    d.mkdir()
    for f in sorted(DLRM.glob("worker*.json")):
        shutil.copy(f, d / f.name)
    w3 = next(DLRM.glob("worker3_*.json")).read_bytes()
    (d / "zz_worker3_again.json").write_bytes(
        w3.replace(b'"schemaVersion": 1', b'"schemaVersion": 1, "copy": 1', 1)
    )
    (d / "broken.json").write_bytes(b'{"schemaVersion": 1, "deviceProperties": [')
    return d


def ingest(inputs: Path, lake: Path, env: dict | None = None, wait: bool = True, jobs: int = 1):
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "ingest",
        str(inputs),
        "--lake",
        str(lake),
        "--jobs",
        str(jobs),
    ]
    e = {k: v for k, v in os.environ.items() if k != "TRACELAKE_CRASH_AT"}
    p = subprocess.Popen(
        cmd, cwd=REPO, env={**e, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if not wait:
        return p
    out, _ = p.communicate(timeout=300)
    return p.returncode, out.decode()


def snapshot(lake: Path) -> dict[str, list[str]]:
    """Every table's rows as read from all its Parquet files (as any reader would), sorted, without
    sources.ingested_at_ns."""
    out = {}
    for t in sch.tables():
        rows = []
        for f in sorted((lake / t).glob("run=*/*.parquet")):
            tbl = pq.read_table(f)
            if t == "sources":
                tbl = tbl.drop(["ingested_at_ns"])
            rows += [repr(r) for r in tbl.to_pylist()]
        out[t] = sorted(rows)
    return out


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory):
    lake = tmp_path_factory.mktemp("ref") / "lake"
    code, out = ingest(inputs, lake)
    assert code == 3, out  # broken.json failed, the rest ingested
    snap = snapshot(lake)
    assert len(snap["sources"]) == 10 and sum("'failed'" in r for r in snap["sources"]) == 1
    assert len({r for r in snap["sources"] if "_worker3_again" in r}) == 1
    assert snap["gpu_activities"] and snap["cpu_ops"]
    return snap


def assert_clean(lake: Path) -> None:
    tmp = lake / ".tmp"
    assert not tmp.exists() or not any(tmp.iterdir()), list(tmp.iterdir())
    have = {(p.parent.name, p.stem) for p in (lake / "sources").glob("run=*/*.parquet")}
    for t in sch.tables():
        for p in (lake / t).glob("run=*/*.parquet"):
            assert (p.parent.name, p.stem) in have, p


# the three stages of a source's commit (broken.json's failed row is the first; the copy of rank 3,
# moved to a run of its own, the second, the ingest's last write), and the 8 held ranks' generation
# written, then switched in (pipeline/ingest/hold.py: a run of several small files is written in
# one switch, before the copy of rank 3, whose run is known only once the ranks are claimed)
@pytest.mark.parametrize(
    "point", ["commit:1", "compact-written:1", "compact-switched:1", "journal:2", "rename:3"]
)
def test_sigkill_at_a_moment_then_rerun(point, inputs, reference, tmp_path):
    lake = tmp_path / "lake"
    code, out = ingest(inputs, lake, {"TRACELAKE_CRASH_AT": point})
    assert code == -signal.SIGKILL, out
    assert snapshot(lake) != reference  # it really stopped part-way
    code, out = ingest(inputs, lake)
    assert code == 3, out
    assert_clean(lake)
    assert snapshot(lake) == reference


def test_killed_twice_and_from_outside(inputs, reference, tmp_path):
    lake = tmp_path / "lake"
    code, _ = ingest(inputs, lake, {"TRACELAKE_CRASH_AT": "rename:4"})
    assert code == -signal.SIGKILL
    # a second run killed from outside once it has committed more sources (the two committed one
    # by one; the 8 held ranks are written last)
    p = ingest(inputs, lake, wait=False, jobs=2)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if len(list((lake / "sources").glob("run=*/*.parquet"))) >= 2:
            break
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    code, out = ingest(inputs, lake)
    assert code in (0, 3), out
    assert_clean(lake)
    assert snapshot(lake) == reference


def test_a_second_ingest_is_refused_while_one_holds_the_lake(inputs, reference, tmp_path):
    lake = tmp_path / "lake"
    with Lake(lake).lock():
        code, out = ingest(inputs, lake)
    assert code == EXIT_FAILED
    assert f"another tracelake command (ingest or forget) is writing to this lake (pid {os.getpid()}" in out
    assert len(out.strip().splitlines()) == 1
    assert not list((lake / "sources").glob("run=*/*.parquet"))
    # two at once: whichever comes second is refused or finds everything already there
    a, b = ingest(inputs, lake, wait=False), ingest(inputs, lake, wait=False)
    outs = [(p.wait(timeout=300), p.stdout.read().decode()) for p in (a, b)]
    for code, out in outs:
        assert code in (0, 3) or (
            code == EXIT_FAILED and "another tracelake command (ingest or forget) is writing" in out
        ), out
    assert any(code == 3 for code, _ in outs)
    assert_clean(lake)
    assert snapshot(lake) == reference


def test_a_trace_replaced_while_it_is_read_fails_and_is_ingested_later(tmp_path, monkeypatch):
    """rank0.json is hashed, then, while it is parsed, replaced by another rank's trace (an
    attack did this with mv in a loop: the lake stored one file's hash with the other's rows, so
    the real content was later skipped as already in the lake). The file fails with one line
    naming the change, nothing of it is stored, and ingesting it again, complete, stores it with
    the hash of its own bytes (hashlib here) and the rows of that file."""
    import hashlib

    from pipeline.ingest import ingest_paths
    from pipeline.ingest import prepare as prep

    d = tmp_path / "job"
    d.mkdir()
    src = sorted(corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto").glob("worker*.json"))
    f = d / "rank0.json"
    shutil.copy(src[0], f)
    real = prep.kineto.parse_stream

    def parse_then_replace(*a, **k):
        out = real(*a, **k)
        tmp = d / ".swap"
        shutil.copy(src[1], tmp)
        os.replace(tmp, f)  # what `mv -f` does: a new inode under the same name
        return out

    monkeypatch.setattr(prep.kineto, "parse_stream", parse_then_replace)
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([f], lake, jobs=1)
    assert r.status == "failed" and r.error.startswith("the file changed while it was read")
    assert "\n" not in r.error
    monkeypatch.setattr(prep.kineto, "parse_stream", real)
    (r,) = ingest_paths([f], lake, jobs=1)
    assert r.status == "ok"
    src_rows = lake.sources().filter(pl.col("status") == "ok")
    assert src_rows["content_sha256"].to_list() == [hashlib.sha256(f.read_bytes()).hexdigest()]
    assert src_rows["rank"].to_list() == [1]  # worker1's distributedInfo rank: the bytes now there
