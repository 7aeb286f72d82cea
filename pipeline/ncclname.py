"""NCCL kernel names -> collective op, algorithm, protocol and reduction.

Used by every ingest that sees GPU kernels (Kineto, Nsight Systems). Kernel names of three NCCL
eras (../shared/reference/nsys.md section 3.3):
  ncclAllReduceRingLLKernel_sum_f32 (<= 2.8), ncclKernel_AllReduce_RING_LL_Sum_float (2.9-2.18),
  ncclDevKernel_AllReduce_Sum_f32_RING_LL (>= 2.19; also ncclDevKernel_SendRecv, _Generic).
"""

from __future__ import annotations

import re

_KERNEL_META = re.compile(
    r"(?i)nccl(?:Dev)?Kernel_(?P<op>[A-Za-z]+)|nccl(?P<op_old>AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv)"
)
_KERNEL_ALGO = re.compile(
    r"(?:_|(?<=[a-z]))(RING|TREE|NVLS_TREE|NVLS|COLLNET_DIRECT|COLLNET_CHAIN|PAT|Ring|Tree)(?=_|LL|Simple|\(|$)"
)
_KERNEL_PROTO = re.compile(r"(?:_|(?<=Ring)|(?<=Tree))(LL128|LL|SIMPLE|Simple)(?=_|Kernel|\(|$)")
_KERNEL_DTYPE = re.compile(
    r"_(f8e4m3|f8e5m2|bf16|f16|f32|f64|i8|u8|i32|u32|i64|u64|half|float|double|"
    r"int8_t|uint8_t|int32_t|uint32_t|int64_t|uint64_t|__nv_bfloat16|__nv_fp8_e4m3|__nv_fp8_e5m2)(?=_|\(|$)"
)
_KERNEL_RED = re.compile(r"_(Sum|Prod|Max|Min|Avg|PreMulSum|SumPostDiv|sum|prod|max|min|avg)(?=_|\(|$)")


def kernel_meta(name: str) -> dict:
    """op, algorithm, protocol, reduction and dtype (the type name as the kernel spells it, with
    its size from pipeline.catalog.dtype_bytes) parsed from an NCCL kernel name (None where absent)."""
    m = _KERNEL_META.search(name)
    a, p, r = _KERNEL_ALGO.search(name), _KERNEL_PROTO.search(name), _KERNEL_RED.search(name)
    d = _KERNEL_DTYPE.search(name)
    return {
        "op": (m.group("op") or m.group("op_old")) if m else None,
        "dtype": d.group(1) if d else None,
        "algorithm": a.group(1).upper() if a else None,
        "protocol": p.group(1).upper() if p else None,
        "reduction": r.group(1).lower() if r else None,
    }
