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
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, corpus

from pipeline import derive
from pipeline import lake_manifest as manifest
from pipeline import schema as sch
from pipeline.ingest import hold, ingest_paths
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


@pytest.mark.parametrize("pooled", [False, True])
def test_held_sources_are_the_reference_rows(inputs, reference, tmp_path, monkeypatch, pooled):
    """Held sources give the reference rows, read in threads of the ingesting process (these
    inputs are under pool_scope.PARALLEL_MIN_BYTES) or in a process pool, which pickles each Held back
    (Held.__getstate__: its tables as Arrow IPC streams)."""
    from pipeline import pool_scope

    if pooled:
        monkeypatch.setattr(pool_scope, "PARALLEL_MIN_BYTES", 0)
    root = tmp_path / "lake"
    res = ingest_paths([inputs], Lake(root), jobs=2)
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


def test_a_run_of_one_file_keeps_parts_of_its_own_and_two_are_held(inputs, tmp_path):
    """HOLD_MIN_SOURCES (2): a run of two small files is written as one generation, the rows those
    of each source's own parts (an ingest with compact=False); a run of one file keeps its parts."""
    for keep in (("rank1.json",), ("rank1.json", "rank2.json")):
        d = tmp_path / f"few{len(keep)}" / "few"
        shutil.copytree(inputs, d, ignore=lambda _, names, keep=keep: [n for n in names if n not in keep])
        root, parts = d.parent / "lake", d.parent / "parts"
        assert [r.status for r in ingest_paths([d], Lake(root))] == ["ok"] * len(keep)
        assert [r.status for r in ingest_paths([d], Lake(parts), compact=False)] == ["ok"] * len(keep)
        gen = manifest.read_one(root, "run=few")
        files = list((root / "gpu_activities" / "run=few").glob("*.parquet"))
        if len(keep) == 1:
            assert gen is None and len(files) == 1
        else:
            assert (
                gen is not None
                and len(gen.sources) == 2
                and [f.name for f in files] == gen.files["gpu_activities"]
            )
        assert len(list((parts / "gpu_activities" / "run=few").glob("*.parquet"))) == len(keep)
        assert raw_rows(root) == raw_rows(parts)


def _source_tables(root: Path, sid: str) -> dict:
    """One source's rows of each table, from every Parquet file under the lake (pyarrow, filtered
    by source_id), tables without rows left out."""
    out = {}
    for t in sch.tables():
        files = sorted((root / t).glob("run=*/*.parquet"))
        tbl = pq.read_table(files, filters=[("source_id", "=", sid)], partitioning=None) if files else None
        if tbl is not None and tbl.num_rows:
            out[t] = tbl
    return out


def _sources(root: Path) -> list[dict]:
    """Every `sources` row under the lake (pyarrow)."""
    return [
        r for f in sorted((root / "sources").glob("run=*/*.parquet")) for r in pq.read_table(f).to_pylist()
    ]


def test_derived_columns_of_many_sources_in_one_plan_equal_those_of_the_parts(reference):
    """derive.derive_many over sources that share rank, correlation ids, threads and External ids
    (rank 0 of the job, rank 3 relabelled as rank 0, and the rank 0 copy an hour later in a run of
    its own) gives each the derived columns its own parts got (the reference lake's rows): no row
    is matched with another source's."""
    root = reference
    rows = [r for r in _sources(root) if r["status"] == "ok" and r["rank"] in (0, 3)]
    rows.sort(key=lambda r: (r["run_id"] != "job", r["rank"]))
    assert [(r["run_id"] == "job", r["rank"]) for r in rows] == [(True, 0), (True, 3), (False, 0)]
    picked = [_source_tables(root, r["source_id"]) for r in rows]
    want = [p["gpu_activities"] for p in picked]
    relabel = lambda t: t.set_column(  # noqa: E731
        t.schema.get_field_index("rank"), "rank", pa.array([0] * t.num_rows, pa.int32())
    )
    ins = [
        tuple(
            relabel(p[t]).drop_columns(list(derive.DERIVED)) if t == "gpu_activities" else relabel(p[t])
            for t in ("gpu_activities", "cpu_ops", "steps")
        )
        for p in picked
    ]
    got = [sch.conform("gpu_activities", g) for g in derive.derive_many(ins)]
    for g, w in zip(got, want):
        assert g.drop_columns(["rank"]).to_pylist() == w.drop_columns(["rank"]).to_pylist()
    # the copy an hour later: its launches an hour (HOUR_US, as the inputs were written) after rank 0's
    early, late = ([x for x in t.column("launch_ns").to_pylist() if x is not None] for t in (got[0], got[-1]))
    assert early and sorted(x - HOUR_US * 1000 for x in late) == sorted(early)
    # rank 0's kernels each have a correlation of their own in the trace: none is a graph replay
    assert not any(got[0].column("graph_replay").to_pylist())


