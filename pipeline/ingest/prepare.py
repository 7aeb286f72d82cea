"""One unit of work, in a worker: read an input with its format's module, stage its tables in
the lake (pipeline/lake.py Lake.stage) and build its `sources` row, not yet committed.

Formats: Kineto JSON, streamed (pipeline/ingest/kineto); NCCL-family text and dumps
(pipeline/ingest/nccl: they hold no rank's trace and claim no rank); Nsight Systems exports and
nsys-jax archives, which need a real file (pipeline/ingest/nsys); members of a compressed tar,
read front to back. A bad input never raises: it gives a Prepared with status failed and a
one-line error. Which run the result lands in is decided when it is committed
(pipeline/ingest/runs.py, commit.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import polars as pl

from .. import schema as sch
from ..lake import Lake, one_line
from . import archive as arc
from . import hold, kineto, nccl, streams
from .discover import log_format, needs_file, sniff_path
from .errors import TraceError, UnknownFormat
from .formats import SQLITE_SIDECARS
from .jobid import ENV_KEYS, stated_job
from .rows import (
    MAX_RANK,
    Options,
    Prepared,
    _size,
    base_row,
    content_sha256,
    failed,
    rank_from_name,
    skipped,
)
from .runs import is_done, log_identity, run_for
from .spool import _Budget

IN_MEMORY_LIMIT = 1 << 30  # formats read whole (NCCL-family JSON, pickles and reports)
LOG_SPOOL_BYTES = 64 << 20  # a text log's built rows kept in memory up to this, then on disk
# DuckDB threads of the per-source results a pool worker computes (with_local; None: every core),
# its share of the cores (executors.init_worker)
LOCAL_THREADS: int | None = None


def _identity(path: str) -> tuple | None:
    """What tells a file's bytes changed between two reads of it: (device, inode, size, mtime in
    ns), and the same of the files SQLite keeps beside a database (an Nsight Systems export's
    write-ahead log is read with it); None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    side = []
    for suffix in SQLITE_SIDECARS:
        try:
            s = os.stat(os.path.realpath(path) + suffix)
            side.append((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns))
        except OSError:
            side.append(None)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, *side


def prepare(inp, opts: Options, done, lake: Lake, sha: str | None = None) -> Prepared:
    """A unit's outcome (module doc). A file is hashed in one read and parsed in another: when it
    was replaced or written to in between or during the parse (its device, inode, size or mtime
    changed), its rows and its hash may be of different bytes (the hash would then mark content
    as in the lake that is not), so it fails instead, saying so."""
    before = _identity(inp.path) if isinstance(inp, arc.FileInput) else None
    p = _prepare(inp, opts, done, lake, sha)
    if before is None or p.status not in ("ok", "partial") or _identity(inp.path) == before:
        return p
    if p.staged is not None:
        lake.discard(p.staged)
    return failed(
        p.path,
        p.run_id,
        "the file changed while it was read (replaced or written to during ingest): ingest it again "
        "once it is complete",
        None,
        before[2],
    )


def _prepare(inp, opts: Options, done, lake: Lake, sha: str | None = None) -> Prepared:
    run_id = run_for(inp.run_name, opts.run)
    if isinstance(inp, arc.FileInput):
        path = Path(inp.path)
        fmt = inp.fmt or sniff_path(path)
        if fmt is not None and fmt.startswith("nsys_"):
            return prepare_nsys(path, inp.display, fmt, run_id, opts, done, lake, named=inp.run_name_with)
    t0 = time.time_ns()
    size = inp.size()
    if sha is None:
        sha = arc.sha256_of(inp)
    if not opts.force and is_done(done, sha, run_id, opts.run is None):
        return skipped(inp.display, done, sha, run_id, opts.run is None)
    base = base_row(inp.display, run_id, sha, size, "kineto_json", t0)
    with inp.open() as raw:
        try:
            stream = streams.Inflate(raw)
            peek = streams.Peek(stream.read)
        except TraceError as e:  # a gzip stream that yields nothing: no format detected
            base = {**base, "format": "unknown", "uncompressed_bytes": None}
            return failed(inp.display, run_id, str(e), sha, size, base=base)
        head = peek.head
        if not isinstance(inp, arc.FileInput) and needs_file(head, inp.name):
            return prepare_extracted(inp, peek, sha, size, run_id, opts, done, lake)
        log_fmt = log_format(head, inp.name)
        if log_fmt is not None and nccl.streams(head, log_fmt):
            return prepare_log_stream(inp.name, peek, log_fmt, lake, base)
        if log_fmt is not None:
            data = peek.read(IN_MEMORY_LIMIT + 1)
            rest = b""
            while len(data) <= IN_MEMORY_LIMIT and (rest := peek.read(IN_MEMORY_LIMIT + 1 - len(data))):
                data += rest
            if len(data) > IN_MEMORY_LIMIT:
                return failed(
                    inp.display, run_id, f"log larger than {IN_MEMORY_LIMIT >> 20} MB", sha, size, base=base
                )
            return prepare_log(inp.name, data, log_fmt, lake, {**base, "uncompressed_bytes": len(data)})
        return prepare_kineto(inp, peek, stream, base, run_id, opts, lake)


