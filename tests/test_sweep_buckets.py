"""step_time.sql's sweep a bucket at a time (issue 40): a rank's edges are swept in time buckets
of about getvariable('sweep_bucket_rows') work intervals, each bucket starting from the running
sums of those before it, so that DuckDB can spill the sweep of a rank of millions of kernels.
The rows must not depend on the bucketing: one bucket per rank is the single sweep over the
rank's edges, and buckets of one or seven work intervals cut every gap, step window and
DataLoader fetch of real traces across bucket edges (HTA's trace_diff test trace has every idle
cause, memory and communication work; trace_filter's two ranks share one sweep)."""

from __future__ import annotations

import polars as pl
from conftest import corpus

from pipeline import query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake


def test_step_time_swept_in_small_buckets_equals_one_sweep_per_rank(tmp_path):
    lake = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_diff", "test", "test.json.gz")], lake, run="diff")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lake, run="filter")
    con = query.connect(lake)
    sql = (query.QUERIES_DIR / "step_time.sql").read_text()

    def rows(bucket_rows: int) -> pl.DataFrame:
        con.execute(f"SET VARIABLE sweep_bucket_rows = {bucket_rows}")
        return pl.from_arrow(con.sql(sql).to_arrow_table())

    whole = rows(10**12)
    for n in (1, 7):
        assert rows(n).equals(whole), n
    # the comparison covers every cause and three ranks in one sweep, not rows of zeros
    assert whole.select("run_id", "rank").unique().height == 3 and whole.height == 10
    for c in (
        "idle_input_ns",
        "idle_unreliable_ns",
        "idle_host_wait_ns",
        "idle_kernel_wait_ns",
        "idle_other_ns",
    ):
        assert whole.get_column(c).sum() > 0, c
    assert whole.get_column("exposed_memory_ns").sum() > 0 and whole.get_column("comm_ns").sum() > 0