def test_a_held_source_whose_sources_row_does_not_fit_fails_alone(reference, tmp_path):
    """Pending.flush conforms a run's `sources` rows together; a row that does not fit schema v3
    (a rank given as text) fails its source only, and the run's other held sources are written
    with their rows as given."""
    root = reference
    rows = [r for r in _sources(root) if r["run_id"] == "job" and r["status"] == "ok"]
    lake = Lake(tmp_path / "lake")
    pending = hold.Pending(lake, min_sources=2)
    for i, r in enumerate(rows):
        tables = _source_tables(root, r["source_id"])
        tables["gpu_activities"] = sch.conform(
            "gpu_activities", tables["gpu_activities"].drop_columns(list(derive.DERIVED))
        )
        bad = {**r, "rank": "three"} if i == 1 else r
        pending.add(hold.Held("job", r["source_id"], tables), bad, key=i)
    failures = pending.flush()
    assert [k for k, _ in failures] == [1] and isinstance(failures[0][1], sch.SchemaError)
    assert "sources.rank" in str(failures[0][1])
    m = manifest.read_one(lake.root, "run=job")
    assert sorted(m.sources) == sorted(r["source_id"] for i, r in enumerate(rows) if i != 1)
    got = raw_rows(lake.root)
    want_sids = set(m.sources)
    want = {
        t: sorted(
            repr({k: v for k, v in r.items() if not (t == "sources" and k == "ingested_at_ns")})
            for f in (root / t).glob("run=job/*.parquet")
            for r in pq.read_table(f).to_pylist()
            if r["source_id"] in want_sids
        )
        for t in sch.tables()
    }
    assert got == want


def test_an_ingest_reports_a_held_source_whose_row_does_not_fit_as_failed(inputs, monkeypatch, tmp_path):
    """A held source whose `sources` row fails the flush's conform (its rank made text here) is
    reported failed with one line and a failed `sources` row; the run's other sources are
    stored."""
    add = hold.Pending.add

    def spoiled(self, held, row, key=None):
        return add(self, held, {**row, "rank": "three"} if row["rank"] == 3 else row, key)

    monkeypatch.setattr(hold.Pending, "add", spoiled)
    root = tmp_path / "lake"
    res = ingest_paths([inputs], Lake(root))
    bad = [r for r in res if r.path.endswith("rank3.json")]
    assert [(r.status, r.error.split(":")[0]) for r in bad] == [("failed", "schema violation")]
    assert "sources.rank" in bad[0].error and "\n" not in bad[0].error
    assert sorted(r.status for r in res) == ["failed"] * 2 + ["ok"] * RANKS
    rows = _sources(root)
    assert sorted(
        (r["rank"], r["status"]) for r in rows if r["run_id"] == "job" and r["rank"] is not None
    ) == [(k, "ok") for k in range(RANKS) if k != 3]
    assert [r["status"] for r in rows if r["path"].endswith("rank3.json")] == ["failed"]


