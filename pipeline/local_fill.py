"""Per-source metric results computed for committed sources (pipeline/local.py holds what they
are and compute(), which runs their SQL on one source).

fill(lake, runs) adds them to the committed sources of those runs that lack them, in parts of
their own or held by a compacted generation (pipeline/analyze.py calls it at a run's first
analysis, for runs of FILL_MIN_ROWS GPU activities or more); backfill(lake) to every committed
source with parts of its own (lakes written by benchmarks/scale_trace.py). A source whose results
cannot be computed or written is left without: analysis then computes those metrics in full.
The thresholds and the per-source SQL's settings (MIN_GPU_ROWS, SERIAL_ROWS, MEMORY_LIMIT) are
local.py's, read when called (tests set them there).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import shutil
import uuid
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import lake_journal as journal
from . import local, query
from . import schema as sch
from . import scratch as scratch_dirs
from .lake import Lake, LakeError
from .parts import write_parquet

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
# sources fill() computes side by side (each on its own connection, its files QUERY_WORKERS at a
# time), so a run's first analysis keeps the cores busy as the ingest's pool workers did
FILL_WORKERS = 2


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
    (None: local.MIN_GPU_ROWS) GPU activities, in parts of their own or held by their run's compacted
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
    min_rows = local.MIN_GPU_ROWS if min_rows is None else min_rows
    todo, total = _missing(lake, runs, min_rows, src)
    if total < min_total:
        return 0
    # sources up to local.SERIAL_ROWS activities FILL_WORKERS at a time (the ingest's pool workers
    # computed them side by side before), larger ones after them, alone (each under the whole
    # memory cap); a generation's results are written once its last source in that order is
    # computed, so one switch takes a run's small and large sources together
    todo = [t for t in todo if t[3] <= local.SERIAL_ROWS] + [t for t in todo if t[3] > local.SERIAL_ROWS]
    last = {(run_dir, gen): i for i, (run_dir, _, gen, _) in enumerate(todo) if gen is not None}
    state = {"done": 0, "adds": {}, "seen": 0, "total": len(todo), "on_progress": on_progress}
    n_small = sum(1 for t in todo if t[3] <= local.SERIAL_ROWS)
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
            idents.append(_identity(_part(lake, "sources", run_dir, sid)))
            files = _own_files(lake, run_dir, sid)
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
            if res:
                with _writing(lake, state):
                    if (
                        _identity(_part(lake, "sources", run_dir, sid)) == ident
                        and (run_dir, sid) in lake.committed()
                    ):
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
    """local.compute() of a source whose parts files_in(scratch) gives (scratch: a fresh directory
    under the system's temporary directory, removed here); {} when it gives none or fails."""
    scratch = scratch_dirs.make("local")
    try:
        files = files_in(scratch)
        return local.compute(files, sid, min_rows) if files else {}
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
        p = _part(lake, "gpu_activities", d, s)
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
    for t in local.TABLES:
        try:
            with open(_part(lake, t, run_dir, sid), "rb") as f:
                head = f.read(4)
                f.seek(-4, os.SEEK_END)
                if head != b"PAR1" or f.read(4) != b"PAR1":
                    return False
        except OSError:  # gone, or shorter than its magic bytes
            return False
    return True


def _part(lake: Lake, table: str, run_dir: str, sid: str) -> Path:
    """A source's own part of `table` (run_dir: `run=<run id>`)."""
    return lake.root / table / run_dir / f"{sid}.parquet"


def _own_files(lake: Lake, run_dir: str, sid: str) -> dict[str, list[str]]:
    """A source's own parts that local.compute() reads (table -> [file]): every table but the
    local_* ones, where the source has a part."""
    return {
        t: [str(p)]
        for t in sch.tables()
        if not t.startswith("local_") and (p := _part(lake, t, run_dir, sid)).exists()
    }


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
    (table -> [file]) for local.compute()."""
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
    for t in (*local.TABLES, "local_results"):
        dest = _part(lake, t, run_dir, sid)
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
    (and is completed by the next call); one whose local_results part cannot be read (cut or
    damaged) is computed again and its parts replaced, as fill() does. Returns the number of
    sources given results."""
    done = 0
    with lake.lock():
        committed = lake.committed()
        files = [str(_part(lake, "local_results", *key)) for key in lake._listing("local_results")]
        # the parts of the current version that can be read (_current: one that cannot is passed over)
        have = {("run=" + r, s) for r, s in _current(files, query.local_sql_version(), committed)}
        for run_dir, sid in lake._listing("gpu_activities"):
            if (run_dir, sid) in have or (run_dir, sid) not in committed:
                continue
            scratch = lake.scratch()
            try:
                res = local.compute(_own_files(lake, run_dir, sid), sid, min_rows, spill_dir=scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if res:
                _write_own(lake, run_dir, sid, res)
            done += bool(res)
    return done
