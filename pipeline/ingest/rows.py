"""What a worker hands back and the rows it builds: the ingest options as workers see them,
Prepared (a unit's outcome: its `sources` row and staged parts, not yet committed), the sources
row of a file and of a failed one, content hashes, and the rank a file name gives.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from .. import schema as sch
from ..lake import Staged, one_line
from . import archive as arc
from . import streams
from .discover import Unit
from .errors import TraceError
from .formats import GZIP_MAGIC
from .runs import dir_name, held_elsewhere, run_for, skip_note, stored_run

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
MAX_RANK = 2**31 - 1


def rank_from_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def read_bytes(path: Path, limit: int | None = None) -> tuple[bytes, bytes]:
    """(raw bytes as stored, decompressed bytes), read whole. gzip is detected by its magic
    number. Raises TraceError for corrupt gzip or output beyond `limit` bytes, OSError if
    unreadable. (Ingest itself streams; this is for callers that want the bytes.)"""
    with streams.open_regular(path) as f:
        raw = f.read()
    if raw[:2] != GZIP_MAGIC:
        return raw, raw
    import io

    s = streams.Inflate(io.BytesIO(raw), limit=limit)
    data = s.read()
    if s.truncated:
        raise TraceError("corrupt or truncated gzip (the stream ends before its end marker)")
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
    except TraceError:  # not a regular file
        return None


def _size(path: Path) -> int:
    return (
        sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        if path.is_dir()
        else path.stat().st_size
    )


@dataclass
class Options:
    lake: str
    run: str | None = None
    rank: int | None = None
    force: bool = False
    comm_patterns: list[str] | None = None
    step_regex: str | None = None
    exclude: list[str] | None = None  # glob patterns of files and archive members to leave out
    # natural run ids whose small sources a worker holds in memory (pipeline/ingest/hold.py)
    hold_runs: frozenset = frozenset()
    # the ingesting process's TRACELAKE_* settings (limits, test hooks), applied in each worker:
    # a pool's or a cluster's workers do not share this process's environment
    env: dict = field(
        default_factory=lambda: {k: v for k, v in os.environ.items() if k.startswith("TRACELAKE_")}
    )


# the status of a compressed tar's member named like a log that is not an NCCL-family log: not
# committed, only named (ingest_paths' not_logs), as a directory search passes such files over
PASSED_OVER = "passed_over"


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
    staged: Staged | None = None  # or a hold.Held: the tables of a small source in memory
    uncompressed_bytes: int = 0
    unreadable_bytes: int = 0
    oserror: bool = False  # failed with OSError (the committer checks that the lake is writable)
    identity: dict | None = None  # an NCCL-family file's runs.log_identity (placed by it, rule 4)
    held_in: str | None = None  # skipped: runs.held_elsewhere (its content is in another run)


def apply_env(env: dict) -> None:
    """Make this process's TRACELAKE_* settings those of the ingesting process (Options.env)."""
    for k in [k for k in os.environ if k.startswith("TRACELAKE_") and k not in env]:
        del os.environ[k]
    os.environ.update(env)


def base_row(display: str, run_id: str, sha: str, size: int, fmt: str, t0: int) -> dict:
    return {
        "source_id": sha[:16],
        "run_id": run_id,
        "path": display,
        "format": fmt,
        "content_sha256": sha,
        "size_bytes": size,
        "schema_version": sch.SCHEMA_VERSION,
        "tracelake_version": __version__,
        "ingested_at_ns": t0,
    }


def skipped(display: str, done, sha: str, run_id: str, any_run: bool) -> Prepared:
    """The outcome of an input whose content `sha` is already in the lake (runs.is_done): the run
    holding it, the skip note, and held_in when that run is not the one run_id names."""
    return Prepared(
        display,
        stored_run(done, sha, run_id, any_run),
        "skipped",
        notes=[skip_note(done, sha, run_id, any_run)],
        held_in=held_elsewhere(done, sha, run_id, any_run),
        source_id=sha[:16],
        sha=sha,
    )


def failed(
    display: str,
    run_id: str,
    error: str,
    sha: str | None = None,
    size: int = 0,
    fmt: str = "unknown",
    base: dict | None = None,
    oserror: bool = False,
    uncompressed: int = 0,
) -> Prepared:
    sha = sha or hashlib.sha256(("unreadable:" + display).encode("utf-8", "surrogateescape")).hexdigest()
    error = one_line(error)
    row = {
        **(base or base_row(display, run_id, sha, size, fmt, time.time_ns())),
        "status": "failed",
        "error": error,
    }
    row["run_id"] = run_id
    # a failed file's id also hashes its path: two bad files with the same bytes keep a row each
    sid = hashlib.sha256(f"{sha}\x00{display}".encode("utf-8", "surrogateescape")).hexdigest()[:16]
    row["source_id"] = sid
    return Prepared(
        display, run_id, "failed", row, error, [], sid, sha, oserror=oserror, uncompressed_bytes=uncompressed
    )


def sha_or_none(inp) -> str | None:
    try:
        return arc.sha256_of(inp)
    except (OSError, MemoryError, TraceError, Exception):
        return None


def unit_failure(u: Unit, opts: Options, error: str) -> list[Prepared]:
    if u.kind == "targz":
        p = Path(u.item)
        return [
            failed(
                str(p.absolute()),
                run_for(u.below if u.below not in (None, "", ".") else dir_name(p), opts.run),
                error,
                sha_or_none(arc.FileInput(str(p))),
            )
        ]
    inp = u.item
    return [failed(inp.display, run_for(inp.run_name, opts.run), error, sha_or_none(inp))]
