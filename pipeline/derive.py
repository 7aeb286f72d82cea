"""Per-source derived columns of gpu_activities (schemas/v3.toml): each GPU activity's launch,
its step, the graph-replay flag and whether an op with modelled FLOPs launched it.

They depend only on the rows of the activity's own source (its cpu_ops and steps), so they are
computed once, when the source is written: pipeline/lake.py Lake.stage calls derive_files in the
worker that ingests the file, and pipeline/upgrade.py calls it for the parts of a schema v1 lake.
Analysis reads them as plain columns instead of joining every kernel to its launch (that join
was a third of the analysis time of a 64-rank x 100k-kernel lake, docs/performance.md). Polars,
not DuckDB: a DuckDB connection and query cost about 90 ms per source however small it is,
polars a few ms (the 8-rank job of benchmarks/small_job.py has 8 sources).

Definitions (the source's rows only; rank is a key because one Nsight Systems report holds
several processes, and correlation ids repeat across processes):
- launch_ns, launch_name, launch_pid, launch_tid: the runtime/driver call (cpu_ops kind runtime
  or driver) with the activity's rank and correlation id; the earliest when several share it;
  NULL when the trace has none.
- step: the step whose host ProfilerStep window [start_ns, end_ns) (steps, same rank) holds
  launch_ns (HTA assigns iterations the same way: hta/common/trace.py add_iteration); the window
  starting last at or before the launch is the candidate; NULL outside every window or without a
  launch.
- graph_replay: a kernel whose correlation is shared by more than one GPU activity of the rank
  (the kernels of a CUDA/HIP graph replay share the one correlation of cudaGraphLaunch): its
  launch time says nothing about when each kernel was ready, so host-wait classification and
  per-op attribution of those kernels are unreliable.
- flops_op: launched by a host op with modelled FLOPs (cpu_ops.flops not NULL): the op's External
  id is the activity's, or the launching call ran inside the op (op start <= launch_ns < op end)
  on the same process and thread, taking the latest such op starting at or before the launch
  (queries/mfu.sql's FLOP coverage).
- work_op: the event_index of the op whose modelled work (cpu_ops.flops or mem_bytes not NULL,
  pipeline/flops.py and pipeline/opbytes.py) the kernel did, for the roofline: the op with the
  activity's External id when that op is modelled (Kineto gives a kernel the External id of the
  innermost op around its launch), else the latest modelled op on the launching process and
  thread whose range holds launch_ns (an unmodelled inner op such as aten::cudnn_convolution
  leaves the kernel to the modelled aten::convolution around it); NULL when there is none.

Errors: OSError / pyarrow errors for an unreadable part; polars errors for a part of the wrong
shape (the lake's parts are conformed to the schema when written, so neither is expected).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

# the derived columns, in schema order (schemas/v3.toml, last columns of gpu_activities)
DERIVED = (
    "launch_ns",
    "launch_name",
    "launch_pid",
    "launch_tid",
    "step",
    "graph_replay",
    "flops_op",
    "work_op",
)
BATCH_ROWS = 1 << 18
# polars' in-memory engine for a small source: half the time of the streaming one (10 vs 19 ms
# for a DLRM rank); a large one is streamed (see derived_batches)
ENGINE = "in-memory"
_KEYS = ["rank", "correlation"]


def _scan(x: Path | pl.LazyFrame) -> pl.LazyFrame:
    """A part as a lazy frame: a Parquet file scanned, or a frame already in memory."""
    return x if isinstance(x, pl.LazyFrame) else pl.scan_parquet(x, glob=False)


def per_correlation(
    gpu: Path | pl.LazyFrame, cpu: Path | pl.LazyFrame | None, steps: Path | pl.LazyFrame | None
) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    """Lazy frames (gpu, cpu, steps: the source's parts, or lazy frames of their rows): (one row
    per rank and correlation with GPU work: activities, launch_ns,
    launch_name, launch_pid, launch_tid, step, in_op, in_work_op; the External ids of ops with
    modelled FLOPs, column external_id; the External ids of ops with modelled work, columns
    external_id, ext_work_op). Built as one plan, so a small source costs one collect."""
    i64 = pl.Int64
    corr = (
        _scan(gpu)
        .select(_KEYS)
        .filter(pl.col("correlation").is_not_null())
        .group_by(_KEYS)
        .agg(activities=pl.len())
    )
    if cpu is not None:
        ops = _scan(cpu)
        launches = (
            ops.filter(pl.col("kind").is_in(["runtime", "driver"]) & pl.col("correlation").is_not_null())
            .select(*_KEYS, "start_ns", "name", "pid", "tid")
            .sort("start_ns", maintain_order=True)
            .group_by(_KEYS, maintain_order=True)
            .first()
            .rename(
                {"start_ns": "launch_ns", "name": "launch_name", "pid": "launch_pid", "tid": "launch_tid"}
            )
        )
        modelled = ops.filter(pl.col("flops").is_not_null())
        ids = modelled.filter(pl.col("external_id").is_not_null()).select("external_id").unique()
        mo = modelled.select(
            launch_pid="pid", launch_tid="tid", op_start_ns="start_ns", op_end_ns="end_ns"
        ).sort("op_start_ns")
        work = ops.filter(pl.col("flops").is_not_null() | pl.col("mem_bytes").is_not_null())
        wids = (
            work.filter(pl.col("external_id").is_not_null())
            .group_by("external_id")
            .agg(ext_work_op=pl.col("event_index").min())
        )
        wo = work.select(
            launch_pid="pid", launch_tid="tid", w_start_ns="start_ns", w_end_ns="end_ns", w_op="event_index"
        ).sort("w_start_ns")
    else:
        launches = pl.LazyFrame(
            schema={
                "rank": pl.Int32,
                "correlation": i64,
                "launch_ns": i64,
                "launch_name": pl.String,
                "launch_pid": i64,
                "launch_tid": i64,
            }  # fmt: skip
        )
        ids = pl.LazyFrame(schema={"external_id": i64})
        mo = pl.LazyFrame(schema={"launch_pid": i64, "launch_tid": i64, "op_start_ns": i64, "op_end_ns": i64})
        wids = pl.LazyFrame(schema={"external_id": i64, "ext_work_op": i64})
        wo = pl.LazyFrame(
            schema={"launch_pid": i64, "launch_tid": i64, "w_start_ns": i64, "w_end_ns": i64, "w_op": i64}
        )
    if steps is not None:
        st = _scan(steps).select("rank", "step", step_start_ns="start_ns", step_end_ns="end_ns")
    else:
        st = pl.LazyFrame(schema={"rank": pl.Int32, "step": i64, "step_start_ns": i64, "step_end_ns": i64})
    # asof joins give no match for a NULL key (an unknown launch, pid or tid)
    out = (
        corr.join(launches, on=_KEYS, how="left")
        .sort("launch_ns")
        .join_asof(
            st.sort("step_start_ns"),
            left_on="launch_ns",
            right_on="step_start_ns",
            by="rank",
            strategy="backward",
            check_sortedness=False,
        )
        .join_asof(
            mo,
            left_on="launch_ns",
            right_on="op_start_ns",
            by=["launch_pid", "launch_tid"],
            strategy="backward",
            check_sortedness=False,
        )
        .join_asof(
            wo,
            left_on="launch_ns",
            right_on="w_start_ns",
            by=["launch_pid", "launch_tid"],
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(
            step=pl.when(pl.col("launch_ns") < pl.col("step_end_ns")).then(pl.col("step")).cast(i64),
            in_op=(pl.col("launch_ns") < pl.col("op_end_ns")).fill_null(False),
            in_work_op=pl.when(pl.col("launch_ns") < pl.col("w_end_ns")).then(pl.col("w_op")),
        )
        .drop("step_start_ns", "step_end_ns", "op_start_ns", "op_end_ns", "w_start_ns", "w_end_ns", "w_op")
    )
    return out, ids, wids


def _with_derived(df: pl.LazyFrame | pl.DataFrame, corr, ids, wids):
    df = df.drop([c for c in DERIVED if c in df.collect_schema().names()])
    df = df.join(corr, on=_KEYS, how="left", maintain_order="left")
    df = df.join(ids.with_columns(by_ext=pl.lit(True)), on="external_id", how="left", maintain_order="left")
    df = df.join(wids, on="external_id", how="left", maintain_order="left")
    return df.with_columns(
        graph_replay=((pl.col("activities") > 1) & (pl.col("kind") == "kernel")).fill_null(False),
        flops_op=pl.col("by_ext").fill_null(False) | pl.col("in_op").fill_null(False),
        work_op=pl.coalesce("ext_work_op", "in_work_op").cast(pl.Int64),
    ).drop("activities", "in_op", "by_ext", "ext_work_op", "in_work_op")


def derived_batches(gpu: Path, cpu: Path | None, steps: Path | None) -> Iterator[pa.Table]:
    """The rows of the gpu_activities part `gpu`, in its order and batch by batch, with the
    derived columns computed from the source's cpu_ops and steps parts (None: it has none). The
    derived columns are computed for the whole part at once from its key columns only (rank,
    correlation, external id, kind: one join, a few bytes a row) and then appended to each batch
    of the part as it is read, so the part's other columns (kernel names, geometry) are never
    joined or held whole. A large source is computed on polars' streaming engine, so that only
    the launch calls' rows of cpu_ops are held (in memory, every op's name would be read before
    the filter); a small one on the in-memory engine (half the time)."""
    corr, ids, wids = per_correlation(gpu, cpu, steps)
    pf = pq.ParquetFile(gpu)
    try:
        cpu_rows = pq.read_metadata(cpu).num_rows if cpu is not None else 0
        small = pf.metadata.num_rows <= BATCH_ROWS and cpu_rows <= 4 * BATCH_ROWS
        keys = pl.scan_parquet(gpu, glob=False).select("rank", "correlation", "external_id", "kind")
        derived = (
            _with_derived(keys, corr, ids, wids)
            .select(DERIVED)
            .collect(engine=ENGINE if small else "streaming")
        )
        offset = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS):
            t = pa.Table.from_batches([batch])
            t = t.drop_columns([c for c in DERIVED if c in t.column_names])
            cols = derived.slice(offset, batch.num_rows).to_arrow()
            for c in DERIVED:
                t = t.append_column(c, cols.column(c))
            offset += batch.num_rows
            yield t
        if offset != derived.height:  # the joins keep one row per activity, in its order
            raise AssertionError(f"{gpu}: {derived.height} derived rows for {offset} activities")
    finally:
        pf.close()


def derive_table(gpu: pa.Table, cpu: pa.Table | None, steps: pa.Table | None) -> pa.Table:
    """A small source's gpu_activities rows held in memory (pa.Table of its schema v3 columns)
    with the derived columns computed from its cpu_ops and steps rows (None: it has none): the
    same values as derived_batches gives for the same rows written as parts, in one in-memory
    polars plan without a Parquet round trip (pipeline/ingest/hold.py). Types as polars gives
    them (the caller conforms the table to the schema)."""
    lazy = [None if t is None else pl.from_arrow(t).lazy() for t in (gpu, cpu, steps)]
    corr, ids, wids = per_correlation(*lazy)
    keys = lazy[0].select("rank", "correlation", "external_id", "kind")
    derived = _with_derived(keys, corr, ids, wids).select(DERIVED).collect(engine=ENGINE).to_arrow()
    if derived.num_rows != gpu.num_rows:  # the joins keep one row per activity, in its order
        raise AssertionError(f"{derived.num_rows} derived rows for {gpu.num_rows} activities")
    out = gpu.drop_columns([c for c in DERIVED if c in gpu.column_names])
    for c in DERIVED:
        out = out.append_column(c, derived.column(c))
    return out


def derive_files(
    gpu: Path, cpu: Path | None, steps: Path | None, out: Path, write: Callable[[object, Path], bool]
) -> bool:
    """Write `out` from derived_batches(gpu, cpu, steps) with write(chunks, path) (pipeline/lake.py
    conforms each chunk to the schema); returns what write returns."""
    return write(derived_batches(gpu, cpu, steps), out)
