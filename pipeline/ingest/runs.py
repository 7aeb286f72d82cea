"""Which run each file lands in. The rule, as docs/usage.md states it:

1. A file's run is named by `--run`, else by its directory: its path below the directory given
   (as TensorBoard names runs), or the directory's own name for a file given by name or lying
   directly in it; an archive member as if the archive were unpacked where it lies. A path is
   stored with '.' between its directories (run_id_of, pipeline/ingest/runid.py: `job1/traces` is
   run `job1.traces`; letters of any script kept, long names shortened keeping the job).
   The job a file states (its name, else a Kineto trace's metadata) is put after that name
   (pipeline/ingest/jobid.py: `traces/job-4711_rank0.json` is run `traces.job-4711`).
2. A run holds one file per rank and, without `--run`, one profiling window (files whose time
   spans overlap); a file that does not fit its named run goes to the first run it fits among
   those its name was moved to, else to a new run `<name>_<start>` (the UTC second it starts;
   `<name>_<8 hex>` when that is unknown or taken), with a note saying so. A name once given is
   kept: of the windows wanting one name the first ingested holds it (a note says when a window
   starts before the one holding its name).
3. Content already in the lake (without `--run` in any run, with it in that run) is skipped;
   `--force` re-ingests it where it is.

4. An NCCL-family file (NCCL_DEBUG log, nccl-tests output, watchdog capture, Flight Recorder
   dump, RAS report, profiler-plugin trace) is placed by its own identity (log_identity: the
   communicator ids it states, commId / RAS and profiler comm hashes; its processes, host and
   pid; its world communicator's nranks, NCCL versions and time span), without --run, after the
   batch's other files. Files of one name that share a communicator id, or a process (host and
   pid) with no contradiction (different NCCL versions, world sizes, or disjoint time spans), are
   one job (linked; transitively within a batch). A job goes to the first run of its name (or one
   it was moved to) holding a file it is linked to; else to the first of those holding traces
   (a log put beside the traces of its job stays with them; whether it matched a traced rank is
   the analysis's nccl_matching); else to the named run when it holds nothing yet; else to a new
   run moved_run(), with a note. A file without any identity (a bare nccl-tests table, a watchdog
   capture without NCCL lines) is a job of its own. --run puts every file in the run it names.
   Before they are grouped, a log joins the traces beside it (log_name): the run it is named
   for is, among the runs its directory's traces were named (those in the lake and this batch,
   lying in the same directory: beside_key), the one its own name gives (its job, or none),
   else the only one, else the one of traces that state no job, else its own name. Its sources
   row keeps its own name (named_run_id), so a re-ingest finds it, alone or with its traces.

Ranks come from the trace (pipeline/ingest/prepare.py). This module owns names (run_for), the
index of what the lake already holds (done_index), the rank and time claims (Runs) and where
NCCL-family jobs go (Runs.place); what identifies their jobs and the run a log is named for beside
traces are in pipeline/ingest/logruns.py (log_identity, linked, jobs, log_name: re-exported here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import polars as pl

from .formats import archive_stem
from .logruns import (  # noqa: F401  (rule 4's pieces, re-exported: their module is logruns.py)
    IDENTITY_TABLES,
    NCCL_FORMATS,
    beside_key,
    comm_ids,
    has_identity,
    jobs,
    linked,
    log_identity,
    log_job_note,
    log_name,
    stored_identity,
)
from .runid import given_run_id, run_id_of, suffixed  # the names' ids: runid.py

# in the note of a file not put in its named run (Runs.claim), before the run it was put in
PLACED = "; this file was put in run "


def dir_name(path) -> str:
    """The name of the directory a file lies in, as the path was given (rule 1): a symbolic link
    is named by the directory holding the link, not by its target's (os.path.abspath, which
    removes '.' and '..' without resolving links). The root directory, which has no name, is '/'
    (run id run-42099b: a run id is never '', which a hive partition cannot hold)."""
    return Path(os.path.abspath(path)).parent.name or "/"


def run_for(name: str, run: str | None) -> str:
    """The run id of a file whose directory gives `name` (rule 1): --run when given (a run id as
    it is, a directory path as such a path is stored: `--run job1/traces` names run job1.traces;
    runid.given_run_id)."""
    return given_run_id(run) if run else run_id_of(name)


# a start before 2000-01-01 UTC is a relative clock, not a date to name a run by
_MIN_EPOCH_NS = 946_684_800 * 10**9


def moved_run(run_id: str, source_id: str, t0: int | None = None, taken=()) -> str:
    """The new run a file goes to when no run of its name fits it (rule 2): `<run>_<start>`, the
    UTC second its first file starts (`prof_20210608T085712`: a second profiling cycle or another
    job reads as when it ran), when that start is known (an epoch time) and no run in `taken`
    has that id; else `<run>_<8 hex digits of its first file's source id>`. The suffix is kept
    whole (runid.suffixed: a long run id is cut before it), and a run id in any script stays
    as it is (`日本語_run_20230907T231001`)."""
    if t0 is not None and t0 >= _MIN_EPOCH_NS:
        import datetime as dt

        when = dt.datetime.fromtimestamp(t0 // 10**9, dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        named = suffixed(run_id, f"_{when}")
        if named not in taken:
            return named
    return suffixed(run_id, f"_{source_id[:8]}")


def stored_sources(src: pl.DataFrame) -> pl.DataFrame:
    """The sources rows that did not fail, with column `named`: the run each was named
    (sources.named_run_id, before it was moved to another run; its run_id in lakes written
    before that column)."""
    ok = src.filter(pl.col("status") != "failed")
    return ok.with_columns(named=pl.coalesce("named_run_id", "run_id"))


# ------------------------------------------------------------------ what the lake holds (rule 3)

Done = dict  # (content sha256, named run | None) -> (run it is stored in, committed in this batch)


def done_index(stored: pl.DataFrame) -> Done:
    """(content sha256, named run) and (content sha256, None) -> (the run the content is stored
    in, False), for the sources of stored_sources(); files committed by this ingest are added
    with True (pipeline/ingest/commit.py). Without --run, content already in any run counts as
    in the lake (the None key): the same bytes are the same trace, whichever directory it was
    reached from."""
    done: Done = {}
    cols = (stored["content_sha256"].to_list(), stored["named"].to_list(), stored["run_id"].to_list())
    for h, n, r in zip(*cols):
        done[(h, n)] = (r, False)
        done.setdefault((h, None), (r, False))
        done.setdefault((NAMED, h), n)  # the name the (None) entry's content was stored under
    return done


NAMED = "named"  # done[(NAMED, sha)]: the run name content sha was first stored under


def done_entry(done: Done, sha: str, run_id: str, any_run: bool):
    """(run, in this batch) of content `sha` named run_id when it is in the lake, else None:
    looked up in any run (any_run: no --run) or in run_id."""
    return done.get((sha, None) if any_run else (sha, run_id))


def is_done(done: Done, sha: str, run_id: str, any_run: bool) -> bool:
    """Whether content `sha` named run_id is already in the lake (done_entry)."""
    return done_entry(done, sha, run_id, any_run) is not None


def stored_run(done: Done, sha: str, run_id: str, any_run: bool) -> str:
    """The run a file already in the lake is stored in: its named run, the one it was moved to
    (Runs.claim), or (any_run) the run the same content is in."""
    return (done_entry(done, sha, run_id, any_run) or (run_id,))[0]


def held_elsewhere(done: Done, sha: str, run_id: str, any_run: bool) -> str | None:
    """The run holding content `sha` when it was stored under another run name than run_id (from
    another directory, or with another --run), so that run_id's run does not hold it; else None
    (not in the lake, or stored under this name, wherever rank claims moved it)."""
    if not any_run or (sha, run_id) in done:
        return None
    if str(done.get((NAMED, sha))).startswith(f"{run_id}."):  # its own directory's run with the
        return None  # job its contents state (jobid.py), which a check before reading cannot know
    entry = done.get((sha, None))
    return entry[0] if entry is not None else None


def skip_note(done: Done, sha: str, run_id: str, any_run: bool) -> str:
    """The note of a file skipped because its content is already in the lake or the batch. When
    that content is held under another run name (held_elsewhere), the note says that run_id's run
    lacks it and that --run puts a copy there (--force would re-ingest it where it is)."""
    run, in_batch = done_entry(done, sha, run_id, any_run) or (run_id, False)
    other = held_elsewhere(done, sha, run_id, any_run)
    if other is not None:
        seen = "ingested earlier in this batch" if in_batch else "already in the lake"
        return (
            f"same content {seen} in run {other}, so run {run_id} does not hold it; "
            f"--run {run_id} ingests it into that run too"
        )
    where = f", in run {run}" if run != run_id else ""
    if in_batch:
        return f"same content as a file ingested earlier in this batch{where}; --force re-ingests"
    return f"already in the lake (same content{where}); --force re-ingests"


# ------------------------------------------------------------------ ranks and time windows (rule 2)


def _archive_named(path: str, named: str) -> bool:
    """Whether a source is a member at an archive's top named by the archive (rank0.tar.gz!rank0.json
    in run rank0, or <dir>.rank0 below a directory searched): it states no job, and its archive
    stands for a directory of its own (docs/usage.md "Runs"), so traces beside the archive in
    other runs are no disagreement of jobs (Runs.job_note)."""
    archive, bang, member = path.rpartition("!")
    if not bang or "/" in member:
        return False
    tail = run_id_of(archive_stem(archive.rsplit("/", 1)[-1]))
    return named == tail or named.endswith("." + tail)


class Runs:
    """The lake's runs as committing needs them: the source holding each (run, rank), each run's
    time span (the union of its sources' trace_start_ns..trace_end_ns), per named run the runs its
    files were moved to, the runs holding each content, each source's stored row, and per
    directory the named runs of the traces lying there (beside, rule 4). Built from
    stored_sources(); add() keeps it current as files are committed."""

    def __init__(self, stored: pl.DataFrame, load: Callable[[str, str], dict] | None = None):
        """stored: stored_sources() of the lake; load(run, source_id): the log_identity of a
        stored NCCL-family source (read when a file of that run's name is placed, rule 4)."""
        self.load = load
        self.members: dict[str, int] = {}  # run -> sources it holds
        self.traced: set[str] = set()  # runs holding a file that is not NCCL-family (traces)
        self.logs: dict[str, list[list]] = {}  # run -> [source_id, identity or None (not loaded)]
        self.ranks: dict[tuple[str, int], str] = {}
        self.spans: dict[str, tuple[int, int]] = {}
        self.moved: dict[str, list[str]] = {}
        self.by_content: dict[str, list[str]] = {}
        self.beside: dict[str, list[str]] = {}  # beside_key -> named runs of the traces there
        # (run, source_id) -> (path, named run, notes saying where it was put): kept by --force
        self.rows: dict[tuple[str, str], tuple[str, str, list[str]]] = {}
        names = (
            "run_id",
            "named",
            "source_id",
            "content_sha256",
            "rank",
            "ranks",
            "trace_start_ns",
            "trace_end_ns",
            "notes",
            "path",
            "format",
        )
        for r, n, s, h, k, ks, t0, t1, notes, path, fmt in zip(*[stored[c].to_list() for c in names]):
            rank_list = [k for k in (ks if ks is not None else [k]) if k is not None]
            self.add(r, n, s, h, rank_list, t0, t1, notes or [], path, fmt)

    def add(
        self,
        run_id: str,
        named: str,
        source_id: str,
        sha: str,
        rank_list: list[int],
        t0: int | None,
        t1: int | None,
        notes: list[str],
        path: str,
        fmt: str | None = None,
        ident: dict | None = None,
    ) -> None:
        """A committed source, with its sources path, notes, format and (NCCL-family files
        committed by this ingest) its log_identity."""
        self.rows[(run_id, source_id)] = (path, named, [n for n in notes if PLACED in n])
        self.members[run_id] = self.members.get(run_id, 0) + 1
        if fmt in NCCL_FORMATS:
            self.logs.setdefault(run_id, []).append([source_id, ident])
        elif fmt is not None:
            self.traced.add(run_id)
            there = self.beside.setdefault(beside_key(path), [])
            if named not in there:
                there.append(named)
        for r in rank_list:
            self.ranks[(run_id, r)] = source_id
        if t0 is not None and t1 is not None:
            lo, hi = self.spans.get(run_id, (t0, t1))
            self.spans[run_id] = (min(lo, t0), max(hi, t1))
        if run_id != named and run_id not in self.moved.setdefault(named, []):
            self.moved[named].append(run_id)
        if run_id not in self.by_content.setdefault(sha, []):
            self.by_content[sha].append(run_id)

    def taken(self, run_id: str, source_id: str, rank_list: list[int]) -> list[int]:
        """The ranks of rank_list another source already holds in run_id."""
        return [r for r in rank_list if self.ranks.get((run_id, r), source_id) != source_id]

    def claim(
        self,
        run_id: str,
        source_id: str,
        rank_list: list[int],
        t0: int | None,
        t1: int | None,
        notes: list[str],
        by_time: bool = True,
        path: str | None = None,
    ) -> str:
        """The run a source named run_id goes to (rule 2). by_time=False (--run named it): run_id
        when no other source holds one of its ranks there. Otherwise the candidates are run_id and
        the runs files named run_id were moved to, those where no other source holds one of its
        ranks; the first whose time span overlaps the file's wins: the files of one profiling
        window run at the same time, so a second cycle of a job, or a second job of the same name
        that ran at another time, stays one run whatever the order the files come in. Else run_id
        when it is a candidate and holds no timed file yet; else a new run moved_run(). A note
        (also printed) says when the file is not put in run_id, and (path: its sources path,
        job_note) when it is the first of its run named to state another job than the traces
        beside it."""
        taken = self.taken(run_id, source_id, rank_list)
        if not by_time and not taken:
            return run_id
        if path is not None and by_time:  # named by --run: its name is no job it states
            notes += self.job_note(path, run_id)
        free = [c for c in [run_id] + self.moved.get(run_id, []) if not self.taken(c, source_id, rank_list)]
        if taken:
            what = f"rank {taken[0]}" if len(taken) == 1 else f"ranks {', '.join(map(str, taken))}"
            why = f"{what} of run {run_id} is already held by source {self.ranks[(run_id, taken[0])]}"
        else:
            why = (
                f"its time span does not overlap run {run_id}'s "
                "(another profiling cycle or job in the same directory)"
            )
        if t1 is not None and run_id in self.spans and t1 < self.spans[run_id][0]:
            why += f"; it ends before run {run_id} starts, which was ingested first and keeps its name"
        if t0 is not None and t1 is not None:
            for c in free:
                span = self.spans.get(c)
                if span and span[0] <= t1 and t0 <= span[1]:
                    if c != run_id:
                        notes.append(f"{why}{PLACED}{c}, with the files of the same time window")
                    return c
            if not taken and run_id not in self.spans:
                return run_id
        elif not taken:
            return run_id
        moved = moved_run(run_id, source_id, t0, self._taken())
        notes.append(f"{why}{PLACED}{moved}")
        return moved

    def job_note(self, path: str, named: str) -> list[str]:
        """A note for the first trace named `named` (its directory's run with the job it states)
        lying in a directory whose traces were named otherwise (in the lake or this batch:
        beside): they state another job or none, so each job is a run of its own, never silently."""
        there = self.beside.get(beside_key(path), [])
        if not there or named in there or _archive_named(path, named):
            return []
        more = f" and {len(there) - 1} more" if len(there) > 1 else ""
        return [
            f"the traces beside it are in run {there[0]}{more}: this one states another job (or none), "
            f"so it starts run {named} (one run per job; --run names one run for all)"
        ]

    def _taken(self) -> set[str]:
        """Every run id the lake or this batch holds (a moved run's name must be new)."""
        return set(self.members) | set(self.spans)

    def _logs_of(self, run_id: str) -> list[dict]:
        """The identities of the NCCL-family sources run_id holds (stored ones read by load)."""
        out = []
        for entry in self.logs.get(run_id, []):
            if entry[1] is None:
                entry[1] = self.load(run_id, entry[0]) if self.load else log_identity({})
            out.append(entry[1])
        return out

    def place(self, run_id: str, source_id: str, job: list[dict], notes: list[str]) -> str:
        """The run a job of NCCL-family files named run_id goes to (rule 4; source_id: its first
        file's, for moved_run). The candidates are run_id and the runs files named run_id were
        moved to: the first holding a file linked to one of the job's, else the first holding
        traces, else run_id when it holds nothing yet, else a new run moved_run(). A note (also
        printed) says when the job is not put in run_id."""
        cands = [run_id] + self.moved.get(run_id, [])
        for c in cands:
            if any(linked(a, b) for b in self._logs_of(c) for a in job):
                if c != run_id:
                    notes.append(
                        f"it shares a communicator or a process with the NCCL files of run {c}{PLACED}{c}"
                    )
                return c
        for c in cands:
            if c in self.traced:
                if c != run_id:
                    notes.append(
                        f"run {run_id} holds other NCCL files and no traces{PLACED}{c}, with the traces"
                    )
                return c
        if not self.members.get(run_id):
            return run_id
        starts = [a["span"][0] for a in job if a.get("span") and a["span"][0] is not None]
        moved = moved_run(run_id, source_id, min(starts) if starts else None, self._taken())
        why = (
            "states no communicator id or process"
            if not any(has_identity(a) for a in job)
            else ("shares no communicator and no process with them")
        )
        notes.append(f"run {run_id} holds files of another job (this NCCL file {why}){PLACED}{moved}")
        return moved
