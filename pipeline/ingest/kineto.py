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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import msgspec
import numpy as np
import polars as pl

from .. import classify as classify_mod
from .. import catalog
from ..flops import MODELLED_OPS, op_flops
from ..ncclname import kernel_meta  # noqa: F401  (re-exported for callers of kineto.kernel_meta)
from ..timeparse import us_text_to_ns


class TraceError(ValueError):
    """The file cannot be read as a trace (empty, truncated, not JSON, wrong shape)."""


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


_TAGGED = Union[(_TX,) + tuple(_other(t) for t in ("M", "i", "I", "s", "t", "f", "C", "B", "E", "b", "e", "n", "P", "O", "N", "D", "R"))]




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
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "int8": 1, "char": 1, "uint8": 1, "byte": 1, "bool": 1,
    "short": 2, "int16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complexfloat": 8, "complexdouble": 16,
}
@dataclass
class Parsed:
    """Tables of one trace (polars frames), plus what the file says about itself."""
    gpu: pl.DataFrame
    cpu: pl.DataFrame
    steps: pl.DataFrame
    collectives: pl.DataFrame
    devices: pl.DataFrame
    process_groups: pl.DataFrame
    annotations: pl.DataFrame
    counters: pl.DataFrame
    rank: int | None
    world_size: int | None
    backend: str | None
    host: str | None
    base_time_ns: int | None
    tool_versions: dict
    event_count: int
    notes: list[str] = field(default_factory=list)


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


def _names(evs: list) -> list:
    names = list(map(_NAME, evs))
    return names if all(map(_is_str, names)) else [n if isinstance(n, str) else str(n) for n in names]


_NAME = operator.attrgetter("name")


def _is_str(x) -> bool:
    return type(x) is str


def _texts(raws: list) -> list:
    """JSON texts of many msgspec.Raw values in one decode (NUL never occurs in JSON text)."""
    if not raws:
        return []
    return [t or None for t in b"\x00".join(raws).decode("utf-8", "replace").split("\x00")]


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


