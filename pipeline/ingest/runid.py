"""The run id a run name is stored as (docs/usage.md "Runs", rule 1; pipeline/ingest/runs.py).

A run name is a path of directories, the job a file states last (`2026-11-04/job-4711/traces`,
`traces/job-4711`; pipeline/ingest/jobid.py). Its id must be a Hive partition value and a file
name (`<lake>/<table>/run=<id>/`), readable in a listing and typed in a shell:

- its parts joined with '.' (`2026-11-04.job-4711.traces`) when each holds only letters, digits
  and combining marks of any script (`über-job`, `日本語_run`, `हिन्दी` keep theirs), '.', '_'
  and '-', and the whole fits in MAX_ID bytes of UTF-8 (`日本語` is 9; a directory name holds
  255); names are compared in Unicode NFC, so a directory that macOS wrote decomposed (`u` +
  combining diaeresis) names the same run as one typed on Linux;
- a '.' of an id thus stands for a '/': a part holding a '.' of its own (a directory `v1.2`, a
  job value `llama-8b.exp3`) is followed by '-' and 6 hex digits of its SHA-1 (`_token`:
  `a.b/` is run `a.b-<6 hex>`, `a/b/` run `a.b`), so two different directories never share a
  run; a part that already ends so (an id given back) is kept;
- another character (a space, punctuation, a symbol or emoji, a bidi control) is replaced as
  safe_run_id (pipeline/lake.py) replaces it, with 6 hex digits of the name's SHA-1 after it
  (`my job/traces` is `my_job_traces-<6 hex>`, as tracelake always stored it), so two names
  never share an id;
- a longer name is shortened in its directories, never in a part that names a job
  (`job-4711/<long>/traces`, `<long>/job-4711`): the longest part is cut first, the last one
  (the job a trace's metadata states, up to 64 characters) kept at least LAST_MAX bytes, the
  others MIN_PART while there is room, then middle directories dropped; a part whose own '.'
  is kept keeps _token's '-<6 hex>' after it (`deeper.dir-<6 hex>`); the hash of the whole
  name follows (`nightly_llama70b_pretrain_nig.job-4711-<6 hex>`).

run_id_of is a pure function of the name, so a re-ingest names a file the same way. A stored id
given to `--run` names its run (given_run_id: a value that is a run id, is_run_id, is taken as it
is, since run_id_of('a.b') is the id of a directory `a.b`, not `a.b` itself).
"""

from __future__ import annotations

import posixpath
import re
import unicodedata

from ..lake import name_hash, safe_run_id
from .jobid import JOB_IN_NAME, job_of_name

MAX_ID = 100  # UTF-8 bytes of a run id before its hash (safe_run_id's limit, in characters)
LAST_MAX = 64  # bytes the last part keeps when a name is shortened (a job value's limit)
MIN_PART = 8  # bytes a shortened directory keeps while there is room
_SHORTENED = re.compile(r".+-[0-9a-f]{6}")  # an id with a hash after it (shortened, or _token's)


def _ok_char(c: str) -> bool:
    """A letter or digit of any script, a combining mark (the vowel signs of Devanagari: `हिन्दी`),
    '.', '_' or '-'; not a space, punctuation, a symbol or a format character (bidi controls)."""
    return c.isalnum() or c in "._-" or unicodedata.category(c) in ("Mn", "Mc")


def clean_part(part: str) -> bool:
    """Whether a directory name is kept as it is in a run id: _ok_char's characters, not starting
    or ending with '.' or '_' (nor '.' or '..')."""
    return bool(part) and all(_ok_char(c) for c in part) and part.strip("._") == part


def _token(part: str) -> str:
    """A clean part as it stands in a run id: itself, or (holding a '.', which in an id stands for
    a '/') itself with '-' and its hash after it, unless it already ends so (an id given back)."""
    return f"{part}-{name_hash(part)}" if "." in part and not _SHORTENED.fullmatch(part) else part


def is_run_id(s: str) -> bool:
    """Whether s is a run id as this module writes them (one part of _ok_char's characters, not
    starting or ending with '.' or '_', in NFC, at most MAX_ID UTF-8 bytes, or MAX_ID + 7 with a
    hash after it): `--run` given one names that run (given_run_id)."""
    return (
        clean_part(s)
        and unicodedata.is_normalized("NFC", s)
        and (_bytes(s) <= MAX_ID or (_bytes(s) <= MAX_ID + 7 and _SHORTENED.fullmatch(s) is not None))
    )


