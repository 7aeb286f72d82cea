"""Compaction (pipeline/lake_compact.py, pipeline/lake_manifest.py): a run's small parts merged
into one file per table keep every row, readers see the same metrics before and after, forget and
re-ingest of a source inside a compacted run work, and a `tracelake compact` or `forget` killed
with SIGKILL at each step leaves either the old parts or the new ones (every row exactly once).

Inputs: four ranks of one real trace (HTA's simple_add, 306 kB of Kineto JSON each: the same
bytes with distributedInfo.rank 0-3, so one run of four sources). The expected rows are read
straight from every Parquet file of the lake before compaction (pyarrow, file by file: no
listing or manifest of the code under test), and compared row by row."""

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

from pipeline import local_fill, query
from pipeline import schema as sch
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.lake_compact import sort_keys

TRACE = corpus(
    "hta", "tests", "data", "critical_path", "simple_add", "benchmark_result_493459_1694039959_trace.json.gz"
)
RUN = "job"


def _rank_copy(r: int) -> bytes:
    doc = msgspec.json.decode(gzip.decompress(TRACE.read_bytes()))
    doc["distributedInfo"] = {"rank": r, "world_size": 4, "backend": "nccl"}
    return msgspec.json.encode(doc)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("in") / RUN
    d.mkdir()
    for r in range(4):
        (d / f"rank{r}.json").write_bytes(_rank_copy(r))
    return d


@pytest.fixture(scope="module")
def small_lake(inputs, tmp_path_factory) -> Path:
    """The four sources as parts of their own (compaction off), with local results (min_rows
    lowered so that these small sources get them, as a large rank would at its run's first
    analysis: local_fill.fill)."""
    root = tmp_path_factory.mktemp("lake") / "lake"
    res = ingest_paths([inputs], Lake(root), compact=False)
    assert [r.status for r in res] == ["ok"] * 4 and {r.run_id for r in res} == {RUN}
    assert local_fill.fill(Lake(root), min_rows=10) == 4
    return root


def raw_rows(root: Path, without: str | None = None) -> dict[str, list[str]]:
    """Every table's rows read from every Parquet file under the lake (no listing of the code under
    test), sorted; sources.ingested_at_ns left out; `without`: a source id whose rows are left out."""
    out = {}
    for t in sch.tables():
        rows = []
        for f in sorted((root / t).glob("run=*/*.parquet")):
            tbl = pq.read_table(f)
            if t == "sources":
                tbl = tbl.drop(["ingested_at_ns"])
            rows += [repr(r) for r in tbl.to_pylist() if r["source_id"] != without]
        out[t] = sorted(rows)
    return out


def reader_rows(root: Path) -> dict[str, list[str]]:
    """Every table's rows as readers see them (Lake.table_files, the parts query.connect reads)."""
    lake = Lake(root)
    out = {}
    for t in sch.tables():
        rows = []
        for f in lake.table_files(t):
            tbl = pq.read_table(f)
            if t == "sources":
                tbl = tbl.drop(["ingested_at_ns"])
            rows += [repr(r) for r in tbl.to_pylist()]
        out[t] = sorted(rows)
    return out


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "lake"
    shutil.copytree(src, dst)
    return dst


def _compact(root: Path) -> list:
    lake = Lake(root)
    with lake.lock():
        return lake.compact()


def _sids(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "sources" / f"run={RUN}").glob("*.parquet"))


def test_compaction_keeps_every_row_in_one_sorted_file_per_table(small_lake, tmp_path):
    root = _copy(small_lake, tmp_path)
    before = raw_rows(root)
    tables = [t for t in sch.tables() if before[t]]
    assert len(before["sources"]) == 4 and len(before["gpu_activities"]) == 4 * 139  # 139 kernels a rank
    assert "local_results" in tables
    # every part, those of no rows included (a local table a source has no rows in)
    parts = sum(len(list((root / t).glob("run=*/*.parquet"))) for t in sch.tables())
    assert parts >= 4 * len(tables)
    assert _compact(root) == [(RUN, parts, len(tables))]
    # readers, and every file left in the lake, hold exactly the rows there were
    assert reader_rows(root) == before
    assert raw_rows(root) == before
    for t in tables:
        files = list((root / t).glob("run=*/*.parquet"))
        assert len(files) == 1 and files[0].name.startswith("c-")
        keys = [k for k, _ in sort_keys(t)]
        got = pq.read_table(files[0], columns=keys).to_pylist()
        assert got == sorted(got, key=lambda r: tuple((r[k] is None, r[k]) for k in keys))
    # nothing more to do: the run's generation alone is not compacted again
    assert _compact(root) == []


