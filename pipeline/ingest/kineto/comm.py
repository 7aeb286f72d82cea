"""What a Kineto NCCL kernel's collective is, from the host records around its launch.

Before Kineto copied record_param_comms' fields onto NCCL kernels (Dec 2023), a kernel has no
Collective name args, and its External id may be its own correlation rather than the host op's
(PARAM et_replay dlrm_kineto: ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t with "External id" ==
"correlation" == 41246). What ties it to the call is time: the runtime event that launched it
(cuda_runtime / cuda_driver, same correlation) lies on the host thread inside the records
PyTorch writes for the call, outermost first:

  c10d::<op>          the dispatcher op (torch/csrc/distributed/c10d/Ops.cpp); Input Dims in its
                      schema's order (output, input for _allgather_base_ / alltoall_base_ / ...;
                      pipeline/catalog/collectives.toml [c10d_args])
  record_param_comms  RECORD_PARAM_COMMS (c10d/ParamCommsUtils.hpp): first input = the input
                      tensor(s); since 2023 also Collective name, In/Out msg nelems, dtype, Group size
  nccl:<op>           ProcessGroupNCCL's profiler range for the Work (initWork(profilingTitle,
                      inputs)): Input Dims / Input type = the input tensors; "nccl:send 0->1"

launch_chains() finds, for each launch, the comm host ops on its pid/tid whose [start, end] holds
the launch start, innermost first; chain_meta() reads the op and the element counts from them:
the op from the innermost record that names one, each count from the innermost record of that op
(or of none) that records it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import polars as pl

from ... import catalog

# "Input type" values that are not a tensor's element type (torch/csrc/profiler/collection.cpp
# and older Kineto): scalars, lists, None/strings ("").
_NON_TENSOR = {"", "Scalar", "ScalarList", "TensorList", "GenericList", "None", "String", "Device", "Layout"}


def launch_chains(launches: pl.DataFrame, hosts: pl.DataFrame) -> dict[int, list[int]]:
    """correlation -> event_index of the comm host ops enclosing its launch, innermost first
    (an empty list: the launch has none around it).

    launches: correlation, pid, tid, start_ns (one row per correlation); hosts: event_index, pid,
    tid, start_ns, end_ns. One sweep per thread over both sorted by time, with a stack of the
    open host ops: O((H + L) log(H + L)). A host op contains a launch when start <= t <= end.
    Threads are keyed by a dense index, not by (pid, tid) tuples: a tuple's hash is a function of
    its items' hashes, which Python does not randomize for ints, so a trace can name 20,000
    threads whose (pid, tid) share one hash, and a dict of them took 13 s (issue 39 item 3)."""
    out: dict[int, list[int]] = {c: [] for c in launches["correlation"].to_list()}
    if not launches.height or not hosts.height:
        return out
    threads = pl.concat(
        [launches.select("pid", "tid"), hosts.select("pid", "tid")], how="vertical_relaxed"
    ).unique()
    threads = threads.with_row_index("thread")
    hosts = hosts.join(threads, on=["pid", "tid"], nulls_equal=True)  # a null pid or tid is a thread too
    launches = launches.join(threads, on=["pid", "tid"], nulls_equal=True)
    hs = hosts.sort(["thread", "start_ns", "end_ns"], descending=[False, False, True])
    by_thread = hs.partition_by("thread", as_dict=True)
    for key, lg in launches.sort(["thread", "start_ns"]).partition_by("thread", as_dict=True).items():
        hg = by_thread.get(key)
        if hg is None:
            continue
        starts, ends, idx = hg["start_ns"].to_list(), hg["end_ns"].to_list(), hg["event_index"].to_list()
        j, stack = 0, []
        for corr, t in zip(lg["correlation"].to_list(), lg["start_ns"].to_list()):
            while j < len(starts) and starts[j] <= t:
                while stack and ends[stack[-1]] < starts[j]:
                    stack.pop()
                stack.append(j)
                j += 1
            while stack and ends[stack[-1]] < t:
                stack.pop()
            out[corr] = [
                idx[k] for k in reversed(stack) if ends[k] >= t
            ]  # the filter: ranges that overlap without nesting
    return out


@dataclass
class HostRec:
    """What one comm host op says about its collective."""

    name: str  # as recorded, up to the first space ("nccl:send 0->1" -> "nccl:send")
    op: str | None  # the catalog op it names (None: it names none)
    op_raw: str | None
    in_n: int | None = None  # element counts
    out_n: int | None = None
    dtype: str | None = None  # element type as recorded ("float", "long int", "Float")
    meta: dict | None = None  # its Collective name args (kineto.collectives._meta_row), when it has them
    has_dims: bool = False  # Input Dims recorded at all
    mixed: bool = False  # its input tensors have different element types


def _json(text):
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _shape(d) -> bool:
    return isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d)


def _entry(dims: list, types: list, i: int) -> tuple[int | None, str | None]:
    """(element count, element type) of Input Dims entry i: a tensor (shape + element type), or
    a TensorList whose shapes Kineto recorded (count only: a list has no element type)."""
    d = dims[i] if i < len(dims) else None
    t = types[i] if i < len(types) else None
    if isinstance(t, str) and t not in _NON_TENSOR:
        return (math.prod(d) if _shape(d) else None), t
    if t == "TensorList" and isinstance(d, list) and d and all(_shape(x) for x in d):
        return sum(math.prod(x) for x in d), None
    return None, None


def host_record(name: str, dims_text: str | None, types_text: str | None, meta: dict | None) -> HostRec:
    """Read one comm host op: its name, Input Dims / Input type (JSON text as written) and, when
    it has Collective name args, their _meta_row."""
    short = name.split(" ", 1)[0]
    dims, types = _json(dims_text), _json(types_text)
    dims = dims if isinstance(dims, list) else []
    types = types if isinstance(types, list) else []
    rec = HostRec(name=short, op=None, op_raw=None, has_dims=bool(dims))
    if meta is not None and meta.get("op") not in (None, "unknown"):
        rec.op, rec.op_raw, rec.meta = meta["op"], meta.get("op_raw") or short, meta
        rec.in_n, rec.out_n, rec.dtype = meta.get("in_nelems"), meta.get("out_nelems"), meta.get("dtype")
        return rec
    if short.startswith("nccl:") or short.startswith("gloo:"):
        raw = short.split(":", 1)[1]
        rec.op_raw = short
        rec.op = _named(raw)
        counts, dts = [], set()
        for i in range(len(dims)):
            n, t = _entry(dims, types, i)
            if n is not None:
                counts.append(n)
                if t is not None:
                    dts.add(t)
        rec.mixed = len(dts) > 1  # no one element size: no size from this record
        if counts and not rec.mixed:
            rec.in_n, rec.dtype = sum(counts), next(iter(dts), None)
    elif short.startswith("c10d::") or short.startswith("c10d_functional::"):
        raw = short.split("::", 1)[1]
        rec.op_raw = short
        rec.op = _named(raw.rstrip("_"))
        pos = catalog.c10d_args().get(raw)
        if pos:
            for side in ("in", "out"):
                if side in pos:
                    n, t = _entry(dims, types, pos[side])
                    setattr(rec, f"{side}_n", n)
                    rec.dtype = rec.dtype or t
    elif short == "record_param_comms":  # no Collective name: only its first input, the input tensor(s)
        rec.in_n, rec.dtype = _entry(dims, types, 0)
    return rec


def _named(raw: str) -> str | None:
    op = catalog.normalize_op(raw)
    return None if op == "unknown" else op


def chain_meta(recs: list[HostRec]) -> tuple[dict, str | None]:
    """The collective of a kernel from the host records around its launch (innermost first):
    ({op, op_raw, in_nelems, out_nelems, dtype, dtype_bytes, and the Collective name args' group
    and process-group fields when a record has them}, why no size when the counts are missing).
    The op is the innermost record's that names one; counts and element type come from the
    innermost records of that op, or of none (record_param_comms without Collective name)."""
    if not recs:
        return (
            {},
            "no collective metadata: no Collective name args, no record_param_comms / nccl: op "
            "around the launch (kernel name only)",
        )
    named = next((r for r in recs if r.op), None)
    op = named.op if named else None
    use = [r for r in recs if r.op is None or r.op == op]
    with_meta = next((r.meta for r in use if r.meta), None)
    meta = {
        k: v
        for k, v in (with_meta or {}).items()
        if k not in ("op", "op_raw", "in_nelems", "out_nelems", "dtype", "dtype_bytes")
    }
    in_r = next((r for r in use if r.in_n is not None), None)
    out_r = next((r for r in use if r.out_n is not None), None)
    dtype = next((r.dtype for r in (in_r, out_r) if r is not None and r.dtype), None) or next(
        (r.dtype for r in use if r.dtype), None
    )
    meta.update(
        op=op,
        op_raw=named.op_raw if named else recs[0].name,
        in_nelems=in_r.in_n if in_r else None,
        out_nelems=out_r.out_n if out_r else None,
        dtype=dtype,
        dtype_bytes=catalog.dtype_bytes(dtype),
    )
    # all_gather's output is its input times the group's size, reduce_scatter's input its output
    # times it (torch.distributed all_gather_into_tensor / reduce_scatter_tensor): the group size
    # when no record states it (HTA's trace_filter: [16777216] gathered into [1073741824], 64 ranks)
    i_n, o_n = meta["in_nelems"], meta["out_nelems"]
    if meta.get("group_size") is None and i_n and o_n and op in ("all_gather", "reduce_scatter"):
        big, small = (o_n, i_n) if op == "all_gather" else (i_n, o_n)
        if big % small == 0 and big // small >= 2:
            meta["group_size"] = big // small
    distinct = list(dict.fromkeys(r.name for r in use))
    names, verb = " / ".join(distinct), ("has" if len(distinct) == 1 else "have")
    if in_r is None and out_r is None:
        if any(r.mixed for r in use):
            return meta, f"{names} around the launch: input tensors of different element types"
        if not any(r.has_dims for r in use):
            return meta, f"{names} around the launch {verb} no Input Dims"
        return meta, f"{names} around the launch {verb} no tensor sizes in Input Dims"
    rule = catalog.collectives()[op]["msg"] if op else None
    if rule == "out" and out_r is None:
        return meta, f"{op} is sized by its output; {names} around the launch {verb} only the input"
    if rule == "in" and in_r is None:
        return meta, f"{op} is sized by its input; {names} around the launch {verb} only the output"
    return meta, None
