"""Reading an nsys-jax archive's members: every member read from the zip in memory, bounded by
TRACELAKE_MAX_UNCOMPRESSED_BYTES (_read, _parquet, _xz), the member names, and the metadata
members: device-metadata (_devices), XlaLauncher thread names (_launcher_devices), the
allow-listed system environment (_system_env) and the recipe versions (_recipe_versions).
Member names are only ever looked up, never used as paths."""

from __future__ import annotations

import json
import lzma
import re
import zipfile
import zlib

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ... import catalog
from ...lake import one_line
from ..errors import TraceError
from ..streams import max_uncompressed_bytes

TRACE_MEMBER = "nvtx_gpu_proj_trace/trace.parquet"
ANALYSIS_MEMBER = "nvtx_gpu_proj_trace/nvtx_gpu_proj_trace.nsys-analysis"
PUSHPOP_MEMBER = "report_nvtx_pushpop_trace.csv.xz"
DEVICE_MEMBER = "device-metadata.parquet"
SYSTEM_MEMBER = "system-metadata.parquet"
THREAD_MEMBER = "thread-metadata.parquet"
RECIPE = "nvtx_gpu_proj_trace"
RANK_SOURCE = "xla_process"
_XLA_DEVICE = re.compile(r"global=(\d+),local=(\d+),process=(\d+)")
_LAUNCHER = re.compile(r"^XlaLauncher:#global=(\d+),local=(\d+),process=(\d+),slice=(\d+)#$")


def _limit() -> int:
    return max_uncompressed_bytes()


def _read(z: zipfile.ZipFile, name: str, limit: int) -> bytes:
    info = z.getinfo(name)
    if info.file_size > limit:
        raise TraceError(
            f"zip member {name} expands to {info.file_size} bytes, beyond {limit} "
            "(TRACELAKE_MAX_UNCOMPRESSED_BYTES); refusing a possible zip bomb"
        )
    try:
        with z.open(info) as f:
            data = f.read(limit + 1)
    except (
        zipfile.BadZipFile,
        zlib.error,
        lzma.LZMAError,
        EOFError,
        OSError,
        NotImplementedError,
        RuntimeError,
    ) as e:
        raise TraceError(
            f"zip member {name} cannot be read ({one_line(str(e)) or type(e).__name__})"
        ) from None
    if len(data) > limit:
        raise TraceError(f"zip member {name} expands beyond {limit} bytes (TRACELAKE_MAX_UNCOMPRESSED_BYTES)")
    return data


def _parquet(z: zipfile.ZipFile, name: str, limit: int, columns: list[str] | None = None) -> pa.Table:
    data = _read(z, name, limit)
    try:
        # ParquetFile, not pq.read_table: the dataset reader on these pandas-written files left a
        # thread that aborted the interpreter at exit (pyarrow 26)
        pf = pq.ParquetFile(pa.BufferReader(data))
        if columns is not None:
            columns = [c for c in columns if c in pf.schema_arrow.names]
        return pf.read(columns=columns, use_pandas_metadata=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError) as e:
        raise TraceError(f"zip member {name} is not readable Parquet ({one_line(str(e))[:200]})") from None


def _xz(z: zipfile.ZipFile, name: str, limit: int) -> bytes:
    raw = _read(z, name, limit)
    d = lzma.LZMADecompressor()
    try:
        out = d.decompress(raw, max_length=limit + 1)
    except lzma.LZMAError as e:
        raise TraceError(f"zip member {name} is not readable xz ({one_line(str(e))})") from None
    if len(out) > limit:
        raise TraceError(f"zip member {name} expands beyond {limit} bytes (TRACELAKE_MAX_UNCOMPRESSED_BYTES)")
    if not d.eof:
        raise TraceError(f"zip member {name} is a truncated xz stream")
    return out