def test_a_generation_of_several_held_batches_is_merged_at_the_threshold(inputs, tmp_path):
    """Three ingests of two ranks each into run `job` leave three generation files per table
    (append adds one per batch); compaction merges them once a table has min_sources of them (the
    ingest's own, AUTO_MIN_SOURCES = 16: not yet; `tracelake compact`, 2: now), into one file with
    the rows of the three (each file's rows counted from its Parquet footer)."""
    root = tmp_path / "lake"
    for k in range(3):
        d = tmp_path / f"b{k}" / "job"
        d.mkdir(parents=True)
        for r in (2 * k, 2 * k + 1):
            (d / f"rank{r}.json").write_bytes((inputs / f"rank{r}.json").read_bytes())
        assert [r.status for r in ingest_paths([d], Lake(root))] == ["ok", "ok"]
    m = manifest.read_one(root, "run=job")
    assert len(m.sources) == 6 and all(len(ns) == 3 for ns in m.files.values())

    def rows(m, t):
        return sum(pq.ParquetFile(root / t / "run=job" / n).metadata.num_rows for n in m.files[t])

    before = {t: rows(m, t) for t in m.files}
    lake = Lake(root)
    with lake.lock():
        assert lake.compact({"job"}, 16) == []  # 3 files a table: under the ingest's threshold
        assert lake.compact({"job"}, 4) == []
        assert lake.compact(None, 3) == [("job", 3 * len(m.files), len(m.files))]
    after = manifest.read_one(root, "run=job")
    assert after.sources == m.sources and all(len(ns) == 1 for ns in after.files.values())
    assert {t: rows(after, t) for t in after.files} == before


def test_a_held_source_pickles_its_tables_whole(reference, monkeypatch):
    """Held pickled and read back: the same tables, types and schema metadata included, whether
    written as Arrow IPC streams or, where a stream cannot hold a table, pickled as pyarrow does."""
    import pickle

    tables = {}
    for t in ("gpu_activities", "cpu_ops", "sources"):
        [f] = sorted((reference / t).glob("run=job/*.parquet"))[:1]
        tables[t] = pq.read_table(f)
    h = hold.Held("job", "s1", tables, 123)
    state = h.__getstate__()
    assert all(isinstance(v, bytes) for v in state["tables"].values())
    back = pickle.loads(pickle.dumps(h))
    assert (back.run_id, back.source_id, back.nbytes, back.dir) == ("job", "s1", 123, h.dir)
    assert back.tables.keys() == tables.keys()
    for t, tab in tables.items():
        assert back.tables[t].schema.equals(tab.schema, check_metadata=True)
        assert back.tables[t].equals(tab) and back.tables[t].num_rows > 0

    def refuse(*a, **k):
        raise pa.ArrowNotImplementedError("no stream for this")

    monkeypatch.setattr(pa.ipc, "new_stream", refuse)
    assert all(isinstance(v, pa.Table) for v in h.__getstate__()["tables"].values())
    again = pickle.loads(pickle.dumps(h))
    assert all(again.tables[t].equals(tab) for t, tab in tables.items())


@pytest.mark.parametrize("where", ["switch", "place"])
def test_a_held_batch_that_cannot_be_switched_leaves_no_file_behind(
    inputs, reference, tmp_path, monkeypatch, where
):
    """The held batch's write fails with OSError (a full disk) as its generation's manifest is
    written (switch) or as its second file is moved into place (place): the batch is committed
    source by source instead (module doc), and the files already placed for the generation that
    never went live are removed at once (they stayed until the next command's recover()). So
    every Parquet file under the lake, read without any manifest (raw_rows), holds exactly the
    reference's rows: a file left behind would add its rows twice."""
    from pipeline import lake_compact

    fail = {"left": 1}
    if where == "switch":
        real = lake_compact.manifest.encode

        def encode(m):
            if fail["left"]:
                fail["left"] -= 1
                raise OSError(28, "No space left on device")
            return real(m)

        monkeypatch.setattr(lake_compact.manifest, "encode", encode)
    else:
        real_replace, moved = os.replace, {"n": 0}

        def replace(src, dst):
            if "/compact-" in str(src) and fail["left"]:
                moved["n"] += 1
                if moved["n"] == 2:
                    fail["left"] = 0
                    raise OSError(28, "No space left on device")
            return real_replace(src, dst)

        monkeypatch.setattr(lake_compact.os, "replace", replace)
    root = tmp_path / "lake"
    res = ingest_paths([inputs], Lake(root))
    assert fail["left"] == 0
    assert sorted(r.status for r in res) == ["failed"] + ["ok"] * (RANKS + 1)
    assert raw_rows(root) == raw_rows(reference)
