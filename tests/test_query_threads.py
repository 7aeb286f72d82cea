"""A small lake's connect loads its tables, materializes its views and runs its queries on one
DuckDB thread (pipeline/query.py: waking the other threads cost more than the work; issue 38), with
the rows of a connection on two threads; a thread count the caller gives is kept."""

from __future__ import annotations

from conftest import corpus

from pipeline import query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

SETTING = "SELECT current_setting('threads')"


def test_small_lake_runs_on_one_thread_with_two_threads_rows(tmp_path):
    lk = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lk)
    names = ["breakdown", "step_time", "idle_breakdown", "top_kernels"]
    con = query.connect(lk)
    assert query._bytes(lambda t: lk.table_files(t)) <= query.LOAD_ALL_BYTES  # the one-thread path
    assert con.execute(SETTING).fetchall() == [(1,)]
    got = query.run_many(con, names)
    # the reference: the same lake on a connection bound with two threads throughout
    two = query.connect(lk, threads=2)
    assert two.execute(SETTING).fetchall() == [(2,)]
    ref = query.run_many(two, names)
    assert got["step_time"].height > 0
    assert all(got[k].equals(ref[k]) for k in names)


def test_small_lake_queries_planned_once_give_the_relations_rows(tmp_path):
    """A small lake's connection (and its cursors) runs each metric through con.execute, bound and
    planned once (pipeline/query.py _SMALL); every metric's frame equals the one DuckDB's relation
    gives for the same SQL (con.sql(...).to_arrow_table(), the path a larger lake keeps), on the
    connection and on a cursor of it, and DuckDB's note on the extra copy is not printed."""
    import subprocess
    import sys

    import polars as pl

    lk = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lk)
    con = query.connect(lk)
    cur = query.cursor(con)
    assert con in query._SMALL and cur in query._SMALL
    assert query.connect(lk, materialize=False) in query._SMALL  # by the lake's size alone
    names = query.metric_names()
    # in a process of its own (pytest resets warning filters per test): nothing on stderr
    code = (
        "import sys\n"
        "from pipeline import query\n"
        "from pipeline.lake import Lake\n"
        f"con = query.connect(Lake({str(lk.root)!r}))\n"
        "print(sum(query.run(con, n).height for n in query.metric_names()))\n"
    )
    p = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == "", p.stderr[-500:]
    assert int(p.stdout) == sum(query.run(cur, n).height for n in names) > 0
    for n in names:
        ref = pl.from_arrow(con.sql(query.metric_sql(con, n)).to_arrow_table())
        assert query.run(con, n).equals(ref) and query.run(cur, n).equals(ref), n
