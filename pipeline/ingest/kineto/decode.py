"""Kineto JSON bytes -> msgspec structs: the event / args / document structs and decode().

Owns: KEvent (one event, ts/dur/args kept as raw text), KArgs (the args keys tracelake reads),
KTrace (the top-level object), the tagged fast-path structs (args of complete events decoded in
the same pass), decode_args() (raw args -> KArgs) and decode() (a whole document in memory, with
the invalid-UTF-8 fallback), and NotKinetoError.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Union

import msgspec

from ..errors import TraceError


class NotKinetoError(TraceError):
    """Valid JSON that is not a Kineto trace (Chakra execution trace, memory timeline, ...)."""


class KEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")
    args: msgspec.Raw = msgspec.Raw(b"")  # decoded later, only for events that are kept


# The Kineto args keys tracelake reads (../shared/reference/hta.md section 1d), attribute <- key.
# Everything else in args is skipped by the decoder without building Python objects.
_ARG_KEYS = {
    "external_id": "External id",
    "external_id_old": "external id",
    "correlation": "correlation",
    "stream": "stream",
    "device": "device",
    "context": "context",
    "grid": "grid",
    "block": "block",
    "registers_per_thread": "registers per thread",
    "shared_memory": "shared memory",
    "bytes": "bytes",
    "input_dims": "Input Dims",
    "input_dims_old": "Input dims",
    "input_type": "Input type",
    "flops": "flops",
    "concrete_inputs": "Concrete Inputs",
    "sequence_number": "Sequence number",
    "cuda_sync_kind": "cuda_sync_kind",
    "graph_id": "graph id",
    "collective_name": "Collective name",
    "in_msg_nelems": "In msg nelems",
    "out_msg_nelems": "Out msg nelems",
    "group_size": "Group size",
    "dtype": "dtype",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",
    "seq": "Seq",
    "comms_id": "Comms Id",
    "src_rank": "Src Rank",
    "dst_rank": "Dst Rank",
}


class KArgs(msgspec.Struct, rename=_ARG_KEYS, gc=False, frozen=True):
    """The args of one event that tracelake reads (attributes named in _ARG_KEYS)."""

    external_id: Any = None
    external_id_old: Any = None
    correlation: Any = None
    stream: Any = None
    device: Any = None
    context: Any = None
    grid: Any = None
    block: Any = None
    registers_per_thread: Any = None
    shared_memory: Any = None
    bytes: Any = None
    input_dims: msgspec.Raw = msgspec.Raw(b"")
    input_dims_old: msgspec.Raw = msgspec.Raw(b"")
    input_type: msgspec.Raw = msgspec.Raw(b"")
    concrete_inputs: msgspec.Raw = msgspec.Raw(b"")
    flops: Any = None
    sequence_number: Any = None
    cuda_sync_kind: Any = None
    graph_id: Any = None
    collective_name: Any = None
    in_msg_nelems: Any = None
    out_msg_nelems: Any = None
    group_size: Any = None
    dtype: Any = None
    pg_name: Any = None
    pg_desc: Any = None
    pg_ranks: Any = None
    seq: Any = None
    comms_id: Any = None
    src_rank: Any = None
    dst_rank: Any = None


_EMPTY_ARGS = KArgs()
_ARGS_LIST = msgspec.json.Decoder(list[KArgs])
_ARGS_ONE = msgspec.json.Decoder(KArgs)


# Fast path: a union tagged by "ph", so complete events ("X") get their args decoded into KArgs in
# the same pass while metadata/flow/counter events keep theirs as raw text. Any event this does not
# fit (unknown phase, args that are not an object) sends the file to the general decoder.
# cat, name, pid and tid as JSON scalars only: a batch with a list or object in one of them is
# decoded again by the general decoder (KEvent, Any), whose events columns.sort_events checks one
# by one; this one's need no check (the same decoding time, measured on 150k events)
_SCALAR = Union[str, int, float, bool, None]


class _TEv(msgspec.Struct, tag_field="ph", gc=False):
    cat: _SCALAR = None
    name: _SCALAR = None
    pid: _SCALAR = None
    tid: _SCALAR = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")


class _TX(_TEv, tag="X"):
    ph: ClassVar[str] = "X"
    args: KArgs = _EMPTY_ARGS


def _other(tag: str):
    return type(
        f"_T{tag}",
        (_TEv,),
        {"__annotations__": {"ph": ClassVar[str], "args": msgspec.Raw}, "ph": tag, "args": msgspec.Raw(b"")},
        tag=tag,
    )


class _TSkipped(msgspec.Struct, tag_field="ph", gc=False):
    """An event of a phase no table reads (metadata, flows, instants, ...): only counted (event
    index), so none of its keys is kept (the decoder skips them without building objects). Its
    cat reads as None (a class attribute, never decoded), as columns.sort_events reads every
    event's."""

    cat: ClassVar[None] = None


def _skipped(tag: str):
    return type(f"_S{tag}", (_TSkipped,), {"__annotations__": {"ph": ClassVar[str]}, "ph": tag}, tag=tag)