def parse(data: bytes, comm_patterns: list[str] | None = None) -> Parsed:
    """Parse one Kineto trace. See the module doc for what is handled and raised."""
    doc, notes = decode(data)
    if isinstance(doc, list):
        events, top = doc, KTrace(trace_events=doc)
    else:
        events, top = doc.trace_events, doc
    if not all(isinstance(e, (KEvent, _TEv)) for e in events[:1]):
        raise TraceError("not a Kineto trace: traceEvents is not a list of events")

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

    xs = [i for i, e in enumerate(events) if e.ph == "X"]
    cats = [events[i].cat for i in xs]
    gpu_idx = [i for i, c in zip(xs, cats) if c in GPU_KIND]
    ann_idx = [i for i, c in zip(xs, cats) if c == "gpu_user_annotation"]
    cpu_idx = [i for i, c in zip(xs, cats) if c not in GPU_KIND and c not in SKIP_CATS and c != "gpu_user_annotation"]
    ctr = [i for i, e in enumerate(events) if e.ph == "C"]
    unknown_cats: dict[str, int] = {}
    for c in cats:
        if c not in CPU_KIND and c not in GPU_KIND and c not in SKIP_CATS and c != "gpu_user_annotation":
            unknown_cats[str(c)] = unknown_cats.get(str(c), 0) + 1
    if unknown_cats:
        notes.append("unrecognized categories kept as cpu_ops kind=other: " + ", ".join(f"{k} ({v})" for k, v in sorted(unknown_cats.items())))

    bad_dur = 0

    def times(idx):
        nonlocal bad_dur
        evs = [events[i] for i in idx]
        ts, ok_ts = us_text_to_ns([e.ts for e in evs])
        du, ok_du = us_text_to_ns([e.dur for e in evs])
        ok_du &= du < 2**62  # a duration of over a century is corrupt, and start + dur must fit
        bad_dur += int((ok_ts & ~ok_du).sum())
        if len(ts) and base_ns and (ts[ok_ts].max(initial=0) > 2**63 - 1 - base_ns or ts[ok_ts].min(initial=0) < -base_ns):
            raise TraceError("timestamps plus baseTimeNanoseconds fall outside the int64 ns range")
        return evs, ts, ok_ts, du, ok_du

    # ---------------- GPU activities
    evs, ts, ok_ts, du, ok_du = times(gpu_idx)
    bad_t = int((~ok_ts).sum())
    neg = int(((du < 0) & ok_du).sum())
    du = np.where(ok_du & (du > 0), du, 0)
    args = decode_args(evs)
    names = _names(evs)
    kinds = [GPU_KIND[e.cat] for e in evs]
    grid = [_dims(a.grid, 3) for a in args]
    block = [_dims(a.block, 3) for a in args]
    copy = [(_COPY_RE.match(n).groups() if k == "memcpy" and _COPY_RE.match(n) else (None, None, None)) for n, k in zip(names, kinds)]
    mset = [(_MEMSET_RE.match(n).group(1) if k == "memset" and _MEMSET_RE.match(n) else None) for n, k in zip(names, kinds)]
    gpu = pl.DataFrame({
        "device": _ints(e.pid if a.device is None else a.device for a, e in zip(args, evs)).cast(pl.Int32, strict=False),
        "stream": _ints(e.tid if a.stream is None else a.stream for a, e in zip(args, evs)),
        "kind": kinds,
        "name": names,
        "start_ns": ts + base_ns,
        "dur_ns": du,
        "correlation": _ints(map(_AG["correlation"], args)),
        "external_id": _ints(a.external_id_old if a.external_id is None else a.external_id for a in args),
        "context": _ints(map(_AG["context"], args)),
        "grid_x": [g[0] if g else None for g in grid],
        "grid_y": [g[1] if g else None for g in grid],
        "grid_z": [g[2] if g else None for g in grid],
        "block_x": [b[0] if b else None for b in block],
        "block_y": [b[1] if b else None for b in block],
        "block_z": [b[2] if b else None for b in block],
        "registers_per_thread": _ints(map(_AG["registers_per_thread"], args)).cast(pl.Int32, strict=False),
        "shared_memory_bytes": _ints(map(_AG["shared_memory"], args)),
        "bytes": _ints(map(_AG["bytes"], args)),
        "copy_kind": [c[0] for c in copy],
        "src_kind": [c[1] for c in copy],
        "dst_kind": [c[2] if k == "memcpy" else m for c, m, k in zip(copy, mset, kinds)],
        "sync_kind": [(_SYNC_KIND.get(a.cuda_sync_kind or n, "other") if k == "sync" else None) for a, n, k in zip(args, names, kinds)],
        "graph_id": _ints(map(_AG["graph_id"], args)),
        "pid": _ints(map(_AG["pid"], evs)),
        "tid": _ints(map(_AG["tid"], evs)),
        "event_index": np.asarray(gpu_idx, dtype=np.int64),
        "has_comm_args": [a.collective_name is not None for a in args],
        "_ok": ok_ts,
    }, schema_overrides={"device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64, "external_id": pl.Int64,
                         "kind": pl.String, "name": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64,
                         "event_index": pl.Int64, "has_comm_args": pl.Boolean, "_ok": pl.Boolean,
                         "context": pl.Int64, "grid_x": pl.Int32, "grid_y": pl.Int32, "grid_z": pl.Int32,
                         "block_x": pl.Int32, "block_y": pl.Int32, "block_z": pl.Int32,
                         "registers_per_thread": pl.Int32, "shared_memory_bytes": pl.Int64, "bytes": pl.Int64,
                         "graph_id": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "copy_kind": pl.String,
                         "src_kind": pl.String, "dst_kind": pl.String, "sync_kind": pl.String})
    gpu_comm_meta = {gpu_idx[j]: args[j] for j in range(len(args)) if args[j].collective_name is not None}

    # ---------------- CPU ops
    evs, ts, ok_ts_c, du, ok_du_c = times(cpu_idx)
    bad_t += int((~ok_ts_c).sum())
    neg += int(((du < 0) & ok_du_c).sum())
    du = np.where(ok_du_c & (du > 0), du, 0)
    args = decode_args(evs)
    names = _names(evs)
    dims = _texts([a.input_dims_old if not len(a.input_dims) else a.input_dims for a in args])  # JSON text as written
    types = _texts([a.input_type for a in args])
    n_cpu = len(evs)
    flops, fsrc, fdt = [None] * n_cpu, [None] * n_cpu, [None] * n_cpu
    for j in [j for j, (n, a) in enumerate(zip(names, args)) if a.flops is not None or n in MODELLED_OPS]:
        n, fv = names[j], args[j].flops
        conc = _text(args[j].concrete_inputs)
        if isinstance(fv, (int, float)) and not isinstance(fv, bool) and fv > 0:
            flops[j], fsrc[j] = float(fv), "trace"
            fdt[j] = op_flops(n, dims[j], types[j], conc)[1] if n in MODELLED_OPS else None
        elif n in MODELLED_OPS:
            v, dt = op_flops(n, dims[j], types[j], conc)
            if v is not None:
                flops[j], fsrc[j], fdt[j] = v, "shapes", dt
    cpu = pl.DataFrame({
        "pid": _ints(map(_AG["pid"], evs)),
        "tid": _ints(map(_AG["tid"], evs)),
        "kind": [CPU_KIND.get(e.cat, "other") for e in evs],
        "category": [e.cat if isinstance(e.cat, str) else None for e in evs],
        "name": names,
        "start_ns": ts + base_ns,
        "dur_ns": du,
        "correlation": _ints(map(_AG["correlation"], args)),
        "external_id": _ints(a.external_id_old if a.external_id is None else a.external_id for a in args),
        "sequence_number": _ints(map(_AG["sequence_number"], args)),
        "input_dims": dims,
        "input_types": types,
        "flops": flops,
        "flops_source": fsrc,
        "flops_dtype": fdt,
        "event_index": np.asarray(cpu_idx, dtype=np.int64),
        "_ok": ok_ts_c,
    }, schema_overrides={"pid": pl.Int64, "tid": pl.Int64, "correlation": pl.Int64, "external_id": pl.Int64,
                         "kind": pl.String, "name": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64,
                         "event_index": pl.Int64, "_ok": pl.Boolean,
                         "sequence_number": pl.Int64, "input_dims": pl.String, "input_types": pl.String,
                         "flops": pl.Float64, "flops_source": pl.String, "flops_dtype": pl.String, "category": pl.String})
    cpu_comm_meta = {cpu_idx[j]: args[j] for j in range(len(args)) if names[j] == "record_param_comms" or args[j].collective_name is not None}

    if bad_t:
        notes.append(f"{bad_t} events without a readable ts (or beyond the int64 ns range) were dropped")
    if bad_dur:
        notes.append(f"{bad_dur} events without a readable dur (or beyond the int64 ns range) were given dur 0")
    if neg:
        notes.append(f"{neg} events with negative dur clamped to 0")
    gpu = gpu.filter(pl.col("_ok")).drop("_ok").with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))
    cpu = cpu.filter(pl.col("_ok")).drop("_ok").with_columns(end_ns=pl.col("start_ns") + pl.col("dur_ns"))

    # ---------------- classification (catalog rules)
    host_re = classify_mod.comm_host_op_regex()
    comm_ext = cpu.filter(pl.col("name").str.contains(host_re) & pl.col("external_id").is_not_null())["external_id"]
    gpu = classify_mod.classify(gpu, comm_ext, comm_patterns).drop("has_comm_args")

    # ---------------- steps
    steps = (
        cpu.filter(pl.col("kind").is_in(["annotation", "op"]) & pl.col("name").str.contains(r"^ProfilerStep\s*#\s*\d+$"))
        .select(
            step=pl.col("name").str.extract(r"(\d+)$").cast(pl.Int64),
            name="name", start_ns="start_ns", end_ns="end_ns", dur_ns="dur_ns",
            source=pl.lit("profiler_step"), pid="pid", tid="tid",
        ).sort("start_ns")
    )

    # ---------------- annotations
    evs, ts, ok_a, du, _ = times(ann_idx)
    args = decode_args(evs)
    annotations = pl.DataFrame({
        "kind": ["gpu_user_annotation"] * len(evs),
        "domain": [None] * len(evs),
        "name": [e.name if isinstance(e.name, str) else str(e.name) for e in evs],
        "start_ns": ts + base_ns,
        "end_ns": ts + base_ns + np.maximum(du, 0),
        "device": _ints(e.pid if a.device is None else a.device for a, e in zip(args, evs)).cast(pl.Int32, strict=False),
        "stream": _ints(e.tid if a.stream is None else a.stream for a, e in zip(args, evs)),
        "pid": _ints(map(_AG["pid"], evs)),
        "tid": _ints(map(_AG["tid"], evs)),
        "_ok": ok_a,
    }, schema_overrides={"kind": pl.String, "name": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
                         "_ok": pl.Boolean, "domain": pl.String, "device": pl.Int32, "stream": pl.Int64, "pid": pl.Int64, "tid": pl.Int64}
    ).filter(pl.col("_ok")).drop("_ok")

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
    counters = pl.DataFrame({**c_rows, "unit": [None] * len(cts), "ts_ns": cts + base_ns, "_ok": cok},
                            schema_overrides={"device": pl.Int32, "name": pl.String, "value": pl.Float64, "unit": pl.String,
                                              "ts_ns": pl.Int64, "_ok": pl.Boolean}
                            ).filter(pl.col("_ok")).drop("_ok")

    # ---------------- distributed info, devices, process groups
    di = top.distributed_info if isinstance(top.distributed_info, dict) else {}
    rank = _int(di.get("rank"))
    world = _int(di.get("world_size"))
    backend = di.get("backend") if isinstance(di.get("backend"), str) else None
    pgs = []
    for pg in di.get("pg_config") or []:
        if isinstance(pg, dict):
            pgs.append({"process_group": str(pg.get("pg_name")), "pg_desc": pg.get("pg_desc", pg.get("uid")),
                        "backend": pg.get("backend_config"), "group_size": _int(pg.get("pg_size")),
                        "ranks": _ranks(pg.get("ranks"))})
    process_groups = pl.DataFrame(pgs, schema={"process_group": pl.String, "pg_desc": pl.String, "backend": pl.String,
                                               "group_size": pl.Int32, "ranks": pl.List(pl.Int32)})
    used_devices = set(gpu["device"].drop_nulls().unique().to_list())
    vendor = _vendor(cpu, top)
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
                      "num_sms": _int(d.get("numSms")), "bus_id": None, "used": idx in used_devices})
    for idx in sorted(used_devices - {r["device"] for r in drows}):
        drows.append({"device": idx, "name": None, "vendor": vendor, "compute_major": None, "compute_minor": None,
                      "total_memory_bytes": None, "num_sms": None, "bus_id": None, "used": True})
    devices = pl.DataFrame(drows, schema={"device": pl.Int32, "name": pl.String, "vendor": pl.String,
                                          "compute_major": pl.Int32, "compute_minor": pl.Int32,
                                          "total_memory_bytes": pl.Int64, "num_sms": pl.Int32, "bus_id": pl.String,
                                          "used": pl.Boolean})

    collectives = _collectives(gpu, cpu, gpu_comm_meta, cpu_comm_meta)

    versions = {k: v for k, v in {
        "schemaVersion": top.schema_version, "cupti_version": top.cupti_version,
        "cuda_runtime_version": top.cuda_runtime_version, "cuda_driver_version": top.cuda_driver_version,
        "roctracer_version": top.roctracer_version, "hip_runtime_version": top.hip_runtime_version,
        "hip_driver_version": top.hip_driver_version, "nccl_version": di.get("nccl_version"),
    }.items() if v is not None}
    host = top.host_name or top.hostname
    return Parsed(gpu=gpu, cpu=cpu, steps=steps, collectives=collectives, devices=devices,
                  process_groups=process_groups, annotations=annotations, counters=counters,
                  rank=rank, world_size=world, backend=backend, host=host if isinstance(host, str) else None,
                  base_time_ns=base_ns if has_base else None, tool_versions=versions,
                  event_count=len(events), notes=notes)


