"""Nsight Systems exports -> schema v3 tables, streamed through a DuckDB staging database.

Inputs (../shared/reference/nsys.md):
- SQLite exports (`nsys export --type sqlite`) of any schema version: the version is read from
  META_DATA_EXPORT or the older EXPORT_META_DATA; columns are selected by name (missing ones read
  as NULL); tables may be missing (lazy exports). Opened read-only and immutable, never modified;
  one whose write-ahead log still holds rows (or with the journal of a transaction cut short) is
  read with them from a private copy (.readers sidecars), and its content hash covers them.
- parquetdir exports (a `<name>_pqtdir/` folder, one `<TABLE>.parquet` per table).
- `.nsys-rep` / `.qdrep` reports: converted with `nsys export --type sqlite` when nsys is on PATH,
  else NsysError naming the command to run.

Mapping (one row per event; times = utcEpochNs + timestamp, or the timestamp itself when the
export was written with --ts-normalize; a --ts-shift is undone):
- every process that ran GPU work is its own rank: rank from MPI_RANKS or "MPI Rank N" NVTX
  thread names, else (one process) the file name or --rank, else processes ordered by their
  lowest CUDA device, then pid (rank_source process_order);
- kernels (demangled name, else short name), memcpy (copy kind, pageable/pinned memory kinds),
  memset and synchronization -> gpu_activities; CUDA runtime/driver calls -> cpu_ops, joined to
  GPU work per process (correlationId repeats across processes); PyTorch NVTX op ranges
  (`aten::mm, seq = N, op_id = M, sizes = [...]`) -> cpu_ops kind op with FLOPs from sizes;
- NVTX ranges and marks -> annotations (text or textId, domain name); steps from ProfilerStep#N
  ranges or a --step-range regex;
- NCCL kernels -> collectives (op, reduction, dtype, algorithm, protocol from the name; a kernel
  launched inside an NCCL NVTX range is communication whatever its name);
- TARGET_INFO_GPU (else TARGET_INFO_CUDA_DEVICE, else the device ids seen) -> devices;
  GPU_METRICS samples -> counters;
- privacy: of the capture environment only pipeline/catalog/nsys.toml [privacy] names are read.

Memory stays bounded: tables are copied into an on-disk DuckDB database in chunks (DuckDB spills
to disk beyond its memory limit) and the lake tables are streamed out of it in record batches.
Errors: NsysError (a ValueError) with a one-line message.

Modules: this package face (export_command, open_export: the dispatcher; the format is sniffed
by pipeline/ingest/discover.py); .export (the result types ExportInfo, Export, JaxArchive;
NsysError, CHUNK_ROWS); .stage (the DuckDB staging schema STAGE); .readers (SQLite and
parquetdir readers); .build (staging and the derived tables), .steps (devices, steps), .payloads
(NCCL NVTX payload blobs); .mapping (the staging -> schema v3 SQL, op FLOPs, collectives); .jax,
.jax_read, .jax_build (nsys-jax archives).
"""

from __future__ import annotations

import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import duckdb

from ...classify import check_regex
from ..formats import REPORT_MAGIC, SQLITE_MAGIC
from . import jax
from .build import _build
from .export import CHUNK_ROWS, Export, ExportInfo, JaxArchive, NsysError
from .mapping import COUNTER_SQL, CPU_SQL, GPU_SQL, NVTX_SQL
from .payloads import decode_payload_blob, schema_of_blob
from .readers import _ParquetDir, _Sqlite
from .stage import F64, GPU_TABLES, I64, MEMORY_LIMIT, REQUIRED, STAGE, STR

__all__ = [
    "CHUNK_ROWS",
    "COUNTER_SQL",
    "CPU_SQL",
    "F64",
    "GPU_SQL",
    "GPU_TABLES",
    "I64",
    "MEMORY_LIMIT",
    "NVTX_SQL",
    "REPORT_MAGIC",
    "REQUIRED",
    "SQLITE_MAGIC",
    "STAGE",
    "STR",
    "Export",
    "ExportInfo",
    "JaxArchive",
    "NsysError",
    "decode_payload_blob",
    "export_command",
    "jax",
    "open_export",
    "schema_of_blob",
]


def export_command(path: Path, out: Path | None = None) -> list[str]:
    out = out or path.with_suffix(".sqlite")
    return ["nsys", "export", "--type", "sqlite", "--include-blobs=true", "--output", str(out), str(path)]


@contextmanager
def open_export(
    path: Path,
    fmt: str,
    scratch: Path,
    *,
    file_rank: int | None = None,
    cli_rank: int | None = None,
    step_regex: str | None = None,
    comm_patterns: list[str] | None = None,
):
    """Stage the export at `path` (format from pipeline/ingest/discover.py sniff_path()) in a
    DuckDB database under `scratch` and yield an Export. Raises NsysError for unreadable
    exports, re.error for a bad step_regex."""
    if step_regex:
        check_regex(step_regex)
    notes: list[str] = []
    if fmt == "nsys_rep":
        ex = _Sqlite(_convert_report(path, scratch, notes), scratch)
    elif fmt == "nsys_sqlite":
        ex = _Sqlite(path, scratch)
    elif fmt == "nsys_parquetdir":
        ex = _ParquetDir(path)
    elif fmt == "nsys_jax":
        yield jax.open_archive(
            path, scratch, file_rank=file_rank, cli_rank=cli_rank, comm_patterns=comm_patterns
        )
        return
    else:
        raise ValueError(f"not an nsys format: {fmt}")
    notes += ex.notes
    con = duckdb.connect(str(scratch / "stage.duckdb"))
    try:
        con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        con.execute("SET enable_progress_bar = false")  # ingest's own progress goes to stderr
        con.execute(f"SET temp_directory = '{str(scratch / 'spill').replace(chr(39), chr(39) * 2)}'")
        con.execute("SET preserve_insertion_order = false")
        result = _build(ex, con, notes, file_rank, cli_rank, step_regex, comm_patterns)
        result.format = "nsys_sqlite" if fmt == "nsys_rep" else ex.kind
        yield result
    finally:
        con.close()
        ex.close()


def _convert_report(path: Path, scratch: Path, notes: list[str]) -> Path:
    """Convert a .nsys-rep / .qdrep report to SQLite under `scratch` with `nsys export`; returns
    the .sqlite path. NsysError when nsys is not on PATH or the conversion fails."""
    exe = shutil.which("nsys")
    sqlite_path = scratch / (path.stem + ".sqlite")
    cmd = export_command(path, sqlite_path)
    if exe is None:
        raise NsysError(
            "an Nsight Systems report cannot be read directly and nsys is not on PATH; convert it first: "
            + " ".join(export_command(path))
            + " (then ingest the .sqlite)"
        )
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NsysError(f"'{' '.join(cmd)}' failed: {e}") from None
    if r.returncode != 0 or not sqlite_path.is_file():
        err = (r.stderr or r.stdout or b"").decode("utf-8", "replace").strip().splitlines()
        raise NsysError(
            f"'{' '.join(cmd)}' failed with exit code {r.returncode}: {err[-1] if err else 'no output'}"
        )
    notes.append(f"converted with: {' '.join(cmd[:-3] + [cmd[-1]])}")
    return sqlite_path