def prepare_kineto(inp, peek, stream, base: dict, run_id: str, opts: Options, lake: Lake) -> Prepared:
    display, source_id = inp.display, base["source_id"]
    scratch: list[Path] = []  # made at the first spill only (a small trace never spills)

    def scratch_dir() -> Path:
        scratch.append(lake.scratch())
        return scratch[-1]

    parsed = None
    try:
        err = None
        try:
            parsed = kineto.parse_stream(peek.read, comm_patterns=opts.comm_patterns, spool_dir=scratch_dir)
        except kineto.NotKinetoError as e:
            err = str(e)
            base["format"] = "unknown"
        except TraceError as e:
            err = str(e)
            head = peek.head
            if (
                err.startswith(("not valid JSON", "not a Kineto trace: wrong JSON shape", "empty file"))
                and head.lstrip()[:1] not in (b"{", b"[")
                and not inp.name.lower().endswith((".json", ".json.gz"))
            ) and head.strip():
                err = (
                    "not a Kineto trace, Nsight Systems export or NCCL-family log: "
                    "neither JSON nor NCCL_DEBUG / nccl-tests / PyTorch NCCL lines"
                )
                base["format"] = "unknown"
            if (
                inp.name.lower().endswith(".gz")
                and not stream.gzip
                and err.startswith(("not valid JSON", "not a Kineto trace", "empty file", "truncated JSON"))
            ):
                err = f"named .gz but not gzip (no gzip header); {err}"
        except RecursionError:
            err = "JSON nested too deeply"
        if stream.truncated and stream.out_bytes == 0:
            err = "corrupt or truncated gzip: nothing could be decompressed"
        elif stream.truncated and (err is not None or parsed is None or parsed.event_count == 0):
            err = f"corrupt or truncated gzip (the stream ends early){': ' + err if err else ''}"
        base["uncompressed_bytes"] = stream.out_bytes if err is None else None
        if parsed is not None and parsed.event_count == 0 and err is None:
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
            if not streams.json_start(peek.head):  # nothing of it reads as JSON: no format was detected
                base["format"] = "unknown"
            return failed(display, run_id, err, base["content_sha256"], base["size_bytes"], base=base)
        notes = list(parsed.notes)
        ws = parsed.world_size
        if ws is not None and not 0 < ws <= MAX_RANK:
            notes.append(f"distributedInfo world_size {ws} is not a world size: left out")
        elif ws is not None and rsrc == "distributed_info" and r >= ws:
            # a rank of world size W is 0..W-1 (torch.distributed): one of the two is wrong, and
            # the run would count more ranks than its world
            notes.append(
                f"distributedInfo rank {r} is not below its world_size {ws} (ranks are 0..{ws - 1}): "
                "kept as stated; check how this trace was written"
            )
        if stream.truncated:
            notes.append(
                f"the gzip stream ends early (after {stream.in_bytes} compressed bytes): "
                "the file was cut while written"
            )
        partial = parsed.partial or stream.truncated
        p = parsed
        if opts.run is None:  # the job the trace states, and notes when ids disagree (jobid.py)
            job, why = stated_job(inp.name, inp.run_name_with(None), p.job_metadata)
            notes += why
            if job is not None:
                run_id = base["run_id"] = run_for(inp.run_name_with(job), None)
        try:
            tables = p.tables({"run_id": run_id, "source_id": source_id, "rank": r}, arrow=True)
            if run_id in opts.hold_runs:  # a small source stays in memory (hold.py)
                staged = hold.hold_or_stage(lake, run_id, source_id, tables)
            else:
                staged = lake.stage(run_id, source_id, tables)
            if not isinstance(staged, hold.Held):
                with_local(lake, staged, notes, "partial" if partial else "ok")
        except sch.SchemaError as e:
            return failed(
                display,
                run_id,
                f"schema violation: {e}",
                base["content_sha256"],
                base["size_bytes"],
                base=base,
            )
        row = {
            **base,
            "rank": r,
            "rank_source": rsrc,
            "ranks": [r],
            "host": p.host,
            "world_size": p.world_size if p.world_size is not None and 0 < p.world_size <= MAX_RANK else None,
            "backend": p.backend,
            "tool_versions": json.dumps(p.tool_versions, sort_keys=True, default=str)
            if p.tool_versions
            else None,
            "status": "partial" if partial else "ok",
            "unreadable_bytes": p.unreadable_bytes,
            "event_count": p.event_count,
            "base_time_ns": p.base_time_ns,
            "trace_start_ns": p.trace_start_ns,
            "trace_end_ns": p.trace_end_ns,
        }
        return Prepared(
            display,
            run_id,
            row["status"],
            row,
            None,
            notes,
            source_id,
            base["content_sha256"],
            r,
            [r],
            staged,
            stream.out_bytes,
            p.unreadable_bytes,
        )
    finally:
        if parsed is not None:
            parsed.close()
        for d in scratch:
            shutil.rmtree(d, ignore_errors=True)


