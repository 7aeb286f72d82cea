"""A small lake's connect loads its tables and materializes its views on one DuckDB thread
(pipeline/query.py: waking the other threads cost more than the work; issue 38), then gives the
connection back DuckDB's own thread count, so the metric queries and `tracelake sql` run as before;
a thread count the caller gives is kept."""

from __future__ import annotations

import duckdb
from conftest import corpus

from pipeline import query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

SETTING = "SELECT current_setting('threads')"


def test_small_lake_connect_gives_the_threads_back(tmp_path):
    lk = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lk)
    names = ["breakdown", "step_time", "idle_breakdown", "top_kernels"]
    con = query.connect(lk)
    assert query._bytes(lambda t: lk.table_files(t)) <= query.LOAD_ALL_BYTES  # the one-thread path
    assert con.execute(SETTING).fetchall() == duckdb.connect().execute(SETTING).fetchall()
    got = query.run_many(con, names)
    # the reference: the same lake on a connection bound with two threads throughout
    two = query.connect(lk, threads=2)
    assert two.execute(SETTING).fetchall() == [(2,)]
    ref = query.run_many(two, names)
    assert got["step_time"].height > 0
    assert all(got[k].equals(ref[k]) for k in names)