def _devices(z, names, limit) -> tuple[list[dict], list[str]]:
    """device-metadata rows: pandas MultiIndex column names "('TABLE', 'column')" plus cuDevice."""
    if DEVICE_MEMBER not in names:
        return [], [f"archive has no {DEVICE_MEMBER}: no devices, rank not from XLA's process index"]
    try:
        t = _parquet(z, DEVICE_MEMBER, limit)
    except TraceError as e:
        return [], [f"{e}: no devices"]
    col = {}
    for n in t.column_names:
        m = re.fullmatch(r"\('(\w+)', '(\w+)'\)", n)
        col[(m.group(1), m.group(2)) if m else (None, n)] = n

    def get(row, table, name):
        c = col.get((table, name))
        return row.get(c) if c else None

    out = []
    for row in t.to_pylist():
        dev = next(
            (
                v
                for v in (
                    get(row, None, "cuDevice"),
                    get(row, "TARGET_INFO_NVTX_CUDA_DEVICE", "deviceId"),
                    get(row, "TARGET_INFO_GPU", "id"),
                )
                if v is not None
            ),
            None,
        )
        if dev is None:
            continue
        xla = get(row, "TARGET_INFO_NVTX_CUDA_DEVICE", "name")
        m = _XLA_DEVICE.search(xla or "")
        out.append(
            {
                "device": int(dev),
                "name": get(row, "TARGET_INFO_GPU", "name"),
                "compute_major": get(row, "TARGET_INFO_GPU", "computeMajor"),
                "compute_minor": get(row, "TARGET_INFO_GPU", "computeMinor"),
                "total_memory_bytes": get(row, "TARGET_INFO_GPU", "totalMemory"),
                "num_sms": get(row, "TARGET_INFO_GPU", "smCount"),
                "bus_id": get(row, "TARGET_INFO_GPU", "busLocation"),
                "xla_name": bool(m),
                "global": int(m.group(1)) if m else None,
                "process": int(m.group(3)) if m else None,
            }
        )
    seen, uniq = set(), []
    for d in out:
        if d["device"] not in seen:
            seen.add(d["device"])
            uniq.append(d)
    return uniq, []


def _launcher_devices(z, names, limit, devices) -> pl.DataFrame:
    """(pid, tid) -> device for XLA's launcher threads `XlaLauncher:#global=G,...#` (only these
    thread names are looked at; nothing of thread-metadata is kept)."""
    empty = pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "device": pl.Int32})
    if THREAD_MEMBER not in names:
        return empty
    try:
        t = _parquet(z, THREAD_MEMBER, limit, ["Name", "PID", "TID"])
    except TraceError:
        return empty
    if not {"Name", "PID", "TID"} <= set(t.column_names):
        return empty
    t = t.filter(pc.fill_null(pc.match_substring_regex(t["Name"], _LAUNCHER.pattern), False))
    by_global = {d["global"]: d["device"] for d in devices if d["global"] is not None}
    rows = []
    for name, pid, tid in zip(t["Name"].to_pylist(), t["PID"].to_pylist(), t["TID"].to_pylist()):
        g = int(_LAUNCHER.match(name).group(1))
        if g in by_global and pid is not None and tid is not None:
            rows.append({"pid": int(pid), "tid": int(tid), "device": by_global[g]})
    return pl.DataFrame(rows, schema=empty.schema) if rows else empty


def _system_env(z, names, limit) -> dict[str, str]:
    """Only the allow-listed TARGET_INFO_SYSTEM_ENV names (pipeline/catalog/nsys.toml [privacy])."""
    if SYSTEM_MEMBER not in names:
        return {}
    try:
        t = _parquet(z, SYSTEM_MEMBER, limit, ["name", "value"])
    except TraceError:
        return {}
    if not {"name", "value"} <= set(t.column_names):
        return {}
    allow = catalog.nsys()["privacy"]["system_env_allow"]
    t = t.filter(pc.fill_null(pc.is_in(t["name"], value_set=pa.array(allow, pa.string())), False))
    return {k: v for k, v in zip(t["name"].to_pylist(), t["value"].to_pylist()) if v}


def _recipe_versions(z, names, limit) -> dict[str, str]:
    if ANALYSIS_MEMBER not in names:
        return {}
    try:
        doc = json.loads(_read(z, ANALYSIS_MEMBER, limit))
    except (TraceError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    keys = {
        "RecipeJsonVersion": "nsys_recipe_json_version",
        "RecipeRuntimeVersion": "nsys_recipe_runtime_version",
    }
    return {out: str(doc[k]) for k, out in keys.items() if isinstance(doc.get(k), (str, int, float))}
