"""Ingest: find input files, detect their format, parse them and write them into the lake.

One bad file never stops a batch: it gets a `sources` row with status=failed and a one-line
error, and the rest are ingested. A path that does not exist, a directory that cannot be read or
a special file (FIFO, device) is reported the same way. Formats: Kineto JSON (plain or .gz, read
as a stream: pipeline/ingest/kineto.py); NCCL_DEBUG logs, nccl-tests output, PyTorch watchdog
messages, Flight Recorder dumps, RAS reports (pipeline/ingest/nccl.py; they hold no rank's trace
and claim no rank); Nsight Systems SQLite exports, parquetdir exports (`*_pqtdir/`) and
.nsys-rep/.qdrep reports (pipeline/ingest/nsys.py; one report may hold several ranks); .tar,
.tar.gz/.tgz and .zip archives of any of these, read in place (pipeline/ingest/archive.py).

Run and rank assignment:
- run_id = --run, else the name of the file's parent directory (archive members: the member's
  parent directory inside the archive, else the archive's name without its suffix), sanitized for
  hive paths (a name that had to be changed gets a short hash of the original, so different names
  never merge).
- rank = distributedInfo.rank, else a number in the file name (rank-3, rank3, rank_3, worker3;
  for a member, its own name), else --rank, else 0 (rank_source = default). Ranks must lie in
  [0, 2^31).
- Two different files never land silently on one (run, rank): the later one (in input order)
  moves to run '<run>_<source_id[:8]>' and both the note and the printed message say so. A new
  rank file of a run already in the lake joins that run.
- A file whose content (sha256) is already in the same run and did not fail is skipped unless
  force (re-running over an archive reads each file once, to hash it).
- Truncated traces keep every complete event: status 'partial', with the unreadable byte count in
  the sources column `unreadable_bytes` (0 for a Kineto trace read whole; null for formats that do
  not count it and for failed files), in `notes` and in FileResult.unreadable_bytes.

Work is split into units (a file, an archive member, or a whole compressed tar) that are parsed
and staged (pipeline/lake.py: Lake.stage) by workers — this process (jobs=1), a process pool of
the standard library (jobs>1), or an existing Dask cluster (scheduler=ADDRESS; the lake and the
inputs must then be on a file system the workers share) — while this process commits the results
in input order, under the lake's lock. The lake is therefore the same whatever the parallelism.
"""

from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import stat
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable

import duckdb
import polars as pl

from .. import __version__
from .. import schema as sch
from ..lake import Lake, LakeError, Staged, one_line, safe_run_id
from . import archive as arc
from . import kineto, nccl, nsys

TRACE_SUFFIXES = (".json", ".json.gz", ".gz", ".sqlite", ".nsys-rep", ".qdrep", ".zip", ".pkl", ".pickle", ".tar", ".tgz")
# text outputs (NCCL_DEBUG logs, nccl-tests, watchdog messages, RAS): found by a directory search
# only when their first 64 KiB look like one (pipeline/ingest/nccl.py sniff); named files always
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".jsonl")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
MAX_RANK = 2**31 - 1
IN_MEMORY_LIMIT = 1 << 30   # formats read whole (NCCL-family logs)
PARALLEL_MIN_BYTES = 16 << 20  # below this much input a process pool costs more than it saves


def max_uncompressed_bytes() -> int:
    return arc.max_uncompressed_bytes()


@dataclass
class FileResult:
    path: str
    run_id: str | None
    rank: int | None
    status: str  # ok | partial | failed | skipped
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    source_id: str | None = None
    uncompressed_bytes: int = 0
    unreadable_bytes: int = 0


@dataclass
class Problem:
    """A path that could not even be opened as a file (missing, unreadable directory, FIFO)."""
    path: Path
    error: str


def exclude_patterns(exclude: Iterable[str] | None) -> list[str]:
    """--exclude patterns as matched: a leading './' and trailing '/' dropped. Raises ValueError
    for a pattern that is empty or only slashes."""
    out = []
    for pat in exclude or ():
        p = pat[2:] if pat.startswith("./") else pat
        p = p.rstrip("/")
        if not p:
            raise ValueError(f"--exclude {pat!r}: empty pattern")
        out.append(p)
    return out


def excluded(relpath: str, patterns: list[str] | None) -> bool:
    """True when a file, directory or archive member is left out by --exclude: the name or the
    path (relative to the directory searched, or inside the archive; '/'-separated) of it or of
    one of its directories matches one of the glob patterns (fnmatch: `*` also matches `/`), so
    `checkpoints` leaves out every checkpoints directory at any depth."""
    if not patterns:
        return False
    parts = PurePosixPath(relpath).parts
    for i, name in enumerate(parts):
        prefix = "/".join(parts[: i + 1])
        if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(prefix, p) for p in patterns):
            return True
    return False