def with_local(lake: Lake, staged, notes: list[str], status: str) -> None:
    """For a lake in a bucket (pipeline/lake_s3.py), stage the source's per-source metric results
    beside its parts (pipeline/local.py; status: the sources status it will be committed with);
    a failure there costs only speed (analysis then computes those metrics in full): a note. A
    local lake's sources get them at their run's first analysis instead (local_fill.fill: half of a
    large rank's ingest CPU, and DuckDB is not imported by an ingest of Kineto traces), which
    cannot yet write them into a bucket."""
    if not getattr(lake, "remote", False):
        return
    import duckdb

    from .. import local

    if LOCAL_THREADS is not None:
        local.THREADS = LOCAL_THREADS
    try:
        local.stage_local(staged, status)
    except (duckdb.Error, sch.SchemaError, OSError, pl.exceptions.PolarsError) as e:
        notes.append(
            f"per-source metric results not stored ({one_line(f'{type(e).__name__}: {e}')[:200]}); "
            "analysis computes those metrics in full"
        )


def prepare_log_stream(name: str, peek, fmt: str, lake: Lake, base: dict) -> Prepared:
    """An NCCL-family text log (nccl.streams): read line by line from `peek`, its append-only
    tables spooled (in memory up to the spool budget, then in the lake's scratch directory), so
    memory stays bounded whatever the log's length. Else as prepare_log."""
    read_bytes = 0

    def read(n: int) -> bytes:
        nonlocal read_bytes
        b = peek.read(n)
        read_bytes += len(b)
        return b

    scratch = lake.scratch()
    p = None
    try:
        try:
            p = nccl.parse_stream(read, name, fmt, _Budget(LOG_SPOOL_BYTES, scratch))
        except TraceError as e:
            b = {**base, "format": fmt}
            return failed(b["path"], b["run_id"], str(e), b["content_sha256"], b["size_bytes"], base=b)
        return prepare_log(name, p, fmt, lake, {**base, "uncompressed_bytes": read_bytes}, read_bytes)
    finally:
        if p is not None:
            p.close()
        shutil.rmtree(scratch, ignore_errors=True)


def prepare_log(name: str, data, fmt: str, lake: Lake, base: dict, size: int | None = None) -> Prepared:
    """An NCCL-family file (pipeline/ingest/nccl/): its nccl_* / flight_recorder* tables. Such a
    file holds no rank's trace rows, so it never claims a rank of its run. data: the file's bytes,
    or the nccl.LogParsed that prepare_log_stream read from it (then size: its byte count)."""
    run_id, source_id, display = base["run_id"], base["source_id"], base["path"]
    base = {**base, "format": fmt}
    if isinstance(data, nccl.LogParsed):
        p = data
    else:
        size = len(data)
        try:
            p = nccl.parse(data, name, fmt)
        except TraceError as e:
            return failed(display, run_id, str(e), base["content_sha256"], base["size_bytes"], base=base)
    ids = [pl.lit(run_id).alias("run_id"), pl.lit(source_id).alias("source_id")]

    def with_ids(v):
        if isinstance(v, pl.DataFrame):
            return v.with_columns(ids).to_arrow() if v.height else None
        return (f.with_columns(ids).to_arrow() for f in v)  # a spool: streamed into its part

    identity = log_identity(p.tables)  # before the tables are streamed into their parts
    tables = {t: with_ids(v) for t, v in p.tables.items()}
    tables = {t: v for t, v in tables.items() if v is not None}
    row = {
        **base,
        "status": "ok",
        "host": p.host,
        "event_count": p.event_count,
        "world_size": p.world_size if p.world_size is not None and 0 < p.world_size <= MAX_RANK else None,
        "tool_versions": json.dumps(p.tool_versions, sort_keys=True, default=str)
        if p.tool_versions
        else None,
    }
    try:
        staged = lake.stage(run_id, source_id, tables)
    except sch.SchemaError as e:
        return failed(
            display, run_id, f"schema violation: {e}", base["content_sha256"], base["size_bytes"], base=base
        )
    return Prepared(
        display,
        run_id,
        "ok",
        row,
        None,
        list(p.notes),
        source_id,
        base["content_sha256"],
        None,
        None,
        staged,
        size,
        identity=identity,
    )


