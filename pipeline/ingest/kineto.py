"""PyTorch profiler (Kineto) Chrome-trace JSON -> schema v1 tables.

Input: the bytes of one trace (already decompressed). Handles, per
../shared/reference/hta.md section 1d: top-level object or 2021 bare event array; categories old
(Operator/Runtime/Kernel/Memcpy/Memset) and new; integer epoch µs, ns-fraction µs and
`baseTimeNanoseconds`-relative ts; ROCm (hip*, stream 0) and MTIA (mtia_ccp_events) traces;
CPU-only traces; missing distributedInfo or ProfilerStep; uint64 `Comms Id`; invalid UTF-8
(replaced, noted). Overlapping events on one stream are kept as they are.

Output: `Parsed`, polars frames without run_id/source_id/rank (the caller adds them).
Errors: `NotKinetoError` for files that are valid JSON but not a Kineto trace, `TraceError` for
unreadable ones; both carry a one-line message.
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Union

import msgspec
import msgspec.structs
import numpy as np
import polars as pl
import pyarrow as pa

from .. import classify as classify_mod
from .. import catalog
from ..flops import MODELLED_OPS, op_flops
from ..ncclname import kernel_meta  # noqa: F401  (re-exported for callers of kineto.kernel_meta)
from ..timeparse import us_text_to_ns
from . import kineto_comm
from .errors import TraceError


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
    "external_id": "External id", "external_id_old": "external id", "correlation": "correlation",
    "stream": "stream", "device": "device", "context": "context", "grid": "grid", "block": "block",
    "registers_per_thread": "registers per thread", "shared_memory": "shared memory", "bytes": "bytes",
    "input_dims": "Input Dims", "input_dims_old": "Input dims", "input_type": "Input type", "flops": "flops",
    "concrete_inputs": "Concrete Inputs",
    "sequence_number": "Sequence number", "cuda_sync_kind": "cuda_sync_kind", "graph_id": "graph id",
    "collective_name": "Collective name", "in_msg_nelems": "In msg nelems", "out_msg_nelems": "Out msg nelems",
    "group_size": "Group size", "dtype": "dtype", "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description", "pg_ranks": "Process Group Ranks", "seq": "Seq",
    "comms_id": "Comms Id", "src_rank": "Src Rank", "dst_rank": "Dst Rank",
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
class _TEv(msgspec.Struct, tag_field="ph", gc=False):
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")


class _TX(_TEv, tag="X"):
    ph: ClassVar[str] = "X"
    args: KArgs = _EMPTY_ARGS


def _other(tag: str):
    return type(f"_T{tag}", (_TEv,), {"__annotations__": {"ph": ClassVar[str], "args": msgspec.Raw},
                                       "ph": tag, "args": msgspec.Raw(b"")}, tag=tag)


class _TSkipped(msgspec.Struct, tag_field="ph", gc=False):
    """An event of a phase no table reads (metadata, flows, instants, ...): only counted (event
    index), so none of its keys is kept (the decoder skips them without building objects)."""


def _skipped(tag: str):
    return type(f"_S{tag}", (_TSkipped,), {"__annotations__": {"ph": ClassVar[str]}, "ph": tag}, tag=tag)


# ph X: GPU work, CPU ops and annotations; ph C: counters (_Acc.add reads no other phase)
_TAGGED = Union[(_TX, _other("C")) + tuple(_skipped(t) for t in ("M", "i", "I", "s", "t", "f", "B", "E", "b", "e", "n", "P", "O", "N", "D", "R"))]




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
    "trace_events": "traceEvents", "device_properties": "deviceProperties",
    "distributed_info": "distributedInfo", "base_time_ns": "baseTimeNanoseconds",
    "schema_version": "schemaVersion", "cupti_version": "cupti_version",
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


_DECODER = msgspec.json.Decoder(Union[KTrace, list[KEvent]])


class _KTraceTagged(KTrace, rename=_KTRACE_RENAME):
    trace_events: Union[list[_TAGGED], None] = None


_FAST_DECODER = msgspec.json.Decoder(Union[_KTraceTagged, list[_TAGGED]])


GPU_KIND = {
    "kernel": "kernel", "Kernel": "kernel", "mtia_ccp_events": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset",
    "cuda_sync": "sync",
    "cuda_profiler_range": "unknown",
}
CPU_KIND = {
    "cpu_op": "op", "Operator": "op", "user_annotation": "annotation",
    "python_function": "python", "cuda_runtime": "runtime", "Runtime": "runtime",
    "cuda_driver": "driver", "mtia_runtime": "runtime", "overhead": "other",
}
SKIP_CATS = {"Trace", "ac2g", "async_cpu_to_gpu", "async", "fwdbwd", "critical_path", "cpu_instant_event"}

_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_COPY_RE = re.compile(r"^(?:hip)?Memcpy\s*(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|AtoH|HtoA|AtoA)?(?:\s*\((\w+)\s*->\s*(\w+)\))?")
_MEMSET_RE = re.compile(r"^(?:hip)?Memset\s*(?:\((\w+)\))?")
_SYNC_KIND = {"Stream Sync": "stream", "Event Sync": "event", "Context Sync": "context",
              "Stream Wait Event": "stream_wait_event", "Device Sync": "context"}
def _int(v) -> int | None:
    if type(v) is int:
        return v if -(2**63) <= v < 2**63 else None
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 9.2e18 else None
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s, 16) if s.lower().startswith("0x") else int(float(s)) if "." in s else int(s)
        except ValueError:
            m = re.search(r"-?\d+", s)
            return int(m.group()) if m else None
    return None


def _text(r: msgspec.Raw) -> str | None:
    return bytes(r).decode("utf-8", "replace") if len(r) else None


_AG = {k: operator.attrgetter(k) for k in ("pid", "tid", "correlation", "context", "registers_per_thread",
                                           "shared_memory", "bytes", "graph_id", "sequence_number")}


def _ints(values) -> pl.Series:
    """Int64 column from Python values: the fast path takes ints and None as they are; any other
    value (float, numeric string, hex string, out-of-range int) goes through _int."""
    vals = list(values)
    try:
        return pl.Series(vals, dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series([_int(v) for v in vals], dtype=pl.Int64)


def _names(evs: list) -> tuple[list, pl.Series]:
    """Event names (str(name) for a name that is not a string) as a list and a String series."""
    names = list(map(_NAME, evs))
    try:
        s = pl.Series(names, dtype=pl.String, strict=True)
        if not s.null_count():
            return names, s
    except (TypeError, pl.exceptions.PolarsError):
        pass
    names = [n if isinstance(n, str) else str(n) for n in names]
    return names, pl.Series(names, dtype=pl.String)


_NAME = operator.attrgetter("name")


def _texts(raws: list) -> pl.Series:
    """JSON texts of many msgspec.Raw values (null for an empty one), split in Rust from one
    joined decode (NUL never occurs in JSON text)."""
    if not raws:
        return pl.Series([], dtype=pl.String)
    s = pl.Series([b"\x00".join(raws).decode("utf-8", "replace")], dtype=pl.String).str.split("\x00").explode()
    return s.replace("", None) if s.str.len_bytes().min() == 0 else s


def _ranks(v) -> list[int] | None:
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if isinstance(v, list):
        out = [_int(x) for x in v]
        return None if any(x is None for x in out) else out
    return None


def _dims3(vals: list, prefix: str) -> dict[str, pl.Series]:
    """{prefix_x, prefix_y, prefix_z} Int32 columns from grid/block values: _dims(v, 3) of each,
    with the common case (a list of three ints) checked inline."""
    xs, ys, zs = [], [], []
    lim = 2**31
    for v in vals:
        if type(v) is list and len(v) == 3:
            a, b, c = v
            if type(a) is int and type(b) is int and type(c) is int and 0 <= a < lim and 0 <= b < lim and 0 <= c < lim:
                xs.append(a)
                ys.append(b)
                zs.append(c)
                continue
        d = _dims(v, 3)
        xs.append(d[0] if d else None)
        ys.append(d[1] if d else None)
        zs.append(d[2] if d else None)
    return {f"{prefix}_x": pl.Series(xs, dtype=pl.Int32), f"{prefix}_y": pl.Series(ys, dtype=pl.Int32),
            f"{prefix}_z": pl.Series(zs, dtype=pl.Int32)}


def _dims(v, n):
    if isinstance(v, list) and len(v) >= n and all(isinstance(x, (int, float)) and 0 <= x < 2**31 for x in v[:n]):
        return [int(x) for x in v[:n]]
    return None


def decode(data: bytes) -> tuple[Any, list[str]]:
    """Decode trace bytes; returns (KTrace | list[KEvent], notes). Raises TraceError."""
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
            raise TraceError(f"truncated JSON ({msg}); the profiler was probably killed while writing") from None
        else:
            raise TraceError(f"not valid JSON: {msg}") from None
    if isinstance(doc, KTrace) and doc.trace_events is None:
        if doc.nodes is not None and doc.schema is not None:
            raise NotKinetoError("not a Kineto trace: this is a Chakra execution trace (has 'nodes' and 'schema', no 'traceEvents')")
        raise NotKinetoError("not a Kineto trace: JSON object without 'traceEvents'")
    return doc, notes


# ----------------------------------------------------------------------------- streaming split
# A trace is read as a stream and its traceEvents array is decoded in batches of about
# BATCH_BYTES, so memory is bounded by the batch size, not the file size. Batch boundaries are
# found by a byte scan for the text between two events ('}' ',' '{', whitespace allowed) or at the
# end of the array ('}' ']'); the bytes up to a candidate boundary are decoded by msgspec as one
# JSON array. A candidate that lies inside an event (an args object holding a list of objects, or
# a string) cannot decode as a complete array: msgspec reports the input truncated or malformed
# at its very last byte, and the next candidate is tried. So no JSON is parsed by hand: the scan
# only proposes cut points and msgspec decides. Everything around the array (deviceProperties,
# distributedInfo, baseTimeNanoseconds, which Kineto writes after the events) is decoded as a
# skeleton: the text before the array + '[]' + the text after it.
#
# A file that ends inside the array (a job killed while the profiler wrote) keeps every event
# that is complete: the last boundary before the end that decodes is taken, and the bytes after
# it are counted as unreadable (Parsed.partial / unreadable_bytes).

BATCH_BYTES = 16 << 20
READ_BYTES = 4 << 20
HEAD_LIMIT = 64 << 20          # traceEvents must start within this many bytes
TAIL_LIMIT = 256 << 20         # text after the traceEvents array
MAX_EVENT_BYTES = 256 << 20    # one event (no boundary found within this many bytes -> error)
IN_MEMORY_LIMIT = 1 << 30      # whole-document fallback (no traceEvents array found up front)
SPOOL_BYTES = 256 << 20        # phase-1 tables kept in memory up to this, then spilled to disk

_HEAD_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT_RE = re.compile(rb"\}\s*(?:(,)\s*\{|\])")
_END_RE = re.compile(rb"\}\s*\]")
_LAST_RE = re.compile(rb"\}(?=\s*(?:,|\]|\Z))")
_BYTE_RE = re.compile(r"\(byte (\d+)\)")
_WS = b" \t\r\n"
_NON_WS = re.compile(rb"[^ \t\r\n]")
_BATCH_FAST = msgspec.json.Decoder(list[_TAGGED])
_BATCH_GENERAL = msgspec.json.Decoder(list[KEvent])
_TOP = msgspec.json.Decoder(KTrace)


def _fix_utf8(text) -> tuple[bytes, int]:
    repl = "\ufffd".encode()
    before = bytes(text).count(repl)
    fixed = bytes(text).decode("utf-8", "replace").encode("utf-8")
    return fixed, fixed.count(repl) - before


class _ArrayEnd(Exception):
    """The decoded text held the end of the traceEvents array, `from_end` bytes before its end."""

    def __init__(self, from_end: int):
        self.from_end = from_end


class _Splitter:
    """Batches of decoded events from `read(n) -> bytes` (b'' at the end); afterwards `top` (the
    KTrace without events), `notes`, `truncated`, `unreadable_bytes`, `total_bytes`."""

    def __init__(self, read, batch_bytes: int = BATCH_BYTES):
        self.read = read
        self.batch = max(1024, int(batch_bytes))
        self.buf = bytearray()
        self.off = 0  # absolute offset of buf[0]
        self.eof = False
        self.top: KTrace | None = None
        self.notes: list[str] = []
        self.utf8_fixed = 0
        self.truncated = False
        self.tail_lost = False
        self.unreadable_bytes = 0

    @property
    def total_bytes(self) -> int:
        return self.off + len(self.buf)

    def _fill(self, n: int) -> None:
        while len(self.buf) < n and not self.eof:
            b = self.read(max(READ_BYTES, n - len(self.buf)))
            if not b:
                self.eof = True
            else:
                self.buf += b

    def _consume(self, k: int) -> None:
        del self.buf[:k]
        self.off += k

    def _skip_ws(self, i: int) -> int:
        while True:
            m = _NON_WS.search(self.buf, i)
            if m is not None:
                return m.start()
            i = len(self.buf)
            if self.eof:
                return i
            if i > 1 << 20:  # drop whitespace as it is skipped
                self._consume(i)
                i = 0
            self._fill(len(self.buf) + READ_BYTES)

    def _decode_top(self, text: bytes) -> KTrace:
        try:
            return _TOP.decode(text)
        except msgspec.DecodeError as e:
            if "UTF-8" not in str(e):
                raise
            text, n = _fix_utf8(text)
            self.utf8_fixed += n
            return _TOP.decode(text)

    def batches(self):
        i = self._skip_ws(0)
        if i >= len(self.buf):
            raise TraceError("empty file")
        self._fill(1 << 16)
        c = self.buf[i]
        head = None
        if c == ord("["):
            pos = i + 1
        elif c == ord("{"):
            m = _HEAD_RE.search(self.buf, i)
            while m is None and not self.eof and len(self.buf) < HEAD_LIMIT:
                n = len(self.buf)
                self._fill(n + READ_BYTES)
                m = _HEAD_RE.search(self.buf, max(i, n - 64))
            if m is not None:
                head = bytes(self.buf[i:m.end() - 1])
                try:
                    self.top = self._decode_top(head + b"[]}")
                except (msgspec.DecodeError, msgspec.ValidationError):
                    m = None  # "traceEvents" was not a top-level key: read it whole
            if m is None:
                yield from self._whole()
                return
            pos = m.end()
        else:
            yield from self._whole()
            return
        self._consume(pos)
        pos = 0
        while True:
            pos = self._skip_ws(pos)
            if pos >= len(self.buf):  # the file ends between events
                self.truncated = True
                self.unreadable_bytes = 0
                return
            if self.buf[pos] == ord("]"):  # empty array
                self._tail(head, pos + 1)
                return
            if self.buf[pos] != ord("{"):
                raise TraceError(f"not a Kineto trace: wrong JSON shape (traceEvents element at byte {self.off + pos} is not an object)")
            self._fill(pos + self.batch + READ_BYTES)
            if self.eof and len(self.buf) - pos <= self.batch:
                evs = self._rest(pos, head)
                if evs:
                    yield evs
                return
            search, tries = pos + self.batch, 0
            while True:
                m = _CUT_RE.search(self.buf, search)
                if m is None:
                    if len(self.buf) - pos > MAX_EVENT_BYTES + self.batch * 64:
                        raise TraceError(f"no end of an event within {MAX_EVENT_BYTES >> 20} MB after byte {self.off + pos}; not a trace?")
                    n = len(self.buf)
                    self._fill(n + READ_BYTES)
                    if len(self.buf) == n:  # end of input inside the array
                        evs = self._rest(pos, head)
                        if evs:
                            yield evs
                        return
                    search = max(search, n - 64)
                    continue
                r = self._try(pos, m.start() + 1)
                if r is not None:
                    break
                # the candidate lies inside an event: look further (geometrically after a few misses)
                tries += 1
                search = m.end() if tries < 4 else pos + 2 * (m.end() - pos)
                self._fill(search + READ_BYTES)
            evs, tail_at = r
            yield evs
            if tail_at is not None:  # the array ended before the candidate
                self._tail(head, tail_at)
                return
            if m.group(1):
                self._consume(m.end() - 1)
                pos = 0
            else:
                self._tail(head, m.end())
                return

    def _try(self, pos: int, end: int):
        """(events, None) for buf[pos:end] decoded as one JSON array; (events, i) when the array
        closes before `end`, with i just after its ']'; None when the text is not a complete array
        (the cut lies inside an event). TraceError when it is not valid JSON."""
        try:
            evs = self._decode(pos, end)
            return None if evs is None else (evs, None)
        except _ArrayEnd as e:
            bracket = end + 1 - e.from_end
            evs = self._decode(pos, bracket) if pos <= bracket < end and self.buf[bracket] == ord("]") else None
            if evs is None:
                raise TraceError(f"not valid JSON at byte {self.off + bracket}") from None
            return evs, bracket + 1

    def _decode(self, pos: int, end: int):
        text = b"".join((b"[", memoryview(self.buf)[pos:end], b"]"))  # one copy (msgspec.Raw values refer to it)
        fixed = 0
        general = False
        while True:
            try:
                evs = (_BATCH_GENERAL if general else _BATCH_FAST).decode(text)
                self.utf8_fixed += fixed
                return evs
            except msgspec.ValidationError as e:
                if general:
                    raise TraceError(f"not a Kineto trace: wrong JSON shape ({e})") from None
                general = True  # an odd event (unknown phase, args not an object): the general decoder
            except msgspec.DecodeError as e:
                msg = str(e)
                if "UTF-8" in msg and not fixed:
                    text, fixed = _fix_utf8(text)
                    continue
                b = _BYTE_RE.search(msg)
                k = int(b.group(1)) if b else None
                if "trailing characters" in msg and k is not None:
                    j = k - 2  # msgspec reports the byte after the first trailing one
                    while j > 0 and text[j] in _WS:
                        j -= 1
                    raise _ArrayEnd(len(text) - j)  # counted from the end: replacing invalid UTF-8 moves the start
                if "truncated" in msg or (k is not None and k >= len(text) - 1):
                    return None
                where = f" at byte {self.off + pos + k - 1}" if k is not None and not fixed else ""
                raise TraceError(f"not valid JSON: {_BYTE_RE.sub('', msg).strip()}{where}") from None

    def _last_end(self, pos: int) -> int | None:
        """Just after the '}' of the last '}' ']' (whitespace between allowed) in buf[pos:]."""
        buf, i = self.buf, len(self.buf)
        for _ in range(64):
            i = buf.rfind(b"]", pos, i)
            if i < 0:
                return None
            j = i - 1
            while j >= pos and buf[j] in _WS:
                j -= 1
            if j >= pos and buf[j] == ord("}"):
                return j + 1
        return None

    def _rest(self, pos: int, head) -> list:
        """All the rest of the input from pos is in buf: the events up to the end of the array,
        or, when the input ends inside it, every complete event."""
        # Usually the array closes at the last '}' ']' of the input (Kineto writes only scalars
        # after it): try that cut first, so the events are decoded once. A cut that decodes as a
        # complete array is the end of the array (a '}' ']' inside it cannot be: ']' would close
        # the array there); one past the end reports where the array ended (_try).
        end = self._last_end(pos)
        if end is not None:
            try:
                r = self._try(pos, end)
            except TraceError:
                r = None  # decided below, the general way
            if r is not None:
                evs, tail_at = r
                self._tail(head, tail_at if tail_at is not None else _END_RE.match(self.buf, end - 1).end())
                return evs
        r = self._try(pos, len(self.buf))
        if r is not None:
            evs, tail_at = r
            if tail_at is not None:
                self._tail(head, tail_at)
            else:  # every event complete, but neither the array nor the document is closed
                self.truncated = self.tail_lost = True
            return evs
        self.truncated = True
        cands = [m.start() for m in _LAST_RE.finditer(self.buf, pos)]
        for k in reversed(cands[-16:]):
            r = self._try(pos, k + 1)
            if r is not None:
                self.unreadable_bytes = len(self.buf) - (k + 1)
                return r[0]
        self.unreadable_bytes = len(self.buf) - pos
        return []

    def _tail(self, head: bytes | None, at: int) -> None:
        """Decode the text after the array (Kineto writes baseTimeNanoseconds there)."""
        self._fill(at + TAIL_LIMIT + 1)
        tail = bytes(self.buf[at:])
        if len(tail) > TAIL_LIMIT:
            raise TraceError(f"more than {TAIL_LIMIT >> 20} MB of JSON after the traceEvents array")
        if head is None:  # bare event array
            if tail.strip(_WS):
                raise TraceError(f"not valid JSON: trailing characters after the event array at byte {self.off + at}")
            self.top = KTrace()
            return
        try:
            self.top = self._decode_top(head + b"[]" + tail)
            return
        except msgspec.ValidationError as e:
            raise TraceError(f"not a Kineto trace: wrong JSON shape ({e})") from None
        except msgspec.DecodeError as e:
            msg = str(e)
            b = _BYTE_RE.search(msg)
            if not ("truncated" in msg or (b and int(b.group(1)) >= len(head) + 2 + len(tail.rstrip(_WS)) - 1)):
                raise TraceError(f"not valid JSON: {_BYTE_RE.sub('', msg).strip()} after the traceEvents array") from None
        # the file ends inside the trailing keys: keep the complete ones
        self.truncated = self.tail_lost = True
        cuts = [k for k in range(len(tail)) if tail[k] == ord(",")][-32:]
        for k in reversed(cuts):
            try:
                self.top = self._decode_top(head + b"[]" + tail[:k] + b"}")
                self.unreadable_bytes = len(tail) - k
                return
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        self.unreadable_bytes = len(tail)  # self.top stays what the head said

    def _whole(self):
        """No traceEvents array up front: read and decode the document whole (bounded)."""
        while not self.eof:
            if len(self.buf) > IN_MEMORY_LIMIT:
                raise TraceError(f"no traceEvents array in the first {HEAD_LIMIT >> 20} MB and the file is larger than "
                                 f"{IN_MEMORY_LIMIT >> 20} MB; not a Kineto trace?")
            self._fill(len(self.buf) + (16 << 20))
        doc, notes = decode(bytes(self.buf))
        self.notes += notes
        self._consume(len(self.buf))
        if isinstance(doc, list):
            events, self.top = doc, KTrace()
        else:
            events, self.top = doc.trace_events, doc
            doc.trace_events = None
        if not all(isinstance(e, (KEvent, _TEv, _TSkipped)) for e in events[:1]):
            raise TraceError("not a Kineto trace: traceEvents is not a list of events")
        step = 250_000
        for k in range(0, len(events), step):
            yield events[k:k + step]


_TS, _DUR, _PID, _TID, _CAT = (operator.attrgetter(k) for k in ("ts", "dur", "pid", "tid", "cat"))
_A_GRID, _A_BLOCK, _A_COLL, _A_DEVICE, _A_STREAM, _A_TYPE, _A_FLOPS = (operator.attrgetter(k) for k in (
    "grid", "block", "collective_name", "device", "stream", "input_type", "flops"))
_CPU_KIND_GET = CPU_KIND.get


def _ints_or(vals: list, fallback: pl.Series, evs: list, attr) -> pl.Series:
    """_ints(v if v is not None else attr(e)) for v, e in zip(vals, evs), where fallback is
    _ints(map(attr, evs)): when every v is an int or None (the fast path), v's nulls are exactly
    its None values, so the fallback fills them; otherwise value by value."""
    try:
        return pl.Series(vals, dtype=pl.Int64, strict=True).fill_null(fallback)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return _ints(attr(e) if v is None else v for v, e in zip(vals, evs))


def _ext_ids(args: list) -> pl.Series:
    """External id ('External id', else the old 'external id')."""
    new = list(map(_A_EXT, args))
    try:
        s = pl.Series(new, dtype=pl.Int64, strict=True)
        if not s.null_count():
            return s
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        pass
    return _ints(a.external_id_old if v is None else v for v, a in zip(new, args))


_A_EXT = operator.attrgetter("external_id")


_GPU_SCHEMA = {"device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64, "external_id": pl.Int64,
               "kind": pl.String, "name": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64,
               "event_index": pl.Int64, "has_comm_args": pl.Boolean, "_ok": pl.Boolean,
               "context": pl.Int64, "grid_x": pl.Int32, "grid_y": pl.Int32, "grid_z": pl.Int32,
               "block_x": pl.Int32, "block_y": pl.Int32, "block_z": pl.Int32,
               "registers_per_thread": pl.Int32, "shared_memory_bytes": pl.Int64, "bytes": pl.Int64,
               "graph_id": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "copy_kind": pl.String,
               "src_kind": pl.String, "dst_kind": pl.String, "sync_kind": pl.String}
_CPU_SCHEMA = {"pid": pl.Int64, "tid": pl.Int64, "correlation": pl.Int64, "external_id": pl.Int64,
               "kind": pl.String, "name": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64,
               "event_index": pl.Int64, "_ok": pl.Boolean,
               "sequence_number": pl.Int64, "input_dims": pl.String, "input_types": pl.String,
               "flops": pl.Float64, "flops_source": pl.String, "flops_dtype": pl.String, "category": pl.String}


# ----------------------------------------------------------------------------- spooling

class _Budget:
    def __init__(self, limit: int, directory):
        self.limit, self.used, self.dir = limit, 0, directory


class _Spool:
    """Arrow tables of one kind in the order added: in memory while the shared budget allows,
    then in an Arrow IPC file (lz4) in the budget's directory, read back batch by batch."""

    def __init__(self, name: str, budget: _Budget):
        self.name, self.budget = name, budget
        self.mem: list[pa.Table] = []
        self.writer = None
        self.path = None
        self.schema = None
        self.rows = 0

    def add(self, tbl: pa.Table) -> None:
        if self.schema is None:
            self.schema = tbl.schema
        if tbl.num_rows == 0:
            return
        self.rows += tbl.num_rows
        if tbl.schema != self.schema:
            tbl = tbl.cast(self.schema)
        if self.writer is None:
            self.mem.append(tbl)
            self.budget.used += tbl.nbytes
            if self.budget.used > self.budget.limit and self.budget.dir is not None:
                self._spill()
        else:
            self.writer.write_table(tbl)

    def _spill(self) -> None:
        import uuid

        self.path = Path(self.budget.dir) / f"spool-{self.name}-{uuid.uuid4().hex}.arrow"
        self.writer = pa.ipc.new_file(str(self.path), self.schema, options=pa.ipc.IpcWriteOptions(compression="lz4"))
        for t in self.mem:
            self.writer.write_table(t)
            self.budget.used -= t.nbytes
        self.mem = []

    def __iter__(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.mem = []
        if self.path is not None:
            with pa.OSFile(str(self.path)) as f:
                r = pa.ipc.open_file(f)
                for i in range(r.num_record_batches):
                    yield pl.from_arrow(r.get_batch(i))
        elif self.mem:
            for t in self.mem:
                yield pl.from_arrow(t)
        elif self.schema is not None:  # no rows: one empty frame, so the columns are known
            # (built column by column: Schema.empty_table() imports pandas, ~0.3 s)
            yield pl.from_arrow(pa.Table.from_arrays([pa.nulls(0, type=f.type) for f in self.schema], schema=self.schema))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.path is not None:
            Path(self.path).unlink(missing_ok=True)
        self.mem = []


# ----------------------------------------------------------------------------- parse

@dataclass
class TraceMeta:
    """What a trace file says about itself (distributedInfo, host, base time, versions) and how
    much of it could be read; shared by Parsed and StreamParsed."""
    rank: int | None
    world_size: int | None
    backend: str | None
    host: str | None
    base_time_ns: int | None
    tool_versions: dict
    event_count: int
    notes: list[str]
    partial: bool
    unreadable_bytes: int


@dataclass
class Parsed(TraceMeta):
    """Tables of one trace (polars frames), plus what the file says about itself (parse())."""
    gpu: pl.DataFrame
    cpu: pl.DataFrame
    steps: pl.DataFrame
    collectives: pl.DataFrame
    devices: pl.DataFrame
    process_groups: pl.DataFrame
    annotations: pl.DataFrame
    counters: pl.DataFrame


def parse(data: bytes, comm_patterns: list[str] | None = None) -> Parsed:
    """Parse one Kineto trace held in memory (parse_stream, materialized). See the module doc for
    what is handled and raised."""
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
    return Parsed(gpu=fr["gpu_activities"], cpu=fr["cpu_ops"], steps=fr["steps"], collectives=fr["collectives"],
                  devices=fr["devices"], process_groups=fr["process_groups"], annotations=fr["annotations"],
                  counters=fr["counters"], **{f.name: getattr(s, f.name) for f in fields(TraceMeta)})


def parse_stream(read, comm_patterns: list[str] | None = None, spool_dir=None, batch_bytes: int | None = None,
                 spool_bytes: int | None = None) -> "StreamParsed":
    """Parse one Kineto trace from `read(n) -> bytes` (decompressed; b'' at the end) in batches.
    Memory is bounded by batch_bytes plus spool_bytes of tables (beyond that they are spilled to
    Arrow IPC files in spool_dir; without spool_dir they stay in memory). Raises TraceError /
    NotKinetoError (one line). Call .close() on the result when done with it."""
    sp = _Splitter(read, BATCH_BYTES if batch_bytes is None else batch_bytes)
    acc = _Acc(_Budget(SPOOL_BYTES if spool_bytes is None else spool_bytes, spool_dir))
    try:
        for events in sp.batches():
            acc.add(events)
        return acc.finish(sp, comm_patterns)
    except BaseException:
        acc.close()
        raise


_NO_RAW = msgspec.Raw(b"")


def _slim(a: KArgs) -> KArgs:
    """Args kept past their batch, without their raw-text fields: a msgspec.Raw refers to the
    whole text it was decoded from, which would otherwise stay in memory with it."""
    return msgspec.structs.replace(a, input_dims=_NO_RAW, input_dims_old=_NO_RAW, input_type=_NO_RAW, concrete_inputs=_NO_RAW)


class _Acc:
    """Phase 1: per batch, the table rows with raw (file) timestamps, spooled; plus what the
    whole-trace steps need (comm host ops' External ids, collective metadata, step ranges, used
    devices, vendor evidence, counts)."""

    def __init__(self, budget: _Budget):
        self.spools = {k: _Spool(k, budget) for k in ("gpu", "cpu", "ann", "ctr", "launch")}
        self.n = 0
        self.unknown_cats: dict[str, int] = {}
        self.bad_t = self.bad_dur = self.neg = 0
        self.ts_lo = self.ts_hi = None
        self.start_lo = self.end_hi = None
        self.used_devices: set = set()
        self.vendor_hip = self.vendor_cu = self.vendor_mtia = False
        self.comm_ext: set = set()
        self.steps: list[pl.DataFrame] = []
        self.rpc: list[pl.DataFrame] = []
        self.hosts: list[pl.DataFrame] = []  # comm host ops (comm_host_ops), for the launch chains of NCCL kernels
        self.gpu_meta: dict = {}
        self.cpu_meta: dict = {}
        self.host_re = classify_mod.comm_host_op_regex()
        self.flops_memo: dict = {}  # (name, dims, types, concrete inputs) -> op_flops

    def close(self):
        for s in self.spools.values():
            s.close()

    def _span(self, ts, ok):
        if ok.any():
            lo, hi = int(ts[ok].min()), int(ts[ok].max())
            self.ts_lo = lo if self.ts_lo is None else min(self.ts_lo, lo)
            self.ts_hi = hi if self.ts_hi is None else max(self.ts_hi, hi)

    def _extent(self, df: pl.DataFrame):
        if df.height:
            lo, hi = df["start_ns"].min(), (df["start_ns"] + df["dur_ns"]).max()
            self.start_lo = lo if self.start_lo is None else min(self.start_lo, lo)
            self.end_hi = hi if self.end_hi is None else max(self.end_hi, hi)

    def add(self, events: list) -> None:
        off = self.n
        self.n += len(events)
        # one pass: the events of each table, by phase and category
        gpu_idx, ann_idx, cpu_idx, ctr = [], [], [], []
        unknown = self.unknown_cats
        for i, e in enumerate(events):
            ph = e.ph
            if ph == "X":
                c = e.cat
                if c in GPU_KIND:
                    gpu_idx.append(i)
                elif c == "gpu_user_annotation":
                    ann_idx.append(i)
                elif c not in SKIP_CATS:
                    cpu_idx.append(i)
                    if c not in CPU_KIND:
                        unknown[str(c)] = unknown.get(str(c), 0) + 1
            elif ph == "C":
                ctr.append(i)
        ng, nc = len(gpu_idx), len(cpu_idx)
        kept = gpu_idx + cpu_idx + ann_idx
        evs_all = [events[i] for i in kept]
        # the times of all three tables in one conversion each
        ts_all, ok_ts_all = us_text_to_ns(list(map(_TS, evs_all)))
        du_all, ok_du_all = us_text_to_ns(list(map(_DUR, evs_all)))
        ok_du_all &= du_all < 2**62  # a duration of over a century is corrupt, and start + dur must fit
        self.bad_dur += int((ok_ts_all & ~ok_du_all).sum())
        self._span(ts_all, ok_ts_all)
        pid_all = _ints(map(_PID, evs_all))
        tid_all = _ints(map(_TID, evs_all))
        cat_all = list(map(_CAT, evs_all))
        args_all = decode_args(evs_all)
        g, c_ = slice(0, ng), slice(ng, ng + nc)

        # ---------------- GPU activities
        evs, args, cats = evs_all[g], args_all[g], cat_all[g]
        ts, ok_ts, du, ok_du = ts_all[g], ok_ts_all[g], du_all[g], ok_du_all[g]
        self.bad_t += int((~ok_ts).sum())
        self.neg += int(((du < 0) & ok_du).sum())
        du = np.where(ok_du & (du > 0), du, 0)
        names, names_s = _names(evs)
        kinds = [GPU_KIND[c] for c in cats]
        pid, tid = pid_all[g], tid_all[g]
        dims3 = {**_dims3(list(map(_A_GRID, args)), "grid"), **_dims3(list(map(_A_BLOCK, args)), "block")}
        copy_kind, src_kind, dst_kind, sync_kind = [None] * ng, [None] * ng, [None] * ng, [None] * ng
        for j, k in enumerate(kinds):
            if k == "memcpy":
                m = _COPY_RE.match(names[j])
                if m:
                    copy_kind[j], src_kind[j], dst_kind[j] = m.groups()
            elif k == "memset":
                m = _MEMSET_RE.match(names[j])
                if m:
                    dst_kind[j] = m.group(1)
            elif k == "sync":
                sync_kind[j] = _SYNC_KIND.get(args[j].cuda_sync_kind or names[j], "other")
        colls = list(map(_A_COLL, args))
        gpu = pl.DataFrame({
            "device": _ints_or(list(map(_A_DEVICE, args)), pid, evs, _PID).cast(pl.Int32, strict=False),
            "stream": _ints_or(list(map(_A_STREAM, args)), tid, evs, _TID),
            "kind": pl.Series(kinds, dtype=pl.String),
            "name": names_s,
            "start_ns": ts,
            "dur_ns": du,
            "correlation": _ints(map(_AG["correlation"], args)),
            "external_id": _ext_ids(args),
            "context": _ints(map(_AG["context"], args)),
            **dims3,
            "registers_per_thread": _ints(map(_AG["registers_per_thread"], args)).cast(pl.Int32, strict=False),
            "shared_memory_bytes": _ints(map(_AG["shared_memory"], args)),
            "bytes": _ints(map(_AG["bytes"], args)),
            "copy_kind": pl.Series(copy_kind, dtype=pl.String),
            "src_kind": pl.Series(src_kind, dtype=pl.String),
            "dst_kind": pl.Series(dst_kind, dtype=pl.String),
            "sync_kind": pl.Series(sync_kind, dtype=pl.String),
            "graph_id": _ints(map(_AG["graph_id"], args)),
            "pid": pid,
            "tid": tid,
            "event_index": np.asarray(gpu_idx, dtype=np.int64) + off,
            "has_comm_args": pl.Series([x is not None for x in colls], dtype=pl.Boolean),
            "_ok": ok_ts,
        }, schema_overrides=_GPU_SCHEMA)
        self.gpu_meta.update({gpu_idx[j] + off: _slim(args[j]) for j, x in enumerate(colls) if x is not None})
        gpu = gpu.filter(pl.col("_ok")).drop("_ok")
        self.used_devices |= set(gpu["device"].drop_nulls().unique().to_list())
        self._extent(gpu)
        self.spools["gpu"].add(gpu.to_arrow())

        # ---------------- CPU ops
        evs, args, cats = evs_all[c_], args_all[c_], cat_all[c_]
        ts, ok_ts_c, du, ok_du_c = ts_all[c_], ok_ts_all[c_], du_all[c_], ok_du_all[c_]
        self.bad_t += int((~ok_ts_c).sum())
        self.neg += int(((du < 0) & ok_du_c).sum())
        du = np.where(ok_du_c & (du > 0), du, 0)
        names, names_s = _names(evs)
        dims_s = _texts([a.input_dims_old if not len(a.input_dims) else a.input_dims for a in args])  # JSON text as written
        types_s = _texts(list(map(_A_TYPE, args)))
        fl = list(map(_A_FLOPS, args))
        colls = list(map(_A_COLL, args))
        flops, fsrc, fdt = [None] * nc, [None] * nc, [None] * nc
        memo = self.flops_memo
        todo = [j for j, (n, f) in enumerate(zip(names, fl)) if f is not None or n in MODELLED_OPS]
        dims = dict(zip(todo, dims_s.gather(todo).to_list())) if todo else {}
        types = dict(zip(todo, types_s.gather(todo).to_list())) if todo else {}
        for j in todo:
            n, fv = names[j], fl[j]
            if n in MODELLED_OPS:  # op_flops of the same op and inputs once per trace (steps repeat shapes)
                key = (n, dims[j], types[j], _text(args[j].concrete_inputs))
                r = memo.get(key)
                if r is None:
                    r = memo[key] = op_flops(*key)
            if isinstance(fv, (int, float)) and not isinstance(fv, bool) and fv > 0:
                flops[j], fsrc[j] = float(fv), "trace"
                fdt[j] = r[1] if n in MODELLED_OPS else None
            elif n in MODELLED_OPS:
                v, dt = r
                if v is not None:
                    flops[j], fsrc[j], fdt[j] = v, "shapes", dt
        cpu = pl.DataFrame({
            "pid": pid_all[c_],
            "tid": tid_all[c_],
            "kind": pl.Series([_CPU_KIND_GET(c, "other") for c in cats], dtype=pl.String),
            "category": pl.Series([c if type(c) is str or isinstance(c, str) else None for c in cats], dtype=pl.String),
            "name": names_s,
            "start_ns": ts,
            "dur_ns": du,
            "correlation": _ints(map(_AG["correlation"], args)),
            "external_id": _ext_ids(args),
            "sequence_number": _ints(map(_AG["sequence_number"], args)),
            "input_dims": dims_s,
            "input_types": types_s,
            "flops": pl.Series(flops, dtype=pl.Float64),
            "flops_source": pl.Series(fsrc, dtype=pl.String),
            "flops_dtype": pl.Series(fdt, dtype=pl.String),
            "event_index": np.asarray(cpu_idx, dtype=np.int64) + off,
            "_ok": ok_ts_c,
        }, schema_overrides=_CPU_SCHEMA)
        sel = set(np.flatnonzero((names_s == "record_param_comms").to_numpy()).tolist())
        sel.update(j for j, x in enumerate(colls) if x is not None)
        meta = {cpu_idx[j] + off: _slim(args[j]) for j in sorted(sel)}
        self.cpu_meta.update(meta)
        cpu = cpu.filter(pl.col("_ok")).drop("_ok")
        self._extent(cpu)
        hosts = cpu.filter(pl.col("name").str.contains(self.host_re))
        self.comm_ext |= set(hosts["external_id"].drop_nulls().to_list())
        if hosts.height:
            self.hosts.append(hosts.select("event_index", "pid", "tid", "name", "start_ns", "dur_ns", "input_dims", "input_types"))
        rts = cpu.filter(pl.col("kind").is_in(["runtime", "driver"]))
        self.spools["launch"].add(rts.filter(pl.col("correlation").is_not_null()).select("correlation", "pid", "tid", "start_ns").to_arrow())
        rt = rts["name"]
        self.vendor_hip |= bool(rt.str.starts_with("hip").any())
        self.vendor_cu |= bool(rt.str.starts_with("cu").any())
        self.vendor_mtia |= bool(cpu["category"].eq("mtia_runtime").any())
        st = cpu.filter(pl.col("kind").is_in(["annotation", "op"]) & pl.col("name").str.contains(r"^ProfilerStep\s*#\s*\d+$"))
        if st.height:
            self.steps.append(st.select("name", "start_ns", "dur_ns", "pid", "tid"))
        if meta:
            self.rpc.append(cpu.filter(pl.col("event_index").is_in(list(meta))).select("event_index", "external_id", "start_ns", "dur_ns"))
        self.spools["cpu"].add(cpu.to_arrow())

        # ---------------- annotations
        a_ = slice(ng + nc, None)
        evs, args = evs_all[a_], args_all[a_]
        ts, ok_a, du = ts_all[a_], ok_ts_all[a_], du_all[a_]
        pid, tid = pid_all[a_], tid_all[a_]
        ann = pl.DataFrame({
            "kind": ["gpu_user_annotation"] * len(evs),
            "domain": [None] * len(evs),
            "name": _names(evs)[1],
            "start_ns": ts,
            "end_ns": ts + np.maximum(du, 0),
            "device": _ints_or(list(map(_A_DEVICE, args)), pid, evs, _PID).cast(pl.Int32, strict=False),
            "stream": _ints_or(list(map(_A_STREAM, args)), tid, evs, _TID),
            "pid": pid,
            "tid": tid,
            "_ok": ok_a,
        }, schema_overrides={"kind": pl.String, "name": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
                             "_ok": pl.Boolean, "domain": pl.String, "device": pl.Int32, "stream": pl.Int64, "pid": pl.Int64, "tid": pl.Int64}
        ).filter(pl.col("_ok")).drop("_ok")
        self.spools["ann"].add(ann.to_arrow())

        # ---------------- counters (ph C: one series per args key)
        c_rows = {"device": [], "name": [], "ts_raw": [], "value": []}
        for i in ctr:
            e = events[i]
            try:
                cargs = msgspec.json.decode(e.args) if len(e.args) else None
            except msgspec.DecodeError:
                cargs = None
            if isinstance(cargs, dict):
                for k, v in cargs.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        c_rows["device"].append(None)
                        c_rows["name"].append(f"{e.name}.{k}" if e.name else str(k))
                        c_rows["ts_raw"].append(e.ts)
                        c_rows["value"].append(float(v))
        cts, cok = us_text_to_ns(c_rows.pop("ts_raw"))
        ctr_df = pl.DataFrame({**c_rows, "unit": [None] * len(cts), "ts_ns": cts, "_ok": cok},
                              schema_overrides={"device": pl.Int32, "name": pl.String, "value": pl.Float64, "unit": pl.String,
                                                "ts_ns": pl.Int64, "_ok": pl.Boolean}
                              ).filter(pl.col("_ok")).drop("_ok")
        self.spools["ctr"].add(ctr_df.to_arrow())

    def finish(self, sp: _Splitter, comm_patterns) -> "StreamParsed":
        top = sp.top or KTrace()
        notes = list(sp.notes)
        if sp.utf8_fixed:
            notes.append(f"invalid UTF-8 replaced by U+FFFD ({sp.utf8_fixed} places)")
        if sp.truncated and self.n == 0:
            raise TraceError(f"truncated JSON (the file ends after {sp.total_bytes} bytes, before any complete event); "
                             "the profiler was probably killed while writing")
        base_ns = 0
        has_base = len(top.base_time_ns) > 0
        if has_base:
            b = bytes(top.base_time_ns).strip(b'" ')
            try:
                base_ns = int(b)
            except ValueError:
                raise TraceError(f"baseTimeNanoseconds is not an integer: {b[:40]!r}") from None
            if not 0 <= base_ns < 2**62:
                raise TraceError(f"baseTimeNanoseconds {base_ns} is outside the epoch-ns range")
        if base_ns and self.ts_hi is not None and (self.ts_hi > 2**63 - 1 - base_ns or self.ts_lo < -base_ns):
            raise TraceError("timestamps plus baseTimeNanoseconds fall outside the int64 ns range")
        if self.unknown_cats:
            notes.append("unrecognized categories kept as cpu_ops kind=other: " + ", ".join(f"{k} ({v})" for k, v in sorted(self.unknown_cats.items())))
        if self.bad_t:
            notes.append(f"{self.bad_t} events without a readable ts (or beyond the int64 ns range) were dropped")
        if self.bad_dur:
            notes.append(f"{self.bad_dur} events without a readable dur (or beyond the int64 ns range) were given dur 0")
        if self.neg:
            notes.append(f"{self.neg} events with negative dur clamped to 0")
        if sp.truncated:
            where = "after the traceEvents array, in its trailing keys" if sp.tail_lost else "inside the traceEvents array"
            notes.append(f"truncated: the file ends {where}; {self.n} complete events kept, {sp.unreadable_bytes} bytes "
                         f"(of {sp.total_bytes}) unreadable; the profiler was probably killed while writing")
            if not has_base and self.ts_hi is not None and self.ts_hi < 10**17:
                notes.append("baseTimeNanoseconds, which Kineto writes at the end of the file, is missing: timestamps are "
                             "relative to an unknown base")

        di = top.distributed_info if isinstance(top.distributed_info, dict) else {}
        pgs = []
        for pg in di.get("pg_config") or []:
            if isinstance(pg, dict):
                pgs.append({"process_group": str(pg.get("pg_name")), "pg_desc": pg.get("pg_desc", pg.get("uid")),
                            "backend": pg.get("backend_config"), "group_size": _int(pg.get("pg_size")),
                            "ranks": _ranks(pg.get("ranks"))})
        process_groups = pl.DataFrame(pgs, schema={"process_group": pl.String, "pg_desc": pl.String, "backend": pl.String,
                                                   "group_size": pl.Int32, "ranks": pl.List(pl.Int32)})
        if self.vendor_hip:
            vendor = "amd"
        elif self.vendor_cu:
            vendor = "nvidia"
        elif self.vendor_mtia:
            vendor = "mtia"
        elif top.hip_runtime_version is not None or top.roctracer_version is not None:
            vendor = "amd"
        else:
            vendor = "unknown"
        drows = []
        for d in top.device_properties or []:
            if not isinstance(d, dict):
                continue
            idx = _int(d.get("id"))
            if idx is None:
                continue
            drows.append({"device": idx, "name": d.get("name") if isinstance(d.get("name"), str) else None,
                          "vendor": vendor, "compute_major": _int(d.get("computeMajor")),
                          "compute_minor": _int(d.get("computeMinor")), "total_memory_bytes": _int(d.get("totalGlobalMem")),
                          "num_sms": _int(d.get("numSms")), "bus_id": None, "used": idx in self.used_devices})
        for idx in sorted(self.used_devices - {r["device"] for r in drows}):
            drows.append({"device": idx, "name": None, "vendor": vendor, "compute_major": None, "compute_minor": None,
                          "total_memory_bytes": None, "num_sms": None, "bus_id": None, "used": True})
        devices = pl.DataFrame(drows, schema={"device": pl.Int32, "name": pl.String, "vendor": pl.String,
                                              "compute_major": pl.Int32, "compute_minor": pl.Int32,
                                              "total_memory_bytes": pl.Int64, "num_sms": pl.Int32, "bus_id": pl.String,
                                              "used": pl.Boolean})
        versions = {k: v for k, v in {
            "schemaVersion": top.schema_version, "cupti_version": top.cupti_version,
            "cuda_runtime_version": top.cuda_runtime_version, "cuda_driver_version": top.cuda_driver_version,
            "roctracer_version": top.roctracer_version, "hip_runtime_version": top.hip_runtime_version,
            "hip_driver_version": top.hip_driver_version, "nccl_version": di.get("nccl_version"),
        }.items() if v is not None}
        host = top.host_name or top.hostname
        steps = (pl.concat(self.steps) if self.steps else
                 pl.DataFrame(schema={"name": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64}))
        steps = steps.select(
            step=pl.col("name").str.extract(r"(\d+)$").cast(pl.Int64),
            name="name", start_ns=pl.col("start_ns") + base_ns, end_ns=pl.col("start_ns") + base_ns + pl.col("dur_ns"),
            dur_ns="dur_ns", source=pl.lit("profiler_step"), pid="pid", tid="tid",
        ).sort("start_ns", maintain_order=True)
        # one row per step number: some traces write ProfilerStep#N twice (a user_annotation and a
        # cpu_op), and every per-step join would count it twice; the first (then longest) is kept
        steps = (steps.sort(["start_ns", "dur_ns"], descending=[False, True], maintain_order=True)
                 .unique("step", keep="first", maintain_order=True))
        rpc = (pl.concat(self.rpc) if self.rpc else
               pl.DataFrame(schema={"event_index": pl.Int64, "external_id": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64}))
        rpc = rpc.with_columns(start_ns=pl.col("start_ns") + base_ns).with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))
        hosts = (pl.concat(self.hosts) if self.hosts else
                 pl.DataFrame(schema={"event_index": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "name": pl.String, "start_ns": pl.Int64,
                                      "dur_ns": pl.Int64, "input_dims": pl.String, "input_types": pl.String}))
        hosts = hosts.with_columns(start_ns=pl.col("start_ns") + base_ns).with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))
        return StreamParsed(
            acc=self, base_ns=base_ns, comm_ext=pl.Series(sorted(self.comm_ext), dtype=pl.Int64),
            comm_patterns=comm_patterns, steps=steps, devices=devices, process_groups=process_groups, rpc=rpc, comm_hosts=hosts,
            rank=_int(di.get("rank")), world_size=_int(di.get("world_size")),
            backend=di.get("backend") if isinstance(di.get("backend"), str) else None,
            host=host if isinstance(host, str) else None, base_time_ns=base_ns if has_base else None,
            tool_versions=versions, event_count=self.n, notes=notes, partial=sp.truncated,
            unreadable_bytes=sp.unreadable_bytes, decompressed_bytes=sp.total_bytes,
            trace_start_ns=None if self.start_lo is None else self.start_lo + base_ns,
            trace_end_ns=None if self.end_hi is None else self.end_hi + base_ns)


