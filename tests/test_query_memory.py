"""A metric query that runs out of DuckDB's memory cap (pipeline/query.py MEMORY_LIMIT) is run
again without it (query.run, under run_many) instead of failing the analysis: a lake of 64 ranks
x 100k kernels whose per-source results were stale ran out at 953 MiB and gave a traceback."""

from __future__ import annotations

import duckdb
from conftest import corpus

from pipeline import query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake


def test_a_query_past_the_cap_runs_again_uncapped(tmp_path):
    lk = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lk)
    names = ["step_time", "idle_breakdown", "top_kernels"]
    ref = query.run_many(query.connect(lk, materialize=False), names)
    assert ref["step_time"].height > 0
    con = query.connect(lk, materialize=False)  # its tables read from Parquet, not held in memory
    con.execute("SET memory_limit = '1MB'")
    try:  # the cap is really too small for these queries
        con.sql(query.metric_sql(con, "step_time")).to_arrow_table()
        raise AssertionError("step_time ran under 1 MB")
    except duckdb.OutOfMemoryException:
        pass
    got = query.run_many(con, names)
    assert all(got[k].equals(ref[k]) for k in names)
    # the connection now runs with DuckDB's own default
    setting = "SELECT current_setting('memory_limit')"
    assert con.execute(setting).fetchall() == duckdb.connect().execute(setting).fetchall()