def discover(paths: Iterable[str | Path], problems: list | None = None, exclude: Iterable[str] | None = None,
             left_out: list | None = None, roots: dict | None = None) -> list[Path]:
    """Files named by `paths`, minus those `exclude` leaves out (see excluded(): files and
    directories found below a directory given, and files given by their name; a directory given is
    always searched), appended to `left_out` when given: files as given, directories searched recursively for
    *.json / *.json.gz / *.gz / *.sqlite / *.nsys-rep / *.qdrep / *.zip / *.pkl / *.pickle /
    *.tar / *.tgz, and *.log / *.txt / *.out / *.err / *.jsonl that look like NCCL-family output
    (symlinks to directories are not followed); an nsys parquetdir export (`*_pqtdir/`) is one
    input, given or found. Archives are listed as files (ingest_paths opens them). Paths that do
    not exist, are not regular files or directories, or cannot be listed go to `problems` (a list
    of Problem) when given; otherwise the first raises FileNotFoundError. roots, when given, maps
    each file found by searching a directory given (by its resolved path) to (that directory,
    resolved; the path of the file's directory below it: its run name, archive.FileInput); of two
    directories given that both hold it, the outer one, whatever their order."""
    out: list[Path] = []

    def problem(p: Path, msg: str):
        if problems is None:
            raise FileNotFoundError(f"{p}: {msg}")
        problems.append(Problem(p, msg))

    exclude = exclude_patterns(exclude)

    def root_of(f: Path, top: Path, rel: Path) -> None:
        if roots is not None:
            key = f.resolve()
            old = roots.get(key)
            if old is None or old[0].is_relative_to(top):
                roots[key] = (top, rel.as_posix())

    def leave(f: Path, rel: str) -> bool:
        if excluded(rel, exclude):
            if left_out is not None:
                left_out.append(f)
            return True
        return False

    for p in paths:
        p = Path(p)
        if not p.is_dir() and leave(p, p.name):
            continue
        if p.is_dir() and nsys.detect(p):
            out.append(p)
        elif p.is_dir():
            top = p.resolve()
            for root, dirs, files in os.walk(p, onerror=lambda e: problem(Path(e.filename), f"cannot list directory: {e.strerror}")):
                rel = Path(root).relative_to(p)
                dirs[:] = sorted(d for d in dirs if not leave(Path(root) / d, (rel / d).as_posix()))
                for d in [d for d in dirs if d.endswith("_pqtdir")]:
                    dirs.remove(d)
                    out.append(Path(root) / d)
                    root_of(out[-1], top, rel)
                for name in sorted(files):
                    f = Path(root) / name
                    if leave(f, (rel / name).as_posix()):
                        continue
                    root_of(f, top, rel)
                    if name.lower().endswith(TRACE_SUFFIXES) and f.is_file():
                        out.append(f)
                    elif name.lower().endswith(TRACE_SUFFIXES) and f.is_symlink() and not f.exists():
                        problem(f, "broken symbolic link")
                    elif name.lower().endswith(LOG_SUFFIXES) and f.is_file() and _looks_like_log(f):
                        out.append(f)
        elif p.is_file():
            out.append(p)
        elif p.exists() or p.is_symlink():
            problem(p, "not a regular file or directory" if p.exists() else "broken symbolic link")
        else:
            problem(p, "no such file or directory")
    seen, uniq = set(), []
    for f in out:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            uniq.append(f)
    return uniq


def _looks_like_log(f: Path) -> bool:
    try:
        with open(f, "rb") as fh:
            head = fh.read(65536)
    except OSError:
        return True  # let ingest report why it cannot be read
    return nccl.sniff(head, f.name) is not None


def rank_from_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def read_bytes(path: Path, limit: int | None = None) -> tuple[bytes, bytes]:
    """(raw bytes as stored, decompressed bytes), read whole. gzip is detected by its magic
    number. Raises TraceError for corrupt gzip or output beyond `limit` bytes, OSError if
    unreadable. (Ingest itself streams; this is for callers that want the bytes.)"""
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise kineto.TraceError("not a regular file")
        raw = f.read()
    if raw[:2] != arc.GZIP_MAGIC:
        return raw, raw
    import io

    s = arc.Inflate(io.BytesIO(raw), limit=limit)
    data = s.read()
    if s.truncated:
        raise kineto.TraceError("corrupt or truncated gzip (the stream ends before its end marker)")
    return raw, data


def content_sha256(path: Path) -> str | None:
    """SHA-256 of a file's bytes (archive.sha256_of); of a directory (nsys parquetdir): of its
    sorted member names and their bytes. None for special files. Raises OSError."""
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(path.rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(path)).encode("utf-8", "surrogateescape") + b"\x00")
                h.update(bytes.fromhex(content_sha256(f) or ""))
        return h.hexdigest()
    try:
        return arc.sha256_of(arc.FileInput(str(path)))
    except kineto.TraceError:  # not a regular file
        return None


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


# ------------------------------------------------------------------ units of work

@dataclass
class Options:
    lake: str
    run: str | None = None
    rank: int | None = None
    force: bool = False
    comm_patterns: list[str] | None = None
    step_regex: str | None = None
    exclude: list[str] | None = None  # glob patterns of files and archive members to leave out
    # the ingesting process's TRACELAKE_* settings (limits, test hooks), applied in each worker:
    # a pool's or a cluster's workers do not share this process's environment
    env: dict = field(default_factory=lambda: {k: v for k, v in os.environ.items() if k.startswith("TRACELAKE_")})


def _apply_env(env: dict) -> None:
    for k in [k for k in os.environ if k.startswith("TRACELAKE_") and k not in env]:
        del os.environ[k]
    os.environ.update(env)


@dataclass
class Prepared:
    """A unit's outcome from a worker: the sources row and the staged parts, not yet committed.
    row['run_id'] is the natural run; the committing process may move the source (rank claims)."""
    path: str
    run_id: str
    status: str  # ok | partial | failed | skipped
    row: dict | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    source_id: str | None = None
    sha: str | None = None
    rank: int | None = None
    rank_list: list[int] | None = None  # ranks this source claims (None: claims none)
    staged: Staged | None = None
    uncompressed_bytes: int = 0
    unreadable_bytes: int = 0
    oserror: bool = False  # failed with OSError (the committer checks that the lake is writable)


@dataclass
class Unit:
    kind: str  # input (a FileInput/MemberInput), targz (a whole compressed tar), refused, problem
    item: object
    size: int = 0
    below: str | None = None  # targz: the archive's directory below the directory given (member_run_name)


def _run_for(name: str, run: str | None) -> str:
    return safe_run_id(run) if run else safe_run_id(name)


def _moved(run_id: str, source_id: str) -> str:
    return safe_run_id(f"{run_id}_{source_id[:8]}")


