"""One batch of events -> the rows of the per-event tables (schema v3 columns, raw file timestamps).

Owns: the category maps (GPU_KIND, CPU_KIND, SKIP_CATS) and name patterns (memcpy / memset /
sync kinds); sort_events() (which table each event feeds); convert() (the times, pids, tids and
args of every kept event in one conversion each, as one Part per table); and the table builders
gpu_frame() (gpu_activities), cpu_frame() (cpu_ops, with FLOPs), ann_frame() (annotations) and
ctr_frame() (counters). What the whole trace needs from these rows is collected by acc._Acc.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from operator import attrgetter

import msgspec
import msgspec.structs
import numpy as np
import polars as pl

from ...flops import MODELLED_OPS, op_flops
from ...opbytes import MODELLED_OPS as TRAFFIC_OPS
from ...opbytes import op_bytes
from ...timeparse import us_text_to_ns
from .decode import KArgs, _TEv, _TSkipped, decode_args
from .values import (
    _A_BLOCK,
    _A_COLL,
    _A_DEVICE,
    _A_FLOPS,
    _A_GRID,
    _A_STREAM,
    _A_TYPE,
    _AG,
    _CAT,
    _DUR,
    _PID,
    _TID,
    _TS,
    _dims3,
    _ext_ids,
    _ints,
    _ints_or,
    _names,
    _text,
    _texts,
)

GPU_KIND = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "mtia_ccp_events": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_sync": "sync",
    "cuda_profiler_range": "unknown",
}
CPU_KIND = {
    "cpu_op": "op",
    "Operator": "op",
    "user_annotation": "annotation",
    "python_function": "python",
    "cuda_runtime": "runtime",
    "Runtime": "runtime",
    "cuda_driver": "driver",
    "mtia_runtime": "runtime",
    "overhead": "other",
}
SKIP_CATS = {"Trace", "ac2g", "async_cpu_to_gpu", "async", "fwdbwd", "critical_path", "cpu_instant_event"}

_STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_COPY_RE = re.compile(
    r"^(?:hip)?Memcpy\s*(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|AtoH|HtoA|AtoA)?"
    r"(?:\s*\((\w+)\s*->\s*(\w+)\))?"
)
_MEMSET_RE = re.compile(r"^(?:hip)?Memset\s*(?:\((\w+)\))?")
_SYNC_KIND = {
    "Stream Sync": "stream",
    "Event Sync": "event",
    "Context Sync": "context",
    "Stream Wait Event": "stream_wait_event",
    "Device Sync": "context",
}
_CPU_KIND_GET = CPU_KIND.get

_GPU_SCHEMA = {
    "device": pl.Int32,
    "stream": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "kind": pl.String,
    "name": pl.String,
    "start_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "event_index": pl.Int64,
    "has_comm_args": pl.Boolean,
    "_ok": pl.Boolean,
    "context": pl.Int64,
    "grid_x": pl.Int32,
    "grid_y": pl.Int32,
    "grid_z": pl.Int32,
    "block_x": pl.Int32,
    "block_y": pl.Int32,
    "block_z": pl.Int32,
    "registers_per_thread": pl.Int32,
    "shared_memory_bytes": pl.Int64,
    "bytes": pl.Int64,
    "graph_id": pl.Int64,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "copy_kind": pl.String,
    "src_kind": pl.String,
    "dst_kind": pl.String,
    "sync_kind": pl.String,
}
_CPU_SCHEMA = {
    "pid": pl.Int64,
    "tid": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "kind": pl.String,
    "name": pl.String,
    "start_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "event_index": pl.Int64,
    "_ok": pl.Boolean,
    "sequence_number": pl.Int64,
    "input_dims": pl.String,
    "input_types": pl.String,
    "flops": pl.Float64,
    "flops_source": pl.String,
    "flops_dtype": pl.String,
    "mem_bytes": pl.Float64,
    "vector_flops": pl.Float64,
    "category": pl.String,
}
_ANN_SCHEMA = {
    "kind": pl.String,
    "name": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "_ok": pl.Boolean,
    "domain": pl.String,
    "device": pl.Int32,
    "stream": pl.Int64,
    "pid": pl.Int64,
    "tid": pl.Int64,
}
_CTR_SCHEMA = {
    "device": pl.Int32,
    "name": pl.String,
    "value": pl.Float64,
    "unit": pl.String,
    "ts_ns": pl.Int64,
    "_ok": pl.Boolean,
}


_NO_RAW = msgspec.Raw(b"")


def _slim(a: KArgs) -> KArgs:
    """Args kept past their batch, without their raw-text fields: a msgspec.Raw refers to the
    whole text it was decoded from, which would otherwise stay in memory with it."""
    return msgspec.structs.replace(
        a, input_dims=_NO_RAW, input_dims_old=_NO_RAW, input_type=_NO_RAW, concrete_inputs=_NO_RAW
    )


CONTAINERS = (list, dict)
# the key of sort_events' `unknown` that counts events with a list or object in cat/name/pid/tid
NOT_SCALAR = "\x00not scalar"


def _as_text(e, unknown: dict) -> None:
    """An event whose cat, name, pid or tid is a JSON list or object (Kineto writes strings and
    numbers there): each such field becomes its JSON text, so the event is kept and nothing
    downstream hashes a list; counted in unknown[NOT_SCALAR]."""
    for f in ("cat", "name", "pid", "tid"):
        v = getattr(e, f)
        if isinstance(v, CONTAINERS):
            setattr(e, f, msgspec.json.encode(v).decode("utf-8", "replace"))
    unknown[NOT_SCALAR] = unknown.get(NOT_SCALAR, 0) + 1


_PH = attrgetter("ph")  # (_CAT: values.py)
_FAST_EVENTS = (_TEv, _TSkipped)


def sort_events(events: list, unknown: dict) -> tuple[list, list, list, list]:
    """(gpu, cpu, annotation, counter) event indices of a batch: one pass, by phase and category.
    CPU events of a category not in CPU_KIND are counted in `unknown` (category -> count).

    A list or object in cat, name, pid or tid is rare (hostile or broken traces) and only the
    general decoder's events (decode.KEvent) can hold one: the fast decoder's (decode._TEv) are
    JSON scalars there, so only a batch of KEvents is checked first, event by event, each such
    field of a complete or counter event turned into its JSON text (_as_text). Checking every
    event was a fifth of a 50 MB rank's ingest (0.18 of 0.93 CPU-s, cProfile); the same indices
    and counts either way (tests/test_sort_events.py)."""
    if not events:
        return [], [], [], []
    if not isinstance(events[0], _FAST_EVENTS):  # one decoder per batch (kineto/stream.py)
        _containers_as_text(events, unknown)
    gpu_idx, ann_idx, cpu_idx, ctr = [], [], [], []
    gpu_kind, cpu_kind, skip = GPU_KIND, CPU_KIND, SKIP_CATS
    for i, ph, c in zip(range(len(events)), map(_PH, events), map(_CAT, events)):
        if ph == "X":
            if c in gpu_kind:
                gpu_idx.append(i)
            elif c == "gpu_user_annotation":
                ann_idx.append(i)
            elif c not in skip:
                cpu_idx.append(i)
                if c not in cpu_kind:
                    unknown[str(c)] = unknown.get(str(c), 0) + 1
        elif ph == "C":
            ctr.append(i)
    return gpu_idx, cpu_idx, ann_idx, ctr


def _containers_as_text(events: list, unknown: dict) -> None:
    """Each list or object in cat, name, pid or tid of a complete or counter event replaced by its
    JSON text, counted in unknown[NOT_SCALAR] (_as_text)."""
    for e in events:
        if e.ph == "X" or e.ph == "C":
            odd = isinstance(e.cat, CONTAINERS) or isinstance(e.name, CONTAINERS)
            if odd or isinstance(e.pid, CONTAINERS) or isinstance(e.tid, CONTAINERS):
                _as_text(e, unknown)


@dataclass
class Part:
    """The events of one table in a batch (`idx`: their indices in the batch) with their fields
    converted: ts / dur in ns (and whether each was readable), pid, tid, category, decoded args."""

    idx: list
    evs: list
    args: list
    cats: list
    ts: np.ndarray
    ok_ts: np.ndarray
    du: np.ndarray
    ok_du: np.ndarray
    pid: pl.Series
    tid: pl.Series


@dataclass
class Batch:
    """The kept events of one batch as one Part per table, plus the times of all of them."""

    gpu: Part
    cpu: Part
    ann: Part
    ts: np.ndarray
    ok_ts: np.ndarray
    ok_du: np.ndarray


def convert(events: list, gpu_idx: list, cpu_idx: list, ann_idx: list) -> Batch:
    """The fields of the kept events (GPU, then CPU, then annotation events) converted together."""
    ng, nc = len(gpu_idx), len(cpu_idx)
    kept = gpu_idx + cpu_idx + ann_idx
    evs_all = [events[i] for i in kept]
    # the times of all three tables in one conversion each
    ts_all, ok_ts_all = us_text_to_ns(list(map(_TS, evs_all)))
    du_all, ok_du_all = us_text_to_ns(list(map(_DUR, evs_all)))
    ok_du_all &= du_all < 2**62  # a duration of over a century is corrupt, and start + dur must fit:
    # an end past int64 too (a start within dur of 2^63 - 1 ns), which the sum would wrap negative
    ok_du_all &= ts_all <= np.int64(2**63 - 1) - np.where(ok_du_all & (du_all > 0), du_all, 0)
    pid_all = _ints(map(_PID, evs_all))
    tid_all = _ints(map(_TID, evs_all))
    cat_all = list(map(_CAT, evs_all))
    args_all = decode_args(evs_all)

    def part(sl: slice, idx: list) -> Part:
        return Part(
            idx=idx,
            evs=evs_all[sl],
            args=args_all[sl],
            cats=cat_all[sl],
            ts=ts_all[sl],
            ok_ts=ok_ts_all[sl],
            du=du_all[sl],
            ok_du=ok_du_all[sl],
            pid=pid_all[sl],
            tid=tid_all[sl],
        )

    return Batch(
        gpu=part(slice(0, ng), gpu_idx),
        cpu=part(slice(ng, ng + nc), cpu_idx),
        ann=part(slice(ng + nc, None), ann_idx),
        ts=ts_all,
        ok_ts=ok_ts_all,
        ok_du=ok_du_all,
    )


def _copy_kinds(kinds: list, names: list, args: list) -> tuple[list, list, list, list]:
    """(copy_kind, src_kind, dst_kind, sync_kind) of GPU events: from the memcpy / memset name
    and the sync kind."""
    ng = len(kinds)
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
    return copy_kind, src_kind, dst_kind, sync_kind


def gpu_frame(p: Part, off: int) -> tuple[pl.DataFrame, dict]:
    """gpu_activities rows of a batch (events with a readable ts; `off`: the batch's first event
    index), and event_index -> slimmed args of those with Collective name args."""
    evs, args, cats = p.evs, p.args, p.cats
    du = np.where(p.ok_du & (p.du > 0), p.du, 0)
    names, names_s = _names(evs)
    kinds = [GPU_KIND[c] for c in cats]
    pid, tid = p.pid, p.tid
    dims3 = {**_dims3(list(map(_A_GRID, args)), "grid"), **_dims3(list(map(_A_BLOCK, args)), "block")}
    copy_kind, src_kind, dst_kind, sync_kind = _copy_kinds(kinds, names, args)
    colls = list(map(_A_COLL, args))
    gpu = _kept(
        {
            "device": _ints_or(list(map(_A_DEVICE, args)), pid, evs, _PID).cast(pl.Int32, strict=False),
            "stream": _ints_or(list(map(_A_STREAM, args)), tid, evs, _TID),
            "kind": pl.Series(kinds, dtype=pl.String),
            "name": names_s,
            "start_ns": p.ts,
            "dur_ns": du,
            "correlation": _ints(map(_AG["correlation"], args)),
            "external_id": _ext_ids(args),
            "context": _ints(map(_AG["context"], args)),
            **dims3,
            "registers_per_thread": _ints(map(_AG["registers_per_thread"], args)).cast(
                pl.Int32, strict=False
            ),
            "shared_memory_bytes": _ints(map(_AG["shared_memory"], args)),
            "bytes": _ints(map(_AG["bytes"], args)),
            "copy_kind": pl.Series(copy_kind, dtype=pl.String),
            "src_kind": pl.Series(src_kind, dtype=pl.String),
            "dst_kind": pl.Series(dst_kind, dtype=pl.String),
            "sync_kind": pl.Series(sync_kind, dtype=pl.String),
            "graph_id": _ints(map(_AG["graph_id"], args)),
            "pid": pid,
            "tid": tid,
            "event_index": np.asarray(p.idx, dtype=np.int64) + off,
            "has_comm_args": pl.Series([x is not None for x in colls], dtype=pl.Boolean),
        },
        p.ok_ts,
        _GPU_SCHEMA,
    )
    meta = {p.idx[j] + off: _slim(args[j]) for j, x in enumerate(colls) if x is not None}
    return gpu, meta


def _flops(
    names: list, args: list, dims_s: pl.Series, types_s: pl.Series, memo: dict
) -> tuple[list, list, list, list, list]:
    """(flops, flops_source, flops_dtype, mem_bytes, vector_flops) of CPU ops: the trace's own
    'flops' when positive, else op_flops from the shapes for the modelled ops; op_bytes for the
    ops of the traffic model (pipeline/opbytes.py). memo: (name, dims, types, concrete inputs) ->
    (op_flops, op_bytes), shared by the whole trace (steps repeat shapes)."""
    nc = len(names)
    fl = list(map(_A_FLOPS, args))
    flops, fsrc, fdt = [None] * nc, [None] * nc, [None] * nc
    mem, vec = [None] * nc, [None] * nc
    todo = [
        j for j, (n, f) in enumerate(zip(names, fl)) if f is not None or n in MODELLED_OPS or n in TRAFFIC_OPS
    ]
    dims = dict(zip(todo, dims_s.gather(todo).to_list())) if todo else {}
    types = dict(zip(todo, types_s.gather(todo).to_list())) if todo else {}
    for j in todo:
        n, fv = names[j], fl[j]
        r = b = None
        if n in MODELLED_OPS or n in TRAFFIC_OPS:
            key = (n, dims[j], types[j], _text(args[j].concrete_inputs))
            got = memo.get(key)
            if got is None:
                got = memo[key] = (
                    op_flops(*key) if n in MODELLED_OPS else (None, None),
                    op_bytes(*key) if n in TRAFFIC_OPS else (None, None),
                )
            r, b = got
            mem[j], vec[j] = b
        if isinstance(fv, (int, float)) and not isinstance(fv, bool) and 0 < fv < math.inf:
            flops[j], fsrc[j] = float(fv), "trace"
            fdt[j] = r[1] if n in MODELLED_OPS else None
        elif n in MODELLED_OPS:
            v, dt = r
            if v is not None:
                flops[j], fsrc[j], fdt[j] = v, "shapes", dt
    return flops, fsrc, fdt, mem, vec


def cpu_frame(p: Part, off: int, flops_memo: dict) -> tuple[pl.DataFrame, dict]:
    """cpu_ops rows of a batch (events with a readable ts), and event_index -> slimmed args of
    the record_param_comms ops and of those with Collective name args."""
    evs, args, cats = p.evs, p.args, p.cats
    du = np.where(p.ok_du & (p.du > 0), p.du, 0)
    names, names_s = _names(evs)
    dims_s = _texts(
        [a.input_dims_old if not len(a.input_dims) else a.input_dims for a in args]
    )  # JSON text as written
    types_s = _texts(list(map(_A_TYPE, args)))
    colls = list(map(_A_COLL, args))
    flops, fsrc, fdt, mem, vec = _flops(names, args, dims_s, types_s, flops_memo)
    cpu = _kept(
        {
            "pid": p.pid,
            "tid": p.tid,
            "kind": pl.Series([_CPU_KIND_GET(c, "other") for c in cats], dtype=pl.String),
            "category": pl.Series(
                [c if type(c) is str or isinstance(c, str) else None for c in cats], dtype=pl.String
            ),
            "name": names_s,
            "start_ns": p.ts,
            "dur_ns": du,
            "correlation": _ints(map(_AG["correlation"], args)),
            "external_id": _ext_ids(args),
            "sequence_number": _ints(map(_AG["sequence_number"], args)),
            "input_dims": dims_s,
            "input_types": types_s,
            "flops": pl.Series(flops, dtype=pl.Float64),
            "flops_source": pl.Series(fsrc, dtype=pl.String),
            "flops_dtype": pl.Series(fdt, dtype=pl.String),
            "mem_bytes": pl.Series(mem, dtype=pl.Float64),
            "vector_flops": pl.Series(vec, dtype=pl.Float64),
            "event_index": np.asarray(p.idx, dtype=np.int64) + off,
        },
        p.ok_ts,
        _CPU_SCHEMA,
    )
    sel = {j for j, n in enumerate(names) if n == "record_param_comms"}
    sel.update(j for j, x in enumerate(colls) if x is not None)
    meta = {p.idx[j] + off: _slim(args[j]) for j in sorted(sel)}
    return cpu, meta


def ann_frame(p: Part) -> pl.DataFrame:
    """annotations rows (gpu_user_annotation events with a readable ts) of a batch."""
    evs, args = p.evs, p.args
    ts, ok_a, du = p.ts, p.ok_ts, p.du
    pid, tid = p.pid, p.tid
    return _kept(
        {
            "kind": ["gpu_user_annotation"] * len(evs),
            "domain": [None] * len(evs),
            "name": _names(evs)[1],
            "start_ns": ts,
            "end_ns": ts + np.maximum(du, 0),
            "device": _ints_or(list(map(_A_DEVICE, args)), pid, evs, _PID).cast(pl.Int32, strict=False),
            "stream": _ints_or(list(map(_A_STREAM, args)), tid, evs, _TID),
            "pid": pid,
            "tid": tid,
        },
        ok_a,
        _ANN_SCHEMA,
    )


def ctr_frame(events: list, ctr: list) -> pl.DataFrame:
    """counters rows of a batch (ph C: one series per args key; `ctr`: their indices)."""
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
    return _kept({**c_rows, "unit": [None] * len(cts), "ts_ns": cts}, cok, _CTR_SCHEMA)


def _kept(cols: dict, ok: np.ndarray, schema: dict) -> pl.DataFrame:
    """The frame of `cols` (schema: its column types), only the rows where `ok` (a readable ts);
    when every row is (the common case) without a filter (a polars plan of its own)."""
    if ok.all():
        return pl.DataFrame(cols, schema_overrides=schema)
    return pl.DataFrame({**cols, "_ok": ok}, schema_overrides=schema).filter(pl.col("_ok")).drop("_ok")
