"""The collectives table: one row per communication kernel (or per record_param_comms op in a
CPU-only trace), with its op, element counts, message size and process group.

Owns: _collectives() (the table, from the classified GPU rows and the collective metadata kept
in phase 1), _meta_row() (a KArgs' Collective name fields), _plausible(), msg_bytes() (the
nccl-tests message size) and _host_records() (the comm host ops around launches, read by comm).
"""

from __future__ import annotations

import polars as pl

from ... import catalog
from ...ncclname import kernel_meta
from . import comm as kineto_comm
from .decode import KArgs
from .values import _int, _ranks


def _meta_row(a: KArgs) -> dict:
    raw = a.collective_name if isinstance(a.collective_name, str) else None
    op = catalog.normalize_op(raw) if raw else None
    in_n, out_n = _int(a.in_msg_nelems), _int(a.out_msg_nelems)
    dtype = a.dtype if isinstance(a.dtype, str) else None
    size = catalog.dtype_bytes(dtype)
    cid = a.comms_id
    return {
        "op_raw": raw,
        "op": op,
        "in_nelems": in_n,
        "out_nelems": out_n,
        "dtype": dtype,
        "dtype_bytes": size,
        "group_size": _int(a.group_size),
        "process_group": str(a.pg_name) if a.pg_name is not None else None,
        "pg_desc": a.pg_desc if isinstance(a.pg_desc, str) else None,
        "pg_ranks": _ranks(a.pg_ranks),
        "seq": _int(a.seq),
        "comms_id": str(cid) if isinstance(cid, int) else (cid if isinstance(cid, str) else None),
        "src_rank": _int(a.src_rank),
        "dst_rank": _int(a.dst_rank),
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


def msg_bytes(
    op: str | None, in_n, out_n, size, dtype: str | None = None, missing: str | None = None
) -> tuple[int | None, str | None]:
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
        return None, missing or (
            "Out msg nelems not recorded" if rule == "out" else "In msg nelems not recorded"
        )
    if size is None:
        return None, f"element type {dtype!r} unknown" if dtype else "element type not recorded"
    return n * size, None


_COLL_SCHEMA = {
    "op": pl.String,
    "op_raw": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "timing_source": pl.String,
    "device": pl.Int32,
    "stream": pl.Int64,
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "dtype": pl.String,
    "dtype_bytes": pl.Int32,
    "msg_bytes": pl.Int64,
    "msg_bytes_note": pl.String,
    "group_size": pl.Int32,
    "process_group": pl.String,
    "pg_desc": pl.String,
    "pg_ranks": pl.List(pl.Int32),
    "seq": pl.Int64,
    "comms_id": pl.String,
    "src_rank": pl.Int32,
    "dst_rank": pl.Int32,
    "reduction": pl.String,
    "algorithm": pl.String,
    "protocol": pl.String,
}


_NO_LAUNCH = (
    "no collective metadata: no Collective name args, no launch event for the kernel (kernel name only)"
)


def _host_records(chains: dict, hosts: pl.DataFrame | None, cpu_meta: dict) -> dict:
    """event_index -> kineto_comm.HostRec of every host op in the chains; host ops recorded alike
    (name, Input Dims, Input type, no Collective name args: steps repeat them) share one."""
    need = {ei for chain in chains.values() for ei in chain}
    if not need or hosts is None:
        return {}
    out, memo = {}, {}
    h = hosts.filter(pl.col("event_index").is_in(list(need)))
    for ei, name, dims, types in zip(
        h["event_index"].to_list(), h["name"].to_list(), h["input_dims"].to_list(), h["input_types"].to_list()
    ):
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


def _collectives(
    comm: pl.DataFrame | None,
    rpc: pl.DataFrame,
    gpu_meta: dict,
    cpu_meta: dict,
    chains: dict | None = None,
    hosts: pl.DataFrame | None = None,
) -> pl.DataFrame:
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
            mb, note = msg_bytes(
                op,
                meta.get("in_nelems"),
                meta.get("out_nelems"),
                meta.get("dtype_bytes"),
                meta.get("dtype"),
                missing or odd,
            )
        else:
            mb, note = None, missing or _NO_LAUNCH
        rows.append(
            {
                **meta,
                "op": op,
                "op_raw": meta.get("op_raw") or r["name"],
                "start_ns": r["start_ns"],
                "end_ns": r["end_ns"],
                "dur_ns": r["dur_ns"],
                "timing_source": "gpu_kernel",
                "device": r["device"],
                "stream": r["stream"],
                "correlation": r["correlation"],
                "external_id": r["external_id"],
                "msg_bytes": mb,
                "msg_bytes_note": note,
                "reduction": km["reduction"],
                "algorithm": km["algorithm"],
                "protocol": km["protocol"],
            }
        )
    if comm.height == 0 and cpu_meta:
        for r in rpc.iter_rows(named=True):
            a = cpu_meta[r["event_index"]]
            if (
                a.collective_name is None
                or str(a.collective_name).strip().lower() in catalog.not_collectives()
            ):
                continue  # a Work's wait() or a communicator's init records no collective
            meta, odd = _plausible(_meta_row(a))
            mb, note = msg_bytes(
                meta["op"], meta["in_nelems"], meta["out_nelems"], meta["dtype_bytes"], meta["dtype"], odd
            )
            rows.append(
                {
                    **meta,
                    "op": meta["op"] or "unknown",
                    "start_ns": r["start_ns"],
                    "end_ns": r["end_ns"],
                    "dur_ns": r["dur_ns"],
                    "timing_source": "cpu_op",
                    "external_id": r["external_id"],
                    "msg_bytes": mb,
                    "msg_bytes_note": note,
                }
            )
    return pl.DataFrame(rows, schema=_COLL_SCHEMA)
