"""The lake is plain hive-partitioned Parquet: polars and pyarrow.dataset read it without tracelake."""

import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from conftest import REPO
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake


def test_other_readers(tmp_path):
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([REPO / "sample_traces"], lake, run="demo")
    assert [r.status for r in res] == ["ok", "ok"]
    df = pl.scan_parquet(str(lake.root / "gpu_activities" / "**" / "*.parquet"), hive_partitioning=True).collect()
    assert set(df["run"].unique()) == {"demo"} and set(df["run_id"].unique()) == {"demo"}
    # sampled_rank-0: 1154 kernels + 40 memcpy + 10 memset; sampled_rank-1: 1104 + 40 + 10 (hta.md section 2)
    assert df.height == 1204 + 1154
    t = ds.dataset(lake.root / "steps", format="parquet", partitioning="hive").to_table()
    assert t.num_rows == 4 and set(t.column("run").to_pylist()) == {"demo"}
    md = pq.read_schema(next((lake.root / "sources").glob("*/*.parquet"))).metadata
    assert md[b"tracelake.schema_version"] == b"1" and md[b"tracelake.table"] == b"sources"
