"""DuckDB over the lake: one view per schema table, the catalogs, and the SQL in queries/.

connect(lake) returns a DuckDB connection with
- a view per schema v3 table (sources, devices, gpu_activities, ...) reading
  <lake>/<table>/*/*.parquet with hive partitioning (an empty typed table when the lake has none);
- tables device_catalog and collective_catalog (pipeline/catalog/*.toml);
- the derived views of queries/views/*.sql (gpu_work, scope, rank_device, collective_ranks,
  collective_calls), in file order, and one view per metric file (breakdown, mfu, ...);
- runs: only these run ids' parts are read (None: every run);
- materialize=None (the default): True when the lake's GPU and
  host tables (gpu_activities, cpu_ops) hold at most AUTO_MATERIALIZE_BYTES of Parquet (a few
  tenths of a second to compute, and it saves more in binding the metric views over the stack
  of views below them); else False, so `tracelake sql` on a large lake pays only for what a
  query reads;
- with materialize=True, the views named in MATERIALIZED (rank_device, step_window,
  collective_ranks, collective_calls, and scope on a lake of at most AUTO_MATERIALIZE_BYTES)
  computed once into tables behind the same names (for a whole analysis: the variables below
  are fixed at connect time then);
- the helpers (each table's empty typed table, the materialized tables) in the schema
  `internal`, so SHOW TABLES lists only what a user queries, and real tables rather than
  registered Arrow objects or temporary tables, so a cursor() sees them too;
- metric_views: every metric file is made a view (True), or only these (a tuple of names;
  run(con, name) runs any of them); derived_views=False: neither the views of queries/views nor
  the metric views (the schema tables and catalogs only; for_query() decides it for one query);
- variables `analysis_window` ('all' | 'hta'), `kernel_wait_threshold_ns` (default 30000), and,
  when given, `peak_tflops` and `model_flops_per_step` (MFU overrides), `palm_flops_per_token`
  (PaLM's MFU), `global_tokens_per_step` and `tokens_per_step`
  (tokens/s, queries/mfu.sql).
- per-source results (pipeline/local.py): when use_local() holds, the LOCAL_METRICS are read
  through queries/local/<name>.sql from the local_* tables stored at ingest (variable
  `use_local`), with the same rows as queries/<name>.sql; local_results=False turns that off.
run(con, name) executes queries/<name>.sql (or its per-source form) and returns a polars DataFrame;
run_many(con, names, workers) runs several side by side on cursor()s of the connection.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import queue
import re
import time
import warnings
import weakref
from pathlib import Path

import duckdb
import polars as pl

from . import catalog, results_fleet, scratch, upgrade
from . import schema as sch
from .lake import Lake
from .paths import QUERIES_DIR
from .query_text import _views_in, derived_view_names, for_query, metric_names, sql_text  # noqa: F401

# DuckDB's memory cap for a connection: past it DuckDB spills to a directory of its own under the
# system's temporary directory (removed when the connection closes). Unbounded (DuckDB's default,
# 80 % of RAM) the full metric files over one 1.8 M-kernel rank peaked at 2.4 GB of RSS, capped at
# 1.24 GB (issue 40, benchmarks/ingest_memory.py); pipeline/local.py sets its own
MEMORY_LIMIT = "1GB"
AUTO_MATERIALIZE_BYTES = 64 * 2**20
# a table with more parts than LOAD_MIN_PARTS, in a lake whose GPU and host parts hold at most
# LOAD_MAX_BYTES, is read into memory once at connect (many small sources: their parts are
# mostly Parquet footers, so the bytes overstate the rows)
LOAD_MIN_PARTS = 64
LOAD_MAX_BYTES = 256 * 2**20
# and every table, whatever its part count, in a lake whose GPU and host parts hold at most
# LOAD_ALL_BYTES (a small job: each metric query then scans memory instead of opening and decoding
# every part again; PARAM's 8-rank DLRM job, 0.4 MB of Parquet: its 17 metric queries 0.53 -> 0.43
# CPU-s, connect no slower). Above it each query reads only its columns from the parts: at 2.5 MB
# (8 ranks x 8 MB of JSON) loading and not loading cost the same (connect + the 17 queries 0.93 s
# against 0.88 s), at 14 MB (8 ranks x 50 MB, 1.2 M rows) loading cost 3.7 s against 2.8 s and
# 1.0 GB of RSS against 0.66 (it was 16 MB until 2026-12-05)
LOAD_ALL_BYTES = 2 * 2**20
# derived views computed once into tables by connect(materialize=True), in dependency order
# (scope only on a small lake: since the launch join moved to ingest, pipeline/derive.py, it is a
# filter over gpu_activities that each metric reads straight from the Parquet parts, only the
# columns it needs; materializing it cost 5 s and the kernel names' memory at 64 x 100k)
MATERIALIZED = ("rank_device", "step_window", "collective_ranks", "collective_calls")
# connections (and their cursors) over a lake of at most LOAD_ALL_BYTES of GPU and host Parquet: run()
# executes their metric queries with con.execute, which binds and plans a query once, where
# con.sql(...).to_arrow_table() binds it to make the relation and again to run it (PARAM's 8-rank
# DLRM job's 17 queries: 0.30-0.33 -> 0.24-0.27 CPU-s, the same frames); the result is then
# copied once more into Arrow (DuckDB warns of it: ignored below), nothing on a few thousand rows,
# so a larger lake keeps con.sql
_SMALL: weakref.WeakSet = weakref.WeakSet()
warnings.filterwarnings(
    "ignore", message="Arrow output on a DB-API result", category=UserWarning, module=__name__
)


def connect(
    lake: Lake,
    window: str = "all",
    kernel_wait_threshold_ns: int = 30_000,
    threads: int | None = None,
    peak_tflops: float | None = None,
    model_flops_per_step: float | None = None,
    materialize: bool | None = None,
    runs: list[str] | None = None,
    tokens_per_step: float | None = None,
    metric_views: bool | tuple[str, ...] = True,
    derived_views: bool = True,
    parts: dict[str, list[str]] | None = None,
    local_results: bool = True,
    palm_flops_per_token: float | None = None,
    global_tokens_per_step: float | None = None,
    skip_views: tuple[str, ...] = (),
    fleet: bool = True,
) -> duckdb.DuckDBPyConnection:
    """The connection described in the module doc. parts: read these Parquet files per table
    instead of the lake's (one staged source, pipeline/local.py; files of the current schema,
    outside the run= layout), `lake` then only names it. local_results=False: never read the
    per-source results (use_local), always the full metric files; the local_* tables are then
    empty views. skip_views: stems of
    queries/views files not to run (analyze leaves out 50_nccl, the NCCL logs' joins to the traces,
    for runs without NCCL inputs: binding it cost a small job 30 ms). fleet: bind `runs_overview`
    (pipeline/results_fleet.py bind_overview; it reads every kept fleet row's footer, which the metric
    pass does not need). An ingest committing meanwhile
    (`--force` replaces a source's parts) can remove a part between listing and reading it: the
    lake is then listed again, up to 10 times. Raises ValueError for a bad window or override,
    duckdb.Error for an unreadable lake."""
    for attempt in range(10):
        try:
            return _connect(
                lake,
                window,
                kernel_wait_threshold_ns,
                threads,
                peak_tflops,
                model_flops_per_step,
                materialize,
                runs,
                tokens_per_step,
                metric_views,
                derived_views,
                parts,
                local_results,
                palm_flops_per_token,
                global_tokens_per_step,
                skip_views,
                fleet,
            )
        except duckdb.IOException as e:
            if attempt == 9 or "No files found" not in str(e) and "No such file" not in str(e):
                raise
            time.sleep(min(0.1 * (attempt + 1), 0.5))
    raise AssertionError("unreachable")


def _connect(
    lake,
    window,
    kernel_wait_threshold_ns,
    threads,
    peak_tflops,
    model_flops_per_step,
    materialize,
    runs,
    tokens_per_step=None,
    metric_views=True,
    derived_views=True,
    parts=None,
    local_results=True,
    palm_flops_per_token=None,
    global_tokens_per_step=None,
    skip_views=(),
    fleet=True,
):
    def files_of(t: str, committed=None) -> list[str]:
        return list(parts.get(t, ())) if parts is not None else lake.table_files(t, runs, committed)

    size = _bytes(files_of, getattr(lake, "part_size", os.path.getsize))
    small = size <= AUTO_MATERIALIZE_BYTES
    if materialize is None:
        materialize = small
    # scope too on a small lake: each metric then reads it from memory, not from every part
    # (a median 0.94 s instead of 1.30 s for the whole analysis of PARAM's 8-rank DLRM job)
    # the phases' host ranges too (read by three views; from memory, not three scans of cpu_ops)
    materialized = (("scope", "phase_ranges", "phase_steps") if small else ()) + MATERIALIZED
    if window not in ("all", "hta"):
        raise ValueError(f"window must be 'all' or 'hta', not {window!r}")
    # a lake of an older schema is upgraded first, or read through derived copies of its old
    # parts when it cannot be written (pipeline/upgrade.py): never with the derived columns NULL
    instead = upgrade.current_parts(lake) if parts is None else {}
    load = materialize and size <= LOAD_MAX_BYTES
    con = duckdb.connect(":memory:")
    con.execute("SET enable_progress_bar = false")  # DuckDB's bar would print on stdout
    spill = str(scratch.path("spill")).replace("'", "''")  # DuckDB makes it at its first spill
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'; SET temp_directory = '{spill}'")
    if getattr(lake, "remote", False):  # an s3:// lake: its parts read through fsspec (pipeline/lake_s3.py)
        con.register_filesystem(lake.filesystem)
    con.execute("CREATE SCHEMA internal")
    # each table's empty typed table (the views below put their parts after it), in one call
    con.execute(";\n".join(sch.create_empty_sql(t, f"internal._empty_{t}") for t in sch.tables()))
    # a small lake is loaded, bound and queried on one DuckDB thread: its tables are a few thousand
    # rows, and waking the other threads costs more than they do (the DLRM job's connect 0.20-0.22
    # -> 0.17-0.19 CPU-s; its 17 metric queries on two cursors, as analyze runs them, 0.30-0.32 ->
    # 0.26 CPU-s and 0.17-0.19 -> 0.15 s of wall, seven alternated rounds, 2026-12-05). Two cursors
    # side by side (run_many) still keep two cores busy. A thread count the caller gives is kept.
    one_thread = not threads and load and size <= LOAD_ALL_BYTES
    if threads or one_thread:
        con.execute(f"SET threads = {int(threads or 1)}")
    committed = lake.committed() if parts is None else None
    for t in sch.tables():
        # local_results=False: the per-source tables are not even bound (empty), so a damaged one
        # cannot stop the connection (pipeline/analyze.py falls back to this)
        skip = not local_results and t.startswith("local_")
        files = [] if skip else [instead.get(f, f) for f in files_of(t, committed)]
        if files and getattr(lake, "remote", False) and parts is None:  # local copies (lake_s3.py)
            try:
                files = lake.local_parts(files)
            except FileNotFoundError as e:  # removed since listed: connect() lists again
                raise duckdb.IOException(f"No such file: {e}") from None
        if files:
            # the parts are listed, not globbed: no character of the lake path acts as a wildcard
            # (DuckDB still globs inside each name, so [ ] * ? are escaped as one-character classes)
            listed = ", ".join("'" + _glob_escape(f).replace("'", "''") + "'" for f in files)
            # every part of a table has exactly the schema's columns (written conformed; older
            # lakes are upgraded first, pipeline/upgrade.py), so DuckDB binds on one part's
            # footer instead of reading every part's (union_by_name: 10 s of connect for a lake
            # of 1,000 small sources); by name after the empty table, the columns keep its order
            body = (
                f"SELECT * FROM internal._empty_{t} UNION ALL BY NAME "
                f"SELECT * EXCLUDE (run) FROM read_parquet([{listed}], hive_partitioning = true, "
                f"hive_types = {{'run': VARCHAR}}, union_by_name = false)"
                if parts is None
                else f"SELECT * FROM internal._empty_{t} UNION ALL BY NAME "
                f"SELECT * FROM read_parquet([{listed}])"
            )
            if load and derived_views and (len(files) > LOAD_MIN_PARTS or size <= LOAD_ALL_BYTES):
                # many small parts, or a small lake: read once into memory, not once per query
                # (each query otherwise opens every part: 134 s for the analysis of 5,000 small
                # sources)
                con.execute(f"CREATE TABLE internal._t_{t} AS {body}")
                body = f"SELECT * FROM internal._t_{t}"
            con.execute(f"CREATE VIEW {t} AS {body}")
        else:
            con.execute(f"CREATE VIEW {t} AS SELECT * FROM internal._empty_{t}")
    if committed is not None and not lake.unchanged(committed):  # compacted while listed: list again
        con.close()
        raise duckdb.IOException("No such file: the lake was compacted while it was listed")
    for name, arrow in (
        ("device_catalog", catalog.device_catalog_arrow()),
        ("collective_catalog", catalog.collective_catalog_arrow()),
    ):
        con.register(f"_{name}", arrow)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM _{name}")
        con.unregister(f"_{name}")
    if parts is None and fleet:  # the fleet view: each run's newest kept analysis (pipeline/results.py)
        results_fleet.bind_overview(con, lake.root)
    # the NCCL-family formats (views/05_macros.sql doc), from their one list in pipeline/schema.py
    fams = ", ".join("'" + f + "'" for f in sch.NCCL_FORMATS)
    con.execute(f"CREATE OR REPLACE MACRO nccl_family(format) AS format IN ({fams})")
    con.execute(f"SET VARIABLE analysis_window = '{window}'")
    con.execute(f"SET VARIABLE kernel_wait_threshold_ns = {int(kernel_wait_threshold_ns)}")
    con.execute(f"SET VARIABLE roofline_latency_ns = {int(catalog.roofline()['latency_kernel_ns'])}")
    for name, v in (
        ("peak_tflops", peak_tflops),
        ("model_flops_per_step", model_flops_per_step),
        ("tokens_per_step", tokens_per_step),
        ("palm_flops_per_token", palm_flops_per_token),
        ("global_tokens_per_step", global_tokens_per_step),
    ):
        if v is not None:
            if not v > 0:
                raise ValueError(f"{name} must be positive, not {v}")
            con.execute(f"SET VARIABLE {name} = {float(v)!r}::DOUBLE")
    if derived_views:
        create_views(con, materialized if materialize else (), skip=skip_views)
    # the LOCAL_METRICS from the per-source results stored at ingest, when they hold for every
    # source in scope (pipeline/local.py)
    if derived_views and parts is None:
        local = local_results and use_local(con, lake, runs, window, kernel_wait_threshold_ns)
        con.execute(f"SET VARIABLE use_local = {str(local).lower()}")
        if local:  # collective_exposure's compute pieces: those stored (views/60_exposure_cover.sql)
            con.execute(
                "CREATE OR REPLACE VIEW exposure_cover AS "
                "SELECT run_id, rank, start_ns, end_ns FROM local_comm_cover WHERE level = 'rank'"
            )
            # the views the splits read; created only here (binding them costs 0.1 s a connection)
            con.execute((QUERIES_DIR / "local" / "wait_only_view.sql").read_text())
            con.execute((QUERIES_DIR / "local" / "phase_wait_only_view.sql").read_text())
            con.execute((QUERIES_DIR / "local" / "comm_cover_sums_view.sql").read_text())
            if _local_holds(con, "roofline_parts"):  # the roofline's per-rank sums
                con.execute(
                    "CREATE OR REPLACE VIEW roofline_parts AS "
                    "SELECT * EXCLUDE (source_id) FROM local_roofline"
                )
    # every metric is also a view of the same name, for `tracelake sql` and the report's SQL; DuckDB
    # binds a view when it is created (about 10 ms each on a small lake), so a caller that runs
    # the metric files itself (analyze) names only those it reads as views
    for name in (metric_names() if metric_views is True else metric_views or ()) if derived_views else ():
        con.execute(f"CREATE VIEW {name} AS " + metric_sql(con, name).strip().rstrip(";"))
    if size <= LOAD_ALL_BYTES:
        _SMALL.add(con)
    return con


def create_views(con: duckdb.DuckDBPyConnection, materialized=(), skip=()) -> None:
    """Run the files of queries/views/*.sql on con, in file order, except those whose stem is in
    `skip`; each view named in `materialized` is computed into a table (internal._m_<name>) as
    soon as its file has run, and the view then reads that table.

    Each metric query would otherwise recompute the step windows and the collective matching:
    materialized, they are computed once (same rows), and the views of the later files bind
    against tables, not the whole stack of views below them (binding that stack costs a small
    job more than computing it). Their row order is never relied on (every metric orders what
    it needs, and a join's output order already varies with the threads), so DuckDB may write
    them in any order: 12 % faster at scale."""
    done: set[str] = set()
    defined: set[str] = set()
    for f in sorted((QUERIES_DIR / "views").glob("*.sql")):
        if f.stem in skip:
            continue
        text = f.read_text()
        con.execute(text)
        defined |= _views_in(text)
        todo = [n for n in materialized if n in defined and n not in done]
        materialize(con, todo)
        done.update(todo)


def materialize(con: duckdb.DuckDBPyConnection, names) -> None:
    """Compute each view of `names` into a table (internal._m_<name>) and make the view read it:
    the same rows, computed once for every query that reads the view after (create_views; the
    NCCL findings, pipeline/analyze_compute.py, which read their views once per run)."""
    if not names:
        return
    con.execute("SET preserve_insertion_order = false")
    for name in names:
        con.execute(f"CREATE TABLE internal._m_{name} AS SELECT * FROM {name}")
        con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM internal._m_{name}")
    con.execute("RESET preserve_insertion_order")


# the SQL per-source results are computed with and read through: any change to one of these
# files (or to the options below) makes stored results of an earlier version unused
LOCAL_METRICS = ("breakdown", "step_time", "idle_gaps", "idle_breakdown", "step_status", "mfu", "phases")
_LOCAL_FILES = (*(f"{m}.sql" for m in LOCAL_METRICS), "local/*.sql", "views/*.sql")
_LOCAL_OPTIONS = "window=all;kernel_wait_threshold_ns=30000"
# variables that change a metric's (or stored view's) rows: with one set, it runs in full
_LOCAL_OVERRIDES = {
    "roofline_parts": ("peak_tflops",),  # stored with the catalog peaks
    "mfu": (
        "peak_tflops",
        "model_flops_per_step",
        "tokens_per_step",
        "palm_flops_per_token",
        "global_tokens_per_step",
    ),
}


def local_sql_version() -> str:
    """First 16 hex digits of the SHA-256 of the SQL behind per-source results (the files of
    LOCAL_METRICS, queries/local/*.sql, queries/views/*.sql, in that order), the catalogs
    (pipeline/catalog/*.toml: device peaks) and their options."""
    h = hashlib.sha256(_LOCAL_OPTIONS.encode())
    for pattern in _LOCAL_FILES:
        for f in sorted(QUERIES_DIR.glob(pattern)):
            h.update(f.relative_to(QUERIES_DIR).as_posix().encode() + b"\0" + f.read_bytes())
    for f in sorted(Path(catalog.__file__).parent.glob("*.toml")):  # device peaks (mfu)
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def use_local(con, lake: Lake, runs, window: str, kernel_wait_threshold_ns: int) -> bool:
    """Whether the LOCAL_METRICS can be read from the per-source results (pipeline/local.py), and
    collective_exposure's compute pieces with them:
    default options (window all, kernel_wait_threshold_ns 30000), every source with GPU
    activities in scope has a local_results part (the listings and compaction manifests
    compared first, so nothing is read when one lacks it; then the connection's own views, which
    were bound before that listing: a fill that wrote a run's results in between, as a first
    analysis does without waiting for readers, is in the listing but not in these views, whose
    metrics would then come out empty), every local_results row in scope is of the current
    local_sql_version(), and no rank of a run has results from two sources (a rank's work split
    across files would need one sweep over both). The check of the views reads the sources of
    gpu_activities: 0.11 s for 64 ranks x 100k kernels in Parquet."""
    if window != "all" or int(kernel_wait_threshold_ns) != 30_000:
        return False

    gpu = lake.holders("gpu_activities", runs)  # (run directory, source id), compacted or not
    if not gpu or not gpu <= lake.holders("local_results", runs):
        return False
    bad = con.execute(
        "SELECT count(*) FILTER (WHERE sql_version <> ?) + "
        "(SELECT count(*) FROM (SELECT 1 FROM local_results GROUP BY run_id, rank HAVING count(*) > 1)) + "
        "(SELECT count(*) FROM (SELECT DISTINCT run_id, source_id FROM gpu_activities) "
        "ANTI JOIN local_results USING (run_id, source_id)) "
        "FROM local_results",
        [local_sql_version()],
    ).fetchall()[0][0]
    return bad == 0


def metric_sql(con, name: str) -> str:
    """The SQL behind metric `name` on this connection: queries/local/<name>.sql when the
    connection reads per-source results (connect set use_local) and none of the metric's
    overrides is set (_LOCAL_OVERRIDES: mfu's peak and FLOPs), else queries/<name>.sql."""
    if name in LOCAL_METRICS and _local_holds(con, name):
        return (QUERIES_DIR / "local" / f"{name}.sql").read_text()
    return sql_text(name)


def _local_holds(con, name: str) -> bool:
    """Whether `name` (a LOCAL_METRICS file, or roofline_parts) may be read from the stored
    per-source results: the connection reads them (use_local) and none of its overrides
    (_LOCAL_OVERRIDES) is set."""
    names = ("use_local", *_LOCAL_OVERRIDES.get(name, ()))
    use, *overrides = con.execute("SELECT " + ", ".join(f"getvariable('{v}')" for v in names)).fetchall()[0]
    return bool(use) and all(v is None for v in overrides)


_GLOB_CHARS = re.compile(r"([*?\[\]])")


def _glob_escape(path: str) -> str:
    return _GLOB_CHARS.sub(r"[\1]", path)


def run(con: duckdb.DuckDBPyConnection, name: str) -> pl.DataFrame:
    """Metric `name` (queries/<name>.sql, or its per-source form: metric_sql) as a polars frame.
    A query whose state DuckDB cannot spill within the connection's memory cap (MEMORY_LIMIT; 64
    ranks x 100k kernels with stale per-source results: 953 MiB pinned) runs again without it,
    and the connection stays uncapped, rather than failing the analysis."""
    sql = metric_sql(con, name)
    try:
        return frame(con, sql)
    except duckdb.OutOfMemoryException:
        con.execute("RESET memory_limit")
        return frame(con, sql)


def frame(con: duckdb.DuckDBPyConnection, sql: str) -> pl.DataFrame:
    """The rows of one SELECT (sql) on con as a polars frame, bound and planned once on a small
    lake's connection (_SMALL), through a relation otherwise. Raises what DuckDB raises."""
    if con in _SMALL:
        return pl.from_arrow(con.execute(sql).to_arrow_table())
    return pl.from_arrow(con.sql(sql).to_arrow_table())


def _bytes(files_of, size=os.path.getsize) -> int:
    try:
        return sum(size(f) for t in ("gpu_activities", "cpu_ops") for f in files_of(t))
    except (OSError, KeyError):  # a part removed meanwhile (forget, ingest --force): as for a large lake
        return AUTO_MATERIALIZE_BYTES + 1


def query_workers(lake: Lake, runs: list[str] | None = None) -> int:
    """How many metric queries run_many should run at once on this lake: 2 (at most the cores)
    on a small one (GPU and host parts of at most AUTO_MATERIALIZE_BYTES), else 1."""
    small = _bytes(lambda t: lake.table_files(t, runs), getattr(lake, "part_size", os.path.getsize))
    small = small <= AUTO_MATERIALIZE_BYTES
    return min(2, os.cpu_count() or 1) if small else 1


def cursor(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A new connection to con's database (DuckDB cursor()): the same views and tables, and the
    same variables (DuckDB keeps variables per connection: they are copied), usable from another
    thread while con runs a query."""
    cur = con.cursor()
    if con in _SMALL:
        _SMALL.add(cur)
    for name, value, typ in con.execute("SELECT name, value, type FROM duckdb_variables()").fetchall():
        if value is None:
            cur.execute(f"SET VARIABLE {name} = NULL")
        else:
            cur.execute(f"SET VARIABLE {name} = CAST(? AS {typ})", [value])
    return cur


def run_many(
    con: duckdb.DuckDBPyConnection, names, workers: int = 1, on_done=None
) -> dict[str, pl.DataFrame]:
    """run(con, name) for each name, as {name: frame}; on_done(name), if given, is called as each query
    finishes (from the worker thread; a progress bar's advance). workers > 1: that many queries at a
    time, each on its own cursor() (DuckDB releases the GIL while a query runs). On a small lake
    each query spends most of its 10-100 ms binding and planning on one thread, so two side by side
    take PARAM's 8-rank DLRM job's 13 metrics from 0.48 to 0.28 s on 2 cores; on a large one each
    query already uses every core (and two at once would add their memory), so the caller passes 1
    there. Raises what run() raises (the first failing name's error)."""
    done = on_done or (lambda name: None)

    def run_and_report(c, name: str) -> pl.DataFrame:
        df = run(c, name)
        done(name)
        return df

    return on_cursors(con, run_and_report, list(names), workers)


def on_cursors(con: duckdb.DuckDBPyConnection, fn, items: list, workers: int) -> dict:
    """{item: fn(c, item)} for each item, at most `workers` at a time, each call on its own
    cursor() of con (same tables, views and variables; DuckDB releases the GIL while a query
    runs), started in the order of items; workers <= 1: one after another on con itself. Raises
    what fn raises (the first failing item's error); the cursors are closed either way."""
    if workers <= 1 or len(items) <= 1:
        return {i: fn(con, i) for i in items}
    free: queue.SimpleQueue = queue.SimpleQueue()
    curs = [cursor(con) for _ in range(min(workers, len(items)))]
    for c in curs:
        free.put(c)

    def one(item):
        c = free.get()
        try:
            return fn(c, item)
        finally:
            free.put(c)

    try:
        with cf.ThreadPoolExecutor(max_workers=len(curs), thread_name_prefix="tracelake-query") as pool:
            return dict(zip(items, pool.map(one, items)))
    finally:
        for c in curs:
            c.close()


def sql_count(con: duckdb.DuckDBPyConnection, text: str) -> int:
    """The single integer a COUNT query returns."""
    return int(con.execute(text).fetchone()[0])