def test_readers_see_the_same_metrics_and_local_results_before_and_after(small_lake, tmp_path):
    root = _copy(small_lake, tmp_path)

    def metrics():
        lake = Lake(root)
        con = query.connect(lake)
        assert query.use_local(con, lake, None, "all", 30_000)  # every source's stored results used
        got = query.run_many(con, query.metric_names())
        con.close()
        return {n: sorted(map(repr, df.rows())) for n, df in got.items()}

    before = metrics()
    assert sum(map(len, before.values())) > 100
    _compact(root)
    assert metrics() == before


def test_forget_and_reingest_of_a_source_inside_a_compacted_run(small_lake, inputs, tmp_path):
    root = _copy(small_lake, tmp_path)
    want = raw_rows(root)
    sids = _sids(root)
    _compact(root)
    lake = Lake(root)
    with lake.lock():
        assert lake.forget([(RUN, sids[1])]) == 1
    assert reader_rows(root) == raw_rows(small_lake, without=sids[1])
    assert raw_rows(root) == raw_rows(small_lake, without=sids[1])  # the generation was rewritten without it
    man = msgspec.json.decode((root / "_compacted" / f"run={RUN}.json").read_bytes())
    assert sorted(man["sources"]) == [s for s in sids if s != sids[1]]
    # ingested again: its rows are back as parts of its own beside the generation
    res = ingest_paths([inputs], lake, compact=False)
    assert sorted(r.status for r in res) == ["ok", "skipped", "skipped", "skipped"]
    got = reader_rows(root)
    for t in sch.tables():
        if not t.startswith("local_"):  # the default MIN_GPU_ROWS: the re-ingested source has none
            assert got[t] == want[t], t
    # --force re-ingest of a source still inside the generation: replaced, kept once
    res = ingest_paths([inputs / "rank0.json"], lake, force=True, compact=False)
    assert [r.status for r in res] == ["ok"]
    got = reader_rows(root)
    for t in sch.tables():
        if not t.startswith("local_"):
            assert got[t] == want[t], t
    # and compacted again: everything in one generation, nothing left over
    assert [r for r, _, _ in _compact(root)] == [RUN]
    assert reader_rows(root) == raw_rows(root)


def _cli(*args: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRACELAKE_CRASH_AT"}
    if crash:
        env["TRACELAKE_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _state(root: Path) -> str:
    """'new' when the run's sources are all in its generation (one file per table, no own parts),
    'old' when all are parts of their own (no manifest)."""
    man = root / "_compacted" / f"run={RUN}.json"
    own = [p for p in (root / "sources" / f"run={RUN}").glob("*.parquet") if not p.name.startswith("c-")]
    if man.exists() and not own:
        return "new"
    if not man.exists() and len(own) == 4:
        return "old"
    return f"mixed: manifest {man.exists()}, own parts {len(own)}"


@pytest.mark.parametrize(
    "point", ["compact-written:1", "compact-switched:1", "compact-clean:1", "compact-clean:9"]
)
def test_compact_killed_at_each_step_leaves_old_or_new_parts(small_lake, tmp_path, point):
    root = _copy(small_lake, tmp_path)
    before = raw_rows(root)
    p = _cli("compact", "--lake", str(root), crash=point)
    assert p.returncode == -9, p.stderr
    # readers in between see every row exactly once
    assert reader_rows(root) == before
    lake = Lake(root)
    with lake.lock():
        lake.recover()
    # after recovery, the files themselves hold every row exactly once: old parts or new ones
    assert raw_rows(root) == before
    assert _state(root) == ("old" if point == "compact-written:1" else "new")
    assert not list((root / ".tmp").iterdir())
    # and compacting again gives the compacted lake
    assert _cli("compact", "--lake", str(root)).returncode == 0
    assert _state(root) == "new" and raw_rows(root) == before


@pytest.mark.parametrize("point", ["compact-written:1", "compact-switched:1", "compact-clean:1"])
def test_forget_inside_a_generation_killed_leaves_the_source_whole_or_gone(small_lake, tmp_path, point):
    root = _copy(small_lake, tmp_path)
    sid = _sids(root)[2]
    _compact(root)
    before, after = raw_rows(small_lake), raw_rows(small_lake, without=sid)
    p = _cli("forget", "--lake", str(root), "--source", sid, crash=point)
    assert p.returncode == -9, p.stderr
    want = before if point == "compact-written:1" else after
    assert reader_rows(root) == want
    lake = Lake(root)
    with lake.lock():
        lake.recover()
    assert raw_rows(root) == want
