"""Per-source metric results, computed once per source at its run's first analysis (issue 16,
point 3; issue 37 item 2 moved them off the ingest path, where they were half of a large rank's
ingest CPU).

breakdown.sql, step_time.sql, idle_gaps.sql, idle_breakdown.sql, step_status.sql, mfu.sql and
phases.sql read every GPU activity (or host launch) of every rank at each analysis (1-47 s each
at 64 ranks x 100k kernels). Every measure they give depends on the rank's own work alone,
except the split of exposed communication into waiting for peers and transfer (breakdown,
step_time, phases), which needs the other ranks' kernels (views/44_comm_wait.sql). So for a
source of one rank, compute() runs the seven files on that source alone
(window all, the default kernel_wait_threshold_ns; one rank alone has no collective call matched
across ranks, so every collective counts as transfer), queries/local/comm_cover.sql (the
compute under its communication kernels) and comm_phase.sql (the phase that launched each of
them), and the roofline's per-rank sums (views/82_roofline_parts.sql), and stores the rows in
local_<metric>, local_comm_cover, local_comm_phase and local_roofline, with a local_results row
naming the SQL version
(schemas/v3.toml). Analysis (pipeline/query.py use_local) reads them through queries/local/
<metric>.sql (the split made over the waiting parts of collectives; idle_gaps' histogram summed
over the sources) when every source with GPU activities in scope has current results and the
options are the defaults (mfu also without its overrides); otherwise it runs the full files.
The results equal the full files' rows (tests/test_local.py).

Only sources of at least MIN_GPU_ROWS GPU activities get results: below that the full queries
take milliseconds, and a small job would pay a DuckDB connection per file for nothing. And an
analysis fills only runs whose sources hold at least local_fill.FILL_MIN_ROWS GPU activities in
all (fill's min_total): below that, every metric computed in full costs less than the per-source step, whose
fixed costs (a connection, the step windows and ten files per source) then outweigh the sweep.

stage_local(staged) adds them to a staged source (pipeline/ingest/prepare.py calls it for a lake
in a bucket only); pipeline/local_fill.py computes them for committed sources (fill: at a run's
first analysis; backfill: lakes written by benchmarks/scale_trace.py), with compute() here.
Errors: duckdb.Error from the SQL, SchemaError (pipeline/schema.py) if a result does not
conform, OSError from the file system (fill catches them per source: that source is left without
results).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import query, scratch
from . import schema as sch
from .lake import Staged
from .parts import write_parquet

MIN_GPU_ROWS = 20_000
# DuckDB's memory limit for the per-source connection (_bound_memory): every stored file spills
# past it (step_time.sql's sweep too, a time bucket at a time), so one rank's results take the same
# memory whatever its event count (issue 40; benchmarks/ingest_memory.py: the ten files over a
# 1.8 M-kernel rank in 0.47 GB of RSS under 256 MB, 0.72 GB under 512 MB, 1.16 GB under 1 GB, in
# no more time; 0.48 GB under 256 MB for 3.5 M kernels); a source whose files still do not fit is
# stored without results (a note), its metrics computed in full at analysis
MEMORY_LIMIT = "256MB"
# sources of more GPU activities than this run the stored files one at a time, each with the
# whole memory limit
SERIAL_ROWS = 500_000
# DuckDB threads of the per-source connection, and files run side by side (_run_stored); None:
# every core. A process-pool worker of an ingest into a lake in a bucket sets its share of the
# cores (pipeline/ingest/prepare.py with_local, from executors.init_worker).
THREADS: int | None = None
# lake table -> the SQL it stores, run on the source alone (metric files: queries/<name>.sql)
STORED = {f"local_{m}": f"{m}.sql" for m in query.LOCAL_METRICS}
STORED["local_comm_cover"] = "local/comm_cover.sql"
STORED["local_comm_phase"] = "local/comm_phase.sql"
STORED["local_roofline"] = "local/roofline_parts.sql"
TABLES = tuple(STORED)
# STORED files run at once by compute() (_run_stored), and the order they start in: the longest
# first (seconds for a 37k-activity rank: phases, breakdown, step_time 0.16-0.22, comm_cover 0.12,
# roofline_parts 0.09, step_status and mfu 0.07, the rest under 0.05)
QUERY_WORKERS = 2
_COST = (
    "local_phases",
    "local_breakdown",
    "local_step_time",
    "local_comm_cover",
    "local_roofline",
    "local_step_status",
    "local_mfu",
)
# the files of queries/views that no STORED file reads, directly or through another view, on a
# source of one rank: the collective matching and the split it feeds (comm_wait is empty
# there), the NCCL-log views, collective_exposure's compute pieces
LOCAL_SKIP_VIEWS = (
    "40_collective_calls",
    "44_comm_wait",
    "50_nccl",
    "60_exposure_cover",
)


def compute(
    files: dict[str, list[str]],
    source_id: str,
    min_rows: int | None = None,
    status: str = "ok",
    spill_dir: Path | None = None,
) -> dict[str, pa.Table]:
    """The local_* tables (local_results included) of one source whose parts are `files` (table
    -> Parquet files of the current schema; status: its sources status, ok or partial, when
    `files` has no sources part), conformed to the schema; {} when the source gets
    none: no GPU activities in it, fewer than min_rows (None: MIN_GPU_ROWS), or more than one
    rank. spill_dir: where DuckDB may spill past MEMORY_LIMIT (a fresh directory, removed here;
    None: one under the system's temporary directory)."""
    if not files.get("gpu_activities"):
        return {}
    min_rows = MIN_GPU_ROWS if min_rows is None else min_rows
    # the row count from the Parquet footers first: a small source costs no DuckDB connection
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files["gpu_activities"])
    if rows < min_rows:
        return {}
    if rows > SERIAL_ROWS:
        _release_memory()
    con = query.connect(None, parts=files, derived_views=False, metric_views=False, threads=THREADS)
    spill = scratch.make("spill", spill_dir)
    try:
        _bound_memory(con, spill)
        n, ranks, run_id = con.execute(
            "SELECT count(*), count(DISTINCT rank), any_value(run_id) FROM gpu_activities"
        ).fetchall()[0]
        if n < min_rows or ranks != 1:
            return {}
        # one rank alone has no collective call matched across ranks: no kernel waits, every
        # collective counts as transfer, so comm_wait is empty (its columns: views/44_comm_wait.sql)
        # and the matching views are not even created, nor those no stored file reads (binding
        # them was a third of this connection's cost); scope, the step windows and the phases'
        # host ranges are computed once, so each file below reads the source's GPU work from
        # memory, not through the stack of views (0.9 s instead of 1.2 s for a rank of 37k GPU
        # activities)
        con.execute(
            "CREATE TABLE internal._no_wait (run_id VARCHAR, source_id VARCHAR, rank INTEGER, "
            "correlation BIGINT, start_ns BIGINT, wait_end_ns BIGINT); "
            "CREATE VIEW comm_wait AS SELECT * FROM internal._no_wait"
        )
        once = ("scope", "step_window", "phase_ranges", "phase_steps")
        query.create_views(con, once, skip=LOCAL_SKIP_VIEWS)
        if not files.get("sources"):  # a staged source: its row is written at commit
            lit = [("'" + str(v).replace("'", "''") + "'") for v in (run_id, source_id, status)]
            con.execute(  # a view cannot take parameters: quoted literals
                "CREATE OR REPLACE VIEW sources AS SELECT * FROM internal._empty_sources UNION ALL BY NAME "
                f"SELECT {lit[0]}::VARCHAR AS run_id, {lit[1]}::VARCHAR AS source_id, "
                f"{lit[2]}::VARCHAR AS status"
            )
        workers = 1 if n > SERIAL_ROWS else None
        out = {
            t: df.with_columns(pl.lit(source_id).alias("source_id"))
            for t, df in _run_stored(con, workers).items()
        }
        rank = con.execute("SELECT any_value(rank) FROM gpu_activities").fetchall()[0][0]
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    version = query.local_sql_version()
    out["local_results"] = pl.DataFrame(
        {"run_id": [run_id], "source_id": [source_id], "rank": [rank], "sql_version": [version]}
    )
    return {t: sch.conform(t, df.to_arrow()) for t, df in out.items()}


