"""The per-source derived columns of gpu_activities (pipeline/derive.py) against a brute-force
reference computed from the raw Kineto JSON, and the upgrade of a schema v1 lake
(pipeline/upgrade.py): in place, through derived copies when the lake is locked, and by ingest."""

from __future__ import annotations

import fcntl
import json
import os
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import corpus

from pipeline import derive, upgrade
from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

DLRM = ("param", "et_replay", "tests", "inputs", "dlrm_kineto")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


def _brute(path, base_ns: int):
    """{(correlation, start_ns, name): (launch_ns, step, graph_replay)} straight from the JSON:
    the earliest runtime/driver event of the correlation, the ProfilerStep#N whose [ts, ts + dur)
    holds it, and whether more than one GPU event shares the correlation."""
    evs = json.loads(path.read_bytes())["traceEvents"]
    ns = lambda us: base_ns + int(round(us * 1000))  # noqa: E731  (integer µs in these files)
    launch = {}
    for e in evs:
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {}):
            c = e["args"]["correlation"]
            launch[c] = min(launch.get(c, ns(e["ts"])), ns(e["ts"]))
    steps = [
        (ns(e["ts"]), ns(e["ts"]) + int(round(e["dur"] * 1000)), int(e["name"].split("#")[1]))
        for e in evs
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    gpu = [e for e in evs if e.get("cat") in GPU_CATS and e.get("ph") == "X"]
    share = defaultdict(int)
    for e in gpu:
        share[e["args"].get("correlation")] += 1
    out = {}
    for e in gpu:
        c = e["args"].get("correlation")
        ln = launch.get(c)
        step = next((n for s, t, n in steps if ln is not None and s <= ln < t), None)
        out[(c, ns(e["ts"]), e["name"])] = (ln, step, e["cat"] == "kernel" and share[c] > 1)
    return out


def _lake_rows(lake: Lake, source_id: str, cols: str, table: str = "gpu_activities", where: str = "true"):
    """The source's rows of table, from its parts or its run's compacted generation (a run of
    several small files is written as one, pipeline/ingest/hold.py)."""
    con = __import__("duckdb").connect()
    files = lake.table_files(table)
    sql = f"SELECT {cols} FROM read_parquet($1) WHERE source_id = $2 AND {where}"
    return con.execute(sql, [files, source_id]).fetchall()


def test_launch_step_and_graph_replay_match_the_raw_json(tmp_path):
    d = corpus(*DLRM)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([d], lake)
    assert len(res) == 8 and all(r.status == "ok" for r in res)
    src = lake.sources().to_dicts()
    checked = 0
    for r in src:
        path = d / os.path.basename(r["path"])
        want = _brute(path, r["base_time_ns"] or 0)
        rows = _lake_rows(lake, r["source_id"], "correlation, start_ns, name, launch_ns, step, graph_replay")
        got = {(c, s, n): (ln, st, g) for c, s, n, ln, st, g in rows}
        assert len(rows) == len(want) and got == want, path.name
        checked += sum(1 for v in want.values() if v[1] is not None)
    assert checked > 1000  # most DLRM kernels are launched inside a step


def test_flops_op_matches_a_brute_force_attribution(tmp_path):
    """flops_op: the kernel's External id is a modelled op's, or its launch call ran inside the
    latest modelled op of the same thread that started at or before it (modelled ops taken from
    the lake's cpu_ops: which ops have FLOPs is pipeline/flops.py's business, tested apart)."""
    lake = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lake)
    hits = 0
    for sid in [r["source_id"] for r in lake.sources().to_dicts() if r["status"] == "ok"]:
        ops = _lake_rows(lake, sid, "external_id, pid, tid, start_ns, end_ns", "cpu_ops", "flops IS NOT NULL")
        ext = {o[0] for o in ops if o[0] is not None}
        by_thread = defaultdict(list)
        for _, pid, tid, s, e in ops:
            by_thread[(pid, tid)].append((s, e))
        rows = _lake_rows(lake, sid, "external_id, launch_ns, launch_pid, launch_tid, flops_op")
        for x, ln, pid, tid, got in rows:
            want = x in ext
            if not want and ln is not None:
                before = [(s, e) for s, e in by_thread.get((pid, tid), []) if s <= ln]
                want = bool(before) and ln < max(before)[1]
            assert got == want
            hits += want
    assert hits > 100  # trace_filter: 756 ops with FLOPs over its two ranks


TRAFFIC = ["mem_bytes", "vector_flops"]  # cpu_ops columns of schema v3


def _make_old(lake: Lake, version: int) -> None:
    """Turn a lake into what schema `version` wrote: gpu_activities parts without the derived
    columns of later versions (v1: all of them; v2: work_op), cpu_ops parts without the traffic
    columns (v3's), their version in the parts' metadata, and a TRACELAKE marker naming it."""
    drop = {"gpu_activities": list(derive.DERIVED) if version == 1 else ["work_op"], "cpu_ops": TRAFFIC}
    for table, cols in drop.items():
        for f in lake.table_files(table):
            t = pq.read_table(f).drop_columns(cols)
            md = {**t.schema.metadata, b"tracelake.schema_version": str(version).encode()}
            pq.write_table(t.replace_schema_metadata(md), f)
    (lake.root / "TRACELAKE").write_text(f"tracelake lake, schema v{version}\n")


