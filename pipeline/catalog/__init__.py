"""Catalogs of facts with sources: device peaks and links (devices.toml), collective busbw
factors and name normalization (collectives.toml), GPU-work classification (classification.toml),
element sizes (dtypes.toml), roofline constants (roofline.toml).

Each fact lives in one of these files; Python and SQL both read them from here.
"""

from __future__ import annotations

import re
from functools import lru_cache

import polars as pl
import pyarrow as pa

from .. import toml_data
from ..paths import CATALOG_DIR


def _load(name: str) -> dict:
    return toml_data.load(CATALOG_DIR / name)  # parsed once per content, then JSON (toml_data.py)


@lru_cache(maxsize=1)
def classification() -> dict:
    return _load("classification.toml")


@lru_cache(maxsize=1)
def _dtype_sizes() -> dict[str, int]:
    return _load("dtypes.toml")["bytes"]


def dtype_bytes(name) -> int | None:
    """Bytes per element of an element-type name in any spelling tracelake meets (PyTorch,
    NCCL kernel names and ncclDataType_t, nccl-tests; dtypes.toml), or None when unknown."""
    if not isinstance(name, str):
        return None
    return _dtype_sizes().get(name.lower().replace("c10::", "").replace("at::", ""))


@lru_cache(maxsize=1)
def nsys() -> dict:
    """Nsight Systems enum ids and the privacy allow-list (nsys.toml)."""
    return _load("nsys.toml")


@lru_cache(maxsize=1)
def collectives() -> dict:
    return _load("collectives.toml")["ops"]


@lru_cache(maxsize=1)
def not_collectives() -> frozenset[str]:
    """RECORD_PARAM_COMMS titles that are not collective calls ("wait", "init"; collectives.toml),
    lower case."""
    return frozenset(n.lower() for n in _load("collectives.toml")["not_collectives"])


@lru_cache(maxsize=1)
def c10d_args() -> dict[str, dict[str, int]]:
    """c10d op name (after "c10d::") -> {"in": i, "out": j}: which of its Input Dims entries is
    the input and which the output (collectives.toml [c10d_args])."""
    return _load("collectives.toml")["c10d_args"]


@lru_cache(maxsize=1)
def replay() -> dict:
    """The what-if replay's facts (replay.toml): blocking_calls, cross_stream_max_gap_ns,
    explained_gap_ns."""
    return _load("replay.toml")


@lru_cache(maxsize=1)
def roofline() -> dict:
    """Roofline constants (roofline.toml): latency_kernel_ns."""
    return _load("roofline.toml")


@lru_cache(maxsize=1)
def devices() -> list[dict]:
    return _load("devices.toml")["device"]


@lru_cache(maxsize=1)
def _alias_map() -> dict[str, str]:
    out = {}
    for op, spec in collectives().items():
        for a in spec["aliases"]:
            out[a.lower()] = op
    return out


_KERNEL_OP = re.compile(
    r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll)", re.IGNORECASE
)


def normalize_op(raw: str | None) -> str:
    """Map a collective name (PyTorch 'Collective name', NCCL kernel or COLL opName) to the
    catalog's op key; 'unknown' when nothing matches."""
    if not raw:
        return "unknown"
    key = raw.strip().lower()
    m = _alias_map().get(key)
    if m:
        return m
    # an alias with a suffix: PyTorch's 'all_reduce_barrier' (nccl:all_reduce_barrier, pytorch#140785),
    # tagged titles ('all_reduce:tag'), 'reduce_scatter_v': the longest alias the name starts with,
    # followed by '_' or a non-alphanumeric character
    pre = max(
        (a for a in _alias_map() if key.startswith(a) and len(key) > len(a) and not key[len(a)].isalnum()),
        key=len,
        default=None,
    )
    if pre:
        return _alias_map()[pre]
    k = _KERNEL_OP.search(raw)
    if k:
        return _alias_map().get(k.group(1).lower(), "unknown")
    return "unknown"


def device_catalog_arrow() -> pa.Table:
    """devices.toml as a table for DuckDB (`device_catalog`); missing peaks are null."""
    keys = [
        "key",
        "match",
        "fp32_tflops",
        "tf32_tflops",
        "bf16_tflops",
        "fp16_tflops",
        "fp8_tflops",
        "memory_gbps",
        "nvlink_gbps",
        "source",
    ]
    rows = devices()
    cols = {k: [r.get(k) for r in rows] for k in keys}
    cols["priority"] = list(range(len(rows)))
    types = {k: pl.Float64 for k in keys}
    types.update(key=pl.String, match=pl.String, source=pl.String, priority=pl.Int32)
    # built with polars: pyarrow's pa.array() of a Python list imports pandas when it is installed
    # (0.4 s of every analysis in an environment with HTA)
    return pl.DataFrame(cols, schema=types).to_arrow()


def collective_catalog_arrow() -> pa.Table:
    """collectives.toml as a table for DuckDB (`collective_catalog`: op, busbw_factor_kind)."""
    ops = collectives()
    return pl.DataFrame(
        {
            "op": list(ops),
            "busbw_factor": [ops[o]["factor"] for o in ops],
            "msg": [ops[o]["msg"] for o in ops],
        },
        schema={"op": pl.String, "busbw_factor": pl.String, "msg": pl.String},
    ).to_arrow()
