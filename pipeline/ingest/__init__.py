"""Ingest: find input files, detect their format, parse them and write them into the lake.

One bad file never stops a batch: it gets a `sources` row with status=failed and a one-line
error, and the rest are ingested. A path that does not exist, a directory that cannot be read or
a special file (FIFO, device) is reported the same way. Formats today: Kineto JSON (plain or .gz).

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
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import polars as pl

from .. import __version__
from .. import schema as sch
from ..lake import Lake, one_line, safe_run_id
from . import kineto

try:  # isal's gzip is ~2x faster than zlib's and decompresses the same bytes
    from isal import igzip as _gz
except ImportError:  # pragma: no cover
    _gz = gzip

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
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
    *.json / *.json.gz / *.gz (symlinks to directories are not followed). Paths that do not
    exist, are not regular files or directories, or cannot be listed go to `problems` (a list of
    Problem) when given; otherwise the first raises FileNotFoundError."""
    out: list[Path] = []

    def problem(p: Path, msg: str):
        if problems is None:
            raise FileNotFoundError(f"{p}: {msg}")
        problems.append(Problem(p, msg))

    for p in paths:
        p = Path(p)
        if p.is_dir():
            for root, dirs, files in os.walk(p, onerror=lambda e: problem(Path(e.filename), f"cannot list directory: {e.strerror}")):
                dirs.sort()
                for name in sorted(files):
                    f = Path(root) / name
                    if name.lower().endswith(TRACE_SUFFIXES) and f.is_file():
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
    src = lake.sources().filter(pl.col("status") != "failed")
    return {(r, k): s for r, k, s in zip(src["run_id"], src["rank"], src["source_id"]) if k is not None}


def ingest_paths(
    paths: Iterable[str | Path],
    lake: Lake,
    run: str | None = None,
    rank: int | None = None,
    force: bool = False,
    comm_patterns: list[str] | None = None,
    on_file: Callable[[FileResult], None] | None = None,
) -> list[FileResult]:
    """Ingest every file under `paths` into `lake`; returns one FileResult per file or problem
    path. Raises LakeError when the lake itself cannot be created or written."""
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
            res = ingest_file(f, lake, run=run, rank=rank, force=force, comm_patterns=comm_patterns, done=done, ranks=ranks)
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
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest() if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
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


def ingest_file(path: Path, lake: Lake, run: str | None, rank: int | None, force: bool,
                comm_patterns: list[str] | None, done: set, ranks: dict) -> FileResult:
    path = Path(path)
    abspath = str(path.absolute())
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
    if err is None:
        try:
            parsed = kineto.parse(data, comm_patterns=comm_patterns)
        except kineto.NotKinetoError as e:
            err = str(e)
            base_row["format"] = "unknown"
        except kineto.TraceError as e:
            err = str(e)
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
    key = (run_id, r)
    if key in ranks and ranks[key] != source_id:
        notes.append(f"rank {r} of run {run_id} is already held by source {ranks[key]}; this file was put in run {moved}")
        run_id = moved
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
    row = {**base_row, "run_id": run_id, "rank": r, "rank_source": rsrc, "host": p.host,
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