# in the note of a file not put in its named run (_Runs.claim), before the run it was put in
_PLACED = "; this file was put in run "
# the note of a file moved because its rank was taken (_Runs.claim): names the run it was named
_HELD_NOTE = re.compile(r" of run (\S+) is already held by source ")


def _stored_sources(src: pl.DataFrame) -> pl.DataFrame:
    """The sources rows that did not fail, with column `named`: the run each was named
    (sources.named_run_id: what --run or its directory named it, before it was moved to another
    run); in lakes written before that column, the run its rank-collision note names, else its
    run_id."""
    ok = src.filter(pl.col("status") != "failed")
    named = []
    for run, n, notes in zip(ok["run_id"].to_list(), ok["named_run_id"].to_list(), ok["notes"].to_list()):
        if n is None:
            m = next((m for x in (notes or []) if (m := _HELD_NOTE.search(x))), None)
            n = m.group(1) if m else run
        named.append(n)
    return ok.with_columns(named=pl.Series(named, dtype=pl.String))


def _done_index(stored: pl.DataFrame) -> dict[tuple[str, str | None], tuple[str, bool]]:
    """(content sha256, named run) and (content sha256, None) -> (the run the content is stored
    in, False), for the sources of _stored_sources(); files committed by this ingest are added
    with True (_commit). A file moved because its rank was taken is stored in another run than
    it was named (_Runs.claim). Without --run, content already in any run counts as in the lake
    (the None key): the same bytes are the same trace, whichever directory it was reached from."""
    done: dict = {}
    for h, n, r in zip(stored["content_sha256"].to_list(), stored["named"].to_list(), stored["run_id"].to_list()):
        done[(h, n)] = (r, False)
        done.setdefault((h, None), (r, False))
    return done


def _entry(done, sha: str, run_id: str, any_run: bool):
    return done.get((sha, None) if any_run else (sha, run_id))


def _is_done(done, sha: str, run_id: str, any_run: bool) -> bool:
    """Whether content `sha` named run_id is already in the lake: in run_id (--run given), or in
    any run (any_run: no --run)."""
    return _entry(done, sha, run_id, any_run) is not None


def _stored_run(done, sha: str, run_id: str, any_run: bool) -> str:
    """The run a file already in the lake is stored in: its named run, the one it was moved to
    when its rank was taken (_Runs.claim), or (any_run) the run the same content is in."""
    return (_entry(done, sha, run_id, any_run) or (run_id,))[0]


def _skip_note(done, sha: str, run_id: str, any_run: bool) -> str:
    run, in_batch = _entry(done, sha, run_id, any_run) or (run_id, False)
    where = f", in run {run}" if run != run_id else ""
    if in_batch:
        return f"same content as a file ingested earlier in this batch{where}; --force re-ingests"
    return f"already in the lake (same content{where}); --force re-ingests"


def _base_row(display: str, run_id: str, sha: str, size: int, fmt: str, t0: int) -> dict:
    return {"source_id": sha[:16], "run_id": run_id, "path": display, "format": fmt, "content_sha256": sha,
            "size_bytes": size, "schema_version": sch.SCHEMA_VERSION, "tracelake_version": __version__,
            "ingested_at_ns": t0}


def _failed(display: str, run_id: str, error: str, sha: str | None = None, size: int = 0, fmt: str = "unknown",
            base: dict | None = None, oserror: bool = False, uncompressed: int = 0) -> Prepared:
    sha = sha or hashlib.sha256(("unreadable:" + display).encode("utf-8", "surrogateescape")).hexdigest()
    error = one_line(error)
    row = {**(base or _base_row(display, run_id, sha, size, fmt, time.time_ns())), "status": "failed", "error": error}
    row["run_id"] = run_id
    # a failed file's id also hashes its path: two bad files with the same bytes keep a row each
    sid = hashlib.sha256(f"{sha}\x00{display}".encode("utf-8", "surrogateescape")).hexdigest()[:16]
    row["source_id"] = sid
    return Prepared(display, run_id, "failed", row, error, [], sid, sha, oserror=oserror, uncompressed_bytes=uncompressed)


def _sha_or_none(inp) -> str | None:
    try:
        return arc.sha256_of(inp)
    except (OSError, MemoryError, kineto.TraceError, Exception):
        return None


def _work(unit: Unit, opts: Options, done) -> list[Prepared]:
    """Parse and stage one unit (in a worker). Never raises for a bad input."""
    _apply_env(opts.env)
    lake = Lake(opts.lake)
    if unit.kind == "targz":
        return _work_targz(unit.item, opts, done, lake, unit.below)
    inp = unit.item
    if os.environ.get("TRACELAKE_CRASH_ON") == inp.name:  # test hook: this worker dies (tests/test_parallel.py)
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    try:
        return [_prepare(inp, opts, done, lake)]
    except MemoryError:
        err, ose = "out of memory while ingesting this file", False
    except OSError as e:
        err, ose = f"cannot read: {e.strerror or e}", True
    except Exception as e:  # never let one file stop the batch; say what happened
        err, ose = f"could not ingest ({type(e).__name__}: {one_line(str(e))[:200]}); please report this file", False
    sha = _sha_or_none(inp)
    try:
        size = inp.size()
    except OSError:
        size = 0
    return [_failed(inp.display, _run_for(inp.run_name, opts.run), err, sha, size, oserror=ose)]


