"""Per-source derived columns of gpu_activities (schemas/v3.toml): each GPU activity's launch,
its step, the graph-replay flag and whether an op with modelled FLOPs launched it.

They depend only on the rows of the activity's own source (its cpu_ops and steps), so they are
computed once, when the source is written: pipeline/lake.py Lake.stage calls derive_files in the
worker that ingests the file, pipeline/upgrade.py calls it for the parts of a schema v1 lake, and
the small sources an ingest holds in memory get theirs from derive_many, a run's at a time, in
the ingesting process (pipeline/ingest/hold.py). Analysis reads them as plain columns instead of
joining every kernel to its launch (that join was a third of the analysis time of a 64-rank x
100k-kernel lake, docs/performance.md). Polars,
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

import numpy as np
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
# a part of more activities than this (or more than 4x as many ops) is derived this many
# activities at a time (derived_batches); the peak grows with the chunk, about 1.5 kB an activity
# (the part's rows read and written with their derived columns, the chunk's launches): a 1.8 M
# kernel part peaked at 0.46 GB with 2^17, 0.65 GB with 2^18, 1.0 GB with 2^19 and 0.8 GB whole
# (benchmarks/ingest_memory.py's 1 GB trace; 0.2 GB of it is the imports)
CHUNK_ROWS = 1 << 17
# polars' in-memory engine for a small source: half the time of the streaming one (10 vs 19 ms
# for a DLRM rank); a large one is streamed (see derived_batches)
ENGINE = "in-memory"
_KEYS = ["rank", "correlation"]
# derive_many's source key: the source's place in its list
SOURCE_KEY = "_source"
SOURCE_KEY_TYPE = pl.Int32


def _scan(x: Path | pl.LazyFrame) -> pl.LazyFrame:
    """A part as a lazy frame: a Parquet file scanned, or a frame already in memory."""
    return x if isinstance(x, pl.LazyFrame) else pl.scan_parquet(x, glob=False)


# cpu_ops' columns read here, for a source without cpu_ops
_NO_OPS = {
    "rank": pl.Int32,
    "correlation": pl.Int64,
    "kind": pl.String,
    "name": pl.String,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "external_id": pl.Int64,
    "flops": pl.Float64,
    "mem_bytes": pl.Float64,
    "event_index": pl.Int64,
}


def _launches(ops: pl.LazyFrame, by: tuple[str, ...] = ()) -> pl.LazyFrame:
    """One row per rank and correlation (and `by`: derive_many's source key) of the runtime/driver
    calls among `ops` (cpu_ops rows): the earliest call's launch_ns, launch_name, launch_pid,
    launch_tid."""
    return (
        ops.filter(pl.col("kind").is_in(["runtime", "driver"]) & pl.col("correlation").is_not_null())
        .select(*by, *_KEYS, "start_ns", "name", "pid", "tid")
        .sort("start_ns", maintain_order=True)
        .group_by([*by, *_KEYS], maintain_order=True)
        .first()
        .rename({"start_ns": "launch_ns", "name": "launch_name", "pid": "launch_pid", "tid": "launch_tid"})
    )


def _modelled(ops: pl.LazyFrame, work: bool) -> pl.LazyFrame:
    """The ops with modelled FLOPs (work: or modelled bytes) among `ops`."""
    has = pl.col("flops").is_not_null()
    return ops.filter(has | pl.col("mem_bytes").is_not_null() if work else has)


def _ranges(
    mo: pl.LazyFrame, wo: pl.LazyFrame, by: tuple[str, ...] = ()
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The asof right sides: (modelled ops: launch_pid, launch_tid, op_start_ns, op_end_ns; ops
    with modelled work: launch_pid, launch_tid, w_start_ns, w_end_ns, w_op), each sorted by start
    and, among equal starts, by event_index (so that a subset of the ops sorts its rows in the
    same order as the whole: _near); `by` columns kept as they are."""
    mo = mo.sort("start_ns", "event_index").select(
        *by, launch_pid="pid", launch_tid="tid", op_start_ns="start_ns", op_end_ns="end_ns"
    )
    wo = wo.sort("start_ns", "event_index").select(
        *by, launch_pid="pid", launch_tid="tid", w_start_ns="start_ns", w_end_ns="end_ns", w_op="event_index"
    )
    return mo, wo


def _join(corr, launches, st, mo, wo, by: tuple[str, ...] = ()) -> pl.LazyFrame:
    """corr (rank, correlation, activities) with its launch, the step window holding the launch
    and the (modelled, work) op the launch ran in: per_correlation's first frame. by: key columns
    every frame has (derive_many's source key), joined on first."""
    # asof joins give no match for a NULL key (an unknown launch, pid or tid)
    asof = dict(left_on="launch_ns", strategy="backward", check_sortedness=False)
    return (
        corr.join(launches, on=[*by, *_KEYS], how="left")
        .sort("launch_ns")
        .join_asof(st.sort("step_start_ns"), right_on="step_start_ns", by=[*by, "rank"], **asof)
        .join_asof(mo, right_on="op_start_ns", by=[*by, "launch_pid", "launch_tid"], **asof)
        .join_asof(wo, right_on="w_start_ns", by=[*by, "launch_pid", "launch_tid"], **asof)
        .with_columns(
            step=pl.when(pl.col("launch_ns") < pl.col("step_end_ns")).then(pl.col("step")).cast(pl.Int64),
            in_op=(pl.col("launch_ns") < pl.col("op_end_ns")).fill_null(False),
            in_work_op=pl.when(pl.col("launch_ns") < pl.col("w_end_ns")).then(pl.col("w_op")),
        )
        .drop("step_start_ns", "step_end_ns", "op_start_ns", "op_end_ns", "w_start_ns", "w_end_ns", "w_op")
    )


def _steps(steps: Path | pl.LazyFrame | None, by: tuple[str, ...] = ()) -> pl.LazyFrame:
    if steps is None:
        return pl.LazyFrame(
            schema={
                **dict.fromkeys(by, SOURCE_KEY_TYPE),
                "rank": pl.Int32,
                "step": pl.Int64,
                "step_start_ns": pl.Int64,
                "step_end_ns": pl.Int64,
            }
        )
    return _scan(steps).select(*by, "rank", "step", step_start_ns="start_ns", step_end_ns="end_ns")


def _external(
    mo: pl.LazyFrame, wo: pl.LazyFrame, by: tuple[str, ...] = ()
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """(the External ids of modelled ops: external_id; of ops with modelled work, the least
    event_index: external_id, ext_work_op), each with the `by` columns."""
    ids = mo.filter(pl.col("external_id").is_not_null()).select(*by, "external_id").unique()
    wids = (
        wo.filter(pl.col("external_id").is_not_null())
        .group_by([*by, "external_id"])
        .agg(ext_work_op=pl.col("event_index").min())
    )
    return ids, wids


def per_correlation(
    gpu: Path | pl.LazyFrame,
    cpu: Path | pl.LazyFrame | None,
    steps: Path | pl.LazyFrame | None,
    by: tuple[str, ...] = (),
) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    """Lazy frames (gpu, cpu, steps: the source's parts, or lazy frames of their rows): (one row
    per rank and correlation with GPU work: activities, launch_ns,
    launch_name, launch_pid, launch_tid, step, in_op, in_work_op; the External ids of ops with
    modelled FLOPs, column external_id; the External ids of ops with modelled work, columns
    external_id, ext_work_op). Built as one plan, so a small source costs one collect. by: key
    columns of all three (derive_many's source key), each frame's rows then derived per key value
    as if alone."""
    corr = (
        _scan(gpu)
        .select(*by, *_KEYS)
        .filter(pl.col("correlation").is_not_null())
        .group_by([*by, *_KEYS])
        .agg(activities=pl.len())
    )
    ops = (
        _scan(cpu)
        if cpu is not None
        else pl.LazyFrame(schema={**dict.fromkeys(by, SOURCE_KEY_TYPE), **_NO_OPS})
    )
    launches = _launches(ops, by)
    mo, wo = _modelled(ops, False), _modelled(ops, True)
    ids, wids = _external(mo, wo, by)
    return _join(corr, launches, _steps(steps, by), *_ranges(mo, wo, by), by), ids, wids


def _with_derived(df: pl.LazyFrame | pl.DataFrame, corr, ids, wids, by: tuple[str, ...] = ()):
    df = df.drop([c for c in DERIVED if c in df.collect_schema().names()])
    df = df.join(corr, on=[*by, *_KEYS], how="left", maintain_order="left")
    ext = [*by, "external_id"]
    df = df.join(ids.with_columns(by_ext=pl.lit(True)), on=ext, how="left", maintain_order="left")
    df = df.join(wids, on=ext, how="left", maintain_order="left")
    return df.with_columns(
        graph_replay=((pl.col("activities") > 1) & (pl.col("kind") == "kernel")).fill_null(False),
        flops_op=pl.col("by_ext").fill_null(False) | pl.col("in_op").fill_null(False),
        work_op=pl.coalesce("ext_work_op", "in_work_op").cast(pl.Int64),
    ).drop("activities", "in_op", "by_ext", "ext_work_op", "in_work_op")


def _between(col: str, lo, hi) -> pl.Expr:
    """col in [lo, hi]; nothing when lo is None (the chunk has no such key)."""
    return pl.lit(False) if lo is None else pl.col(col).is_between(lo, hi)


def _near(ops: pl.LazyFrame, t0: int | None, t1: int | None) -> pl.LazyFrame:
    """The rows of `ops` (pid, tid, start_ns, ...) that a backward asof join on start_ns by pid and
    tid can pick for a time in [t0, t1]: those starting in [t0, t1], and on each thread those
    starting last before t0 (all of them when several start together). Exact: the latest start at
    or before t in [t0, t1] is either in [t0, t1] or the thread's last start before t0."""
    if t0 is None:
        return ops.filter(pl.lit(False))
    before = ops.filter(pl.col("start_ns") < t0)
    last = before.group_by("pid", "tid").agg(pl.col("start_ns").max()).collect(engine="streaming")
    near = ops.filter(pl.col("start_ns").is_between(t0, t1))
    return pl.concat([before.join(last.lazy(), on=["pid", "tid", "start_ns"]), near])


def _chunk_derived(keys: pl.DataFrame, gpu: Path, cpu: Path | None, st: pl.LazyFrame) -> pl.DataFrame:
    """The DERIVED columns of the activities `keys` (rank, correlation, external_id, kind: a chunk
    of the part `gpu`, in its order), reading from the parts only the rows their values can come
    from: the part's activities of the chunk's correlation range (to count those sharing a
    correlation), the calls of that range (launches), the modelled ops _near the chunk's launch
    times, and those of its External id range. Equal to the whole part's values for those rows
    (tests/test_derive.py forces tiny chunks); memory grows with the chunk and with how far its
    launch times and ids spread, not with the part."""
    c = keys.get_column("correlation")
    c0, c1 = c.min(), c.max()
    corr = (
        _scan(gpu)
        .select(_KEYS)
        .filter(_between("correlation", c0, c1))
        .group_by(_KEYS)
        .agg(activities=pl.len())
    )
    ops = _scan(cpu) if cpu is not None else pl.LazyFrame(schema=_NO_OPS)
    launches = _launches(ops.filter(_between("correlation", c0, c1))).collect(engine="streaming")
    t = launches.join(keys.select(_KEYS).unique(), on=_KEYS, how="semi").get_column("launch_ns")
    t0, t1 = t.min(), t.max()
    cols = ["pid", "tid", "start_ns", "end_ns", "event_index", "external_id", "flops", "mem_bytes"]
    mo, wo = _ranges(*(_near(_modelled(ops, w).select(cols), t0, t1) for w in (False, True)))
    e = keys.get_column("external_id")
    ext = _between("external_id", e.min(), e.max())
    ids, wids = _external(*(_modelled(ops, w).filter(ext) for w in (False, True)))
    corr = _join(corr, launches.lazy(), st, mo, wo)
    return _with_derived(keys.lazy(), corr, ids, wids).select(DERIVED).collect(engine="streaming")


def derived_batches(
    gpu: Path, cpu: Path | None, steps: Path | None, chunk_rows: int | None = None
) -> Iterator[pa.Table]:
    """The rows of the gpu_activities part `gpu`, in its order and batch by batch, with the
    derived columns computed from the source's cpu_ops and steps parts (None: it has none).

    A part of at most chunk_rows activities (None: CHUNK_ROWS) and at most 4 x chunk_rows ops:
    the derived columns are computed for the whole part at once from its key columns only (rank,
    correlation, external id, kind: one join, a few bytes a row) and then appended to each batch
    of the part as it is read, so the part's other columns (kernel names, geometry) are never
    joined or held whole; a small one on polars' in-memory engine, a larger one on the streaming
    engine (only the launch calls' rows of cpu_ops are held; in memory every op's name would be
    read before the filter). A larger part: chunk_rows activities at a time (_chunk_derived), so
    that memory stays bounded whatever the part's size (issue 40: the whole-part join held
    0.78 GB for 1.8 M kernels). Same values either way."""
    chunk = chunk_rows or CHUNK_ROWS
    pf = pq.ParquetFile(gpu)
    try:
        cpu_rows = pq.read_metadata(cpu).num_rows if cpu is not None else 0
        if pf.metadata.num_rows > chunk or cpu_rows > 4 * chunk:
            st = _steps(steps).collect().lazy()
            for batch in pf.iter_batches(batch_size=chunk):
                t = pa.Table.from_batches([batch])
                keys = pl.from_arrow(t.select(["rank", "correlation", "external_id", "kind"]))
                yield _append(t, _chunk_derived(keys, gpu, cpu, st).to_arrow())
            return
        corr, ids, wids = per_correlation(gpu, cpu, steps)
        small = pf.metadata.num_rows <= BATCH_ROWS and cpu_rows <= 4 * BATCH_ROWS
        keys = pl.scan_parquet(gpu, glob=False).select("rank", "correlation", "external_id", "kind")
        derived = (
            _with_derived(keys, corr, ids, wids)
            .select(DERIVED)
            .collect(engine=ENGINE if small else "streaming")
        )
        offset = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS):
            yield _append(pa.Table.from_batches([batch]), derived.slice(offset, batch.num_rows).to_arrow())
            offset += batch.num_rows
        if offset != derived.height:  # the joins keep one row per activity, in its order
            raise AssertionError(f"{gpu}: {derived.height} derived rows for {offset} activities")
    finally:
        pf.close()


def _append(t: pa.Table, derived: pa.Table) -> pa.Table:
    """The rows `t` with their DERIVED columns replaced by those of `derived` (same rows, in order)."""
    if derived.num_rows != t.num_rows:  # the joins keep one row per activity, in its order
        raise AssertionError(f"{derived.num_rows} derived rows for {t.num_rows} activities")
    t = t.drop_columns([c for c in DERIVED if c in t.column_names])
    for c in DERIVED:
        t = t.append_column(c, derived.column(c))
    return t


# the columns of (gpu_activities, cpu_ops, steps) derive_many reads: only these go
# to polars (a small source's wide tables cost more to convert than the plan costs to run)
_READ = (
    ("rank", "correlation", "external_id", "kind"),
    tuple(_NO_OPS),
    ("rank", "step", "start_ns", "end_ns"),
)


def derive_table(gpu: pa.Table, cpu: pa.Table | None, steps: pa.Table | None) -> pa.Table:
    """A small source's gpu_activities rows held in memory (pa.Table of its schema v3 columns)
    with the derived columns computed from its cpu_ops and steps rows (None: it has none): the
    same values as derived_batches gives for the same rows written as parts, in one in-memory
    polars plan without a Parquet round trip (pipeline/ingest/hold.py). Types as polars gives
    them (the caller conforms the table to the schema). derive_many of the one source."""
    return derive_many([(gpu, cpu, steps)])[0]


def derive_files(
    gpu: Path, cpu: Path | None, steps: Path | None, out: Path, write: Callable[[object, Path], bool]
) -> bool:
    """Write `out` from derived_batches(gpu, cpu, steps) with write(chunks, path) (pipeline/lake.py
    conforms each chunk to the schema); returns what write returns."""
    return write(derived_batches(gpu, cpu, steps), out)


def derive_many(
    sources: list[tuple[pa.Table, pa.Table | None, pa.Table | None]],
    finish: Callable[[pa.Table], pa.Table] | None = None,
) -> list[pa.Table]:
    """derive_table of many small sources in one polars plan (pipeline/ingest/hold.py: the held
    sources of a run): sources, each (gpu_activities, cpu_ops, steps) as derive_table takes them,
    every gpu_activities table of the same Arrow schema; returns each source's gpu_activities rows
    with their derived columns, in that order: slices of one table, to which `finish` (when given)
    was applied whole (hold.py conforms it to the schema there: one call, not one per source).

    The same values as derive_table of each source alone: the rows of all sources are put
    together with a SOURCE_KEY column (the source's place in the list), which every group, join
    and asof join of the plan takes as its first key, so no row is matched with another source's
    (two sources may hold the same rank, correlation ids, threads and External ids). One plan for
    N sources instead of N plans of a few ms of polars set-up each (docs/performance.md "Ingest of
    small files"). Types as polars gives them, unless finish changes them."""
    by = (SOURCE_KEY,)
    whole = []
    for k, cols in enumerate(_READ):
        parts = [
            t[k].select(cols).append_column(SOURCE_KEY, _ints32(i, t[k].num_rows))
            for i, t in enumerate(sources)
            if t[k] is not None
        ]
        whole.append(pl.from_arrow(pa.concat_tables(parts)).lazy() if parts else None)
    if not sources:
        return []
    corr, ids, wids = per_correlation(*whole, by=by)
    keys = whole[0].select(SOURCE_KEY, *_READ[0])
    derived = _with_derived(keys, corr, ids, wids, by).select(DERIVED).collect(engine=ENGINE).to_arrow()
    gpu = _append(pa.concat_tables([g for g, _, _ in sources]), derived)
    gpu = finish(gpu) if finish is not None else gpu
    out, offset = [], 0
    for g, _, _ in sources:
        out.append(gpu.slice(offset, g.num_rows))
        offset += g.num_rows
    return out


def _ints32(value: int, n: int) -> pa.Array:
    """n copies of value as an int32 Arrow array, built from a buffer (pa.array imports pandas
    where it is installed)."""
    return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(np.full(n, value, np.int32))])