def _vendor(cpu: pl.DataFrame, top: KTrace) -> str:
    rt = cpu.filter(pl.col("kind").is_in(["runtime", "driver"]))["name"]
    if rt.str.starts_with("hip").any():
        return "amd"
    if rt.str.starts_with("cu").any():
        return "nvidia"
    if cpu["category"].eq("mtia_runtime").any():
        return "mtia"
    if top.hip_runtime_version is not None or top.roctracer_version is not None:
        return "amd"
    return "unknown"


def _dtype_bytes(dtype) -> int | None:
    if not isinstance(dtype, str):
        return None
    return _DTYPE_BYTES.get(dtype.lower().replace("c10::", "").replace("at::", ""))


def _meta_row(a: KArgs) -> dict:
    raw = a.collective_name if isinstance(a.collective_name, str) else None
    op = catalog.normalize_op(raw) if raw else None
    in_n, out_n = _int(a.in_msg_nelems), _int(a.out_msg_nelems)
    dtype = a.dtype if isinstance(a.dtype, str) else None
    size = _dtype_bytes(dtype)
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


def msg_bytes(op: str | None, in_n, out_n, size) -> tuple[int | None, str | None]:
    """nccl-tests message size S (pipeline/catalog/collectives.toml), or (None, reason)."""
    if op is None or op == "unknown":
        return None, "collective op unknown"
    rule = catalog.collectives()[op]["msg"]
    if rule == "none":
        return None, f"{op} moves no payload"
    if size is None:
        return None, "element type unknown"
    if rule == "in":
        n = in_n
    elif rule == "out":
        n = out_n
    else:
        n = max([x for x in (in_n, out_n) if x is not None], default=None)
    if n is None:
        return None, "element count not recorded"
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