def given_run_id(value: str) -> str:
    """The run id a `--run` value names: the value itself when it is a run id (is_run_id: `job1.traces`
    as `tracelake runs` prints it), else run_id_of's id of it as a directory path (`job1/traces`
    is job1.traces, `v1.2/` is v1.2-<6 hex>, `my job` my_job-<6 hex>)."""
    nfc = unicodedata.normalize("NFC", value)
    return nfc if is_run_id(nfc) else run_id_of(run_path(value))


# what follows a directory's run id in the id of a run named by a numbered job its traces state
# (jobid.py: `meta.job-4712`), or of one moved from it (runs.moved_run: `_<start>`, `_<8 hex>`)
_JOB_TAIL = re.compile(r"job-\d+(?:_[0-9A-Za-z]+)?")


def run_path(value: str) -> str:
    """A `--run` value in Unicode NFC; one written as a path (holding a '/', or starting with '.'
    and a '/') normalised as the path form of a directory is: `./a/b`, `a/./b`, `a//b/` and
    `a/c/../b` are `a/b` (posixpath.normpath: '..' removed lexically, as a typed path reads)."""
    nfc = unicodedata.normalize("NFC", value)
    if "/" not in nfc:
        return nfc
    norm = posixpath.normpath(nfc)
    return "/" if norm in ("/", "//") else norm


def resolve_run(value: str, known) -> list[str]:
    """The runs of `known` (run ids) a `--run` value names, for every command (ingest adds to it,
    the others read it): the value as a run id as printed, else as a directory path (run_path,
    then run_id_of; safe_run_id's id, as lakes written before stored it), first found, as [id];
    else the runs a directory's traces named by the numbered jobs they state, or moved from them
    (`meta` finds `meta.job-4712`: _JOB_TAIL), sorted, as a list of one or several; else [] (no
    run of the lake: ingest starts one, given_run_id)."""
    path = run_path(value)
    for name in dict.fromkeys((value, unicodedata.normalize("NFC", value), path)):
        for rid in (name, run_id_of(name), safe_run_id(name)):
            if rid in known:
                return [rid]
    prefix = run_id_of(path) + "."
    return sorted(k for k in known if k.startswith(prefix) and _JOB_TAIL.fullmatch(k[len(prefix) :]))


def id_with_job(run_id: str, job: str) -> str:
    """The id run_id_of gives `<name>/<job>` for a name of clean parts whose id is run_id
    (runs.log_name: the traces beside a log that state no job), when it fits in MAX_ID bytes: the
    run id, '.', the job as a part (_token); else run_id_of of the pair (a long name's shortened id
    depends on the whole name, which run_id does not give back)."""
    joined = f"{run_id}.{_token(job)}"
    return joined if _bytes(joined) <= MAX_ID else run_id_of(f"{run_id}/{job}")


def _replaced(name: str) -> str:
    """safe_run_id's replacement (runs of other characters -> '_', ends stripped of '.' and '_'),
    keeping letters and digits of any script."""
    out, bad = [], False
    for c in name:
        if _ok_char(c):
            out.append(c)
            bad = False
        elif not bad:
            out.append("_")
            bad = True
    return "".join(out).strip("._")


def _bytes(s: str) -> int:
    """The length of a name in a file system's terms: UTF-8 bytes (a directory name has at most
    255 of them on Linux and macOS; `run=` and the id must fit)."""
    return len(s.encode("utf-8", "surrogateescape"))


