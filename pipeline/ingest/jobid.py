"""The job a file names, for its run's name (docs/usage.md "Runs", rule 1; pipeline/ingest/runs.py).

A run is named by its directory; a file that also states the job it belongs to gets that job
after its directory's name (`traces/job-4711_rank3.json` is in run `traces.job-4711`), so the
ranks of one job share a readable run and two jobs' files in one directory get a run each. Where
the job comes from, first found wins:

1. The file's own name (an archive member's or an object's last path part): a job keyword
   (`job`, `jobid`, `job_id`, `job-id`, `slurm`, `slurm_job`, `slurm-job-id`, ...; any case)
   standing at the start of the name or after a character that is not a letter or digit, then
   at most one of `-`, `_`, `.`, `=`, then the job's digits: `job-12345_rank3.json`,
   `llama_slurm-12345.3.pt.trace.json`, `jobid=12345.rank0.json` all name job `job-12345`.
   Digits that no keyword names are never a job: Kineto's tensorboard_trace_handler writes
   `<host>_<pid>.<ms>.pt.trace.json` (HTA's corpus: `worker0_step_12.1694128201545...`,
   `benchmark_result_2869224_1695835535_trace.json`, `rank-34.Jul_15_10_52_41.1074...`), whose
   pid and time differ from rank to rank; taking them would split a job into one run per rank.
2. What the file states about itself (job_of_metadata), read only when its name states no job:
   a Kineto trace's top-level `job_id`, `jobid`, `slurm_job_id`, then `run_id`, then
   `group_trace_id` (the id Kineto's on-demand profiling gives the traces of all ranks
   collected together; `trace_id` is per process and is not used); values added with
   `torch.profiler.profile.add_metadata_json`; keys as written here, in lower case. A value of
   digits, or a job keyword and digits as rule 1 reads them (`slurm-4711`, `JOB-4711`), is job
   `job-<digits>`; any other value of 1 to 64 letters, digits, `.`, `_`, `-`
   is used as it is; other values are ignored (a note says so). An Nsight Systems export: the
   environment its capture recorded for the profiled process (META_DATA_CAPTURE), of which
   only `SLURM_JOB_ID`, `PBS_JOBID`, `LSB_JOBID`, `TORCHELASTIC_RUN_ID` (unless `none`, its
   default) are read, in that order. Not read: NCCL-family files (hosts and pids name
   processes, not jobs).

The job is put after the directory's name unless one of its directories already states it (names
the same job by rule 1, or equals the value): `job-4711/job-4711_rank0.json` stays in run
`job-4711`, `job-4711/traces/job-4711_rank0.json` in `job-4711.traces` (names_job). Ids that
disagree are said in a note of the file, never reconciled silently (stated_job: the file name's
job against its metadata's, the directory's against the file's; Runs.job_note in runs.py: the
traces of one directory split between jobs). NCCL-family files are named by their directory
and the file name's job only, then join the traces beside them (runs.log_name) and group by
what their communicators and processes say (runs.py rule 4). An archive's top member stating a
job is named by the archive's directory with it (archive.member_run_name: as if the archive
were unpacked where it lies). Everything here is a pure function of the name or the parsed
values, so a re-ingest names a file the same way.
"""

from __future__ import annotations

import re

_KEYWORD = r"(?:slurm[-_]?job|slurm|job)(?:[-_]?id)?"
JOB_IN_NAME = re.compile(rf"(?<![a-z0-9]){_KEYWORD}[-_.=]?(\d+)(?!\d)", re.IGNORECASE)
# top-level keys of a Kineto trace naming its job, in order (module doc, 2)
METADATA_KEYS = ("job_id", "jobid", "slurm_job_id", "run_id", "group_trace_id")
# environment variables naming a capture's job (an Nsight Systems export's META_DATA_CAPTURE)
ENV_KEYS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "TORCHELASTIC_RUN_ID")
_VALUE = re.compile(r"[A-Za-z0-9._-]{1,64}")


def job_of_name(name: str) -> str | None:
    """`job-<digits>` for a file name that states its job (module doc, 1), else None."""
    m = JOB_IN_NAME.search(name)
    return f"job-{int(m.group(1))}" if m else None


