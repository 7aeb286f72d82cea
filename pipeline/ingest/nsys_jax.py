"""nsys-jax archives -> schema v1 tables (placeholder: implemented by the nsys-jax work)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from .kineto import TraceError

TRACE_MEMBER = "nvtx_gpu_proj_trace/trace.parquet"


def is_archive(path: Path) -> bool:
    """True for a zip holding an nsys-jax projection trace."""
    try:
        with zipfile.ZipFile(path) as z:
            return TRACE_MEMBER in z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False


def open_archive(path: Path, scratch: Path, *, file_rank=None, cli_rank=None, comm_patterns=None):
    raise TraceError("nsys-jax archives are not supported yet")
