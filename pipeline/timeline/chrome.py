"""The Chrome JSON trace format (the Trace Event Format that chrome://tracing and the Perfetto UI
open): a timeline (pipeline/timeline/__init__.py) as one JSON document, encoded with msgspec.

Units: `ts` and `dur` are microseconds (the format's unit) written as decimal numbers with three
fractional digits, so the lake's int64 ns survive exactly in the text (ts = ns / 1000 on the
lake's absolute clock, epoch µs as Kineto writes them); "displayTimeUnit": "ns". Viewers that
parse numbers as doubles keep about 0.25 µs of an epoch-µs value; tracelake's Kineto reader
(pipeline/timeparse.py) reads the text back to the ns.

Layout: one process per rank (pid = rank, process_name "rank N · host · GPU"), one thread per
track and lane (tids numbered from 1 in track order, thread_name and thread_sort_index
metadata), the run's findings in process FINDINGS_PID; slices are complete events ("X"),
collectives' flows are "s"/"f" pairs ("bp": "e": bound to the enclosing slice). A trace of one
rank also carries Kineto's "distributedInfo" so `tracelake ingest` reads it as that rank.
Source of the format: the Trace Event Format document (Google, "Trace Event Format",
docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU) and Perfetto's
JSON importer (perfetto.dev/docs/getting-started/other-formats).
"""

from __future__ import annotations

import gzip
from decimal import Decimal
from pathlib import Path

import msgspec

FINDINGS_PID = 1_000_000  # the run's findings track: a pid no rank has
_ENCODER = msgspec.json.Encoder(decimal_format="number")


def us(ns: int) -> Decimal:
    """ns as exact decimal µs with three fractional digits (1234567 -> 1234.567)."""
    sign, a = ("-", -ns) if ns < 0 else ("", ns)
    return Decimal(f"{sign}{a // 1000}.{a % 1000:03d}")


def events(tl) -> list[dict]:
    """The traceEvents of timeline `tl`: metadata, then slices by start, then flows."""
    out: list[dict] = []
    for pid, name, sort in tl.processes:
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}
        )
    for (pid, tid), name in tl.thread_names.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append(
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        )
    for s in sorted(tl.slices, key=lambda s: (s.start_ns, -s.end_ns, s.pid, tl.tid_of(s))):
        ev = {
            "ph": "X",
            "pid": s.pid,
            "tid": tl.tid_of(s),
            "ts": us(s.start_ns),
            "dur": us(s.end_ns - s.start_ns),
            "name": s.name,
            "cat": s.cat,
            "args": s.args,
        }
        if s.cname:
            ev["cname"] = s.cname
        out.append(ev)
    for i, (src, dst, ts_src, ts_dst, name) in enumerate(tl.flows, start=1):
        # a flow between two critical-path segments is the path's; the others join a collective
        common = {"id": i, "name": name, "cat": src.cat if src.cat == "critical_path" else "collective"}
        out.append({"ph": "s", "pid": src.pid, "tid": tl.tid_of(src), "ts": us(ts_src), **common})
        out.append({"ph": "f", "bp": "e", "pid": dst.pid, "tid": tl.tid_of(dst), "ts": us(ts_dst), **common})
    return out


def encode(tl) -> bytes:
    """The whole document as JSON bytes."""
    doc = {
        "schemaVersion": 1,
        "displayTimeUnit": "ns",
        "traceEvents": events(tl),
        "otherData": tl.other_data,
    }
    if len(tl.ranks) == 1:
        doc["distributedInfo"] = {"rank": tl.ranks[0], "world_size": tl.world_size}
    return _ENCODER.encode(doc)


def write(tl, path: Path) -> int:
    """Write `tl` to path (gzip-compressed when it ends in .gz); returns the bytes written."""
    data = encode(tl)
    if path.name.lower().endswith(".gz"):
        try:
            from isal import igzip

            data = igzip.compress(data, compresslevel=2)
        except ImportError:  # pragma: no cover - isal is a dependency
            data = gzip.compress(data, compresslevel=6)
    path.write_bytes(data)
    return len(data)