def _prepare(inp, opts: Options, done, lake: Lake, sha: str | None = None) -> Prepared:
    run_id = _run_for(inp.run_name, opts.run)
    if isinstance(inp, arc.FileInput):
        path = Path(inp.path)
        fmt = nsys.detect(path)
        if fmt is not None:
            return _prepare_nsys(path, inp.display, fmt, run_id, opts, done, lake)
    t0 = time.time_ns()
    size = inp.size()
    if sha is None:
        sha = arc.sha256_of(inp)
    source_id = sha[:16]
    if not opts.force and _is_done(done, sha, run_id, opts.run is None):
        return Prepared(inp.display, _stored_run(done, sha, run_id, opts.run is None), "skipped",
                        notes=[_skip_note(done, sha, run_id, opts.run is None)], source_id=source_id, sha=sha)
    base = _base_row(inp.display, run_id, sha, size, "kineto_json", t0)
    with inp.open() as raw:
        try:
            stream = arc.Inflate(raw)
            peek = arc.Peek(stream.read)
        except kineto.TraceError as e:
            return _failed(inp.display, run_id, str(e), sha, size, base={**base, "uncompressed_bytes": None})
        head = peek.head
        if not isinstance(inp, arc.FileInput) and (head.startswith(nsys.SQLITE_MAGIC) or head[:4] in arc.ZIP_MAGIC
                                                   or inp.name.lower().endswith((".nsys-rep", ".qdrep", ".sqlite"))):
            return _prepare_extracted(inp, peek, sha, size, run_id, opts, done, lake)
        log_fmt = nccl.sniff(head, inp.name)
        if log_fmt is not None:
            data = peek.read(IN_MEMORY_LIMIT + 1)
            rest = b""
            while len(data) <= IN_MEMORY_LIMIT and (rest := peek.read(IN_MEMORY_LIMIT + 1 - len(data))):
                data += rest
            if len(data) > IN_MEMORY_LIMIT:
                return _failed(inp.display, run_id, f"log larger than {IN_MEMORY_LIMIT >> 20} MB", sha, size, base=base)
            return _prepare_log(inp.name, data, log_fmt, lake, {**base, "uncompressed_bytes": len(data)})
        return _prepare_kineto(inp, peek, stream, base, run_id, opts, lake)


def _prepare_kineto(inp, peek, stream, base: dict, run_id: str, opts: Options, lake: Lake) -> Prepared:
    display, source_id = inp.display, base["source_id"]
    scratch = lake.scratch()
    parsed = None
    try:
        err = None
        try:
            parsed = kineto.parse_stream(peek.read, comm_patterns=opts.comm_patterns, spool_dir=scratch)
        except kineto.NotKinetoError as e:
            err = str(e)
            base["format"] = "unknown"
        except kineto.TraceError as e:
            err = str(e)
            head = peek.head
            if (err.startswith(("not valid JSON", "not a Kineto trace: wrong JSON shape", "empty file")) and head.lstrip()[:1] not in (b"{", b"[")
                    and not inp.name.lower().endswith((".json", ".json.gz"))) and head.strip():
                err = ("not a Kineto trace, Nsight Systems export or NCCL-family log: "
                       "neither JSON nor NCCL_DEBUG / nccl-tests / PyTorch NCCL lines")
                base["format"] = "unknown"
            if inp.name.lower().endswith(".gz") and not stream.gzip and err.startswith(("not valid JSON", "not a Kineto trace", "empty file")):
                err = f"named .gz but not gzip (no gzip header); {err}"
        except RecursionError:
            err = "JSON nested too deeply"
        if stream.truncated and stream.out_bytes == 0:
            err = "corrupt or truncated gzip: nothing could be decompressed"
        elif stream.truncated and (err is not None or parsed is None or parsed.event_count == 0):
            err = f"corrupt or truncated gzip (the stream ends early){': ' + err if err else ''}"
        base["uncompressed_bytes"] = stream.out_bytes if err is None else None
        if parsed is not None and parsed.event_count == 0:
            err = "trace has no events"
        elif parsed is not None and parsed.trace_start_ns is None and err is None:
            err = f"none of its {parsed.event_count} events has a readable time: nothing to store"
        r = None
        if err is None:
            if parsed.rank is not None:
                r, rsrc = parsed.rank, "distributed_info"
            elif rank_from_name(inp.name) is not None:
                r, rsrc = rank_from_name(inp.name), "file_name"
            elif opts.rank is not None:
                r, rsrc = opts.rank, "cli"
            else:
                r, rsrc = 0, "default"
            if not 0 <= r <= MAX_RANK:
                err = f"rank {r} ({rsrc}) is outside 0..{MAX_RANK}"
        if err is not None:
            return _failed(display, run_id, err, base["content_sha256"], base["size_bytes"], base=base)
        notes = list(parsed.notes)
        if stream.truncated:
            notes.append(f"the gzip stream ends early (after {stream.in_bytes} compressed bytes): the file was cut while written")
        partial = parsed.partial or stream.truncated
        p = parsed
        try:
            staged = lake.stage(run_id, source_id, p.tables({"run_id": run_id, "source_id": source_id, "rank": r}, arrow=True))
        except sch.SchemaError as e:
            return _failed(display, run_id, f"schema violation: {e}", base["content_sha256"], base["size_bytes"], base=base)
        row = {**base, "rank": r, "rank_source": rsrc, "ranks": [r], "host": p.host,
               "world_size": p.world_size if p.world_size is not None and 0 < p.world_size <= MAX_RANK else None,
               "backend": p.backend, "tool_versions": json.dumps(p.tool_versions, sort_keys=True, default=str) if p.tool_versions else None,
               "status": "partial" if partial else "ok", "unreadable_bytes": p.unreadable_bytes,
               "event_count": p.event_count, "base_time_ns": p.base_time_ns,
               "trace_start_ns": p.trace_start_ns, "trace_end_ns": p.trace_end_ns}
        return Prepared(display, run_id, row["status"], row, None, notes, source_id, base["content_sha256"], r, [r], staged,
                        stream.out_bytes, p.unreadable_bytes)
    finally:
        if parsed is not None:
            parsed.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _prepare_log(name: str, data: bytes, fmt: str, lake: Lake, base: dict) -> Prepared:
    """An NCCL-family file (pipeline/ingest/nccl.py): its nccl_* / flight_recorder* tables. Such a
    file holds no rank's trace rows, so it never claims a rank of its run."""
    run_id, source_id, display = base["run_id"], base["source_id"], base["path"]
    base = {**base, "format": fmt}
    try:
        p = nccl.parse(data, name, fmt)
    except kineto.TraceError as e:
        return _failed(display, run_id, str(e), base["content_sha256"], base["size_bytes"], base=base)
    ids = [pl.lit(run_id).alias("run_id"), pl.lit(source_id).alias("source_id")]
    tables = {t: df.with_columns(ids).to_arrow() for t, df in p.tables.items() if df.height}
    row = {**base, "status": "ok", "host": p.host, "event_count": p.event_count,
           "world_size": p.world_size if p.world_size is not None and 0 < p.world_size <= MAX_RANK else None,
           "tool_versions": json.dumps(p.tool_versions, sort_keys=True, default=str) if p.tool_versions else None}
    try:
        staged = lake.stage(run_id, source_id, tables)
    except sch.SchemaError as e:
        return _failed(display, run_id, f"schema violation: {e}", base["content_sha256"], base["size_bytes"], base=base)
    return Prepared(display, run_id, "ok", row, None, list(p.notes), source_id, base["content_sha256"], None, None,
                    staged, len(data))