def job_of_value(value) -> str | None:
    """The job a metadata value names (module doc, 2): `job-<n>` for digits (an int, or text of
    digits) and for a job keyword with digits (`slurm-4711`, `JOB-4711`, `job_id=4711`: as
    job_of_name reads a file name), the text itself for another id (1-64 of letters, digits,
    '.', '_', '-'), else None (also for True/False, null, '', 'none' and nested values)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return f"job-{value}" if value >= 0 else None
    if not isinstance(value, str):
        return None
    v = value.strip()
    if v.isascii() and v.isdigit():
        return f"job-{int(v)}"
    m = JOB_IN_NAME.fullmatch(v) if v.isascii() else None
    if m is not None:  # `slurm-4711`, `JOB-4711`: the job a file name `slurm-4711.json` states
        return f"job-{int(m.group(1))}"
    if v.lower() in ("", "none", "null") or not _VALUE.fullmatch(v) or v in (".", ".."):
        return None
    return v


def job_of_metadata(values: dict, keys=METADATA_KEYS) -> tuple[str | None, str | None]:
    """(job, note) from a file's metadata (`values`: key -> value; keys compared ignoring case),
    the first of `keys` present: its job_of_value, or None with a note when its value names no
    job. (None, None) when no key is present."""
    return _metadata_job(values, keys)[:2]


def _metadata_job(values: dict, keys) -> tuple[str | None, str | None, str | None]:
    """job_of_metadata's (job, note) and the key they come from (None when no key is read); a key
    whose value is empty, 'none' or 'null' is passed over for the next."""
    lower = {str(k).lower(): v for k, v in values.items()}
    for k in keys:
        if k.lower() in lower and lower[k.lower()] is not None:
            v = lower[k.lower()]
            job = job_of_value(v)
            if job is not None:
                return job, None, k
            if not (isinstance(v, str) and v.strip().lower() in ("", "none", "null")):
                return None, f"metadata {k} {str(v)[:40]!r} names no job (not an id): run named without it", k
    return None, None, None


def stated_job(name: str, dir_name: str, values: dict, keys=METADATA_KEYS) -> tuple[str | None, list[str]]:
    """(job, notes) of a file by what it states (module doc; pipeline/ingest/prepare.py): job, the
    one its metadata `values` (job_of_metadata with `keys`) name, to put after its directory's
    run name, or None when its file name `name` states a job (that one is used: it is read
    before the file, so a re-ingest or a failed file names the same run) or none is stated.
    notes (one line each, so two ids are never reconciled silently): the file name's job and
    the metadata's differ; the directory (`dir_name`, its run name without a job) names another
    job than the one the file states (the run holds both); a metadata value names no job. Only
    numbered jobs (`job-<digits>`) are compared: a run_id or group_trace_id of other text
    names a run or a collection, which a job directory may well hold."""
    by_name = job_of_name(name)
    job, why, key = _metadata_job(values, keys)
    notes = [why] if why else []
    if by_name is not None and numbered(job) and job != by_name:
        notes.append(
            f"its file name states {by_name} and its metadata {key} {job}: the run is named by "
            "the file name's (read before the file; rename it or give --run to use the other)"
        )
    stated = by_name or job
    dir_jobs = [j for j in (job_of_name(p) for p in dir_name.rstrip("/").split("/")) if j]
    if numbered(stated) and dir_jobs and stated not in dir_jobs:
        notes.append(
            f"its directory names {dir_jobs[-1]} and the file states {stated}: "
            f"its run name holds both ({with_job(dir_name, stated)}); --run names it otherwise"
        )
    return (job if by_name is None else None), notes


def numbered(job: str | None) -> bool:
    """Whether a job is `job-<digits>` (a scheduler's job id, from a name or a value of digits)."""
    return job is not None and job_of_name(job) == job


def names_job(name: str, job: str) -> bool:
    """Whether one of the directories of run name `name` ('job-4711/traces') already names `job`:
    is it, or states it by rule 1 (module doc: `slurm_4711` names job-4711)."""
    return any(p == job or job_of_name(p) == job for p in name.rstrip("/").split("/"))


def with_job(name: str, job: str | None) -> str:
    """The run name of a file whose directory gives `name` and that states `job`: name/job,
    unless one of name's directories already names that job (names_job: `job-4711/traces` with
    job-4711 stays `job-4711/traces`, not a name holding the job twice); name itself without a job."""
    if not job:
        return name
    if names_job(name, job):
        return name
    return job if name in ("", "/") else f"{name.rstrip('/')}/{job}"