@dataclass
class StreamParsed(TraceMeta):
    """A parsed trace whose large tables are spooled: tables(ids) streams them, with timestamps
    made absolute and GPU work classified (phase 2). What the file says about itself is in the
    attributes. close() removes spill files."""
    acc: _Acc
    base_ns: int
    comm_ext: pl.Series
    comm_patterns: list[str] | None
    steps: pl.DataFrame
    devices: pl.DataFrame
    process_groups: pl.DataFrame
    rpc: pl.DataFrame
    comm_hosts: pl.DataFrame  # comm host ops (event_index, pid, tid, name, start_ns, end_ns, input_dims, input_types)
    decompressed_bytes: int
    trace_start_ns: int | None
    trace_end_ns: int | None

    def close(self) -> None:
        self.acc.close()

    def _launch_chains(self, comm: pl.DataFrame | None) -> dict[int, list[int]]:
        """correlation -> the comm host ops around the launch of each communication kernel
        without Collective name args of its own (kineto_comm.launch_chains)."""
        if comm is None or not comm.height:
            return {}
        own = self.acc.gpu_meta
        want = [c for c, ei in zip(comm["correlation"].to_list(), comm["event_index"].to_list()) if c is not None and ei not in own]
        if not want:
            return {}
        want_df = pl.DataFrame({"correlation": want}, schema={"correlation": pl.Int64}).unique()
        parts = [df.join(want_df, on="correlation", how="semi") for df in self.acc.spools["launch"]]
        if not parts:
            return {}
        launches = pl.concat(parts).unique("correlation", keep="first", maintain_order=True)
        return kineto_comm.launch_chains(launches.with_columns(start_ns=pl.col("start_ns") + self.base_ns), self.comm_hosts)

    def tables(self, ids: dict | None = None, arrow: bool = False) -> dict:
        """Table name -> iterator of chunks (or a callable giving them, for tables that need an
        earlier table fully read), polars frames, or pyarrow tables when arrow=True. ids: columns
        to add to every row (run_id, source_id, rank); devices also get host."""
        ids = ids or {}
        base = self.base_ns
        comm_rows: list[pl.DataFrame] = []
        state = {"gpu_done": False}

        def out(df: pl.DataFrame, with_rank: bool = True):
            cols = [pl.lit(v).alias(k) for k, v in ids.items() if k != "rank"]
            if with_rank and "rank" in ids:
                cols.append(pl.lit(ids["rank"], dtype=pl.Int32).alias("rank"))
            df = df.with_columns(cols) if cols else df
            return df.to_arrow() if arrow else df

        def gpu_chunks():
            for df in self.acc.spools["gpu"]:
                df = df.with_columns(start_ns=pl.col("start_ns") + base).with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))
                df = classify_mod.classify(df, self.comm_ext, self.comm_patterns).drop("has_comm_args")
                comm_rows.append(df.filter(pl.col("category") == "communication"))
                yield out(df)
            state["gpu_done"] = True

        def cpu_chunks():
            for df in self.acc.spools["cpu"]:
                yield out(df.with_columns(start_ns=pl.col("start_ns") + base).with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns")))

        def ann_chunks():
            for df in self.acc.spools["ann"]:
                yield out(df.with_columns(start_ns=pl.col("start_ns") + base, end_ns=pl.col("end_ns") + base))

        def ctr_chunks():
            for df in self.acc.spools["ctr"]:
                yield out(df.with_columns(ts_ns=pl.col("ts_ns") + base))

        def collectives():
            if not state["gpu_done"]:  # gpu_activities was not streamed first: classify here
                comm_rows.clear()
                for _ in gpu_chunks():
                    pass
            comm = pl.concat(comm_rows, how="vertical_relaxed") if comm_rows else None
            return [out(_collectives(comm, self.rpc, self.acc.gpu_meta, self.acc.cpu_meta, self._launch_chains(comm), self.comm_hosts))]

        return {
            "gpu_activities": gpu_chunks(),
            "cpu_ops": cpu_chunks(),
            "steps": [out(self.steps)],
            "collectives": collectives,
            "devices": [out(self.devices.with_columns(host=pl.lit(self.host, dtype=pl.String)) if ids else self.devices)],
            "process_groups": [out(self.process_groups)],
            "annotations": ann_chunks(),
            "counters": ctr_chunks(),
        }


def _meta_row(a: KArgs) -> dict:
    raw = a.collective_name if isinstance(a.collective_name, str) else None
    op = catalog.normalize_op(raw) if raw else None
    in_n, out_n = _int(a.in_msg_nelems), _int(a.out_msg_nelems)
    dtype = a.dtype if isinstance(a.dtype, str) else None
    size = catalog.dtype_bytes(dtype)
    cid = a.comms_id
    return {
        "op_raw": raw, "op": op, "in_nelems": in_n, "out_nelems": out_n, "dtype": dtype, "dtype_bytes": size,
        "group_size": _int(a.group_size),
        "process_group": str(a.pg_name) if a.pg_name is not None else None,
        "pg_desc": a.pg_desc if isinstance(a.pg_desc, str) else None,
        "pg_ranks": _ranks(a.pg_ranks),
        "seq": _int(a.seq),
        "comms_id": str(cid) if isinstance(cid, int) else (cid if isinstance(cid, str) else None),
        "src_rank": _int(a.src_rank), "dst_rank": _int(a.dst_rank),
    }


_MAX_NELEMS = 2**62 // 16  # beyond this a count times the widest element type overflows int64


def _plausible(meta: dict) -> tuple[dict, str | None]:
    """The collective fields a trace recorded, with impossible values made unknown: element counts
    not in (0, 2^58), group sizes not in (0, 2^31) (a negative or zero 'Group size', a fuzzed
    count); returns (meta, a note naming what was dropped, or None)."""
    bad = []
    out = dict(meta)
    for k, hi in (("in_nelems", _MAX_NELEMS), ("out_nelems", _MAX_NELEMS), ("group_size", 2**31)):
        v = out.get(k)
        if v is not None and not 0 < v < hi:
            bad.append(f"{k} {v}")
            out[k] = None
    return out, (f"implausible {', '.join(bad)} ignored" if bad else None)


def msg_bytes(op: str | None, in_n, out_n, size, dtype: str | None = None, missing: str | None = None) -> tuple[int | None, str | None]:
    """nccl-tests message size S (pipeline/catalog/collectives.toml), or (None, reason).
    dtype: the element type as recorded (named in the reason when its size is unknown);
    missing: the reason to give when the element count the op needs is not recorded."""
    if op is None or op == "unknown":
        return None, "collective op unknown"
    rule = catalog.collectives()[op]["msg"]
    if rule == "none":
        return None, f"{op} moves no payload"
    if rule == "in":
        n = in_n
    elif rule == "out":
        n = out_n
    else:
        n = max([x for x in (in_n, out_n) if x is not None], default=None)
    if n is None:
        return None, missing or ("Out msg nelems not recorded" if rule == "out" else "In msg nelems not recorded")
    if size is None:
        return None, f"element type {dtype!r} unknown" if dtype else "element type not recorded"
    return n * size, None


_COLL_SCHEMA = {
    "op": pl.String, "op_raw": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64, "dur_ns": pl.Int64,
    "timing_source": pl.String, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64,
    "external_id": pl.Int64, "in_nelems": pl.Int64, "out_nelems": pl.Int64, "dtype": pl.String,
    "dtype_bytes": pl.Int32, "msg_bytes": pl.Int64, "msg_bytes_note": pl.String, "group_size": pl.Int32,
    "process_group": pl.String, "pg_desc": pl.String, "pg_ranks": pl.List(pl.Int32), "seq": pl.Int64,
    "comms_id": pl.String, "src_rank": pl.Int32, "dst_rank": pl.Int32, "reduction": pl.String,
    "algorithm": pl.String, "protocol": pl.String,
}


_NO_LAUNCH = "no collective metadata: no Collective name args, no launch event for the kernel (kernel name only)"


def _host_records(chains: dict, hosts: pl.DataFrame | None, cpu_meta: dict) -> dict:
    """event_index -> kineto_comm.HostRec of every host op in the chains; host ops recorded alike
    (name, Input Dims, Input type, no Collective name args: steps repeat them) share one."""
    need = {ei for chain in chains.values() for ei in chain}
    if not need or hosts is None:
        return {}
    out, memo = {}, {}
    h = hosts.filter(pl.col("event_index").is_in(list(need)))
    for ei, name, dims, types in zip(h["event_index"].to_list(), h["name"].to_list(), h["input_dims"].to_list(), h["input_types"].to_list()):
        a = cpu_meta.get(ei)
        if a is not None and a.collective_name is not None:
            out[ei] = kineto_comm.host_record(name, dims, types, _meta_row(a))
        else:
            key = (name, dims, types)
            rec = memo.get(key)
            if rec is None:
                rec = memo[key] = kineto_comm.host_record(name, dims, types, None)
            out[ei] = rec
    return out


def _collectives(comm: pl.DataFrame | None, rpc: pl.DataFrame, gpu_meta: dict, cpu_meta: dict,
                 chains: dict | None = None, hosts: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per communication kernel (`comm`: classified GPU rows). Its op and sizes come from,
    in order: its own Collective name args (Kineto copies record_param_comms' fields onto NCCL
    kernels since Dec 2023); the record_param_comms op with the same External id; the comm host
    ops around its launch (`chains`: correlation -> event_index of the nccl:<op> /
    record_param_comms / c10d:: ops enclosing the runtime event that launched it, innermost first,
    rows in `hosts`; kineto_comm.chain_meta); the kernel name (op only).
    CPU-only traces (gloo) get one row per record_param_comms op that names its collective.
    rpc: the CPU ops whose event_index is in cpu_meta (event_index, external_id, start_ns, dur_ns,
    end_ns), in file order."""
    cpu_by_ext = {}
    for ei, ext in zip(rpc["event_index"].to_list(), rpc["external_id"].to_list()):
        if ext is not None and cpu_meta[ei].collective_name is not None:
            cpu_by_ext.setdefault(ext, cpu_meta[ei])
    chains = chains or {}
    recs = _host_records(chains, hosts, cpu_meta)
    chain_memo: dict = {}  # the same records around a launch -> the same answer
    rows = []
    if comm is None:
        comm = pl.DataFrame()
    for r in comm.iter_rows(named=True):
        a = gpu_meta.get(r["event_index"]) or cpu_by_ext.get(r["external_id"])
        km = kernel_meta(r["name"])
        missing = None
        if a:
            meta = _meta_row(a)
        elif r["correlation"] in chains:  # its launch was found (the chain may be empty)
            rs = [recs[ei] for ei in chains[r["correlation"]]]
            key = tuple(map(id, rs))
            if key not in chain_memo:
                chain_memo[key] = kineto_comm.chain_meta(rs)
            meta, missing = chain_memo[key]
        else:
            meta = {}
        meta, odd = _plausible(meta)
        op = meta.get("op") or catalog.normalize_op(km["op"] or r["name"])
        if a or meta:
            mb, note = msg_bytes(op, meta.get("in_nelems"), meta.get("out_nelems"), meta.get("dtype_bytes"), meta.get("dtype"),
                                 missing or odd)
        else:
            mb, note = None, missing or _NO_LAUNCH
        rows.append({**meta, "op": op, "op_raw": meta.get("op_raw") or r["name"], "start_ns": r["start_ns"],
                     "end_ns": r["end_ns"], "dur_ns": r["dur_ns"], "timing_source": "gpu_kernel",
                     "device": r["device"], "stream": r["stream"], "correlation": r["correlation"],
                     "external_id": r["external_id"], "msg_bytes": mb, "msg_bytes_note": note,
                     "reduction": km["reduction"], "algorithm": km["algorithm"], "protocol": km["protocol"]})
    if comm.height == 0 and cpu_meta:
        for r in rpc.iter_rows(named=True):
            a = cpu_meta[r["event_index"]]
            if a.collective_name is None:
                continue
            meta, odd = _plausible(_meta_row(a))
            mb, note = msg_bytes(meta["op"], meta["in_nelems"], meta["out_nelems"], meta["dtype_bytes"], meta["dtype"], odd)
            rows.append({**meta, "op": meta["op"] or "unknown", "start_ns": r["start_ns"], "end_ns": r["end_ns"],
                         "dur_ns": r["dur_ns"], "timing_source": "cpu_op", "external_id": r["external_id"],
                         "msg_bytes": mb, "msg_bytes_note": note})
    return pl.DataFrame(rows, schema=_COLL_SCHEMA)