def _prepare_nsys(path: Path, display: str, fmt: str, run_id: str, opts: Options, done, lake: Lake,
                  name: str | None = None, sha: str | None = None) -> Prepared:
    t0 = time.time_ns()
    sha = sha or content_sha256(path) or hashlib.sha256(("unreadable:" + display).encode()).hexdigest()
    source_id = sha[:16]
    size = _size(path)
    if not opts.force and _is_done(done, sha, run_id, opts.run is None):
        return Prepared(display, _stored_run(done, sha, run_id, opts.run is None), "skipped",
                        notes=[_skip_note(done, sha, run_id, opts.run is None)], source_id=source_id, sha=sha)
    base = _base_row(display, run_id, sha, size, fmt, t0)
    scratch = lake.scratch()
    try:
        with nsys.open_export(path, fmt, scratch, file_rank=rank_from_name(name or path.name), cli_rank=opts.rank,
                              step_regex=opts.step_regex, comm_patterns=opts.comm_patterns) as ex:
            notes = list(ex.notes)
            rank_list = ex.rank_list
            bad = [r for r in rank_list if not 0 <= r <= MAX_RANK]
            if bad:
                raise nsys.NsysError(f"rank {bad[0]} ({ex.rank_source}) is outside 0..{MAX_RANK}")
            row = {**base, "format": ex.format, "rank": rank_list[0] if len(rank_list) == 1 else None,
                   "rank_source": ex.rank_source, "ranks": rank_list, "host": ex.host,
                   "tool_versions": json.dumps(ex.tool_versions, sort_keys=True) if ex.tool_versions else None,
                   "status": "ok", "event_count": ex.event_count,
                   "base_time_ns": ex.base_time_ns, "trace_start_ns": ex.trace_start_ns, "trace_end_ns": ex.trace_end_ns,
                   "world_size": len(rank_list) if ex.rank_source == "process_order" else None}
            staged = lake.stage(run_id, source_id, ex.tables(run_id, source_id))
    except (kineto.TraceError, duckdb.Error, sch.SchemaError) as e:
        err = one_line(str(e) if isinstance(e, kineto.TraceError) else f"{type(e).__name__}: {e}")[:500]
        return _failed(display, run_id, err, sha, size, base=base)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Prepared(display, run_id, "ok", row, None, notes, source_id, sha, rank_list[0] if len(rank_list) == 1 else None,
                    list(rank_list), staged, size)


def _prepare_extracted(inp, peek, sha: str, size: int, run_id: str, opts: Options, done, lake: Lake) -> Prepared:
    """A member in a format that needs a real file (Nsight Systems): copied to scratch first."""
    scratch = lake.scratch()
    try:
        f = scratch / inp.name
        with open(f, "wb") as out:
            while block := peek.read(1 << 20):
                out.write(block)
        fmt = nsys.detect(f)
        if fmt is None:
            return _failed(inp.display, run_id, "not a Kineto trace, Nsight Systems export or NCCL-family log", sha, size)
        return _prepare_nsys(f, inp.display, fmt, run_id, opts, done, lake, name=inp.name, sha=sha)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _work_targz(path: str, opts: Options, done, lake: Lake, below: str | None = None) -> list[Prepared]:
    """A compressed tar, front to back: pass 1 hashes every wanted member; pass 2 (only when some
    member is new, or force) parses the new ones. Members that sniff as nothing of ours are left
    out, as a directory search would."""
    display = str(Path(path).absolute())
    out: list[Prepared] = []
    try:
        shas = {}
        for m, f, why in arc.stream_members(Path(path)):
            if f is not None and not excluded(m.name, opts.exclude):
                h = hashlib.sha256()
                while block := f.read(1 << 20):
                    h.update(block)
                shas[m.name] = h.hexdigest()
        todo = {n for n, s in shas.items()
                if opts.force or not _is_done(done, s, _run_for(arc.member_run_name(display, n, below), opts.run), opts.run is None)}
        for m, f, why in arc.stream_members(Path(path)):
            if excluded(m.name, opts.exclude):
                continue
            run_id = _run_for(arc.member_run_name(display, m.name, below), opts.run)
            disp = f"{display}!{m.name}"
            if why is not None:
                out.append(_failed(disp, run_id, why))
                continue
            if m.name not in todo:
                out.append(Prepared(disp, _stored_run(done, shas[m.name], run_id, opts.run is None), "skipped",
                                    notes=[_skip_note(done, shas[m.name], run_id, opts.run is None)],
                                    source_id=shas[m.name][:16], sha=shas[m.name]))
                continue
            inp = arc.StreamMember(display, m.name, m.size, f, below)
            try:
                p = _prepare(inp, opts, done, lake, sha=shas[m.name])
            except kineto.TraceError:
                raise  # the archive itself (its gzip stream) failed
            except MemoryError:
                p = _failed(disp, run_id, "out of memory while ingesting this member", shas[m.name], m.size)
            except Exception as e:
                p = _failed(disp, run_id, f"could not ingest ({type(e).__name__}: {one_line(str(e))[:200]}); please report this file",
                            shas[m.name], m.size)
            if p is not None and not (p.status == "failed" and p.error and p.error.startswith("not a Kineto trace, Nsight")
                                      and m.name.lower().endswith(LOG_SUFFIXES)):
                out.append(p)
    except (kineto.TraceError, OSError, tarfile.TarError, EOFError, zlib.error) as e:
        # a member's data cut short raises from its read, not from the tar header walk
        err = (str(e) if isinstance(e, kineto.TraceError) else f"cannot read: {e.strerror or e}" if isinstance(e, OSError)
               else f"corrupt or truncated tar.gz ({one_line(str(e)) or type(e).__name__})")
        for p in out:
            if p.staged is not None:
                Lake(opts.lake).discard(p.staged)
        sha = content_sha256(Path(path)) if Path(path).is_file() else None
        return [_failed(display, _run_for(Path(path).resolve().parent.name, opts.run), err, sha,
                        Path(path).stat().st_size if Path(path).exists() else 0)]
    return out


