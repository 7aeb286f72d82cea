"""What an opened Nsight Systems input is: the result types both readers return and the
constants and error they share.

- ExportInfo: the sources-row attributes of any opened nsys input (SQLite / parquetdir export,
  converted report, nsys-jax archive);
- Export: an SQLite or parquetdir export staged in DuckDB (built by .build), whose tables()
  streams the lake tables through the mapping SQL of .mapping;
- JaxArchive: an nsys-jax archive read into memory (built by .jax_build);
- NsysError, the file magics, CHUNK_ROWS and the devices/steps table schemas.

Nothing here imports the SQLite builder or the nsys-jax reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb
import polars as pl

from ... import classify as classify_mod
from ..errors import TraceError
from .mapping import _COMM_COLS, COUNTER_SQL, CPU_SQL, GPU_SQL, NVTX_SQL, _collectives, _op_flops

CHUNK_ROWS = 200_000


class NsysError(TraceError):
    """The export cannot be read (one-line message)."""


_DEVICE_SCHEMA = {
    "rank": pl.Int32,
    "host": pl.String,
    "device": pl.Int32,
    "name": pl.String,
    "vendor": pl.String,
    "compute_major": pl.Int32,
    "compute_minor": pl.Int32,
    "total_memory_bytes": pl.Int64,
    "num_sms": pl.Int32,
    "bus_id": pl.String,
    "used": pl.Boolean,
}


def step_number(name: str) -> int | None:
    """The step number a range's name gives: its last integer (ProfilerStep#12, 'iteration 12',
    'Step 0 to 10' -> 10), None when it has none or one past int64 (17 digits at most)."""
    m = re.findall(r"\d+", name)
    return int(m[-1]) if m and len(m[-1]) < 18 else None


_STEP_SCHEMA = {
    "rank": pl.Int32,
    "step": pl.Int64,
    "name": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "source": pl.String,
    "pid": pl.Int64,
    "tid": pl.Int64,
}


@dataclass
class ExportInfo:
    """What an opened export says about itself, for its sources row (shared by every nsys input)."""

    format: str
    ranks: dict[int, int]  # process key (nsys globalPid, nsys-jax PID) -> rank
    rank_source: str
    host: str | None
    tool_versions: dict
    base_time_ns: int | None
    event_count: int
    trace_start_ns: int | None
    trace_end_ns: int | None
    notes: list[str] = field(default_factory=list)
    # the job variables of the capture's environment (pipeline/ingest/jobid.py ENV_KEYS) -> value
    job_env: dict = field(default_factory=dict)

    @property
    def rank_list(self) -> list[int]:
        return sorted(set(self.ranks.values()))


@dataclass
class Export(ExportInfo):
    """An opened export, staged in DuckDB. `tables(run_id, source_id)` streams the lake tables."""

    con: duckdb.DuckDBPyConnection | None = None
    comm_patterns: list[str] | None = None
    step_regex: str | None = None
    devices: list[dict] = field(default_factory=list)
    _steps: pl.DataFrame | None = None

    def tables(self, run_id: str, source_id: str) -> dict:
        comm_rows: list[dict] = []
        ids = [pl.lit(run_id).alias("run_id"), pl.lit(source_id).alias("source_id")]

        def gpu():
            for b in _stream(self.con, GPU_SQL):
                df = pl.from_arrow(b)
                df = classify_mod.classify(
                    df.with_columns(has_comm_args=pl.lit(False), external_id=pl.lit(None, pl.Int64)),
                    None,
                    self.comm_patterns,
                ).drop("has_comm_args", "comm_launch")
                comm = df.filter(pl.col("category") == "communication")
                if comm.height:  # as Python rows: a filtered frame would keep the whole batch's buffers alive
                    comm_rows.extend(comm.select(_COMM_COLS).iter_rows(named=True))
                yield df.with_columns(ids).to_arrow()

        def cpu():
            for b in _stream(self.con, CPU_SQL):
                yield _op_flops(pl.from_arrow(b)).with_columns(ids).to_arrow()

        def annotations():
            for b in _stream(self.con, NVTX_SQL):
                yield pl.from_arrow(b).with_columns(ids).to_arrow()

        def counters():
            for b in _stream(self.con, COUNTER_SQL):
                yield pl.from_arrow(b).with_columns(ids).to_arrow()

        def collectives():
            return _collectives(comm_rows, self.con).with_columns(ids).to_arrow()

        devices = pl.DataFrame(self.devices, schema=_DEVICE_SCHEMA).with_columns(ids).to_arrow()
        out = {
            "gpu_activities": gpu(),
            "cpu_ops": cpu(),
            "annotations": annotations(),
            "counters": counters(),
            "collectives": collectives,
            "devices": devices,
        }
        if self._steps is not None and self._steps.height:
            out["steps"] = self._steps.with_columns(ids).to_arrow()
        return out


def _stream(con, sql: str):
    reader = con.sql(sql).to_arrow_reader(CHUNK_ROWS)
    for b in reader:
        if b.num_rows:
            yield b


@dataclass
class JaxArchive(ExportInfo):
    """An opened nsys-jax archive: the ExportInfo attributes describe it for its sources row,
    tables() gives the lake tables."""

    _tables: dict[str, pl.DataFrame] = field(default_factory=dict)

    def tables(self, run_id: str, source_id: str) -> dict:
        ids = [pl.lit(run_id).alias("run_id"), pl.lit(source_id).alias("source_id")]
        return {name: df.with_columns(ids).to_arrow() for name, df in self._tables.items()}
