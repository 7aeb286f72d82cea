"""The DuckDB staging schema: which export tables and columns are copied into the on-disk
staging database (STAGE), which of them an export must have (REQUIRED), the GPU activity
tables, the Arrow -> DuckDB type names and the DuckDB memory limit."""

from __future__ import annotations

import os

import pyarrow as pa

MEMORY_LIMIT = os.environ.get("TRACELAKE_NSYS_MEMORY_LIMIT", "512MB")

I64, STR, F64 = pa.int64(), pa.string(), pa.float64()
_GPU_COMMON = {
    "start": I64,
    "end": I64,
    "deviceId": I64,
    "contextId": I64,
    "streamId": I64,
    "correlationId": I64,
    "globalPid": I64,
}
# staging table -> (export table, {column: type}); columns absent from the export read as NULL
STAGE = {
    "kernel": (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        {
            **_GPU_COMMON,
            "shortName": I64,
            "demangledName": I64,
            "gridX": I64,
            "gridY": I64,
            "gridZ": I64,
            "blockX": I64,
            "blockY": I64,
            "blockZ": I64,
            "registersPerThread": I64,
            "staticSharedMemory": I64,
            "dynamicSharedMemory": I64,
            "graphId": I64,
        },
    ),
    "memcpy": (
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        {**_GPU_COMMON, "bytes": I64, "copyKind": I64, "srcKind": I64, "dstKind": I64},
    ),
    "memset": ("CUPTI_ACTIVITY_KIND_MEMSET", {**_GPU_COMMON, "bytes": I64, "memKind": I64}),
    "sync": ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", {**_GPU_COMMON, "syncType": I64}),
    "runtime": (
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        {"start": I64, "end": I64, "eventClass": I64, "globalTid": I64, "correlationId": I64, "nameId": I64},
    ),
    "nvtx": (
        "NVTX_EVENTS",
        {
            "start": I64,
            "end": I64,
            "eventType": I64,
            "text": STR,
            "textId": I64,
            "globalTid": I64,
            "domainId": I64,
        },
    ),
    "strings": ("StringIds", {"id": I64, "value": STR}),
    "mpi_ranks": ("MPI_RANKS", {"globalTid": I64, "rank": I64}),
    "gpu_metrics": ("GPU_METRICS", {"timestamp": I64, "typeId": I64, "metricId": I64, "value": F64}),
    "gpu_metric_names": ("TARGET_INFO_GPU_METRICS", {"typeId": I64, "metricId": I64, "metricName": STR}),
}
REQUIRED = {"kernel": ("start", "end", "deviceId", "streamId", "shortName")}
GPU_TABLES = ("kernel", "memcpy", "memset", "sync")

_DUCK = {I64: "BIGINT", STR: "VARCHAR", F64: "DOUBLE"}