# ------------------------------------------------------------------ committing

class _Runs:
    """The lake's runs as committing needs them: the source holding each (run, rank), each run's
    time span (the union of its sources' trace_start_ns..trace_end_ns), per named run the runs its
    files were moved to, the runs holding each content, and each source's stored row. Built from
    _stored_sources(); add() keeps it current as files are committed."""

    def __init__(self, stored: pl.DataFrame):
        """stored: _stored_sources() of the lake."""
        self.ranks: dict[tuple[str, int], str] = {}
        self.spans: dict[str, tuple[int, int]] = {}
        self.moved: dict[str, list[str]] = {}
        self.by_content: dict[str, list[str]] = {}
        # (run, source_id) -> (path, named run, notes saying where it was put): kept by --force
        self.rows: dict[tuple[str, str], tuple[str, str, list[str]]] = {}
        cols = [stored[c].to_list() for c in ("run_id", "named", "source_id", "content_sha256", "rank", "ranks",
                                               "trace_start_ns", "trace_end_ns", "notes", "path")]
        for r, n, s, h, k, ks, t0, t1, notes, path in zip(*cols):
            self.add(r, n, s, h, [k for k in (ks if ks is not None else [k]) if k is not None], t0, t1, notes or [], path)

    def add(self, run_id: str, named: str, source_id: str, sha: str, rank_list: list[int], t0: int | None,
            t1: int | None, notes: list[str], path: str) -> None:
        """A committed source, with its sources path and notes."""
        self.rows[(run_id, source_id)] = (path, named, [n for n in notes if _PLACED in n])
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

    def claim(self, run_id: str, source_id: str, rank_list: list[int], t0: int | None, t1: int | None,
              notes: list[str], by_time: bool = True) -> str:
        """The run a source named run_id goes to. by_time=False (--run named it): run_id when no
        other source holds one of its ranks there. Otherwise the candidates are run_id and the runs
        files named run_id were moved to, those where no other source holds one of its ranks; the
        first whose time span overlaps the file's wins: the files of one profiling window run at
        the same time, so a second cycle of a job, or a second job of the same name that ran at
        another time, stays one run whatever the order the files come in. Else run_id when it is
        a candidate and holds no timed file yet; else a new run '<run_id>_<source_id[:8]>'. A note
        (also printed) says when the file is not put in run_id."""
        taken = self.taken(run_id, source_id, rank_list)
        if not by_time and not taken:
            return run_id
        cands = [run_id] + self.moved.get(run_id, [])
        free = [c for c in cands if not self.taken(c, source_id, rank_list)]
        if taken:
            what = f"rank {taken[0]}" if len(taken) == 1 else f"ranks {', '.join(map(str, taken))}"
            why = f"{what} of run {run_id} is already held by source {self.ranks[(run_id, taken[0])]}"
        else:
            why = f"its time span does not overlap run {run_id}'s (another profiling cycle or job in the same directory)"
        if t0 is not None and t1 is not None:
            for c in free:
                span = self.spans.get(c)
                if span and span[0] <= t1 and t0 <= span[1]:
                    if c != run_id:
                        notes.append(f"{why}{_PLACED}{c}, with the files of the same time window")
                    return c
            if not taken and run_id not in self.spans:
                return run_id
        elif not taken:
            return run_id
        moved = _moved(run_id, source_id)
        notes.append(f"{why}{_PLACED}{moved}")
        return moved


def _join_siblings(units: list[Unit], stored: pl.DataFrame) -> None:
    """A file (not an archive member) in a directory whose files are already in the lake
    (stored: _stored_sources(); the
    same directory once links and '..' are resolved) takes their run name (the most common named
    run of that directory), so a new rank file joins its run
    whichever directory was given this time (`ingest archive/` then `ingest archive/job1/traces/
    rank8.json`)."""
    ok = stored.filter(~pl.col("path").str.contains("!", literal=True))
    if not ok.height:
        return
    named: dict[str, dict[str, int]] = {}
    for path, n in zip(ok["path"].to_list(), ok["named"].to_list()):
        c = named.setdefault(os.path.realpath(Path(path).parent), {})
        c[n] = c.get(n, 0) + 1
    for u in units:
        if u.kind == "input" and isinstance(u.item, arc.FileInput):
            c = named.get(os.path.realpath(Path(u.item.display).parent))
            if c:
                u.item.run = max(sorted(c), key=c.get)