def _release_memory() -> None:
    """Give the memory the ingest freed back to the system before DuckDB takes its share: the
    decode's and the derived columns' buffers stay in the process's allocators otherwise (pyarrow's
    pool, glibc's heap: 709 -> 544 MB of RSS before the per-source step of benchmarks/
    ingest_memory.py's 1 GB trace). Nothing where glibc is not the C library."""
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _bound_memory(con, spill: Path) -> None:
    """Cap the per-source connection's memory at MEMORY_LIMIT, spilling what does not fit to
    `spill` (DuckDB's temp_directory): the stored files sort and window every GPU activity of the
    source, and unbounded they took 2.2 GB for a 0.5 GB trace of 0.9 M kernels (issue 40;
    benchmarks/ingest_memory.py)."""
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute(f"SET temp_directory = '{str(spill).replace(chr(39), chr(39) * 2)}'")


def _run_stored(con, workers: int | None = None) -> dict[str, pl.DataFrame]:
    """Table -> the rows of its STORED file on `con`, the files run `workers` (None:
    QUERY_WORKERS) at a time on
    cursors of the connection (query.on_cursors), longest first. Most of these files are one sort
    and a window without PARTITION BY over the source's activities, which DuckDB runs on one
    thread: two side by side took the ten files from 1.11-1.26 s to 0.72-0.94 s for a rank of 37k
    GPU activities (2 cores, benchmarks/scale_trace.py's 50 MB rank). Raises what the first
    failing file raises."""
    order = sorted(STORED, key=lambda t: _COST.index(t) if t in _COST else len(_COST))
    texts = {t: (query.QUERIES_DIR / STORED[t]).read_text() for t in order}
    got = query.on_cursors(
        con,
        lambda c, t: query.frame(c, texts[t]),
        order,
        min(workers or QUERY_WORKERS, THREADS or os.cpu_count() or 1),
    )
    return {t: got[t] for t in STORED}


def stage_local(staged: Staged, status: str = "ok", min_rows: int | None = None) -> None:
    """Compute a staged source's local results from its staged parts and stage them beside them
    (staged.tables gains their names); nothing when compute() gives none. status: the sources
    status the source will be committed with (ok, partial)."""
    d = Path(staged.dir)
    files = {t: [str(d / f"{t}.parquet")] for t in staged.tables}
    # DuckDB spills beside the staged source, on the lake's file system (<lake>/.tmp)
    for t, tbl in compute(files, staged.source_id, min_rows, status, spill_dir=d.parent).items():
        write_parquet(tbl, d / f"{t}.parquet")
        staged.tables.append(t)