def prepare_nsys(
    path: Path,
    display: str,
    fmt: str,
    run_id: str,
    opts: Options,
    done,
    lake: Lake,
    name: str | None = None,
    sha: str | None = None,
    named=None,
) -> Prepared:
    """An Nsight Systems export (or nsys-jax archive); named: its input's run_name_with (job ->
    the run name its input gives with that job), for the job its capture's environment states
    when its name states none (jobid.py; archive.member_run_name for an archive's member)."""
    import duckdb  # an export is staged in DuckDB (nsys/build.py)

    from . import nsys  # imported for an export only (40 ms of every other ingest's start-up)

    t0 = time.time_ns()
    if sha is None and (sha := content_sha256(path)) and fmt == "nsys_sqlite":
        sha = nsys.readers.content_sha256(sha, path)  # with its write-ahead log's rows, if any
    sha = sha or hashlib.sha256(("unreadable:" + display).encode()).hexdigest()
    source_id = sha[:16]
    size = _size(path)
    if not opts.force and is_done(done, sha, run_id, opts.run is None):
        return skipped(display, done, sha, run_id, opts.run is None)
    base = base_row(display, run_id, sha, size, fmt, t0)
    scratch = lake.scratch()
    try:
        with nsys.open_export(
            path,
            fmt,
            scratch,
            file_rank=rank_from_name(name or path.name),
            cli_rank=opts.rank,
            step_regex=opts.step_regex,
            comm_patterns=opts.comm_patterns,
        ) as ex:
            notes = list(ex.notes)
            if opts.run is None and named is not None:  # the job its capture states (jobid.py)
                job, why = stated_job(name or path.name, named(None), ex.job_env, ENV_KEYS)
                notes += why
                if job is not None:
                    run_id = base["run_id"] = run_for(named(job), None)
            rank_list = ex.rank_list
            bad = [r for r in rank_list if not 0 <= r <= MAX_RANK]
            if bad:
                raise nsys.NsysError(f"rank {bad[0]} ({ex.rank_source}) is outside 0..{MAX_RANK}")
            row = {
                **base,
                "format": ex.format,
                "rank": rank_list[0] if len(rank_list) == 1 else None,
                "rank_source": ex.rank_source,
                "ranks": rank_list,
                "host": ex.host,
                "tool_versions": json.dumps(ex.tool_versions, sort_keys=True) if ex.tool_versions else None,
                "status": "ok",
                "event_count": ex.event_count,
                "base_time_ns": ex.base_time_ns,
                "trace_start_ns": ex.trace_start_ns,
                "trace_end_ns": ex.trace_end_ns,
                "world_size": len(rank_list) if ex.rank_source == "process_order" else None,
            }
            staged = lake.stage(run_id, source_id, ex.tables(run_id, source_id))
            with_local(lake, staged, notes, "ok")
    except (TraceError, duckdb.Error, sch.SchemaError) as e:
        err = one_line(str(e) if isinstance(e, TraceError) else f"{type(e).__name__}: {e}")[:500]
        if isinstance(e, UnknownFormat):
            base = {**base, "format": "unknown"}
        return failed(display, run_id, err, sha, size, base=base)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Prepared(
        display,
        run_id,
        "ok",
        row,
        None,
        notes,
        source_id,
        sha,
        rank_list[0] if len(rank_list) == 1 else None,
        list(rank_list),
        staged,
        size,
    )


def prepare_extracted(
    inp, peek, sha: str, size: int, run_id: str, opts: Options, done, lake: Lake
) -> Prepared:
    """A member in a format that needs a real file (Nsight Systems): copied to scratch first."""
    scratch = lake.scratch()
    try:
        f = scratch / inp.name
        with open(f, "wb") as out:
            while block := peek.read(1 << 20):
                out.write(block)
        fmt = sniff_path(f)
        if fmt is None or not fmt.startswith("nsys_"):
            return failed(
                inp.display, run_id, "not a Kineto trace, Nsight Systems export or NCCL-family log", sha, size
            )
        return prepare_nsys(
            f, inp.display, fmt, run_id, opts, done, lake, name=inp.name, sha=sha, named=inp.run_name_with
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