def _commit(p: Prepared, lake: Lake, done: dict, runs: _Runs, force: bool, by_time: bool = True) -> FileResult:
    """Put a worker's outcome into the lake (in input order, in this process). by_time: False when
    --run named the run (_Runs.claim); content is then looked up in that run only (_is_done)."""
    if p.status == "skipped":
        return FileResult(p.path, p.run_id, None, "skipped", None, p.notes, p.source_id)
    if p.oserror and not lake.writable():
        if p.staged is not None:
            lake.discard(p.staged)
        raise LakeError(f"{lake.root}: cannot write to the lake")
    if p.status == "failed":
        if p.staged is not None:
            lake.discard(p.staged)
        lake.commit(lake.stage(p.run_id, p.source_id, {}), {**p.row, "named_run_id": p.run_id})
        return FileResult(p.path, p.run_id, None, "failed", p.error, [], p.source_id, p.uncompressed_bytes)
    stored = _entry(done, p.sha, p.run_id, by_time)
    if stored is not None and (not force or stored[1]):  # the same content earlier in this batch (even with --force)
        lake.discard(p.staged)
        return FileResult(p.path, stored[0], None, "skipped", None, [_skip_note(done, p.sha, p.run_id, by_time)], p.source_id)
    notes = list(p.notes)
    run_id = p.run_id
    t0, t1 = p.row.get("trace_start_ns"), p.row.get("trace_end_ns")
    path, named = p.row["path"], p.run_id
    if stored is not None:  # --force: re-ingested in place: its run, and the path and name it was stored with
        run_id = stored[0]
        if (run_id, p.source_id) in runs.rows:
            path, named, placed = runs.rows[(run_id, p.source_id)]
            notes += placed
    elif p.rank_list:
        run_id = runs.claim(run_id, p.source_id, p.rank_list, t0, t1, notes, by_time=by_time)
    if run_id != p.run_id:
        lake.retarget(p.staged, run_id)
    row = {**p.row, "run_id": run_id, "named_run_id": named, "path": path, "notes": notes or None}
    others = [r for r in runs.by_content.get(p.sha, []) if r != run_id]
    if others:  # e.g. ingested before under another --run, or by a tracelake that named runs differently;
        # printed, not stored: the row must not depend on what else is in the lake (forget)
        notes = notes + [f"the same content is already in run {others[0]}{' and others' if len(others) > 1 else ''}; "
                         f"`tracelake forget --run {others[0]}` removes that copy if it is not wanted"]
    try:
        lake.commit(p.staged, row)
    except sch.SchemaError as e:
        err = one_line(f"schema violation: {e}")
        bad = {**p.row, "named_run_id": p.run_id, "status": "failed", "error": err}
        for k in ("rank", "rank_source", "ranks", "notes", "unreadable_bytes"):
            bad.pop(k, None)
        lake.commit(lake.stage(p.run_id, p.source_id, {}), bad)
        return FileResult(p.path, p.run_id, p.rank, "failed", err, notes, p.source_id, p.uncompressed_bytes)
    runs.add(run_id, named, p.source_id, p.sha, p.rank_list or [], t0, t1, row["notes"] or [], path)
    done[(p.sha, p.run_id)] = done[(p.sha, None)] = (run_id, True)
    return FileResult(p.path, run_id, p.rank, p.status, None, notes, p.source_id, p.uncompressed_bytes, p.unreadable_bytes)


# ------------------------------------------------------------------ planning and running

def plan(paths: Iterable[str | Path], exclude: list[str] | None = None) -> tuple[list[Unit], list[Problem]]:
    """The units of work for `paths` in input order (archives opened into their members), minus
    the files and members `exclude` (patterns as exclude_patterns() returns them) leaves out."""
    problems: list[Problem] = []
    roots: dict = {}
    files = discover(paths, problems, exclude, roots=roots)
    units: list[Unit] = [Unit("problem", p) for p in problems]
    for f in files:
        kind = arc.archive_kind(f) if f.is_file() else None
        found = roots.get(f.resolve())
        below = found[1] if found else None
        if kind in ("zip", "tar"):
            try:
                members = arc.list_members(f, kind)
            except kineto.TraceError as e:
                units.append(Unit("problem", Problem(f, str(e))))
                continue
            for m in members:
                if excluded(m.member, exclude):
                    continue
                m.below = below
                if isinstance(m, arc.Refused):
                    units.append(Unit("refused", m))
                elif m.name.lower().endswith(LOG_SUFFIXES) and not _member_looks_like_log(m):
                    continue
                else:
                    units.append(Unit("input", m, m.length))
        elif kind == "tar.gz":
            units.append(Unit("targz", str(f), _size_or_0(f), below))
        else:
            units.append(Unit("input", arc.FileInput(str(f), below if below not in (None, "", ".") else None), _size_or_0(f)))
    return units, problems


def _size_or_0(f: Path) -> int:
    try:
        return _size(f)
    except OSError:
        return 0


def _member_looks_like_log(m) -> bool:
    try:
        with m.open() as raw:
            head = arc.Peek(arc.Inflate(raw).read).head
    except Exception:
        return True  # let ingest say why it cannot be read
    return nccl.sniff(head, m.name) is not None


def _problem_failure(lake: Lake, path: Path, run: str | None, error: str) -> Prepared:
    display = str(Path(path).absolute())
    try:
        sha = content_sha256(Path(path))
    except (OSError, MemoryError):
        sha = None
    try:
        size = Path(path).stat().st_size
    except OSError:
        size = 0
    return _failed(display, _run_for(Path(path).resolve().parent.name, run), error, sha, size)


