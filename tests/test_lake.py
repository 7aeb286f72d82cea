"""The lake is plain hive-partitioned Parquet: polars and pyarrow.dataset read it without tracelake."""

import gzip
import json
import math

import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from conftest import REPO

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

GPU_CATS = {
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "cuda_sync",
    "cuda_profiler_range",
}
SKIP_CATS = {
    "Trace",
    "ac2g",
    "async_cpu_to_gpu",
    "async",
    "fwdbwd",
    "critical_path",
    "cpu_instant_event",
    "gpu_user_annotation",
}


def test_other_readers(tmp_path):
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([REPO / "sample_traces"], lake, run="demo")
    assert [r.status for r in res] == ["ok", "ok"]
    df = pl.scan_parquet(
        str(lake.root / "gpu_activities" / "**" / "*.parquet"), hive_partitioning=True
    ).collect()
    assert set(df["run"].unique()) == {"demo"} and set(df["run_id"].unique()) == {"demo"}
    # sampled_rank-0: 1154 kernels + 40 memcpy + 10 memset; sampled_rank-1: 1104 + 40 + 10 (hta.md section 2)
    assert df.height == 1204 + 1154
    t = ds.dataset(lake.root / "steps", format="parquet", partitioning="hive").to_table()
    assert t.num_rows == 4 and set(t.column("run").to_pylist()) == {"demo"}
    md = pq.read_schema(next((lake.root / "sources").glob("*/*.parquet"))).metadata
    assert md[b"tracelake.schema_version"] == b"3" and md[b"tracelake.table"] == b"sources"


def test_incremental_skip_force_and_a_new_rank_joins_its_run(tmp_path):
    import shutil

    from conftest import corpus

    from pipeline.query import connect

    dlrm = sorted(corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto").glob("worker*.json"))
    job = tmp_path / "job"
    job.mkdir()
    for f in dlrm[:4]:
        shutil.copy(f, job / f.name)
    lake = Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([job], lake)] == ["ok"] * 4
    # more rank files of the same job arrive: they join run "job", the first four are skipped
    for f in dlrm[4:]:
        shutil.copy(f, job / f.name)
    res = ingest_paths([job], lake)
    assert [r.status for r in res] == ["skipped"] * 4 + ["ok"] * 4
    assert {r.run_id for r in res} == {"job"} and [r.rank for r in res[4:]] == [4, 5, 6, 7]
    # the same bytes under another name are the same source (content hash), in the same run
    shutil.copy(dlrm[0], job / "renamed_copy.json")
    (r,) = [r for r in ingest_paths([job], lake) if r.path.endswith("renamed_copy.json")]
    assert r.status == "skipped"
    con = connect(lake)
    assert con.execute(
        "SELECT count(*), count(DISTINCT rank) FROM sources WHERE run_id = 'job'"
    ).fetchone() == (8, 8)
    n_ops = con.execute("SELECT count(*) FROM cpu_ops").fetchone()[0]
    # --force re-ingests and replaces: nothing doubles
    res = ingest_paths([job], lake, force=True)
    # (the renamed copy is the same source as worker0, re-ingested earlier in this batch: skipped)
    assert sorted(r.status for r in res) == ["ok"] * 8 + ["skipped"]
    con = connect(lake)
    assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 8
    assert con.execute("SELECT count(*) FROM cpu_ops").fetchone()[0] == n_ops
    expected = sum(
        1
        for f in dlrm
        for e in json.loads(f.read_bytes())["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") not in GPU_CATS | SKIP_CATS
    )
    assert n_ops == expected


def test_the_benchmark_generator_keeps_the_shape(tmp_path):
    """benchmarks/scale_trace.py: N ranks x 3 copies of a real trace hold 3x its rows per rank, and
    its lake writer (used for the analysis benchmarks) gives the rows of ingesting that JSON."""
    import sys

    from conftest import REPO, corpus

    from pipeline.query import connect

    sys.path.insert(0, str(REPO / "benchmarks"))
    import scale_trace

    src = corpus("hta", "tests", "data", "trace_filter", "sampled_rank-0.json.gz")
    one = Lake(tmp_path / "one")
    ingest_paths([src], one, run="one")
    assert scale_trace.check(src, tmp_path / "chk") == []
    scaled = Lake(tmp_path / "chk" / "from_json")
    c1, c3 = connect(one), connect(scaled)
    for t in ("gpu_activities", "cpu_ops", "steps", "collectives"):
        n1 = c1.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        assert c3.execute(f"SELECT count(*) FROM {t} GROUP BY rank ORDER BY rank").fetchall() == [
            (3 * n1,),
            (3 * n1,),
        ], t
    # copies follow one another, each shifted by the profiler's window (its "Trace" span) + 1 ms
    window_us = max(
        e["ts"] + e.get("dur", 0)
        for e in json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
        if "ts" in e
    ) - min(e["ts"] for e in json.loads(gzip.decompress(src.read_bytes()))["traceEvents"] if "ts" in e)
    (s1,) = c1.execute("SELECT trace_end_ns - trace_start_ns FROM sources").fetchone()
    (s3,) = c3.execute("SELECT trace_end_ns - trace_start_ns FROM sources WHERE rank = 0").fetchone()
    assert s3 == s1 + 2 * (math.ceil(window_us) + 1000) * 1000
