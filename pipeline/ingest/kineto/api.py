"""The entry points: parse() (a trace in memory -> Parsed) and parse_stream() (a trace read as a
stream -> StreamParsed), wiring the splitter (stream), the accumulator (acc) and its spools.
"""

from __future__ import annotations

from dataclasses import fields

import polars as pl

from ..spool import SPOOL_BYTES, _Budget
from .acc import _Acc
from .result import Parsed, StreamParsed, TraceMeta
from .stream import BATCH_BYTES, _Splitter


def parse(data: bytes, comm_patterns: list[str] | None = None) -> Parsed:
    """Parse one Kineto trace held in memory (parse_stream, materialized). See the package doc
    (pipeline/ingest/kineto/__init__.py) for what is handled and raised."""
    import io

    s = parse_stream(io.BytesIO(data).read, comm_patterns)
    try:
        t = s.tables()
        fr = {}
        for k, v in t.items():
            chunks = list(v() if callable(v) else v)
            fr[k] = pl.concat(chunks, how="vertical_relaxed") if chunks else pl.DataFrame()
    finally:
        s.close()
    return Parsed(
        gpu=fr["gpu_activities"],
        cpu=fr["cpu_ops"],
        steps=fr["steps"],
        collectives=fr["collectives"],
        devices=fr["devices"],
        process_groups=fr["process_groups"],
        annotations=fr["annotations"],
        counters=fr["counters"],
        **{f.name: getattr(s, f.name) for f in fields(TraceMeta)},
    )


def parse_stream(
    read,
    comm_patterns: list[str] | None = None,
    spool_dir=None,
    batch_bytes: int | None = None,
    spool_bytes: int | None = None,
    on_batch=None,
) -> "StreamParsed":
    """Parse one Kineto trace from `read(n) -> bytes` (decompressed; b'' at the end) in batches.
    Memory is bounded by batch_bytes plus spool_bytes of tables (beyond that they are spilled to
    Arrow IPC files in spool_dir, a directory or a callable giving one at the first spill; without
    spool_dir they stay in memory). on_batch(batches, events), when given, is called after each
    batch is added (batches and events so far; benchmarks/ingest_memory.py reads the RSS there).
    Raises TraceError / NotKinetoError (one line). Call .close() on the result when done with it."""
    sp = _Splitter(read, BATCH_BYTES if batch_bytes is None else batch_bytes)
    acc = _Acc(_Budget(SPOOL_BYTES if spool_bytes is None else spool_bytes, spool_dir))
    try:
        for k, events in enumerate(sp.batches(), 1):
            acc.add(events)
            del events  # the batch's Python objects go before the next batch is decoded
            if on_batch is not None:
                on_batch(k, acc.n)
        return acc.finish(sp, comm_patterns)
    except BaseException:
        acc.close()
        raise
