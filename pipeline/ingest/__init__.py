"""Ingest: find input files, detect their format, parse them and write them into the lake.

One bad file never stops a batch: it gets a `sources` row with status=failed and a one-line
error, and the rest are ingested. A path that does not exist, a directory that cannot be read or
a special file (FIFO, device) is reported the same way. Formats: Kineto JSON (plain or .gz);
NCCL_DEBUG logs, nccl-tests output, PyTorch watchdog messages, Flight Recorder dumps, RAS
reports (pipeline/ingest/nccl.py; they hold no rank's trace and claim no rank);
Nsight Systems SQLite exports, parquetdir exports (`*_pqtdir/`) and .nsys-rep/.qdrep reports
(pipeline/ingest/nsys.py; one report may hold several ranks).

Run and rank assignment:
- run_id = --run, else the name of the file's parent directory (sanitized for hive paths; a name
  that had to be changed gets a short hash of the original, so different names never merge).
- rank = distributedInfo.rank, else a number in the file name (rank-3, rank3, rank_3, worker3),
  else --rank, else 0 (rank_source = default). Ranks must lie in [0, 2^31).
- Two different files never land silently on one (run, rank): the later one moves to run
  '<run>_<source_id[:8]>' and both the note and the printed message say so.
- A file whose content (sha256) is already in the same run with status ok is skipped unless force.
- Decompression is bounded: a .gz that expands beyond max_uncompressed_bytes (default 4 GiB,
  env TRACELAKE_MAX_UNCOMPRESSED_BYTES) fails cleanly instead of exhausting memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import duckdb
import polars as pl

from .. import __version__
from .. import schema as sch
from ..lake import Lake, one_line, safe_run_id
from . import kineto, nccl, nsys

try:  # isal's gzip is ~2x faster than zlib's and decompresses the same bytes
    from isal import igzip as _gz
except ImportError:  # pragma: no cover
    _gz = gzip

TRACE_SUFFIXES = (".json", ".json.gz", ".gz", ".sqlite", ".nsys-rep", ".qdrep", ".zip", ".pkl", ".pickle")
# text outputs (NCCL_DEBUG logs, nccl-tests, watchdog messages, RAS): found by a directory search
# only when their first 64 KiB look like one (pipeline/ingest/nccl.py sniff); named files always
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".jsonl")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
MAX_RANK = 2**31 - 1


def max_uncompressed_bytes() -> int:
    return int(os.environ.get("TRACELAKE_MAX_UNCOMPRESSED_BYTES", 4 * 2**30))


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


@dataclass
class Problem:
    """A path that could not even be opened as a file (missing, unreadable directory, FIFO)."""
    path: Path
    error: str


def discover(paths: Iterable[str | Path], problems: list | None = None) -> list[Path]:
    """Files named by `paths`: files as given, directories searched recursively for
    *.json / *.json.gz / *.gz / *.sqlite / *.nsys-rep / *.qdrep / *.zip / *.pkl / *.pickle, and
    *.log / *.txt / *.out / *.err / *.jsonl that look like NCCL-family output (symlinks to
    directories are not followed); an nsys parquetdir export (`*_pqtdir/`) is one input, given or
    found. Paths that do not
    exist, are not regular files or directories, or cannot be listed go to `problems` (a list of
    Problem) when given; otherwise the first raises FileNotFoundError."""
    out: list[Path] = []

    def problem(p: Path, msg: str):
        if problems is None:
            raise FileNotFoundError(f"{p}: {msg}")
        problems.append(Problem(p, msg))

    for p in paths:
        p = Path(p)
        if p.is_dir() and nsys.detect(p):
            out.append(p)
        elif p.is_dir():
            for root, dirs, files in os.walk(p, onerror=lambda e: problem(Path(e.filename), f"cannot list directory: {e.strerror}")):
                dirs.sort()
                for d in [d for d in dirs if d.endswith("_pqtdir")]:
                    dirs.remove(d)
                    out.append(Path(root) / d)
                for name in sorted(files):
                    f = Path(root) / name
                    if name.lower().endswith(TRACE_SUFFIXES) and f.is_file():
                        out.append(f)
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
    """(raw bytes as stored, decompressed bytes). gzip is detected by its magic number.
    Raises TraceError for corrupt gzip or output beyond `limit` bytes, OSError if unreadable."""
    limit = max_uncompressed_bytes() if limit is None else limit
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise kineto.TraceError("not a regular file")
        raw = f.read()
    if raw[:2] != b"\x1f\x8b":
        return raw, raw
    try:
        import io

        with _gz.GzipFile(fileobj=io.BytesIO(raw)) as g:
            data = g.read(limit + 1)
    except MemoryError:
        raise kineto.TraceError("gzip output does not fit in memory") from None
    except Exception as e:  # zlib/isal raise their own error types for corrupt streams
        raise kineto.TraceError(f"corrupt or truncated gzip ({one_line(str(e)) or type(e).__name__})") from None
    if len(data) > limit:
        raise kineto.TraceError(f"gzip expands beyond {limit} bytes (TRACELAKE_MAX_UNCOMPRESSED_BYTES); refusing a possible gzip bomb")
    return raw, data


def _rank_index(lake: Lake) -> dict[tuple[str, int], str]:
    """(run_id, rank) -> source_id holding that rank, over every source that was not a failure."""
    src = lake.sources().filter(pl.col("status") != "failed")
    many = src["ranks"] if "ranks" in src.columns else pl.Series([None] * src.height)
    out = {}
    for r, k, ks, s in zip(src["run_id"], src["rank"], many, src["source_id"]):
        for k in (ks if ks is not None else [k]):
            if k is not None:
                out[(r, k)] = s
    return out


def ingest_paths(
    paths: Iterable[str | Path],
    lake: Lake,
    run: str | None = None,
    rank: int | None = None,
    force: bool = False,
    comm_patterns: list[str] | None = None,
    on_file: Callable[[FileResult], None] | None = None,
    step_regex: str | None = None,
) -> list[FileResult]:
    """Ingest every file under `paths` into `lake`; returns one FileResult per file or problem
    path. step_regex: NVTX range names that mark steps in nsys exports (default ProfilerStep#N).
    Raises LakeError when the lake itself cannot be created or written, re.error for a bad
    step_regex."""
    if step_regex:
        re.compile(step_regex)
    problems: list[Problem] = []
    files = discover(paths, problems)
    lake.ensure()
    existing = lake.sources()
    done = {(h, r) for h, r, s in zip(existing["content_sha256"], existing["run_id"], existing["status"]) if s != "failed"}
    ranks = _rank_index(lake)
    results = []
    for p in problems:
        res = _record_failure(lake, p.path, run, p.error)
        results.append(res)
        if on_file:
            on_file(res)
    for f in files:
        try:
            res = ingest_file(f, lake, run=run, rank=rank, force=force, comm_patterns=comm_patterns, done=done, ranks=ranks,
                              step_regex=step_regex)
        except MemoryError:
            res = _record_failure(lake, f, run, "out of memory while ingesting this file")
        except OSError as e:
            if not lake.writable():
                raise
            res = _record_failure(lake, f, run, f"cannot read: {e.strerror or e}")
        except Exception as e:  # never let one file stop the batch; say what happened
            res = _record_failure(lake, f, run, f"could not ingest ({type(e).__name__}: {one_line(str(e))[:200]}); please report this file")
        results.append(res)
        if on_file:
            on_file(res)
    return results


def _run_for(path: Path, run: str | None) -> str:
    return safe_run_id(run) if run else safe_run_id(path.resolve().parent.name)


def _record_failure(lake: Lake, path: Path, run: str | None, error: str) -> FileResult:
    """A failed sources row for a file that could not be read or parsed (content hash of its
    bytes when readable, else of its path)."""
    abspath = str(Path(path).absolute())
    run_id = _run_for(Path(path), run)
    try:
        sha = content_sha256(Path(path))
    except (OSError, MemoryError):
        sha = None
    sha = sha or hashlib.sha256(("unreadable:" + abspath).encode()).hexdigest()
    error = one_line(error)
    row = {"source_id": sha[:16], "run_id": run_id, "path": abspath, "format": "unknown", "content_sha256": sha,
           "size_bytes": 0, "status": "failed", "error": error, "schema_version": sch.SCHEMA_VERSION,
           "tracelake_version": __version__, "ingested_at_ns": time.time_ns()}
    try:
        row["size_bytes"] = Path(path).stat().st_size
    except OSError:
        pass
    lake.write_source(run_id, sha[:16], {}, row, replace=True)
    return FileResult(abspath, run_id, None, "failed", error, [], sha[:16])


def content_sha256(path: Path) -> str | None:
    """SHA-256 of a file's bytes, read in 1 MiB blocks; of a directory (nsys parquetdir): of its
    sorted member names and their bytes. None for special files. Raises OSError."""
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(path.rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(path)).encode("utf-8", "surrogateescape") + b"\x00")
                h.update(bytes.fromhex(content_sha256(f) or ""))
        return h.hexdigest()
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _claim_ranks(run_id: str, source_id: str, rank_list: list[int], ranks: dict, notes: list[str]) -> str:
    """The run this source's ranks go to: run_id, or '<run>_<source_id[:8]>' when another source
    already holds one of them (both the note and the printed message say so)."""
    taken = [r for r in rank_list if (run_id, r) in ranks and ranks[(run_id, r)] != source_id]
    if not taken:
        return run_id
    moved = safe_run_id(f"{run_id}_{source_id[:8]}")
    what = f"rank {taken[0]}" if len(taken) == 1 else f"ranks {', '.join(map(str, taken))}"
    notes.append(f"{what} of run {run_id} is already held by source {ranks[(run_id, taken[0])]}; this file was put in run {moved}")
    return moved


def _ingest_nsys(path: Path, fmt: str, lake: Lake, run_id: str, rank: int | None, force: bool,
                 comm_patterns: list[str] | None, done: set, ranks: dict, step_regex: str | None) -> FileResult:
    abspath = str(path.absolute())
    t0 = time.time_ns()
    sha = content_sha256(path) or hashlib.sha256(("unreadable:" + abspath).encode()).hexdigest()
    source_id = sha[:16]
    moved = safe_run_id(f"{run_id}_{source_id[:8]}")
    size = _size(path)
    if ((sha, run_id) in done or (sha, moved) in done) and not force:
        return FileResult(abspath, run_id, None, "skipped", None, ["already in the lake (same content); --force re-ingests"], source_id)
    base_row = {"source_id": source_id, "run_id": run_id, "path": abspath, "format": fmt, "content_sha256": sha,
                "size_bytes": size, "schema_version": sch.SCHEMA_VERSION, "tracelake_version": __version__,
                "ingested_at_ns": t0}
    scratch = lake.scratch()
    try:
        with nsys.open_export(path, fmt, scratch, file_rank=rank_from_name(path.name), cli_rank=rank,
                              step_regex=step_regex, comm_patterns=comm_patterns) as ex:
            notes = list(ex.notes)
            rank_list = ex.rank_list
            bad = [r for r in rank_list if not 0 <= r <= MAX_RANK]
            if bad:
                raise nsys.NsysError(f"rank {bad[0]} ({ex.rank_source}) is outside 0..{MAX_RANK}")
            run_id = _claim_ranks(run_id, source_id, rank_list, ranks, notes)
            row = {**base_row, "run_id": run_id, "format": ex.format, "rank": rank_list[0] if len(rank_list) == 1 else None,
                   "rank_source": ex.rank_source, "ranks": rank_list, "host": ex.host,
                   "tool_versions": json.dumps(ex.tool_versions, sort_keys=True) if ex.tool_versions else None,
                   "status": "ok", "notes": notes or None, "event_count": ex.event_count,
                   "base_time_ns": ex.base_time_ns, "trace_start_ns": ex.trace_start_ns, "trace_end_ns": ex.trace_end_ns,
                   "world_size": len(rank_list) if ex.rank_source == "process_order" else None}
            lake.write_source(run_id, source_id, ex.tables(run_id, source_id), row, replace=True)
    except (kineto.TraceError, duckdb.Error, sch.SchemaError) as e:
        err = one_line(str(e) if isinstance(e, kineto.TraceError) else f"{type(e).__name__}: {e}")[:500]
        base_row["run_id"] = run_id
        lake.write_source(run_id, source_id, {}, {**base_row, "status": "failed", "error": err}, replace=True)
        return FileResult(abspath, run_id, None, "failed", err, [], source_id, size)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for r in rank_list:
        ranks[(run_id, r)] = source_id
    done.add((sha, run_id))
    return FileResult(abspath, run_id, rank_list[0] if len(rank_list) == 1 else None, "ok", None, notes, source_id, size)


def _ingest_log(path: Path, data: bytes, fmt: str, lake: Lake, base_row: dict, done: set) -> FileResult:
    """An NCCL-family file (pipeline/ingest/nccl.py): its nccl_* / flight_recorder* tables. Such a
    file holds no rank's trace rows, so it never claims a rank of its run."""
    run_id, source_id, abspath = base_row["run_id"], base_row["source_id"], base_row["path"]
    base_row = {**base_row, "format": fmt}
    try:
        p = nccl.parse(data, path.name, fmt)
    except kineto.TraceError as e:
        err = one_line(str(e))
        lake.write_source(run_id, source_id, {}, {**base_row, "status": "failed", "error": err}, replace=True)
        return FileResult(abspath, run_id, None, "failed", err, [], source_id, len(data))
    ids = [pl.lit(run_id).alias("run_id"), pl.lit(source_id).alias("source_id")]
    tables = {t: df.with_columns(ids).to_arrow() for t, df in p.tables.items() if df.height}
    row = {**base_row, "status": "ok", "host": p.host, "notes": p.notes or None, "event_count": p.event_count,
           "world_size": p.world_size if p.world_size is not None and 0 < p.world_size <= MAX_RANK else None,
           "tool_versions": json.dumps(p.tool_versions, sort_keys=True, default=str) if p.tool_versions else None}
    try:
        lake.write_source(run_id, source_id, tables, row, replace=True)
    except sch.SchemaError as e:
        err = one_line(f"schema violation: {e}")
        lake.write_source(run_id, source_id, {}, {**base_row, "status": "failed", "error": err}, replace=True)
        return FileResult(abspath, run_id, None, "failed", err, [], source_id, len(data))
    done.add((base_row["content_sha256"], run_id))
    return FileResult(abspath, run_id, None, "ok", None, list(p.notes), source_id, len(data))


def ingest_file(path: Path, lake: Lake, run: str | None, rank: int | None, force: bool,
                comm_patterns: list[str] | None, done: set, ranks: dict, step_regex: str | None = None) -> FileResult:
    path = Path(path)
    abspath = str(path.absolute())
    fmt = nsys.detect(path)
    if fmt is not None:
        return _ingest_nsys(path, fmt, lake, _run_for(path, run), rank, force, comm_patterns, done, ranks, step_regex)
    run_id = _run_for(path, run)
    t0 = time.time_ns()
    err = None
    try:
        raw, data = read_bytes(path)
    except kineto.TraceError as e:
        with open(path, "rb") as f:
            raw = f.read()
        data, err = b"", str(e)
    sha = hashlib.sha256(raw).hexdigest()
    source_id = sha[:16]
    moved = safe_run_id(f"{run_id}_{source_id[:8]}")
    if ((sha, run_id) in done or (sha, moved) in done) and not force:
        return FileResult(abspath, run_id, None, "skipped", None, ["already in the lake (same content); --force re-ingests"], source_id)
    base_row = {
        "source_id": source_id, "run_id": run_id, "path": abspath, "format": "kineto_json",
        "content_sha256": sha, "size_bytes": len(raw), "uncompressed_bytes": len(data) if err is None else None,
        "schema_version": sch.SCHEMA_VERSION, "tracelake_version": __version__, "ingested_at_ns": t0,
    }
    parsed = None
    log_fmt = nccl.sniff(data[:65536], path.name) if err is None else None
    if log_fmt is not None:
        return _ingest_log(path, data, log_fmt, lake, base_row, done)
    if err is None:
        try:
            parsed = kineto.parse(data, comm_patterns=comm_patterns)
        except kineto.NotKinetoError as e:
            err = str(e)
            base_row["format"] = "unknown"
        except kineto.TraceError as e:
            err = str(e)
            if (err.startswith("not valid JSON") and data.lstrip()[:1] not in (b"{", b"[")
                    and not path.name.lower().endswith((".json", ".json.gz"))):
                err = ("not a Kineto trace, Nsight Systems export or NCCL-family log: "
                       "neither JSON nor NCCL_DEBUG / nccl-tests / PyTorch NCCL lines")
                base_row["format"] = "unknown"
        except RecursionError:
            err = "JSON nested too deeply"
    del data
    if parsed is not None and parsed.event_count == 0:
        err, parsed = "trace has no events", None
    if parsed is not None:
        if parsed.rank is not None:
            r, rsrc = parsed.rank, "distributed_info"
        elif rank_from_name(path.name) is not None:
            r, rsrc = rank_from_name(path.name), "file_name"
        elif rank is not None:
            r, rsrc = rank, "cli"
        else:
            r, rsrc = 0, "default"
        if not 0 <= r <= MAX_RANK:
            err, parsed = f"rank {r} ({rsrc}) is outside 0..{MAX_RANK}", None
    if parsed is None:
        err = one_line(err)
        lake.write_source(run_id, source_id, {}, {**base_row, "status": "failed", "error": err}, replace=True)
        return FileResult(abspath, run_id, None, "failed", err, [], source_id, len(raw))

    notes = list(parsed.notes)
    run_id = _claim_ranks(run_id, source_id, [r], ranks, notes)
    key = (run_id, r)

    def add_ids(df: pl.DataFrame, with_rank: bool = True) -> pl.DataFrame:
        cols = [pl.lit(run_id).alias("run_id"), pl.lit(source_id).alias("source_id")]
        if with_rank:
            cols.append(pl.lit(r, dtype=pl.Int32).alias("rank"))
        return df.with_columns(cols)

    p = parsed
    tables = {
        "gpu_activities": add_ids(p.gpu).to_arrow(),
        "cpu_ops": add_ids(p.cpu).to_arrow(),
        "steps": add_ids(p.steps).to_arrow(),
        "collectives": add_ids(p.collectives).to_arrow(),
        "devices": add_ids(p.devices).with_columns(host=pl.lit(p.host, dtype=pl.String)).to_arrow(),
        "process_groups": add_ids(p.process_groups).to_arrow(),
        "annotations": add_ids(p.annotations).to_arrow(),
        "counters": add_ids(p.counters).to_arrow(),
    }
    starts = [df["start_ns"].min() for df in (p.gpu, p.cpu) if df.height]
    ends = [df["end_ns"].max() for df in (p.gpu, p.cpu) if df.height]
    row = {**base_row, "run_id": run_id, "rank": r, "rank_source": rsrc, "ranks": [r], "host": p.host,
           "world_size": p.world_size if p.world_size is not None and 0 < p.world_size <= MAX_RANK else None,
           "backend": p.backend, "tool_versions": json.dumps(p.tool_versions, sort_keys=True, default=str) if p.tool_versions else None,
           "status": "ok", "notes": notes or None, "event_count": p.event_count, "base_time_ns": p.base_time_ns,
           "trace_start_ns": min(starts) if starts else None, "trace_end_ns": max(ends) if ends else None}
    try:
        lake.write_source(run_id, source_id, tables, row, replace=True)
    except sch.SchemaError as e:
        err = one_line(f"schema violation: {e}")
        lake.write_source(run_id, source_id, {}, {**base_row, "status": "failed", "error": err}, replace=True)
        return FileResult(abspath, run_id, r, "failed", err, notes, source_id, base_row["uncompressed_bytes"] or 0)
    ranks[key] = source_id
    done.add((sha, run_id))
    return FileResult(abspath, run_id, r, "ok", None, notes, source_id, base_row["uncompressed_bytes"] or 0)
