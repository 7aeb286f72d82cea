"""nsys-jax archives -> schema v3 tables.

Input: the `.zip` NVIDIA JAX-Toolbox's `nsys-jax` writes for one process
(../shared/reference/nsys.md section 4). tracelake reads, from the zip in memory (nothing is
extracted; member names are only ever looked up, never used as paths; every member read is
bounded by TRACELAKE_MAX_UNCOMPRESSED_BYTES):
- `nvtx_gpu_proj_trace/trace.parquet` (required): the nsys recipe `nvtx_gpu_proj_trace`, one row
  per NVTX range that launched GPU work (kernel, memcpy or memset): Name = "<domain>:<text>",
  Projected Start/Duration = first..last GPU operation the range launched (GPU time),
  Orig Start/Duration = the range on the CPU, NumGPUOps = launches inside it, RangeId/ParentId =
  the push/pop tree. A row without Name holds every GPU operation launched outside any range.
  Its `Rank` is the report's index in the recipe input, not an MPI rank: ignored.
- `report_nvtx_pushpop_trace.csv.xz` (nsys stats nvtx_pushpop_trace: every push/pop range),
  `device-metadata.parquet` (TARGET_INFO_GPU joined with TARGET_INFO_NVTX_CUDA_DEVICE),
  `nvtx_gpu_proj_trace/nvtx_gpu_proj_trace.nsys-analysis` (recipe name and versions only),
  `system-metadata.parquet` (only the pipeline/catalog/nsys.toml [privacy] system_env_allow names),
  `thread-metadata.parquet` (only XLA's `XlaLauncher:#global=G,...#` thread names, and only when
  the process drove several GPUs). Nothing else of the capture environment reaches the lake.

Mapping:
- gpu_activities: one row per *work range*: an NVTX range that launched GPU work and has no child
  range that did, NCCL-domain API ranges (ncclGroupEnd) folded into their parent (nsys-jax drops
  them too), so every GPU operation is counted once, at its innermost XLA thunk
  (`Thunk:#name=...,hlo_op=...#`; also leaf autotuner/compile ranges). kind 'kernel' (the
  projection does not say whether an operation was a kernel or a copy), name = range text without
  the domain prefix, start/dur = projected GPU interval (gaps between a range's operations count
  as busy), stream NULL (not in the projection), device = the process's GPU (device-metadata;
  several GPUs: XlaLauncher thread -> device), correlation = RangeId. Category from
  pipeline/classify.py: a range holding an NCCL-domain child is communication (rule
  'correlation', nsys's NCCL projection rule); XLA collective thunks also match comm_name_patterns.
- cpu_ops: each work range's host-side NVTX range, kind 'runtime', category 'nvtx_gpu_proj_trace',
  correlation = RangeId: the archive has no CUDA API rows, and this is the host call that
  launched the work (its start is at or before the real launch), so gpu_work finds launches and
  steps.
- collectives: one row per communication work range (a '-done' thunk, which only waits, is not
  a second call), op from the HLO opcode in `hlo_op=` via catalog.normalize_op, timing_source
  gpu_kernel, msg_bytes NULL (sizes live in the HLO protos under dump/, not decoded).
- steps (source 'nvtx'): the executions of the training-step module: among XlaModule ranges not
  nested in another XlaModule or in compilation/autotuning, the module (same range text) executed
  at least twice with the largest total projected GPU time; numbered 0.. in host start order;
  window = the module's host-side range.
- annotations: every push/pop NVTX range of the pushpop report (else of trace.parquet), kind
  'nvtx', domain = the name's prefix before ':' (NULL for the default domain), CPU times.
- devices: device-metadata rows (CUDA ordinal cuDevice), used = a work range ran on it.
- rank: XLA's process index from the NVTX CUDA device name `Xla:#global=G,local=L,process=P,...#`
  (rank_source 'xla_process'), else the file name, --rank, 0.
- time: session-relative ns; the archive holds no session start time (the .nsys-rep is not in
  it), so base_time_ns is NULL and clocks of different archives are not comparable.
Errors: TraceError with a one-line message.

Modules: this one (open_archive), .jax_read (reading the members, bounded), .jax_build
(building the tables); the result type JaxArchive is in .export.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

from ...lake import one_line
from ..errors import TraceError, UnknownFormat
from ..formats import ZIP_MAGIC
from .export import JaxArchive
from .jax_build import _build
from .jax_read import (
    ANALYSIS_MEMBER,
    DEVICE_MEMBER,
    PUSHPOP_MEMBER,
    RANK_SOURCE,
    RECIPE,
    SYSTEM_MEMBER,
    THREAD_MEMBER,
    TRACE_MEMBER,
    _limit,
)

__all__ = [
    "ANALYSIS_MEMBER",
    "DEVICE_MEMBER",
    "PUSHPOP_MEMBER",
    "RANK_SOURCE",
    "RECIPE",
    "SYSTEM_MEMBER",
    "THREAD_MEMBER",
    "TRACE_MEMBER",
    "ZIP_MAGIC",
    "JaxArchive",
    "open_archive",
]


def open_archive(
    path: Path,
    scratch: Path,
    *,
    file_rank: int | None = None,
    cli_rank: int | None = None,
    comm_patterns: list[str] | None = None,
) -> JaxArchive:
    """Read the nsys-jax archive at `path` (scratch is unused: everything is read in memory).
    Raises TraceError (one line) for a corrupt zip, a missing or unreadable trace member, or a
    member beyond the decompression limit; re.error for an invalid comm pattern."""
    limit = _limit()
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:
        raise UnknownFormat(  # no zip at all: neither an nsys-jax archive nor anything else known
            f"corrupt or truncated zip archive ({one_line(str(e)) or type(e).__name__})"
        ) from None
    with z:
        names = set(z.namelist())
        if TRACE_MEMBER not in names:
            raise TraceError(
                f"zip archive without {TRACE_MEMBER}: not an nsys-jax archive "
                f"(or one made without the {RECIPE} recipe)"
            )
        return _build(z, names, limit, file_rank, cli_rank, comm_patterns)
