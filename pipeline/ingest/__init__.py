"""Ingest: find input files, detect their format, parse them and write them into the lake.

One bad file never stops a batch: it gets a `sources` row with status=failed and a one-line
error, and the rest are ingested. A path that does not exist, a directory that cannot be read or
a special file (FIFO, device) is reported the same way. Truncated traces keep every complete
event: status 'partial', with the unreadable byte count in the sources column
`unreadable_bytes` (0 for a Kineto trace read whole; null for formats that do not count it and
for failed files), in `notes` and in FileResult.unreadable_bytes.

The rooms, in the order one ingest goes through them (docs/architecture.md):
- discover.py: find the files, leave out what --exclude names, sniff each one's format
  (formats.py holds the suffixes and magic numbers), plan the units of work;
- executors.py: run the units in this process, a process pool or on a Dask cluster;
- prepare.py: one unit in a worker: parse it with its format's package (kineto/, nccl/, nsys/;
  archive.py reads archives in place), stage its tables and build its sources row;
- runs.py: the run rule (names, one file per rank, one profiling window, skipping what the lake
  holds), written once at the top of that file;
- commit.py: put each outcome into the lake, in input order, under the lake's lock.
The lake itself (staging, committing, locking, recovery) is pipeline/lake.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from .. import pool_scope, scratch
from ..classify import check_regex
from ..lake import Lake, LakeError, one_line
from ..lake_compact import AUTO_MIN_SOURCES
from ..schema import SchemaError
from ..upgrade import upgrade
from . import objects
from .commit import FileResult, commit, problem_failure
from .discover import Problem, discover, exclude_patterns, excluded, plan
from .executors import run_dask, run_pool, run_serial, run_threads
from .formats import LOG_SUFFIXES, TRACE_SUFFIXES
from .hold import Pending, hold_runs
from .jobid import job_of_name, with_job
from .rows import MAX_RANK, PASSED_OVER, Options, content_sha256, failed, rank_from_name, read_bytes, skipped
from .runs import (
    PLACED,
    Runs,
    beside_key,
    dir_name,
    done_entry,
    done_index,
    is_done,
    jobs,
    log_job_note,
    log_name,
    run_for,
    stored_identity,
    stored_sources,
)

__all__ = [
    "FileResult",
    "Problem",
    "LOG_SUFFIXES",
    "TRACE_SUFFIXES",
    "MAX_RANK",
    "content_sha256",
    "discover",
    "exclude_patterns",
    "excluded",
    "ingest_paths",
    "plan",
    "rank_from_name",
    "read_bytes",
]


def ingest_paths(
    paths: Iterable[str | Path],
    lake: Lake,
    run: str | None = None,
    rank: int | None = None,
    force: bool = False,
    comm_patterns: list[str] | None = None,
    on_file: Callable[[FileResult], None] | None = None,
    step_regex: str | None = None,
    jobs: int = 1,
    scheduler: str | None = None,
    on_plan: Callable[[int], None] | None = None,
    exclude: Iterable[str] | None = None,
    not_logs: list | None = None,
    compact: bool = True,
) -> list[FileResult]:
    """Ingest every file under `paths` into `lake`; returns one FileResult per file, archive
    member or problem path, in input order. jobs: parallel workers (1: none, in this process; 0:
    one per core): processes, or threads of this process when the inputs add up to less than
    pool_scope.PARALLEL_MIN_BYTES; scheduler: the address of a Dask scheduler to run the workers on
    instead. on_plan is called once with the number of units before work starts (a compressed tar
    counts as one until its members are known). step_regex: NVTX range names that mark steps in nsys exports
    (default ProfilerStep#N). exclude: glob patterns of files, directories and archive members to
    leave out (see excluded()). not_logs, when given, gets the files and archive members with a
    log suffix passed over as not NCCL-family logs (discover.plan). compact: afterwards, compact
    each run written to that holds at least AUTO_MIN_SOURCES small sources (Lake.compact). Raises
    LakeError when the lake itself cannot be created or written, or another ingest holds its
    lock; re.error for a bad step_regex."""
    if step_regex:
        check_regex(step_regex)
    for p in comm_patterns or []:
        check_regex(p)
    exclude = exclude_patterns(exclude)
    units, _ = plan(paths, exclude, not_logs)
    if on_plan:
        on_plan(len(units))
    lake.ensure()
    results: list[FileResult] = []
    opts = Options(
        str(lake.root.absolute()),
        run,
        rank,
        force,
        list(comm_patterns or []) or None,
        step_regex,
        exclude or None,
        hold_runs(units, run, run_for, compact and isinstance(lake, Lake)),  # held: a local lake only
    )
    scratch.sweep(tempfile.gettempdir())  # what killed processes left there (pipeline/scratch.py)
    with lake.lock():
        lake.recover()
        upgrade(lake)  # a lake of an older schema is brought up to date before it is written to
        stored = stored_sources(lake.sources())
        done = done_index(stored)
        runs = Runs(stored, lambda r, s: stored_identity(lake, r, s))
        pending = Pending(lake)  # small sources held in memory, written at the end (hold.py)
        logs: list[tuple[int, object]] = []  # NCCL-family files placed after the rest (rule 4)

        def put(p) -> None:  # commit one outcome (in input order) and report it
            if run is None and p.identity is not None and p.staged is not None and p.status != "failed":
                results.append(None)  # its place in input order, filled by place_logs
                logs.append((len(results) - 1, p))
                return
            res = commit(p, lake, done, runs, force, run is None, pending=pending, key=(len(results), p.sha))
            results.append(res)
            if on_file:
                on_file(res)

        work = []
        seen = (
            objects.stored_index(stored)
            if any(isinstance(u.item, objects.ObjectInput) for u in units)
            else None
        )
        for u in units:
            if u.kind == "problem":  # named as a healthy file in its place would be (Problem.run)
                name = with_job(u.item.run or dir_name(u.item.path), job_of_name(Path(u.item.path).name))
                put(problem_failure(lake, u.item.path, run or name, u.item.error))
            elif u.kind == "refused":
                put(failed(u.item.display, run_for(u.item.run_name, run), u.item.error))
            elif (
                not force
                and (sha := objects.known_sha(u.item, seen))
                and is_done(done, sha, run_for(u.item.run_name, run), run is None)
            ):  # an object in the lake unchanged: not fetched again (ingest/objects.py)
                put(skipped(u.item.display, done, sha, run_for(u.item.run_name, run), run is None))
            else:
                work.append(u)
        jobs = jobs or os.cpu_count() or 1
        if scheduler:
            stream = run_dask(work, opts, done, scheduler)
        elif jobs > 1 and len(work) > 1 and sum(u.size for u in work) >= pool_scope.PARALLEL_MIN_BYTES:
            stream = run_pool(work, opts, done, min(jobs, len(work)))
        elif jobs > 1 and len(work) > 1:
            stream = run_threads(work, opts, done, min(jobs, len(work)))
        else:
            stream = run_serial(work, opts, done)
        try:
            for u, prepared in stream:
                for p in prepared:
                    if p.status == PASSED_OVER:  # a compressed tar's member that is not a log
                        if not_logs is not None:
                            not_logs.append(p.path)
                        continue
                    try:
                        put(p)
                    except LakeError:
                        raise
                    except OSError:
                        if not lake.writable():
                            raise
                        put(failed(p.path, p.run_id, "cannot write its rows to the lake", p.sha))
            _place_logs(logs, results, lake, done, runs, force, on_file)
            for (i, sha), err in pending.flush():  # held sources the lake could not take: failed
                if isinstance(err, SchemaError):  # its sources row (commit() says it the same way)
                    why = one_line(f"schema violation: {err}")
                elif not lake.writable():
                    raise LakeError(f"{lake.root}: cannot write to the lake")
                else:
                    why = f"cannot write its rows to the lake ({one_line(err.strerror or str(err))})"
                results[i] = commit(
                    failed(results[i].path, results[i].run_id, why, sha), lake, done, runs, force
                )
                results[i].again = True  # it was reported ok when it joined the batch
                if on_file:
                    on_file(results[i])
        finally:
            pending.drop()
            close = getattr(stream, "close", None)
            if close:
                close()
            for i, p in logs:  # the staged parts of logs an interrupted ingest did not commit
                if results[i] is None:
                    lake.discard(p.staged)
        if compact:
            try:  # the runs written to, when one holds many small parts (pipeline/lake_compact.py)
                lake.compact({r.run_id for r in results if r and r.run_id}, AUTO_MIN_SOURCES)
            except OSError:  # an optimisation only: the lake stays as it was or compacted, whole
                pass
    return results


def _place_logs(logs, results, lake, done, runs: Runs, force: bool, on_file) -> None:
    """Commit the batch's NCCL-family files (rule 4 of runs.py): those already in the lake as
    commit() does; the others grouped into jobs per named run (runs.jobs), each job placed by
    Runs.place, in the order of its first file. A log's named run is that of the traces beside it
    (runs.log_name); its sources row keeps the name its own path gives."""
    fresh = []
    for i, p in logs:
        if done_entry(done, p.sha, p.run_id, True) is not None:
            results[i] = commit(p, lake, done, runs, force, True)
            if on_file:
                on_file(results[i])
        else:
            fresh.append((i, p))
    by_name: dict[str, list] = {}  # the run each log is named for: that of the traces beside it
    for i, p in fresh:
        name = log_name(runs.beside.get(beside_key(p.path), []), p.run_id, job_of_name(_leaf(p.path)))
        by_name.setdefault(name, []).append((i, p))
    groups = []
    for name, members in by_name.items():
        groups += [(name, [members[k] for k in g]) for g in jobs([p.identity for _, p in members])]
    for name, g in sorted(groups, key=lambda g: g[1][0][0]):
        notes: list[str] = []
        where = runs.place(name, g[0][1].source_id, [p.identity for _, p in g], notes)
        for i, p in g:
            own = [] if name == p.run_id else [f"the traces beside it are named {name}{PLACED}{where}"]
            own += log_job_note(name, job_of_name(_leaf(p.path)))
            results[i] = commit(p, lake, done, runs, force, True, place=where, place_notes=own + notes)
            if on_file:
                on_file(results[i])


def _leaf(path: str) -> str:
    """A sources path's file name (an archive member's own, after the archive's '!')."""
    return path.rsplit("/", 1)[-1].rsplit("!", 1)[-1]
