"""Small sources held in memory and written straight into their run's compacted generation
(pipeline/ingest/hold.py): the lake holds the same rows as the reference path (every source
staged as parts of its own, committed one by one, then compacted: `compact=False` and
Lake.compact, the code path of every ingest before hold.py), a kill during the batch's write
loses nothing a re-run does not restore, and a bad file or a source moved to another run is
handled as before.

Inputs: copies of a real corpus trace (HTA's trace_filter/sampled_rank-0: 4,855 events, 1,154
kernels, two ProfilerStep windows, so the derived step column is exercised) with
distributedInfo.rank and world_size set, one
run directory of 17 ranks (hold.py holds runs of at least 16 units), plus a bad file and a rank
0 copy of another profiling window (rule 2 moves it to a run of its own, under 16 sources). The
expected rows are those of the reference lake, read from every Parquet file under it with
pyarrow (no listing or manifest of the code under test)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest
from conftest import REPO, corpus

from pipeline import derive
from pipeline import lake_manifest as manifest
from pipeline import schema as sch
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

STEP_TRACE = corpus("hta", "tests", "data", "trace_filter", "sampled_rank-0.json.gz")
RANKS = 17
HOUR_US = 3600 * 10**6


def _copy(rank: int, shift_us: int = 0) -> bytes:
    doc = msgspec.json.decode(gzip.decompress(STEP_TRACE.read_bytes()))
    doc["distributedInfo"] = {"rank": rank, "world_size": RANKS, "backend": "nccl"}
    for e in doc["traceEvents"]:
        if shift_us and isinstance(e.get("ts"), (int, float)):
            e["ts"] += shift_us
    return msgspec.json.encode(doc)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("in") / "job"
    d.mkdir()
    for r in range(RANKS):
        (d / f"rank{r}.json").write_bytes(_copy(r))
    (d / "rank99.json").write_bytes(b'{"traceEvents": [')  # truncated: no event, a failed row
    (d / "zlate.json").write_bytes(_copy(0, HOUR_US))  # rank 0 again, an hour later: another run
    return d


def raw_rows(root: Path) -> dict[str, list[str]]:
    """Every table's rows from every Parquet file under the lake, sorted (sources.ingested_at_ns
    left out)."""
    out = {}
    for t in sch.tables():
        rows = []
        for f in sorted((root / t).glob("run=*/*.parquet")):
            tbl = pq.read_table(f)
            if t == "sources":
                tbl = tbl.drop(["ingested_at_ns"])
            rows += [repr(r) for r in tbl.to_pylist()]
        out[t] = sorted(rows)
    return out


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ref") / "lake"
    res = ingest_paths([inputs], Lake(root), compact=False)
    assert sorted(r.status for r in res) == ["failed"] + ["ok"] * (RANKS + 1)
    lake = Lake(root)
    with lake.lock():
        lake.compact(None, 16)
    return root


def test_held_sources_are_the_reference_rows(inputs, reference, tmp_path):
    root = tmp_path / "lake"
    res = ingest_paths([inputs], Lake(root))
    assert sorted(r.status for r in res) == ["failed"] + ["ok"] * (RANKS + 1)
    assert len({r.run_id for r in res if r.status == "ok"}) == 2
    got, want = raw_rows(root), raw_rows(reference)
    assert got == want
    # read by hand from the trace: 2 ProfilerStep windows, every kernel launched inside one
    assert len(want["sources"]) == RANKS + 2 and len(want["steps"]) == (RANKS + 1) * 2
    gpu = [
        r for f in (root / "gpu_activities").glob("run=job/*.parquet") for r in pq.read_table(f).to_pylist()
    ]
    assert gpu and all(r["step"] is not None for r in gpu if r["kind"] == "kernel")
    # the 17 ranks are one generation of the run, without parts of their own
    m = manifest.read_one(root, "run=job")
    assert m is not None and len(m.sources) == RANKS
    assert [p.name for p in (root / "gpu_activities" / "run=job").iterdir()] == m.files["gpu_activities"]
    assert Lake(root).sources().height == RANKS + 2
    assert sorted(Lake(root).sources()["status"].to_list()) == ["failed"] + ["ok"] * (RANKS + 1)


def test_derived_columns_in_memory_equal_those_of_the_parts(reference):
    """derive.derive_table on a source's rows = the derived columns its staged parts gave (the
    reference lake's rows, written by Lake.stage's derive_files)."""
    root = reference
    f = [
        root / "gpu_activities" / "run=job" / n
        for n in manifest.read_one(root, "run=job").files["gpu_activities"]
    ]
    gpu = pq.read_table(f[0])
    sid = gpu.column("source_id")[0].as_py()
    one = lambda t: pq.read_table(  # noqa: E731
        [root / t / "run=job" / n for n in manifest.read_one(root, "run=job").files[t]][0],
        filters=[("source_id", "=", sid)],
    )
    g, c, s = one("gpu_activities"), one("cpu_ops"), one("steps")
    out = sch.conform("gpu_activities", derive.derive_table(g.drop_columns(list(derive.DERIVED)), c, s))
    assert out.to_pylist() == g.to_pylist()


@pytest.mark.parametrize("point", ["compact-written", "compact-switched"])
def test_a_kill_while_held_sources_are_written_loses_nothing_a_rerun_does_not_restore(
    inputs, reference, tmp_path, point
):
    root = tmp_path / "lake"
    code = "import sys; from pipeline.ingest import ingest_paths; from pipeline.lake import Lake; "
    code += "ingest_paths([sys.argv[1]], Lake(sys.argv[2]))"
    env = {**os.environ, "TRACELAKE_CRASH_AT": f"{point}:1"}
    p = subprocess.run([sys.executable, "-c", code, str(inputs), str(root)], cwd=REPO, env=env)
    assert p.returncode == -9
    switched = manifest.read_one(root, "run=job") is not None
    assert switched == (point == "compact-switched")  # all 17 sources or none of them
    seen = Lake(root).sources()
    assert seen.filter(seen["run_id"] == "job").height == (RANKS + 1 if switched else 1)  # + the failed row
    ingest_paths([inputs], Lake(root))
    assert raw_rows(root) == raw_rows(reference)
    assert not any((root / ".tmp").iterdir())


def test_a_run_of_few_files_keeps_parts_of_its_own(inputs, tmp_path):
    d = tmp_path / "few"
    shutil.copytree(
        inputs, d, ignore=lambda _, names: [n for n in names if n not in ("rank1.json", "rank2.json")]
    )
    root = tmp_path / "lake"
    assert [r.status for r in ingest_paths([d], Lake(root))] == ["ok", "ok"]
    assert manifest.read_one(root, "run=few") is None
    assert len(list((root / "gpu_activities" / "run=few").glob("*.parquet"))) == 2