# ph X: GPU work, CPU ops and annotations; ph C: counters (_Acc.add reads no other phase)
_TAGGED = Union[
    (_TX, _other("C"))
    + tuple(
        _skipped(t) for t in ("M", "i", "I", "s", "t", "f", "B", "E", "b", "e", "n", "P", "O", "N", "D", "R")
    )
]


def decode_args(evs: list) -> list[KArgs]:
    """Decode the args of the given events in one call; an event whose args are not an object
    gets empty args."""
    if not evs:
        return []
    if isinstance(evs[0].args, KArgs):  # decoded in the first pass (fast path)
        return [e.args for e in evs]
    raws = [e.args if len(e.args) else b"{}" for e in evs]
    try:
        return _ARGS_LIST.decode(b"[" + b",".join(raws) + b"]")
    except (msgspec.ValidationError, msgspec.DecodeError):
        out = []
        for r in raws:
            try:
                out.append(_ARGS_ONE.decode(r))
            except (msgspec.ValidationError, msgspec.DecodeError):
                out.append(_EMPTY_ARGS)
        return out


_KTRACE_RENAME = {
    "trace_events": "traceEvents",
    "device_properties": "deviceProperties",
    "distributed_info": "distributedInfo",
    "base_time_ns": "baseTimeNanoseconds",
    "schema_version": "schemaVersion",
    "cupti_version": "cupti_version",
}


class KTrace(msgspec.Struct, rename=_KTRACE_RENAME):
    trace_events: Union[list[KEvent], None] = None
    device_properties: Any = None
    distributed_info: Any = None
    base_time_ns: msgspec.Raw = msgspec.Raw(b"")
    schema_version: Any = None
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    roctracer_version: Any = None
    hip_runtime_version: Any = None
    hip_driver_version: Any = None
    host_name: Any = None
    hostname: Any = None
    nodes: Any = None
    schema: Any = None
    # the job the trace states (pipeline/ingest/jobid.py METADATA_KEYS: add_metadata_json's keys)
    job_id: Any = None
    jobid: Any = None
    slurm_job_id: Any = None
    run_id: Any = None
    group_trace_id: Any = None


_DECODER = msgspec.json.Decoder(Union[KTrace, list[KEvent]])


class _KTraceTagged(KTrace, rename=_KTRACE_RENAME):
    trace_events: Union[list[_TAGGED], None] = None


_FAST_DECODER = msgspec.json.Decoder(Union[_KTraceTagged, list[_TAGGED]])


def decode(data: bytes) -> tuple[Any, list[str]]:
    """Decode trace bytes; returns (KTrace | list[KEvent], notes). Bytes after the end of the JSON
    document are ignored, with a note counting them. Raises TraceError."""
    notes: list[str] = []
    if not data or data[:64].isspace() and data.isspace():
        raise TraceError("empty file")
    try:
        doc = _FAST_DECODER.decode(data)
        if not (isinstance(doc, KTrace) and doc.trace_events is None):
            return doc, notes
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass  # the general decoder below copes with odd events or says what is wrong
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as e:
        raise TraceError(f"not a Kineto trace: wrong JSON shape ({e})") from None
    except msgspec.DecodeError as e:
        msg = str(e)
        end = document_end(data)
        if end is not None:
            doc, notes = decode(data[:end])
            notes.append(
                f"{len(data) - end} trailing bytes after the JSON document (from byte {end}) were ignored"
            )
            return doc, notes
        if "UTF-8" in msg:
            repl = "\ufffd".encode()
            bad = data.count(repl)
            data = data.decode("utf-8", "replace").encode("utf-8")
            notes.append(f"invalid UTF-8 replaced by U+FFFD ({data.count(repl) - bad} places)")
            try:
                doc = _DECODER.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e2:
                raise TraceError(f"not valid JSON: {e2}") from None
        elif "truncated" in msg:
            raise TraceError(
                f"truncated JSON ({msg}); the profiler was probably killed while writing"
            ) from None
        else:
            raise TraceError(f"not valid JSON: {msg}") from None
    if isinstance(doc, KTrace) and doc.trace_events is None:
        if doc.nodes is not None and doc.schema is not None:
            raise NotKinetoError(
                "not a Kineto trace: this is a Chakra execution trace "
                "(has 'nodes' and 'schema', no 'traceEvents')"
            )
        raise NotKinetoError("not a Kineto trace: JSON object without 'traceEvents'")
    return doc, notes


def document_end(data: bytes) -> int | None:
    """Where the JSON document in `data` ends when bytes other than white space follow it (the
    first of them), else None. msgspec finds it (a Raw value is skipped, not built; invalid UTF-8
    inside strings does not stop it)."""
    try:
        msgspec.json.decode(data, type=msgspec.Raw)
    except msgspec.DecodeError as e:
        b = re.search(r"\(byte (\d+)\)", str(e))
        if "trailing characters" in str(e) and b is not None:
            return int(b.group(1)) - 1
    return None
