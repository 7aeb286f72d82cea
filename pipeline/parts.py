"""Writing one Parquet part of the lake: the encoding options every part is written with, a
table or a stream of chunks conformed to the schema and written as one file, and a staged
gpu_activities part rewritten with its derived columns (pipeline/derive.py). pipeline/lake.py
(staging, commits) and pipeline/upgrade.py (rewriting an older lake's parts) write through here.
Errors: SchemaError (pipeline/schema.py) for a chunk that does not conform; OSError and pyarrow
errors from the file system and the writer. rewrite_run_id: a staged part moved to another run."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import derive
from . import schema as sch


def parquet_options(schema: pa.Schema) -> dict:
    """zstd; min/max statistics only for non-string columns (numbers and times prune row groups;
    statistics of long text columns such as input_dims cost as much as the data); dictionary
    encoding only for string columns (names, kinds repeat; nanosecond times and ids rarely do, and
    trying a dictionary on them costs write time: on a scaled Kineto rank 37 % less write time and
    46 % smaller files than the default of every column)."""
    text = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    stats = [f.name for f in schema if not pa.types.is_string(f.type) and not pa.types.is_list(f.type)]
    return dict(compression="zstd", write_statistics=stats, use_dictionary=text)


def write_parquet(tbl: pa.Table, path: Path) -> None:
    pq.write_table(tbl, path, **parquet_options(tbl.schema))


def derive_staged(tmp: Path, done: list[str]) -> None:
    """Rewrite a staged gpu_activities part with its derived columns (pipeline/derive.py)."""
    part = tmp / "gpu_activities.parquet"
    out = tmp / "gpu_activities.derived"
    derive.derive_files(
        part,
        tmp / "cpu_ops.parquet" if "cpu_ops" in done else None,
        tmp / "steps.parquet" if "steps" in done else None,
        out,
        lambda chunks, path: write_stream("gpu_activities", chunks, path),
    )
    os.replace(out, part)


def write_stream(table: str, chunks, path: Path) -> bool:
    """Write an iterable of chunks (pyarrow Table/RecordBatch, or a whole Table) as one Parquet
    file, conforming each; returns False (no file) when there were no rows."""
    if isinstance(chunks, (pa.Table, dict)):
        tbl = sch.conform(table, chunks)
        if tbl.num_rows:
            write_parquet(tbl, path)
        return tbl.num_rows > 0
    writer = None
    rows = 0
    try:
        for c in chunks:
            if isinstance(c, pa.RecordBatch):
                c = pa.Table.from_batches([c])
            tbl = sch.conform(table, c)
            if not tbl.num_rows:
                continue
            if writer is None:
                writer = pq.ParquetWriter(path, tbl.schema, **parquet_options(tbl.schema))
            writer.write_table(tbl)
            rows += tbl.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows > 0


def rewrite_run_id(f: Path, run_id: str) -> None:
    """Rewrite a staged part with run_id in its run_id column (row group by row group; Lake.retarget)."""
    out = f.with_suffix(".retarget")
    pf = pq.ParquetFile(f)
    with pq.ParquetWriter(out, pf.schema_arrow, **parquet_options(pf.schema_arrow)) as w:
        for i in range(pf.num_row_groups):
            tbl = pf.read_row_group(i)
            j = tbl.schema.get_field_index("run_id")
            tbl = tbl.set_column(
                j,
                tbl.schema.field(j),
                pl.repeat(run_id, tbl.num_rows, eager=True).to_arrow().cast(pa.string()),
            )
            w.write_table(tbl)
    pf.close()
    os.replace(out, f)
