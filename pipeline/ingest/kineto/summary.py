"""The whole-trace tables and facts, built once after the last batch (acc._Acc.finish).

Owns: base_time() (baseTimeNanoseconds, checked), process_groups_frame() (distributedInfo
pg_config), vendor() and devices_frame() (deviceProperties plus the devices the GPU rows use),
tool_versions(), and the small phase-1 tables made absolute: steps_frame() (ProfilerStep#N, one
row per step), rpc_frame() (record_param_comms ops) and hosts_frame() (comm host ops).
"""

from __future__ import annotations

import polars as pl

from ..errors import TraceError
from .decode import KTrace
from .values import _int, _ranks


def base_time(top: KTrace) -> tuple[int, bool]:
    """(baseTimeNanoseconds or 0, whether the trace has one). TraceError when it is not an
    integer in the epoch-ns range."""
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
    return base_ns, has_base


def process_groups_frame(di: dict) -> pl.DataFrame:
    """process_groups rows from distributedInfo's pg_config."""
    pgs = []
    for pg in di.get("pg_config") or []:
        if isinstance(pg, dict):
            pgs.append(
                {
                    "process_group": str(pg.get("pg_name")),
                    "pg_desc": pg.get("pg_desc", pg.get("uid")),
                    "backend": pg.get("backend_config"),
                    "group_size": _int(pg.get("pg_size")),
                    "ranks": _ranks(pg.get("ranks")),
                }
            )
    return pl.DataFrame(
        pgs,
        schema={
            "process_group": pl.String,
            "pg_desc": pl.String,
            "backend": pl.String,
            "group_size": pl.Int32,
            "ranks": pl.List(pl.Int32),
        },
    )


def vendor(top: KTrace, hip: bool, cu: bool, mtia: bool) -> str:
    """The GPU vendor: from the runtime calls seen (hip* / cu* / mtia_runtime), else the versions."""
    if hip:
        return "amd"
    if cu:
        return "nvidia"
    if mtia:
        return "mtia"
    if top.hip_runtime_version is not None or top.roctracer_version is not None:
        return "amd"
    return "unknown"


def devices_frame(top: KTrace, vendor: str, used_devices: set) -> pl.DataFrame:
    """devices rows: deviceProperties, plus the devices GPU rows use that it does not list."""
    drows = []
    for d in top.device_properties or []:
        if not isinstance(d, dict):
            continue
        idx = _int(d.get("id"))
        if idx is None:
            continue
        drows.append(
            {
                "device": idx,
                "name": d.get("name") if isinstance(d.get("name"), str) else None,
                "vendor": vendor,
                "compute_major": _int(d.get("computeMajor")),
                "compute_minor": _int(d.get("computeMinor")),
                "total_memory_bytes": _int(d.get("totalGlobalMem")),
                "num_sms": _int(d.get("numSms")),
                "bus_id": None,
                "used": idx in used_devices,
            }
        )
    for idx in sorted(used_devices - {r["device"] for r in drows}):
        drows.append(
            {
                "device": idx,
                "name": None,
                "vendor": vendor,
                "compute_major": None,
                "compute_minor": None,
                "total_memory_bytes": None,
                "num_sms": None,
                "bus_id": None,
                "used": True,
            }
        )
    return pl.DataFrame(
        drows,
        schema={
            "device": pl.Int32,
            "name": pl.String,
            "vendor": pl.String,
            "compute_major": pl.Int32,
            "compute_minor": pl.Int32,
            "total_memory_bytes": pl.Int64,
            "num_sms": pl.Int32,
            "bus_id": pl.String,
            "used": pl.Boolean,
        },
    )


def tool_versions(top: KTrace, di: dict) -> dict:
    """The tool versions the trace records (only those present)."""
    return {
        k: v
        for k, v in {
            "schemaVersion": top.schema_version,
            "cupti_version": top.cupti_version,
            "cuda_runtime_version": top.cuda_runtime_version,
            "cuda_driver_version": top.cuda_driver_version,
            "roctracer_version": top.roctracer_version,
            "hip_runtime_version": top.hip_runtime_version,
            "hip_driver_version": top.hip_driver_version,
            "nccl_version": di.get("nccl_version"),
        }.items()
        if v is not None
    }


def _concat(parts: list[pl.DataFrame], schema: dict) -> pl.LazyFrame:
    """The batches' rows as one lazy frame (an empty one of `schema` when there are none), so that
    what follows is one polars plan, not a call per step."""
    return pl.concat(parts).lazy() if parts else pl.LazyFrame(schema=schema)


def _collect(plan: pl.LazyFrame, parts: list) -> pl.DataFrame:
    """The plan's rows; for no parts (most small traces have no ProfilerStep, collective or comm
    host op) the empty frame of the plan's own schema, without running it (0.2-0.6 ms a plan)."""
    return plan.collect() if parts else pl.DataFrame(schema=plan.collect_schema())


def steps_frame(parts: list[pl.DataFrame], base_ns: int) -> pl.DataFrame:
    """steps rows from the ProfilerStep#N ops of all batches, with absolute times."""
    steps = _concat(
        parts,
        {"name": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64, "pid": pl.Int64, "tid": pl.Int64},
    )
    # a step number past int64 (ProfilerStep#9223372036854775808: no profiler writes one) is no
    # step: that annotation is dropped rather than failing the whole file
    steps = (
        steps.select(
            step=pl.col("name").str.extract(r"(\d+)$").cast(pl.Int64, strict=False),
            name="name",
            start_ns=pl.col("start_ns") + base_ns,
            end_ns=pl.col("start_ns") + base_ns + pl.col("dur_ns"),
            dur_ns="dur_ns",
            source=pl.lit("profiler_step"),
            pid="pid",
            tid="tid",
        )
        .filter(pl.col("step").is_not_null())
        .sort("start_ns", maintain_order=True)
    )
    # one row per step number: some traces write ProfilerStep#N twice (a user_annotation and a
    # cpu_op), and every per-step join would count it twice; the first (then longest) is kept
    return _collect(
        steps.sort(["start_ns", "dur_ns"], descending=[False, True], maintain_order=True).unique(
            "step", keep="first", maintain_order=True
        ),
        parts,
    )


def rpc_frame(parts: list[pl.DataFrame], base_ns: int) -> pl.DataFrame:
    """The CPU ops with collective metadata (event_index, external_id, start_ns, dur_ns, end_ns),
    with absolute times, in file order."""
    rpc = _concat(
        parts, {"event_index": pl.Int64, "external_id": pl.Int64, "start_ns": pl.Int64, "dur_ns": pl.Int64}
    )
    return _absolute(rpc, base_ns, parts)


def _absolute(df: pl.LazyFrame, base_ns: int, parts: list) -> pl.DataFrame:
    """start_ns made absolute (+ base_ns) and end_ns added, in one collect (none without parts)."""
    return _collect(
        df.with_columns(start_ns=pl.col("start_ns") + base_ns).with_columns(
            end_ns=pl.col("start_ns") + pl.col("dur_ns")
        ),
        parts,
    )


def hosts_frame(parts: list[pl.DataFrame], base_ns: int) -> pl.DataFrame:
    """The comm host ops (event_index, pid, tid, name, start_ns, dur_ns, input_dims, input_types,
    end_ns), with absolute times."""
    hosts = _concat(
        parts,
        {
            "event_index": pl.Int64,
            "pid": pl.Int64,
            "tid": pl.Int64,
            "name": pl.String,
            "start_ns": pl.Int64,
            "dur_ns": pl.Int64,
            "input_dims": pl.String,
            "input_types": pl.String,
        },
    )
    return _absolute(hosts, base_ns, parts)