def _make_v1(lake: Lake) -> None:
    _make_old(lake, 1)


def _doc(lake):
    d = json.loads(json.dumps(analyze(lake), default=str))
    d.pop("schema", None)
    return d


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("v2")
    lake = Lake(root / "lake")
    ingest_paths([corpus(*DLRM)], lake)
    return root, _doc(lake)


def _copy_lake(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return Lake(dst)


def test_a_v1_lake_is_upgraded_in_place_on_first_read(reference, tmp_path):
    root, want = reference
    lake = _copy_lake(root / "lake", tmp_path / "lake")
    _make_v1(lake)
    assert upgrade.marker_version(lake) == 1
    assert _doc(lake) == want
    assert upgrade.marker_version(lake) == upgrade.sch.SCHEMA_VERSION
    for f in lake.table_files("gpu_activities"):
        s = pq.read_schema(f)
        assert set(derive.DERIVED) <= set(s.names) and s.metadata[b"tracelake.schema_version"] == b"3"


def test_a_v2_lake_gets_the_traffic_columns_and_work_op(reference, tmp_path):
    """Schema v2 -> v3: cpu_ops' mem_bytes / vector_flops are computed from the parts' own shapes
    (DLRM has no convolution, the one op that needs what the lake does not keep), work_op is
    re-derived: the same values as a fresh ingest, and the same analysis."""
    root, want = reference
    fresh = Lake(root / "lake")
    lake = _copy_lake(root / "lake", tmp_path / "lake")
    _make_old(lake, 2)
    assert upgrade.marker_version(lake) == 2
    assert _doc(lake) == want
    assert upgrade.marker_version(lake) == upgrade.sch.SCHEMA_VERSION

    def cols(lk, table, names):
        return sorted(
            (
                tuple(r)
                for f in lk.table_files(table)
                for r in zip(*pq.read_table(f, columns=["event_index", *names]).to_pydict().values())
            ),
            key=repr,
        )

    got = cols(lake, "cpu_ops", TRAFFIC)
    assert got == cols(fresh, "cpu_ops", TRAFFIC) and sum(1 for r in got if r[1] is not None) > 1000
    w = cols(lake, "gpu_activities", ["work_op"])
    assert w == cols(fresh, "gpu_activities", ["work_op"]) and sum(1 for r in w if r[1] is not None) > 1000


def test_a_locked_v1_lake_is_read_through_derived_copies_and_left_alone(reference, tmp_path):
    root, want = reference
    lake = _copy_lake(root / "lake", tmp_path / "lake")
    _make_v1(lake)
    before = {f: os.path.getmtime(f) for f in lake.table_files("gpu_activities")}
    fd = os.open(lake.root / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another writer holds the lake
        assert _doc(lake) == want
    finally:
        os.close(fd)
    assert upgrade.marker_version(lake) == 1
    assert {f: os.path.getmtime(f) for f in lake.table_files("gpu_activities")} == before
    assert not set(derive.DERIVED) & set(pq.read_schema(next(iter(before))).names)
    assert not set(TRAFFIC) & set(pq.read_schema(lake.table_files("cpu_ops")[0]).names)


def test_ingest_into_a_v1_lake_upgrades_it_first(tmp_path):
    lake = Lake(tmp_path / "lake")
    d = corpus(*DLRM)
    files = sorted(d.iterdir())
    ingest_paths(files[:4], lake, run="job")
    _make_v1(lake)
    ingest_paths(files[4:], lake, run="job")
    assert upgrade.marker_version(lake) == upgrade.sch.SCHEMA_VERSION
    parts = lake.table_files("gpu_activities")  # the two halves' compacted generations (hold.py)
    ids = {s for f in parts for s in pq.read_table(f, columns=["source_id"])["source_id"].to_pylist()}
    assert len(ids) == 8
    for f in parts:
        t = pq.read_table(f, columns=["launch_ns", "graph_replay"])
        assert t.column("launch_ns").null_count < t.num_rows and t.column("graph_replay").null_count == 0


def test_derived_values_given_by_a_writer_are_recomputed(tmp_path):
    """Lake.stage always derives: a writer cannot store launch/step values of its own."""
    from conftest import X, write_trace

    p = write_trace(
        tmp_path / "t.json",
        [
            X("user_annotation", "ProfilerStep#7", 0, 100),
            X("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=1),
            X("kernel", "k", 20, 10, pid=0, tid=7, correlation=1, device=0, stream=7),
        ],
    )
    lake = Lake(tmp_path / "lake")
    ingest_paths([p], lake)
    (f,) = lake.table_files("gpu_activities")
    t = pq.read_table(f)
    assert t.column("launch_ns").to_pylist() == [10_000] and t.column("step").to_pylist() == [7]
    lake2 = Lake(tmp_path / "lake2")
    tables = {n: pq.read_table(lake.table_files(n)[0]) for n in ("gpu_activities", "cpu_ops", "steps")}
    g = tables["gpu_activities"]
    tables["gpu_activities"] = g.set_column(
        g.schema.get_field_index("step"), "step", pa.array([99], pa.int64())
    )
    row = lake.sources().to_dicts()[0]
    lake2.write_source(row["run_id"], row["source_id"], tables, row)
    (f2,) = lake2.table_files("gpu_activities")
    assert pq.read_table(f2).column("step").to_pylist() == [7]


def test_a_large_part_derived_batch_by_batch_gives_the_same_rows(tmp_path, monkeypatch):
    """Parts past BATCH_ROWS are derived row group by row group against the per-correlation table
    computed once; the rows must equal the one-plan path's (here forced with a tiny batch)."""
    lake = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lake)
    for f in lake.table_files("gpu_activities"):
        from pathlib import Path

        g = Path(f)
        cpu = Path(f.replace("gpu_activities", "cpu_ops"))
        steps = Path(f.replace("gpu_activities", "steps"))
        whole = pa.concat_tables(derive.derived_batches(g, cpu, steps))
        monkeypatch.setattr(derive, "BATCH_ROWS", 97)
        parts = list(derive.derived_batches(g, cpu, steps))
        monkeypatch.undo()
        assert len(parts) > 3 and pa.concat_tables(parts).to_pylist() == whole.to_pylist()
        assert whole.to_pylist() == pq.read_table(g).to_pylist()  # the stored part is that


def test_a_part_derived_in_small_chunks_gives_the_whole_parts_values(tmp_path):
    """Parts past CHUNK_ROWS are derived a chunk of activities at a time, each reading only the
    launches of its correlation range and the modelled ops near its launch times (issue 40): every
    derived column must equal the whole-part derivation's, here with chunks of 23 activities, so
    that launches, steps and the op a launch ran in fall across chunk edges. The trace has steps,
    FLOP-modelled ops and ops with modelled work (checked, so the comparison is not of NULLs)."""
    from pathlib import Path

    lake = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lake)
    seen = {"step": 0, "flops_op": 0, "work_op": 0, "chunks": 0}
    for f in lake.table_files("gpu_activities"):
        g = Path(f)
        cpu, steps = (Path(f.replace("gpu_activities", t)) for t in ("cpu_ops", "steps"))
        whole = pa.concat_tables(derive.derived_batches(g, cpu, steps, chunk_rows=10**9))
        parts = list(derive.derived_batches(g, cpu, steps, chunk_rows=23))
        seen["chunks"] += len(parts)
        chunked = pa.concat_tables(parts)
        for c in derive.DERIVED:
            assert chunked.column(c).to_pylist() == whole.column(c).to_pylist(), (g.name, c)
        assert chunked.drop_columns(list(derive.DERIVED)).equals(
            pq.read_table(g).drop_columns(list(derive.DERIVED))
        )
        seen["step"] += whole.column("step").drop_null().__len__()
        seen["flops_op"] += sum(whole.column("flops_op").to_pylist())
        seen["work_op"] += whole.column("work_op").drop_null().__len__()
    assert seen["chunks"] > 50 and seen["step"] > 0 and seen["flops_op"] > 100 and seen["work_op"] > 100, seen


@pytest.mark.parametrize("locked", [False, True])
def test_a_v1_lake_whose_host_parts_also_lack_a_column_is_upgraded(reference, tmp_path, locked):
    """cpu_ops parts older than a column the derivation reads (flops): they are brought to the
    current columns first (NULL), then gpu_activities is derived from them (no op has FLOPs, so
    flops_op is FALSE everywhere), in place or, for a locked lake, in the copies."""
    import duckdb

    root, _ = reference
    lake = _copy_lake(root / "lake", tmp_path / "lake")
    _make_v1(lake)
    for f in lake.table_files("cpu_ops"):
        pq.write_table(pq.read_table(f).drop_columns(["flops"]), f)
    fd = os.open(lake.root / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        con = __import__("pipeline.query", fromlist=["connect"]).connect(lake)
        got = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE flops_op), count(launch_ns) FROM gpu_activities"
        ).fetchall()[0]
        (ops,) = con.execute("SELECT count(flops) FROM cpu_ops").fetchall()[0]
    finally:
        os.close(fd)
    n = duckdb.sql(
        f"SELECT count(*), count(launch_ns) FROM read_parquet({(root / 'lake').as_posix()!r} || "
        "'/gpu_activities/*/*.parquet')"
    ).fetchall()[0]
    assert got == (n[0], 0, n[1]) and ops == 0
    assert upgrade.marker_version(lake) == (1 if locked else upgrade.sch.SCHEMA_VERSION)
