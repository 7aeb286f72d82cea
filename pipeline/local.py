"""Per-source metric results, computed once per source at its run's first analysis (issue 16,
point 3; issue 37 item 2 moved them off the ingest path, where they were half of a large rank's
ingest CPU).

breakdown.sql, step_time.sql, idle_gaps.sql, idle_breakdown.sql, step_status.sql, mfu.sql and
phases.sql read every GPU activity (or host launch) of every rank at each analysis (1-47 s each
at 64 ranks x 100k kernels). Every measure they give depends on the rank's own work alone,
except the split of exposed communication into waiting for peers and transfer (breakdown,
step_time, phases), which needs the other ranks' kernels (views/44_comm_wait.sql). So for a
source of one rank, fill() (called by analysis before it connects) runs the seven files on that
source alone
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
analysis fills only runs whose sources hold at least FILL_MIN_ROWS GPU activities in all (fill's
min_total): below that, every metric computed in full costs less than the per-source step, whose
fixed costs (a connection, the step windows and ten files per source) then outweigh the sweep.

fill(lake, runs) adds them to the committed sources of those runs that lack them, in parts of
their own or held by a compacted generation (pipeline/analyze.py calls it);
stage_local(staged) adds them to a staged source (pipeline/ingest/prepare.py calls it for a lake
in a bucket only, which fill cannot write yet); backfill(lake) to every committed source with
parts of its own (lakes written by benchmarks/scale_trace.py). Errors: duckdb.Error from the SQL,
SchemaError (pipeline/schema.py) if a result does not conform, OSError from the file system
(fill catches them per source: that source is left without results).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import lake_journal as journal
from . import query
from . import schema as sch
from .lake import Lake, LakeError, Staged
from .parts import write_parquet

MIN_GPU_ROWS = 20_000
# an analysis computes the per-source results of its runs first (fill's min_total) only when
# their sources hold at least this many GPU activities in all, with or without results already
# (every source in scope must have them for the metrics to read them: query.use_local). Below it,
# every metric computed in full costs less: 8 ranks x 37k GPU activities (benchmarks/
# scale_trace.py's 50 MB ranks, 0.3 M in all) 4.3-4.5 s wall, 6.6-6.9 CPU-s, 1.13 GB peak for the
# first analysis in full, against 6.6-10.1 s, 11 CPU-s, 0.96 GB with the per-source step first
# (2 cores, 2026-12-05). Above it, the full computation's memory grows with the rows (16 x 100k,
# 1.7 M: 1.19 GB against 0.76 GB, about the same time; 64 x 100k, 6.7 M: 5.4 GB against 1.08 GB)
# while the per-source step's stays under its cap.
FILL_MIN_ROWS = 1_000_000
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
# sources fill() computes side by side (each on its own connection, its files QUERY_WORKERS at a
# time), so a run's first analysis keeps the cores busy as the ingest's pool workers did
FILL_WORKERS = 2
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
    spill = Path(tempfile.mkdtemp(prefix="spill-", dir=spill_dir))
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


def fill(
    lake: Lake,
    runs=None,
    min_rows: int | None = None,
    src: pl.DataFrame | None = None,
    switches=None,
    min_total: int = 0,
    on_progress=None,
) -> int:
    """Compute and store the local results of the committed sources of `runs` (None: every run)
    that lack results of the current SQL version: sources of one rank with at least min_rows
    (None: MIN_GPU_ROWS) GPU activities, in parts of their own or held by their run's compacted
    generation. Called by analysis before it computes (pipeline/analyze.py kept_or_computed), so a run's
    first analysis computes them and every later one reads them (issue 37 item 2: they used to be
    computed by ingest, half of a large rank's ingest CPU). src: the `sources` rows of runs when
    the caller has them. switches: a list given, (results.listing_signature before, after) is
    appended for each compacted generation switched here, both taken under the lake's lock (so
    analysis can tell its own switches from another command's commits). min_total: nothing is
    done unless the one-rank sources of `runs` with at least min_rows GPU activities, with results
    or without, hold at least this many GPU activities in all (analysis passes FILL_MIN_ROWS).
    on_progress(stage, done, total), if given, is called as each source's results are computed
    ("per-source results", sources done, sources to do: analysis's progress bar, which would stand
    still for a minute on a first analysis of 64 ranks x 100k kernels otherwise).

    Each source is computed outside the lake's lock, reading its committed parts (those of a held
    source copied out of the generation first) and spilling under the system's temporary
    directory; its results are then written under the lock if the source is still what was read
    (its `sources` part or its run's generation unchanged), as backfill writes them (local_results
    last, so a kill half-way leaves results no reader uses and the next call completes) or as new
    files of the generation (lake_compact.add_tables, one switch); the first time it takes the
    lock it runs Lake.recover, which removes what a killed fill left (a hidden `.tmp` file in a
    run directory, a generation's files no manifest names). Nothing is done for a lake in a
    bucket (its sources get their results at ingest, pipeline/ingest/prepare.py), one that cannot
    be written or is of an older schema; a source whose results cannot be computed (duckdb.Error,
    SchemaError, OSError, polars' errors: the DuckDB memory cap exceeded, say) or written (OSError:
    a full disk, a directory that cannot be written; no marker is written, so none of it is read)
    is left without, and so is everything still to write while another command holds the lock
    (LakeBusy) or the lock cannot be taken (LakeError): analysis then computes those metrics in
    full, and the next analysis tries again. Returns the number of sources given results; raises
    nothing for what it could not write."""
    from . import upgrade

    if getattr(lake, "remote", False) or not lake.exists() or not lake.writable():
        return 0
    if upgrade.marker_version(lake) < sch.SCHEMA_VERSION:
        return 0
    min_rows = MIN_GPU_ROWS if min_rows is None else min_rows
    todo, total = _missing(lake, runs, min_rows, src)
    if total < min_total:
        return 0
    # sources up to SERIAL_ROWS activities FILL_WORKERS at a time (the ingest's pool workers
    # computed them side by side before), larger ones after them, alone (each under the whole
    # memory cap); a generation's results are written once its last source in that order is
    # computed, so one switch takes a run's small and large sources together
    todo = [t for t in todo if t[3] <= SERIAL_ROWS] + [t for t in todo if t[3] > SERIAL_ROWS]
    last = {(run_dir, gen): i for i, (run_dir, _, gen, _) in enumerate(todo) if gen is not None}
    state = {"done": 0, "adds": {}, "seen": 0, "total": len(todo), "on_progress": on_progress}
    n_small = sum(1 for t in todo if t[3] <= SERIAL_ROWS)
    for lo, hi, workers in ((0, n_small, FILL_WORKERS), (n_small, len(todo), 1)):
        if lo == hi:
            continue
        with cf.ThreadPoolExecutor(workers) as pool:
            try:
                _fill_group(lake, todo, lo, hi, min_rows, pool, switches, last, state)
            except LakeError:  # LakeBusy: another command writes; or a lock that cannot be taken
                pool.shutdown(cancel_futures=True)
                return state["done"]
    return state["done"]


def _fill_group(lake: Lake, todo, lo: int, hi: int, min_rows: int, pool, switches, last, state) -> None:
    """fill() for todo[lo:hi] (todo: (run directory, source id, generation or None, GPU rows)),
    computed on `pool`: a source with parts of its own written as soon as it is computed, those
    of a generation kept in state["adds"] until last[(run directory, generation)], the index of
    the generation's last source in todo, is computed, then written in one switch;
    state["done"] counts the sources given results, state["seen"] those computed (reported to
    state["on_progress"] when set). Raises LakeError, LakeBusy when another command holds the
    lock (what is written stays); a write that fails (OSError) leaves that source or generation
    without results."""
    from . import lake_compact, results

    futures, idents = [], []
    for run_dir, sid, gen, _ in todo[lo:hi]:
        if gen is None:
            part = lake.root / "sources" / run_dir / f"{sid}.parquet"
            idents.append(_identity(part))
            files = {
                t: [str(p)]
                for t in sch.tables()
                if not t.startswith("local_") and (p := lake.root / t / run_dir / f"{sid}.parquet").exists()
            }
            futures.append(pool.submit(_computed, lambda _, f=files: f, sid, min_rows))
        else:
            idents.append(None)
            cp = lambda d, r=run_dir, s=sid: _copy_held(lake, r, s, d)  # noqa: E731
            futures.append(pool.submit(_computed, cp, sid, min_rows))
    adds = state["adds"]
    for i, (run_dir, sid, gen, _), ident, fut in zip(range(lo, hi), todo[lo:hi], idents, futures):
        res = fut.result()
        state["seen"] += 1
        if state["on_progress"] is not None:
            state["on_progress"]("per-source results", state["seen"], state["total"])
        if gen is None:
            part = lake.root / "sources" / run_dir / f"{sid}.parquet"
            if res:
                with _writing(lake, state):
                    if _identity(part) == ident and (run_dir, sid) in lake.committed():
                        try:
                            _write_own(lake, run_dir, sid, res)
                            state["done"] += 1
                        except OSError:  # no marker written: none of it is read; tried again next time
                            pass
            continue
        if res:
            adds.setdefault((run_dir, gen), {})[sid] = res
        if last[(run_dir, gen)] == i and (batch := adds.pop((run_dir, gen), None)):
            with _writing(lake, state):
                before = results.listing_signature(lake.root) if switches is not None else ""
                try:
                    switched = lake_compact.add_tables(lake, run_dir, gen, batch)
                except OSError:  # the run as it was (files placed before the switch: recover())
                    switched = False
                if switched:
                    state["done"] += len(batch)
                    if switches is not None:
                        switches.append((before, results.listing_signature(lake.root)))


@contextlib.contextmanager
def _writing(lake: Lake, state: dict):
    """The lake's lock for fill's writes (purpose "analysis": Lake.lock); the first time in a
    fill, what an interrupted writer left is repaired first (Lake.recover: a fill killed before
    its rename or switch leaves a hidden `.tmp` file in a run directory, or a generation's files no
    manifest names, which no reader sees; the next ingest, forget or compact would remove them,
    but the next analysis may come first)."""
    with lake.lock(purpose="analysis"):
        if not state.get("recovered"):
            state["recovered"] = True
            lake.recover()
        yield


def _computed(files_in, sid: str, min_rows: int) -> dict[str, pa.Table]:
    """compute() of a source whose parts files_in(scratch) gives (scratch: a fresh directory
    under the system's temporary directory, removed here); {} when it gives none or fails."""
    scratch = Path(tempfile.mkdtemp(prefix="tracelake-local-"))
    try:
        files = files_in(scratch)
        return compute(files, sid, min_rows) if files else {}
    except (duckdb.Error, sch.SchemaError, OSError, pl.exceptions.PolarsError):
        return {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _missing(lake: Lake, runs, min_rows: int, src) -> tuple[list[tuple[str, str, str | None, int]], int]:
    """((run directory, source id, its generation or None for parts of its own, its GPU rows) of
    the committed sources fill() gives results, the GPU rows of every committed source of `runs`
    fill() would give results to, with or without them): one rank (their `sources` row's
    rank), at least min_rows GPU activities (from the Parquet footers of own parts; a run's
    generation is read only when its gpu_activities files hold that many rows in all), no
    local_results row of the current version that can be read (and, for parts of their own,
    every local_* part there and whole: _whole)."""
    src = lake.sources(runs) if src is None else src
    if "rank" not in src.columns or not src.height:
        return [], 0
    one_rank = {
        ("run=" + r, s)
        for r, s in src.filter(pl.col("rank").is_not_null() & pl.col("status").is_in(["ok", "partial"]))
        .select("run_id", "source_id")
        .iter_rows()
    }
    view = lake.committed()
    dirs = {d for d, _ in one_rank}
    counts: dict[tuple[str, str], tuple[int, str | None]] = {}
    for d, s in view.singles:
        p = lake.root / "gpu_activities" / d / f"{s}.parquet"
        if d in dirs and (d, s) in one_rank and p.exists():
            counts[(d, s)] = (pq.ParquetFile(p).metadata.num_rows, None)
    for d, m in view.manifests.items():
        names = [lake.root / "gpu_activities" / d / n for n in m.files.get("gpu_activities", ())]
        if d not in dirs or sum(pq.ParquetFile(f).metadata.num_rows for f in names) < min_rows:
            continue
        ids = pa.concat_tables([pq.ParquetFile(f).read(columns=["source_id"]) for f in names])
        for s, n in pl.from_arrow(ids)["source_id"].value_counts().iter_rows():
            if (d, s) in one_rank and s in m.sources:
                counts[(d, s)] = (n, m.gen)
    todo = {k: g for k, (n, g) in counts.items() if n >= min_rows}
    total = sum(counts[k][0] for k in todo)
    if not todo:
        return [], 0
    current = query.local_sql_version()
    have = lake.table_files("local_results", [d[4:] for d, _ in todo], committed=view)
    for r, s in _current(have, current, view):
        key = ("run=" + r, s)
        # a source with parts of its own keeps its results only while every part is whole: one
        # cut short or gone under its marker would be read as a rank without rows
        if key in todo and (todo[key] is not None or _whole(lake, *key)):
            todo.pop(key)
    return [(d, s, g, counts[(d, s)][0]) for (d, s), g in sorted(todo.items())], total


def _current(files: list[str], version: str, view) -> list[tuple[str, str]]:
    """(run id, source id) of the local_results rows of `version` in `files`. A file that cannot
    be read is passed over (its source is then computed again and its part replaced), except a
    compacted generation's, whose sources all count as current (a new file beside it would not
    replace it: the reader names it)."""
    cols = ["run_id", "source_id", "sql_version"]
    try:  # one read for all (the usual case)
        frames = [pl.read_parquet(files, columns=cols)] if files else []
    except (OSError, pl.exceptions.PolarsError):
        frames = []
        for f in files:
            try:
                frames.append(pl.read_parquet(f, columns=cols))
            except (OSError, pl.exceptions.PolarsError):
                run_dir, name = Path(f).parent.name, Path(f).name
                m = view.manifests.get(run_dir)
                if m is not None and name in m.files.get("local_results", ()):
                    held = [s for s, ts in m.sources.items() if "local_results" in ts]
                    frames.append(pl.DataFrame({"run_id": [run_dir[4:]] * len(held), "source_id": held}))
    out = []
    for df in frames:
        if "sql_version" in df.columns:
            df = df.filter(pl.col("sql_version") == version)
        out += df.select("run_id", "source_id").iter_rows()
    return out


def _whole(lake: Lake, run_dir: str, sid: str) -> bool:
    """Whether every local_* part of a source with parts of its own is there and whole (a Parquet
    file begins and ends with its magic bytes: one cut short does not)."""
    for t in TABLES:
        try:
            with open(lake.root / t / run_dir / f"{sid}.parquet", "rb") as f:
                head = f.read(4)
                f.seek(-4, os.SEEK_END)
                if head != b"PAR1" or f.read(4) != b"PAR1":
                    return False
        except OSError:  # gone, or shorter than its magic bytes
            return False
    return True


def _identity(part: Path) -> tuple[int, int] | None:
    """A `sources` part's inode and modification time (a commit replacing the source changes
    them); None when it is gone."""
    try:
        st = part.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _copy_held(lake: Lake, run_dir: str, sid: str, scratch: Path) -> dict[str, list[str]]:
    """A source held by its run's generation, copied out as parts of its own under scratch
    (table -> [file]) for compute()."""
    out = {}
    for t in sch.tables():
        if t.startswith("local_"):
            continue
        df = lake.read_source(t, run_dir[4:], sid)
        if df is not None and df.height:
            write_parquet(sch.conform(t, df.to_arrow()), scratch / f"{t}.parquet")
            out[t] = [str(scratch / f"{t}.parquet")]
    return out


def _write_own(lake: Lake, run_dir: str, sid: str, res: dict[str, pa.Table]) -> None:
    """Write a source's results as parts of its own, local_results last (the marker that makes
    them used), each through a temporary file and a rename. OSError from the file system (a full
    disk, a directory that cannot be written): the temporary file is removed, the parts written
    before stay (unread without their marker)."""
    for t in (*TABLES, "local_results"):
        dest = lake.root / t / run_dir / f"{sid}.parquet"
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{sid}.{uuid.uuid4().hex}.tmp")
        try:
            write_parquet(res[t], tmp)
            journal.crash_point("local-written")
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def backfill(lake: Lake, min_rows: int | None = None) -> int:
    """Add local results to every committed source of `lake` with GPU activities and without a
    local_results part of the current SQL version (older results are replaced), under the lake's
    lock; their local_results part is written last, so a source interrupted half-way is not used
    (and is completed by the next call). Returns the number of sources given results."""
    done = 0
    with lake.lock():
        current = query.local_sql_version()

        def version(key: tuple[str, str]) -> list:
            part = lake.root / "local_results" / key[0] / f"{key[1]}.parquet"
            return pl.read_parquet(part, columns=["sql_version"]).get_column("sql_version").to_list()

        have = {key for key in lake._listing("local_results") if version(key) == [current]}
        committed = lake.committed()
        for run_dir, sid in lake._listing("gpu_activities"):
            if (run_dir, sid) in have or (run_dir, sid) not in committed:
                continue
            files = {}
            for t in sch.tables():
                p = lake.root / t / run_dir / f"{sid}.parquet"
                if p.exists():
                    files[t] = [str(p)]
            scratch = lake.scratch()
            try:
                res = compute(files, sid, min_rows, spill_dir=scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if res:
                _write_own(lake, run_dir, sid, res)
            done += bool(res)
    return done