def _record_failure(lake: Lake, path: Path, run: str | None, error: str) -> FileResult:
    """A failed sources row for a file that could not be read or parsed (content hash of its
    bytes when readable, else of its path)."""
    p = _problem_failure(lake, path, run, error)
    lake.commit(lake.stage(p.run_id, p.source_id, {}), p.row)
    return FileResult(p.path, p.run_id, None, "failed", p.error, [], p.source_id)


def _init_worker() -> None:
    """Pool worker set-up: die with the ingesting process (Linux), so a killed ingest leaves no
    worker writing into the lake's staging area."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover  (not Linux)
        pass


def _run_serial(units, opts, done):
    for u in units:
        yield u, _work(u, opts, done)


def _run_pool(units, opts, done, jobs: int):
    """Results in input order from a process pool (at most 2*jobs units in flight). A worker that
    dies (out of memory, killed) breaks the pool: the units in flight then run again one at a time,
    so only the one that kills its worker fails."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pipeline.ingest"])
    frozen = dict(done)
    i = 0
    while i < len(units):
        window: list = []
        broken = False
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker) as pool:
            while i < len(units) or window:
                try:
                    while len(window) < 2 * jobs and i < len(units):
                        window.append((units[i], pool.submit(_work, units[i], opts, frozen)))
                        i += 1
                    u, fut = window[0]
                    res = fut.result()
                except cf.process.BrokenProcessPool:
                    broken = True
                    break
                window.pop(0)
                yield u, res
        if broken:  # keep what finished; run the rest again, one at a time
            for u, fut in window:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    yield u, fut.result()
                else:
                    yield u, _retry_alone(u, opts, frozen, ctx)


def _retry_alone(u: Unit, opts: Options, done, ctx) -> list[Prepared]:
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx, initializer=_init_worker) as pool:
        try:
            return pool.submit(_work, u, opts, done).result()
        except cf.process.BrokenProcessPool:
            return _unit_failure(u, opts, "the worker process died while ingesting this file (out of memory?)")


def _run_dask(units, opts, done, scheduler: str):
    from ..cluster import client as dask_client

    with dask_client(scheduler) as client:  # SchedulerError (one line) when it cannot be reached
        nthreads = max(1, sum(client.nthreads().values()))
        [frozen] = client.scatter([dict(done)], broadcast=True)  # once to every worker, not per task
        window: list = []
        i = 0
        while i < len(units) or window:
            while len(window) < 2 * nthreads and i < len(units):
                window.append((units[i], client.submit(_work, units[i], opts, frozen, pure=False)))
                i += 1
            u, fut = window.pop(0)
            try:
                res = fut.result()
            except Exception as e:  # a worker died or the task could not run
                res = _unit_failure(u, opts, f"the Dask task failed ({type(e).__name__}: {one_line(str(e))[:200]})")
            yield u, res


def _unit_failure(u: Unit, opts: Options, error: str) -> list[Prepared]:
    if u.kind == "targz":
        p = Path(u.item)
        return [_failed(str(p.absolute()), _run_for(p.resolve().parent.name, opts.run), error, _sha_or_none(arc.FileInput(str(p))))]
    inp = u.item
    return [_failed(inp.display, _run_for(inp.run_name, opts.run), error, _sha_or_none(inp))]


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
) -> list[FileResult]:
    """Ingest every file under `paths` into `lake`; returns one FileResult per file, archive
    member or problem path, in input order. jobs: worker processes (1: in this process; 0: one
    per core); scheduler: the address of a Dask scheduler to run the workers on instead. on_plan
    is called once with the number of units before work starts (a compressed tar counts as one
    until its members are known). step_regex: NVTX range names that mark steps in nsys exports
    (default ProfilerStep#N). exclude: glob patterns of files, directories and archive members to
    leave out (see excluded()). Raises LakeError when the lake itself cannot be created or written,
    or another ingest holds its lock; re.error for a bad step_regex."""
    if step_regex:
        re.compile(step_regex)
    for p in comm_patterns or []:
        re.compile(p)
    exclude = exclude_patterns(exclude)
    units, _ = plan(paths, exclude)
    if on_plan:
        on_plan(len(units))
    lake.ensure()
    results: list[FileResult] = []
    opts = Options(str(lake.root.absolute()), run, rank, force, list(comm_patterns or []) or None, step_regex, exclude or None)
    with lake.lock():
        lake.recover()
        stored = _stored_sources(lake.sources())
        done = _done_index(stored)
        runs = _Runs(stored)
        if run is None:
            _join_siblings(units, stored)

        def emit(res: FileResult):
            results.append(res)
            if on_file:
                on_file(res)

        work = []
        for u in units:
            if u.kind == "problem":
                emit(_commit(_problem_failure(lake, u.item.path, run, u.item.error), lake, done, runs, force, run is None))
            elif u.kind == "refused":
                m = u.item
                emit(_commit(_failed(m.display, _run_for(m.run_name, run), m.error), lake, done, runs, force, run is None))
            else:
                work.append(u)
        jobs = jobs or os.cpu_count() or 1
        if scheduler:
            stream = _run_dask(work, opts, done, scheduler)
        elif jobs > 1 and len(work) > 1 and sum(u.size for u in work) >= PARALLEL_MIN_BYTES:
            stream = _run_pool(work, opts, done, min(jobs, len(work)))
        else:
            stream = _run_serial(work, opts, done)
        try:
            for u, prepared in stream:
                for p in prepared:
                    try:
                        emit(_commit(p, lake, done, runs, force, run is None))
                    except LakeError:
                        raise
                    except OSError:
                        if not lake.writable():
                            raise
                        emit(_commit(_failed(p.path, p.run_id, "cannot write its rows to the lake", p.sha), lake, done, runs, force, run is None))
        finally:
            close = getattr(stream, "close", None)
            if close:
                close()
    return results

