"""Ingest: find input files, detect their format, parse them and write them into the lake.

One bad file never stops a batch: it gets a `sources` row with status=failed and a one-line
error, and the rest are ingested. Formats today: Kineto JSON (plain or .gz).

Run and rank assignment:
- run_id = --run, else the name of the file's parent directory (sanitized for hive paths).
- rank = distributedInfo.rank, else a number in the file name (rank-3, rank3, rank_3, worker3),
  else --rank, else 0 (rank_source = default).
- Two different files never land silently on one (run, rank): the later one moves to run
  '<run>_<source_id[:8]>' and both the note and the printed message say so.
- A file whose content (sha256) is already in the same run with status ok is skipped unless force.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import polars as pl

from .. import __version__
from .. import schema as sch
from ..lake import Lake, safe_run_id
from . import kineto

try:  # isal's gzip is ~2x faster than zlib's and decompresses the same bytes
    from isal import igzip as _gz
except ImportError:  # pragma: no cover
    _gz = gzip

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


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


def discover(paths: Iterable[str | Path]) -> list[Path]:
    """Files named by `paths`: files as given, directories searched recursively for
    *.json / *.json.gz / *.gz. Raises FileNotFoundError for a path that does not exist."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.name.lower().endswith(TRACE_SUFFIXES)))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
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


def read_bytes(path: Path) -> tuple[bytes, bytes]:
    """(raw bytes as stored, decompressed bytes). gzip is detected by its magic number."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return raw, _gz.decompress(raw)
        except Exception as e:  # zlib/isal raise their own error types for corrupt streams
            raise kineto.TraceError(f"corrupt or truncated gzip ({e})") from None
    return raw, raw


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
    """Ingest every file under `paths` into `lake`; returns one FileResult per file."""
    files = discover(paths)
    lake.ensure()
    existing = lake.sources()
    done = {(h, r) for h, r, s in zip(existing["content_sha256"], existing["run_id"], existing["status"]) if s != "failed"}
    ranks = _rank_index(lake)
    results = []
    for f in files:
        res = ingest_file(f, lake, run=run, rank=rank, force=force, comm_patterns=comm_patterns,
                          done=done, ranks=ranks, cli_rank_shared=len(files) > 1)
        results.append(res)
        if on_file:
            on_file(res)
    return results


def ingest_file(path: Path, lake: Lake, run: str | None, rank: int | None, force: bool,
                comm_patterns: list[str] | None, done: set, ranks: dict, cli_rank_shared: bool = False) -> FileResult:
    path = Path(path)
    abspath = str(path.resolve())
    run_id = safe_run_id(run) if run else safe_run_id(path.resolve().parent.name)
    t0 = time.time_ns()
    try:
        raw, data = read_bytes(path)
    except OSError as e:
        return FileResult(abspath, run_id, None, "failed", f"cannot read: {e.strerror or e}")
    except kineto.TraceError as e:
        raw = path.read_bytes()
        data = b""
        err = str(e)
    else:
        err = None
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
        except Exception as e:  # never let one file stop the batch; say what happened
            err = f"could not parse ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); please report this file"
    if parsed is None:
        lake.remove_source(source_id, run_id)  # a failed earlier attempt of the same bytes
        lake.write_source(run_id, source_id, {}, {**base_row, "status": "failed", "error": err})
        return FileResult(abspath, run_id, None, "failed", err, [], source_id, len(data))

    notes = list(parsed.notes)
    if parsed.rank is not None:
        r, rsrc = parsed.rank, "distributed_info"
    elif rank_from_name(path.name) is not None:
        r, rsrc = rank_from_name(path.name), "file_name"
    elif rank is not None:
        r, rsrc = rank, "cli"
    else:
        r, rsrc = 0, "default"
    key = (run_id, r)
    if key in ranks and ranks[key] != source_id:
        new_run = safe_run_id(f"{run_id}_{source_id[:8]}")
        notes.append(f"rank {r} of run {run_id} is already held by source {ranks[key]}; this file was put in run {new_run}")
        run_id = new_run
        key = (run_id, r)
    lake.remove_source(source_id, run_id)  # --force, or a failed earlier attempt
    ranks[key] = source_id

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
    status = "ok"
    row = {**base_row, "run_id": run_id, "rank": r, "rank_source": rsrc, "host": p.host, "world_size": p.world_size,
           "backend": p.backend, "tool_versions": json.dumps(p.tool_versions, sort_keys=True) if p.tool_versions else None,
           "status": status, "notes": notes or None, "event_count": p.event_count, "base_time_ns": p.base_time_ns,
           "trace_start_ns": min(starts) if starts else None, "trace_end_ns": max(ends) if ends else None}
    try:
        lake.write_source(run_id, source_id, tables, row)
    except sch.SchemaError as e:
        lake.write_source(run_id, source_id, {}, {**base_row, "status": "failed", "error": f"schema violation: {e}"})
        return FileResult(abspath, run_id, r, "failed", f"schema violation: {e}", notes, source_id, len(data))
    done.add((sha, run_id))
    return FileResult(abspath, run_id, r, status, None, notes, source_id, len(data))