def run_id_of(name: str) -> str:
    """The run id of a run name (module doc): a str of letters, digits, combining marks, '.', '_',
    '-', at most MAX_ID UTF-8 bytes plus '-' and 6 hex digits. Never raises; '' and '/' are
    stored as safe_run_id stores them (`run-42099b`)."""
    name = unicodedata.normalize("NFC", name)
    stripped = name.rstrip("/") or name
    parts = stripped.split("/") if stripped not in ("", "/") else []
    if not parts or (stripped.isascii() and len(stripped) <= MAX_ID and "/" not in stripped):
        rid = safe_run_id(stripped)  # ASCII single parts: as tracelake always stored them, ...
        return _token(rid) if rid == stripped else rid  # ... but for a '.' of their own
    if all(clean_part(p) for p in parts):
        joined = ".".join(_token(p) for p in parts)
        if _bytes(joined) <= MAX_ID:
            return joined
        if _SHORTENED.fullmatch(joined) and len(parts) == 1 and _bytes(joined) <= MAX_ID + 7:
            return joined  # an id this function shortened, given back (idempotent)
        return _shortened(parts, stripped)
    replaced = _replaced(stripped)
    if _bytes(replaced) <= MAX_ID:
        return (replaced or "run") + "-" + name_hash(stripped)
    return _shortened([_replaced(p) for p in parts], stripped)


def _shortened(parts: list[str], name: str) -> str:
    """parts joined with '.' in MAX_ID UTF-8 bytes (module doc), then '-' and the hash of the
    whole name. Until the name fits: the longest part (in bytes) above its floor loses a character
    (floors, in bytes: a part naming a job, all of it, up to LAST_MAX characters around the job;
    the last part, LAST_MAX, as a job a trace's metadata states has up to 64; another,
    MIN_PART); then middle directories are dropped; then the last part, if it names no job, loses
    characters; then the longest part left."""
    parts = [p for p in parts if p] or ["run"]
    job = [job_of_name(p) is not None for p in parts]
    cut = [_around_job(p, LAST_MAX) if j and len(p) > LAST_MAX else p for p, j in zip(parts, job)]
    # a part's own '.' keeps its marker while it is kept (`deeper.dir-<6 hex>`, as _token writes it)
    mark = [f"-{name_hash(p)}" if "." in p.strip("._") else "" for p in parts]
    lens = [len(p) for p in cut]
    last = len(parts) - 1

    def sized(i: int) -> int:  # bytes part i takes: its kept characters, and its marker
        kept = cut[i][: lens[i]].strip("._")
        return _bytes(cut[i][: lens[i]]) + (len(mark[i]) if mark[i] and "." in kept else 0)

    size = [sized(i) for i in range(len(cut))]
    floor = [
        n if j else min(n, (LAST_MAX if i == last else MIN_PART) + len(mark[i]))
        for i, (n, j) in enumerate(zip(size, job))
    ]

    def total() -> int:
        return sum(n for n in size if n) + sum(1 for n in size if n) - 1

    while total() > MAX_ID:
        free = [i for i, n in enumerate(size) if n > floor[i]]
        drop = [i for i, n in enumerate(lens) if n and not job[i] and i != last]
        if free:  # the longest part above its floor loses a character
            i = max(free, key=lambda j: (size[j], -j))
            lens[i] -= 1
            size[i] = sized(i)
            continue
        if drop:  # a middle directory goes
            lens[drop[len(drop) // 2]] = size[drop[len(drop) // 2]] = 0
            continue
        i = last if not job[last] and lens[last] > 1 else max(range(len(lens)), key=lambda j: (size[j], -j))
        lens[i] -= 1  # the last part, if it names no job; else (a last resort) the longest job part
        size[i] = sized(i)
    kept = [(p[:n].strip("._"), m) for p, n, m in zip(cut, lens, mark) if n and p[:n].strip("._")]
    out = ".".join(k + (m if m and "." in k else "") for k, m in kept)
    return (out or "run") + "-" + name_hash(name)


def suffixed(run_id: str, suffix: str) -> str:
    """The id of run run_id with `suffix` after it (`_<start>` of a moved run: runs.moved_run),
    the suffix kept whole: run_id + suffix when that is a run id that fits (MAX_ID bytes), else
    run_id cut to make room, with the hash of the whole after it."""
    whole = run_id + suffix
    if is_run_id(whole):
        return whole
    room = MAX_ID - _bytes(suffix)
    head = run_id
    while head and _bytes(head) > room:
        head = head[:-1]
    return (head.strip("._") or "run") + suffix + "-" + name_hash(whole)


def _around_job(part: str, cap: int) -> str:
    """A kept part cut to `cap` characters: those ending with the job it names, else its first."""
    m = JOB_IN_NAME.search(part)
    end = max(m.end() if m else 0, cap)
    return part[end - cap : end]
