"""Perfetto's protobuf trace format (`.pftrace`): a timeline (pipeline/timeline/__init__.py) as
TracePackets built with the `perfetto` package's maintained writer (PyPI `perfetto`,
perfetto.trace_builder.proto_builder; its message classes are Perfetto's own
protos/perfetto/trace/perfetto_trace.proto).

The same layout as the Chrome JSON (chrome.py): one process track per rank (ProcessDescriptor
pid = rank, process_name "rank N · host · GPU"), one thread track per track and lane
(ThreadDescriptor with the JSON's tid and thread_name), the findings in process FINDINGS_PID.
Each slice is a TrackEvent TYPE_SLICE_BEGIN / TYPE_SLICE_END pair on its lane's track (a slice
of no length is TYPE_INSTANT), its args as debug annotations; a collective's flow is a flow id
on the source slice's begin and a terminating flow id on the target's. Timestamps are the lake's
int64 ns exactly (TracePacket.timestamp is ns; no µs rounding as in JSON). Packets are written in
timestamp order, ends before begins at one instant, so nested slices close innermost first.
Source of the format: perfetto.dev/docs/reference/synthetic-track-event.
"""

from __future__ import annotations

from pathlib import Path

from .chrome import FINDINGS_PID

SEQUENCE_ID = 1  # every packet on one trusted sequence (the format requires one)


def _annotate(ev, args: dict) -> None:
    for k, v in args.items():
        if v is None:
            continue
        a = ev.debug_annotations.add()
        a.name = str(k)
        if isinstance(v, bool):
            a.bool_value = v
        elif isinstance(v, int) and -(2**63) <= v < 2**63:
            a.int_value = v
        elif isinstance(v, float):
            a.double_value = v
        else:
            a.string_value = str(v)


def encode(tl) -> bytes:
    """The timeline as a serialized Perfetto Trace. Raises ImportError when the `perfetto`
    package is not installed."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    b = TraceProtoBuilder()
    uuids: dict[tuple[int, int], int] = {}
    for pid, name, _sort in tl.processes:
        p = b.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        p.track_descriptor.uuid = 1 + pid  # process tracks: 1 + pid; thread tracks above 2^40
        p.track_descriptor.process.pid = pid
        p.track_descriptor.process.process_name = name
    for i, ((pid, tid), name) in enumerate(sorted(tl.thread_names.items()), start=1):
        uuids[(pid, tid)] = (1 << 40) + i
        p = b.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        p.track_descriptor.uuid = uuids[(pid, tid)]
        p.track_descriptor.parent_uuid = 1 + pid
        p.track_descriptor.thread.pid = pid
        p.track_descriptor.thread.tid = tid
        p.track_descriptor.thread.thread_name = name
    flows_out: dict[int, list[int]] = {}
    flows_in: dict[int, list[int]] = {}
    for i, (src, dst, _ts_src, _ts_dst, _name) in enumerate(tl.flows, start=1):
        flows_out.setdefault(id(src), []).append(i)
        flows_in.setdefault(id(dst), []).append(i)
    # (ts, 0 = end | 1 = begin or instant, order within the instant, slice, kind)
    marks = []
    for s in tl.slices:
        if s.end_ns == s.start_ns:
            marks.append((s.start_ns, 1, 0, s, TrackEvent.TYPE_INSTANT))
        else:
            marks.append((s.start_ns, 1, -(s.end_ns - s.start_ns), s, TrackEvent.TYPE_SLICE_BEGIN))
            marks.append((s.end_ns, 0, -s.start_ns, s, TrackEvent.TYPE_SLICE_END))
    marks.sort(key=lambda m: (m[0], m[1], m[2], m[3].pid, tl.tid_of(m[3])))
    for ts, _, _, s, kind in marks:
        p = b.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        p.timestamp = ts
        ev = p.track_event
        ev.type = kind
        ev.track_uuid = uuids[(s.pid, tl.tid_of(s))]
        if kind == TrackEvent.TYPE_SLICE_END:
            continue
        ev.name = s.name
        if s.cat:
            ev.categories.append(s.cat)
        _annotate(ev, s.args or {})
        ev.flow_ids.extend(flows_out.get(id(s), []))
        ev.terminating_flow_ids.extend(flows_in.get(id(s), []))
    return b.serialize()


def write(tl, path: Path) -> int:
    """Write `tl` to path as a .pftrace; returns the bytes written."""
    data = encode(tl)
    path.write_bytes(data)
    return len(data)


__all__ = ["FINDINGS_PID", "encode", "write"]