def _collectives(gpu: pl.DataFrame, cpu: pl.DataFrame, gpu_meta: dict, cpu_meta: dict) -> pl.DataFrame:
    """One row per communication kernel; metadata from its own args, else from the
    record_param_comms op with the same External id, else from the kernel name. CPU-only
    traces (gloo) get one row per record_param_comms op that names its collective."""
    cpu_by_ext = {}
    rpc = cpu.filter(pl.col("event_index").is_in(list(cpu_meta)))
    for ei, ext in zip(rpc["event_index"].to_list(), rpc["external_id"].to_list()):
        if ext is not None and cpu_meta[ei].collective_name is not None:
            cpu_by_ext.setdefault(ext, cpu_meta[ei])
    rows = []
    comm = gpu.filter(pl.col("category") == "communication")
    for r in comm.iter_rows(named=True):
        a = gpu_meta.get(r["event_index"]) or cpu_by_ext.get(r["external_id"])
        km = kernel_meta(r["name"])
        meta = _meta_row(a) if a else {}
        op = meta.get("op") or catalog.normalize_op(km["op"] or r["name"])
        mb, note = msg_bytes(op, meta.get("in_nelems"), meta.get("out_nelems"), meta.get("dtype_bytes")) if a else (None, "no collective metadata in the trace (kernel name only)")
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
            meta = _meta_row(a)
            mb, note = msg_bytes(meta["op"], meta["in_nelems"], meta["out_nelems"], meta["dtype_bytes"])
            rows.append({**meta, "op": meta["op"] or "unknown", "start_ns": r["start_ns"], "end_ns": r["end_ns"],
                         "dur_ns": r["dur_ns"], "timing_source": "cpu_op", "external_id": r["external_id"],
                         "msg_bytes": mb, "msg_bytes_note": note})
    return pl.DataFrame(rows, schema=_COLL_SCHEMA)
