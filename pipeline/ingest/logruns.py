"""NCCL-family files and their jobs (rule 4 of pipeline/ingest/runs.py, docs/usage.md "Runs"):
what identifies the job of a log (log_identity: the communicator ids it states, its processes,
its world communicator's size, NCCL versions and time span; stored_identity for one in the lake),
which files of one name are one job (linked, jobs), where a log lies (beside_key) and the run it
is named for beside traces (log_name, log_job_note). Runs (runs.py) places the jobs.
"""

from __future__ import annotations

import re

import polars as pl

from .. import schema as sch
from .jobid import JOB_IN_NAME, numbered
from .runid import id_with_job

NCCL_FORMATS = sch.NCCL_FORMATS  # the sources.format values of NCCL-family files
# the tables whose rows state a communicator id or a process (host, pid)
IDENTITY_TABLES = ("nccl_processes", "nccl_ras", "nccl_profiler_events")
_COMM_ID = re.compile(r"0x[0-9a-f]+")


def comm_ids(values) -> set[str]:
    """The communicator ids among values: '0x' + hex, not zero (NCCL's documentation masks them as
    '0x...', which names no communicator)."""
    return {v for v in values if isinstance(v, str) and _COMM_ID.fullmatch(v) and int(v, 16) != 0}


def log_identity(tables: dict, t0: int | None = None, t1: int | None = None) -> dict:
    """What identifies the job of an NCCL-family file, from its parsed tables (polars DataFrames;
    other values, such as spools, are not read): comms (communicator ids), procs ('host:pid',
    host as NCCL prints it, up to the first dot, lower case; processes without a host are left
    out: a pid alone names no process), nranks (the largest communicator), versions (NCCL
    versions of its processes) and span (t0, t1: the file's time span when known)."""
    comms: set[str] = set()
    procs: set[str] = set()
    nranks, versions = None, set()
    for t in IDENTITY_TABLES:
        df = tables.get(t)
        if not isinstance(df, pl.DataFrame) or df.height == 0:
            continue
        if "comm_id" in df.columns:
            comms |= comm_ids(df["comm_id"].drop_nulls().unique().to_list())
        if "host" in df.columns and "pid" in df.columns:
            hp = df.select("host", "pid").drop_nulls().unique()
            procs |= {f"{h.split('.')[0].lower()}:{p}" for h, p in hp.iter_rows() if h}
        if t == "nccl_processes":
            n = df["nranks"].max()
            nranks = int(n) if n is not None else None
            versions = set(df["nccl_version"].drop_nulls().unique().to_list())
    return {
        "comms": sorted(comms),
        "procs": sorted(procs),
        "nranks": nranks,
        "versions": sorted(versions),
        "span": [t0, t1] if t0 is not None and t1 is not None else None,
    }


def beside_key(path: str) -> str:
    """The directory a source lies in, from its sources path (rule 4: the traces beside a log):
    a file's directory, an archive member's directory inside the archive (`a.tar!traces`), the
    archive's own directory for a member at its top (as if the archive were unpacked where it
    lies), an object's prefix."""
    return path.rsplit("/", 1)[0] if "/" in path else ""


def log_name(beside: list[str], named: str, job: str | None) -> str:
    """The run an NCCL-family file named `named` (its directory's run id with `job`, the job its
    file name states, or None) is named for (rule 4: a log joins the traces beside it). beside:
    the named runs of the traces lying in its directory (Runs.beside), first first. The first of
    - named, when traces beside it were named so (they state its job, or both state none);
    - the only run of the traces beside it (they state one job, or none: the log takes it);
    - the run of traces beside it that state no job (named by the directory alone: `named` is
      that run's id with the job after it, runid.id_with_job), so that a log stating a job
      never leaves traces that state none;
    - named (no traces beside it, or those of several jobs none of which is its own nor jobless)."""
    if named in beside or not beside:
        return named
    if len(beside) == 1:
        return beside[0]
    for b in beside:
        if job is not None and id_with_job(b, job) == named:
            return b
    return named


def log_job_note(run: str, job: str | None) -> list[str]:
    """A note for an NCCL-family file whose file name states numbered job `job` and that joins
    the traces of run `run` (log_name) stating another numbered job, and none of its (ids that
    disagree are never reconciled silently, jobid.py): [] otherwise."""
    stated = [f"job-{int(d)}" for d in JOB_IN_NAME.findall(run)]
    if not numbered(job) or not stated or job in stated:
        return []
    return [
        f"its file name states {job} and the traces beside it {stated[-1]}: it joins them in run "
        f"{run} (the only traces beside it); --run names another run"
    ]


def has_identity(ident: dict) -> bool:
    return bool(ident["comms"] or ident["procs"])


def linked(a: dict, b: dict) -> bool:
    """Whether two identities are one job: a shared communicator id (a commId is drawn at random per
    communicator), or a shared process without a contradiction (pids are reused: NCCL versions
    that differ, world communicators of different sizes, or time spans that do not overlap)."""
    if set(a["comms"]) & set(b["comms"]):
        return True
    if not set(a["procs"]) & set(b["procs"]):
        return False
    if a["versions"] and b["versions"] and not set(a["versions"]) & set(b["versions"]):
        return False
    if a["nranks"] and b["nranks"] and a["nranks"] != b["nranks"]:
        return False
    sa, sb = a["span"], b["span"]
    return not (sa and sb and (sa[1] < sb[0] or sb[1] < sa[0]))


def jobs(idents: list[dict]) -> list[list[int]]:
    """The files of one name grouped into jobs: the connected parts of `linked` (union-find),
    each a list of indices in input order, ordered by their first file; a file without identity
    is a job of its own."""
    parent = list(range(len(idents)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_key: dict[str, list[int]] = {}
    for i, ident in enumerate(idents):
        for k in ident["comms"] + ["p:" + p for p in ident["procs"]]:
            by_key.setdefault(k, []).append(i)
    for k, members in by_key.items():
        for j in members[1:]:
            # a communicator id links every file stating it; a process, those it does not contradict
            for i in members[:1] if not k.startswith("p:") else members:
                if i != j and root(i) != root(j) and linked(idents[i], idents[j]):
                    parent[root(j)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(idents)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def stored_identity(lake, run_id: str, source_id: str) -> dict:
    """log_identity of a committed NCCL-family source, from its parts of IDENTITY_TABLES."""
    want = {"comm_id", "host", "pid", "nranks", "nccl_version"}
    tables = {}
    for t in IDENTITY_TABLES:
        try:  # from its own part or its run's compacted files (pipeline/lake_manifest.py)
            df = lake.read_source(t, run_id, source_id, sorted(want))
        except (OSError, pl.exceptions.PolarsError):
            continue
        if df is not None:
            tables[t] = df
    return log_identity(tables)
