"""Nsight Systems exports -> schema v1 tables, streamed through a DuckDB staging database.

Inputs (../shared/reference/nsys.md):
- SQLite exports (`nsys export --type sqlite`) of any schema version: the version is read from
  META_DATA_EXPORT or the older EXPORT_META_DATA; columns are selected by name (missing ones read
  as NULL); tables may be missing (lazy exports). Opened read-only and immutable, never modified.
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
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from .. import catalog
from .. import classify as classify_mod
from ..flops import MODELLED_OPS, op_flops
from ..ncclname import kernel_meta
from .errors import TraceError

SQLITE_MAGIC = b"SQLite format 3\x00"
REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"  # first line of .nsys-rep / .qdrep (nsys.md section 0)
CHUNK_ROWS = 200_000
MEMORY_LIMIT = os.environ.get("TRACELAKE_NSYS_MEMORY_LIMIT", "512MB")


class NsysError(TraceError):
    """The export cannot be read (one-line message)."""


I, S, F = pa.int64(), pa.string(), pa.float64()
_GPU_COMMON = {"start": I, "end": I, "deviceId": I, "contextId": I, "streamId": I, "correlationId": I, "globalPid": I}
# staging table -> (export table, {column: type}); columns absent from the export read as NULL
STAGE = {
    "kernel": ("CUPTI_ACTIVITY_KIND_KERNEL", {
        **_GPU_COMMON, "shortName": I, "demangledName": I, "gridX": I, "gridY": I, "gridZ": I, "blockX": I,
        "blockY": I, "blockZ": I, "registersPerThread": I, "staticSharedMemory": I, "dynamicSharedMemory": I,
        "graphId": I}),
    "memcpy": ("CUPTI_ACTIVITY_KIND_MEMCPY", {**_GPU_COMMON, "bytes": I, "copyKind": I, "srcKind": I, "dstKind": I}),
    "memset": ("CUPTI_ACTIVITY_KIND_MEMSET", {**_GPU_COMMON, "bytes": I, "memKind": I}),
    "sync": ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", {**_GPU_COMMON, "syncType": I}),
    "runtime": ("CUPTI_ACTIVITY_KIND_RUNTIME", {"start": I, "end": I, "eventClass": I, "globalTid": I,
                                                "correlationId": I, "nameId": I}),
    "nvtx": ("NVTX_EVENTS", {"start": I, "end": I, "eventType": I, "text": S, "textId": I, "globalTid": I,
                             "domainId": I}),
    "strings": ("StringIds", {"id": I, "value": S}),
    "mpi_ranks": ("MPI_RANKS", {"globalTid": I, "rank": I}),
    "gpu_metrics": ("GPU_METRICS", {"timestamp": I, "typeId": I, "metricId": I, "value": F}),
    "gpu_metric_names": ("TARGET_INFO_GPU_METRICS", {"typeId": I, "metricId": I, "metricName": S}),
}
REQUIRED = {"kernel": ("start", "end", "deviceId", "streamId", "shortName")}
GPU_TABLES = ("kernel", "memcpy", "memset", "sync")


# ------------------------------------------------------------------ export readers

class _Sqlite:
    kind = "nsys_sqlite"

    def __init__(self, path: Path):
        self.path = path
        self.bad_utf8 = 0
        try:
            uri = "file:" + str(path.absolute()).replace("?", "%3f").replace("#", "%23") + "?mode=ro&immutable=1"
            self.con = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self.con.text_factory = self._text
            self._tables = {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        except sqlite3.DatabaseError as e:
            raise NsysError(f"not a readable SQLite database ({e})") from None

    def _text(self, b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            self.bad_utf8 += 1
            return b.decode("utf-8", "replace")

    def tables(self) -> set[str]:
        return self._tables

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')]

    def batches(self, table: str, cols: dict[str, pa.DataType], where: str = "") -> Iterator[pa.Table]:
        have = set(self.columns(table))
        sel = ", ".join(f'"{c}"' if c in have else "NULL" for c in cols)
        try:
            cur = self.con.execute(f'SELECT {sel} FROM "{table}" {where}')
            while True:
                rows = cur.fetchmany(CHUNK_ROWS)
                if not rows:
                    return
                yield pa.Table.from_arrays([_array(v, t) for v, t in zip(zip(*rows), cols.values())], names=list(cols))
        except sqlite3.DatabaseError as e:
            raise NsysError(f"SQLite table {table} cannot be read ({e})") from None

    def payload_rows(self) -> list[tuple]:
        """(globalTid, start, end, text, textId, blob) of NVTX events that carry a binary payload."""
        if "NVTX_EVENTS" not in self._tables or "binaryData" not in self.columns("NVTX_EVENTS"):
            return []
        return self.con.execute('SELECT globalTid, start, "end", text, textId, binaryData FROM NVTX_EVENTS '
                                'WHERE binaryData IS NOT NULL AND "end" IS NOT NULL').fetchall()

    def close(self):
        self.con.close()


class _ParquetDir:
    kind = "nsys_parquetdir"

    def __init__(self, path: Path):
        self.path = path
        self.bad_utf8 = 0
        self._files = {p.stem: p for p in path.glob("*.parquet")}
        if not self._files:
            raise NsysError("parquetdir export without any .parquet table")

    def tables(self) -> set[str]:
        return set(self._files)

    def columns(self, table: str) -> list[str]:
        try:
            return pq.read_schema(self._files[table]).names
        except (OSError, pa.ArrowInvalid) as e:
            raise NsysError(f"{self._files[table].name} is not readable Parquet ({e})") from None

    def batches(self, table: str, cols: dict[str, pa.DataType], where: str = "") -> Iterator[pa.Table]:
        have = set(self.columns(table))
        try:
            pf = pq.ParquetFile(self._files[table])
            for b in pf.iter_batches(batch_size=CHUNK_ROWS, columns=[c for c in cols if c in have]):
                arrays = []
                for c, t in cols.items():
                    if c in have:
                        a = b.column(c)
                        arrays.append(a.cast(t) if a.type != t else a)
                    else:
                        arrays.append(pa.nulls(b.num_rows, t))
                yield pa.Table.from_arrays(arrays, names=list(cols))
        except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise NsysError(f"{self._files[table].name} cannot be read ({e})") from None

    def payload_rows(self) -> list[tuple]:
        if "NVTX_EVENTS" not in self._files or "binaryData" not in self.columns("NVTX_EVENTS"):
            return []
        cols = ["globalTid", "start", "end", "text", "textId", "binaryData"]
        t = pq.read_table(self._files["NVTX_EVENTS"], columns=cols)
        return [tuple(r[c] for c in cols) for r in t.to_pylist() if r["binaryData"] is not None and r["end"] is not None]

    def close(self):
        pass


def _array(values, t: pa.DataType) -> pa.Array:
    if t == S:
        return pa.array(values, type=S)
    try:
        return pa.array(values, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # a TEXT/BLOB in an INTEGER column
        return pa.array([v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in values], type=t)


def _small(ex, table: str, cols: list[str], where: str = "") -> list[dict]:
    if table not in ex.tables():
        return []
    out = []
    for b in ex.batches(table, {c: _guess(c) for c in cols}, where):
        out.extend(b.to_pylist())
    return out


def _guess(col: str) -> pa.DataType:
    return S if col in ("name", "value", "utcTime", "busLocation", "uuid", "chipName", "metricName", "text") else I


# ------------------------------------------------------------------ result

@dataclass
class ExportInfo:
    """What an opened export says about itself, for its sources row (shared by every nsys input)."""
    format: str
    ranks: dict[int, int]                # process key (nsys globalPid, nsys-jax PID) -> rank
    rank_source: str
    host: str | None
    tool_versions: dict
    base_time_ns: int | None
    event_count: int
    trace_start_ns: int | None
    trace_end_ns: int | None
    notes: list[str] = field(default_factory=list)

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
                df = classify_mod.classify(df.with_columns(has_comm_args=pl.lit(False), external_id=pl.lit(None, pl.Int64)),
                                           None, self.comm_patterns).drop("has_comm_args", "comm_launch")
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
        out = {"gpu_activities": gpu(), "cpu_ops": cpu(), "annotations": annotations(), "counters": counters(),
               "collectives": collectives, "devices": devices}
        if self._steps is not None and self._steps.height:
            out["steps"] = self._steps.with_columns(ids).to_arrow()
        return out


def _stream(con, sql: str):
    reader = con.sql(sql).to_arrow_reader(CHUNK_ROWS)
    for b in reader:
        if b.num_rows:
            yield b


_DEVICE_SCHEMA = {"rank": pl.Int32, "host": pl.String, "device": pl.Int32, "name": pl.String, "vendor": pl.String,
                  "compute_major": pl.Int32, "compute_minor": pl.Int32, "total_memory_bytes": pl.Int64,
                  "num_sms": pl.Int32, "bus_id": pl.String, "used": pl.Boolean}


# ------------------------------------------------------------------ opening

def detect(path: Path) -> str | None:
    """nsys_sqlite, nsys_parquetdir, nsys_rep or nsys_jax for a path that is one, else None."""
    if path.is_dir():
        if path.name.endswith("_pqtdir") or (path / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").is_file() or (path / "StringIds.parquet").is_file():
            return "nsys_parquetdir"
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    if head.startswith(SQLITE_MAGIC):
        return "nsys_sqlite"
    if head.startswith(b"PK\x03\x04"):
        from . import nsys_jax

        return "nsys_jax" if nsys_jax.is_archive(path) else None
    if head.startswith(REPORT_MAGIC) or path.suffix.lower() in (".nsys-rep", ".qdrep"):
        return "nsys_rep"
    return None


def export_command(path: Path, out: Path | None = None) -> list[str]:
    out = out or path.with_suffix(".sqlite")
    return ["nsys", "export", "--type", "sqlite", "--include-blobs=true", "--output", str(out), str(path)]


@contextmanager
def open_export(path: Path, fmt: str, scratch: Path, *, file_rank: int | None = None, cli_rank: int | None = None,
                step_regex: str | None = None, comm_patterns: list[str] | None = None):
    """Stage the export at `path` (format from detect()) in a DuckDB database under `scratch` and
    yield an Export. Raises NsysError for unreadable exports, re.error for a bad step_regex."""
    if step_regex:
        re.compile(step_regex)
    notes: list[str] = []
    if fmt == "nsys_rep":
        exe = shutil.which("nsys")
        sqlite_path = scratch / (path.stem + ".sqlite")
        cmd = export_command(path, sqlite_path)
        if exe is None:
            raise NsysError("an Nsight Systems report cannot be read directly and nsys is not on PATH; convert it first: "
                            + " ".join(export_command(path)) + " (then ingest the .sqlite)")
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NsysError(f"'{' '.join(cmd)}' failed: {e}") from None
        if r.returncode != 0 or not sqlite_path.is_file():
            err = (r.stderr or r.stdout or b"").decode("utf-8", "replace").strip().splitlines()
            raise NsysError(f"'{' '.join(cmd)}' failed with exit code {r.returncode}: {err[-1] if err else 'no output'}")
        notes.append(f"converted with: {' '.join(cmd[:-3] + [cmd[-1]])}")
        ex = _Sqlite(sqlite_path)
    elif fmt == "nsys_sqlite":
        ex = _Sqlite(path)
    elif fmt == "nsys_parquetdir":
        ex = _ParquetDir(path)
    elif fmt == "nsys_jax":
        from . import nsys_jax

        yield nsys_jax.open_archive(path, scratch, file_rank=file_rank, cli_rank=cli_rank, comm_patterns=comm_patterns)
        return
    else:
        raise ValueError(f"not an nsys format: {fmt}")
    con = duckdb.connect(str(scratch / "stage.duckdb"))
    try:
        con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        con.execute(f"SET temp_directory = '{str(scratch / 'spill').replace(chr(39), chr(39) * 2)}'")
        con.execute("SET preserve_insertion_order = false")
        result = _build(ex, con, notes, file_rank, cli_rank, step_regex, comm_patterns)
        result.format = "nsys_sqlite" if fmt == "nsys_rep" else ex.kind
        yield result
    finally:
        con.close()
        ex.close()


def _meta(ex) -> dict[str, str]:
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t in ex.tables():
            return {r["name"]: r["value"] for r in _small(ex, t, ["name", "value"])}
    return {}


def _build(ex, con, notes, file_rank, cli_rank, step_regex, comm_patterns) -> Export:
    tabs = ex.tables()
    meta = _meta(ex)
    if not meta and not (tabs & {STAGE[t][0] for t in GPU_TABLES}) and "NVTX_EVENTS" not in tabs:
        raise NsysError("not an Nsight Systems export: no META_DATA_EXPORT/EXPORT_META_DATA, CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS table")
    for t, req in REQUIRED.items():
        src = STAGE[t][0]
        if src in tabs:
            missing = [c for c in req if c not in ex.columns(src)]
            if missing:
                raise NsysError(f"{src} lacks required columns {missing}")
    event_count = 0
    for name, (src, cols) in STAGE.items():
        con.execute(f"CREATE TABLE {name} (" + ", ".join(f'"{c}" {_DUCK[t]}' for c, t in cols.items()) + ")")
        if src not in tabs:
            continue
        for b in ex.batches(src, cols):
            con.register("_chunk", b)
            con.execute(f"INSERT INTO {name} SELECT * FROM _chunk")
            con.unregister("_chunk")
            if name not in ("strings", "gpu_metric_names"):
                event_count += b.num_rows
    if ex.bad_utf8:
        notes.append(f"invalid UTF-8 replaced by U+FFFD in {ex.bad_utf8} strings")
    n_gpu = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in GPU_TABLES)
    n_nvtx = con.execute("SELECT count(*) FROM nvtx").fetchone()[0]
    n_rt = con.execute("SELECT count(*) FROM runtime").fetchone()[0]
    if n_gpu + n_nvtx + n_rt == 0:
        raise NsysError("export has no CUDA kernel, memcpy, memset, CUDA API or NVTX rows (captured without -t cuda,nvtx?)")

    # ---- clock
    version = meta.get("EXPORT_SCHEMA_VERSION")
    start_rows = _small(ex, "TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"])
    utc = start_rows[0]["utcEpochNs"] if start_rows else None
    normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
    shift = _int(meta.get("EXPORT_PARAM_TIME_SHIFT")) or 0
    if normalized:
        base = 0 - shift
        notes.append("export was written with --ts-normalize: timestamps are already UTC epoch ns")
    elif utc is not None:
        base = utc - shift
    else:
        base = 0 - shift
        notes.append("no TARGET_INFO_SESSION_START_TIME.utcEpochNs: times are relative to the capture start, not absolute")
    if shift:
        notes.append(f"export was written with --ts-shift {shift}: shift undone")
    if meta.get("EXPORT_PARAM_TIMES_TO_EXPORT") or meta.get("DERIVED_WINDOW_NS"):
        notes.append("windowed export (" + (meta.get("EXPORT_PARAM_TIMES_TO_EXPORT") or meta.get("DERIVED_WINDOW_NS")) +
                     "): work whose launch fell outside the window has no launch")
    con.execute(f"SET VARIABLE base_ns = {int(base)}::BIGINT")

    # ---- processes -> ranks
    procs = con.execute("""
        SELECT gp, min(deviceId) AS dev, ((gp >> 24) & 16777215) AS pid FROM (
          SELECT globalPid AS gp, deviceId FROM kernel UNION ALL SELECT globalPid, deviceId FROM memcpy
          UNION ALL SELECT globalPid, deviceId FROM memset) WHERE gp IS NOT NULL GROUP BY gp ORDER BY dev, pid""").fetchall()
    kind_of_procs = "GPU work"
    if not procs:
        kind_of_procs = "CUDA calls" if n_rt else "NVTX ranges"
        procs = con.execute(f"""SELECT gp, NULL, ((gp >> 24) & 16777215) FROM (
            SELECT DISTINCT globalTid & ~16777215 AS gp FROM {'runtime' if n_rt else 'nvtx'} WHERE globalTid IS NOT NULL)
            ORDER BY 3""").fetchall()
    if not procs:
        raise NsysError("no process of the export has GPU work, CUDA calls or NVTX ranges with a process id")
    gps = [p[0] for p in procs]
    mpi = dict(con.execute("SELECT globalTid & ~16777215, min(rank) FROM mpi_ranks GROUP BY 1").fetchall())
    if not mpi:
        mpi = {gp: int(r) for gp, r in con.execute(r"""
            SELECT globalTid & ~16777215, min(regexp_extract(text, 'MPI Rank (\d+)', 1)::BIGINT) FROM nvtx
            WHERE eventType = ? AND regexp_matches(text, 'MPI Rank \d+') GROUP BY 1""",
            [catalog.nsys()["nvtx_event_type"]["thread_name"]]).fetchall()}
    if mpi and all(gp in mpi for gp in gps):
        ranks, rsrc = {gp: int(mpi[gp]) for gp in gps}, "mpi"
    elif len(gps) == 1 and file_rank is not None:
        ranks, rsrc = {gps[0]: file_rank}, "file_name"
    elif len(gps) == 1 and cli_rank is not None:
        ranks, rsrc = {gps[0]: cli_rank}, "cli"
    elif len(gps) == 1:
        ranks, rsrc = {gps[0]: 0}, "default"
    else:
        ranks, rsrc = {gp: i for i, gp in enumerate(gps)}, "process_order"
        notes.append(f"{len(gps)} processes with {kind_of_procs}; ranks assigned in order of lowest CUDA device, then pid: "
                     + ", ".join(f"pid {p[2]} -> rank {ranks[p[0]]}" for p in procs))
    if len(set(ranks.values())) != len(ranks):
        raise NsysError("two processes of the export claim the same MPI rank")
    con.execute("CREATE TABLE rank_map (gp BIGINT, rank INTEGER)")
    con.executemany("INSERT INTO rank_map VALUES (?, ?)", list(ranks.items()))
    orphan = con.execute("SELECT " + " + ".join(f"(SELECT count(*) FROM {t} WHERE globalPid IS NULL)" for t in GPU_TABLES)).fetchone()[0]
    con.execute(f"SET VARIABLE single_gp = {gps[0] if len(gps) == 1 else 'NULL'}::BIGINT")
    if orphan and len(gps) > 1:
        notes.append(f"{orphan} GPU activities without a process id were dropped (several processes in the report)")

    # ---- NVTX domains; NCCL ranges
    et = catalog.nsys()["nvtx_event_type"]
    con.execute(f"SET VARIABLE nvtx_ranges = {et['ranges'] + et['marks']}::BIGINT[]")
    con.execute(f"SET VARIABLE nvtx_range_only = {et['ranges']}::BIGINT[]")
    domains = dict(con.execute("SELECT domainId, any_value(text) FROM nvtx WHERE eventType = ? AND domainId IS NOT NULL GROUP BY 1",
                               [et["domain_create"]]).fetchall())
    for d, n_all, n_nccl in con.execute("""
            SELECT n.domainId, count(*), count(*) FILTER (WHERE coalesce(n.text, s.value) ILIKE 'nccl%')
            FROM nvtx n LEFT JOIN strings s ON s.id = n.textId
            WHERE n.domainId IS NOT NULL AND n.domainId <> 0 AND n.eventType IN (SELECT unnest(getvariable('nvtx_ranges')))
            GROUP BY 1""").fetchall():
        if d not in domains:
            if n_all and n_nccl == n_all:
                domains[d] = "NCCL"
                notes.append(f"NVTX domain {d} has no domain-create row (windowed export); named NCCL because all its {n_all} ranges are nccl* calls")
            else:
                domains[d] = f"domain {d}"
    con.execute("CREATE TABLE domains (domainId BIGINT, domain VARCHAR)")
    if domains:
        con.executemany("INSERT INTO domains VALUES (?, ?)", list(domains.items()))
    # NCCL ranges merged per thread into disjoint intervals (gaps and islands), so one ASOF join
    # finds the interval holding each CUDA call (a range join on the thread alone is quadratic)
    con.execute("""CREATE TABLE nccl_iv AS
        WITH r AS (
          SELECT globalTid, start, "end" FROM nvtx
          WHERE domainId IN (SELECT domainId FROM domains WHERE domain = 'NCCL') AND "end" IS NOT NULL
            AND eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND globalTid IS NOT NULL),
        m AS (SELECT *, max("end") OVER (PARTITION BY globalTid ORDER BY start, "end"
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end FROM r),
        g AS (SELECT *, sum(CASE WHEN prev_end IS NULL OR start > prev_end THEN 1 ELSE 0 END)
                          OVER (PARTITION BY globalTid ORDER BY start, "end" ROWS UNBOUNDED PRECEDING) AS grp FROM m)
        SELECT globalTid, min(start) AS s, max("end") AS e FROM g GROUP BY globalTid, grp""")
    con.execute("""CREATE TABLE comm_launch AS
        SELECT DISTINCT rt.globalTid & ~16777215 AS gp, rt.correlationId
        FROM (SELECT globalTid, start, correlationId FROM runtime WHERE correlationId IS NOT NULL) rt
        ASOF JOIN nccl_iv n ON n.globalTid = rt.globalTid AND rt.start >= n.s
        WHERE rt.start < n.e""")

    # ---- devices, host, versions (allow-listed)
    allow = catalog.nsys()["privacy"]["system_env_allow"]
    env = {}
    if "TARGET_INFO_SYSTEM_ENV" in tabs:
        where = "WHERE name IN (" + ", ".join("'" + a + "'" for a in allow) + ")"
        env = {r["name"]: r["value"] for r in _small(ex, "TARGET_INFO_SYSTEM_ENV", ["name", "value"], where)}
    host = env.get("Hostname") or None
    versions = {k: v for k, v in {
        "nsys_version": meta.get("EXPORT_PRODUCT_VERSION"), "nsys_export_schema": version,
        "nvidia_driver_version": env.get("NvDriverVersion"), "cuda_driver_version": env.get("CudaDriverVersion"),
    }.items() if v}
    devices = _devices(ex, con, ranks, host)
    if not version:
        notes.append("export schema version unknown (no META_DATA_EXPORT / EXPORT_META_DATA)")

    # ---- steps
    steps = _steps(con, step_regex)
    if step_regex and steps.height == 0:
        notes.append(f"--step-range {step_regex!r} matched no NVTX range of a rank process")

    t0, t1 = con.execute("""SELECT min(s), max(e) FROM (
        SELECT min(start) s, max("end") e FROM kernel UNION ALL SELECT min(start), max("end") FROM memcpy
        UNION ALL SELECT min(start), max("end") FROM memset UNION ALL SELECT min(start), max("end") FROM runtime)""").fetchone()
    neg = con.execute("SELECT " + " + ".join(f"(SELECT count(*) FROM {t} WHERE \"end\" < start)" for t in GPU_TABLES + ("runtime",))).fetchone()[0]
    if neg:
        notes.append(f"{neg} events with end before start given dur 0")
    _enum_tables(con)
    _nccl_payloads(ex, con, notes)
    return Export(format=ex.kind, ranks=ranks, rank_source=rsrc, host=host, tool_versions=versions,
                  base_time_ns=None if normalized else base, event_count=event_count,
                  trace_start_ns=None if t0 is None else t0 + base, trace_end_ns=None if t1 is None else t1 + base,
                  notes=notes, con=con, comm_patterns=comm_patterns, step_regex=step_regex, devices=devices,
                  _steps=steps)


_DUCK = {I: "BIGINT", S: "VARCHAR", F: "DOUBLE"}


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _devices(ex, con, ranks: dict[int, int], host) -> list[dict]:
    """Every GPU of the report's host, listed once per rank (used = the rank ran work on it)."""
    used = {}
    for gp, dev in con.execute("""SELECT DISTINCT gp, deviceId FROM (
            SELECT coalesce(globalPid, getvariable('single_gp')) AS gp, deviceId FROM kernel
            UNION ALL SELECT coalesce(globalPid, getvariable('single_gp')), deviceId FROM memcpy
            UNION ALL SELECT coalesce(globalPid, getvariable('single_gp')), deviceId FROM memset)
            WHERE deviceId IS NOT NULL""").fetchall():
        if gp in ranks:
            used.setdefault(ranks[gp], set()).add(int(dev))
    gpus = {}
    for r in _small(ex, "TARGET_INFO_GPU", ["id", "name", "busLocation", "totalMemory", "smCount", "computeMajor", "computeMinor"]):
        if r["id"] is not None:
            gpus[int(r["id"])] = {"name": r["name"], "bus_id": r["busLocation"], "total_memory_bytes": r["totalMemory"],
                                  "num_sms": r["smCount"], "compute_major": r["computeMajor"], "compute_minor": r["computeMinor"]}
    if not gpus:
        for r in _small(ex, "TARGET_INFO_CUDA_DEVICE", ["gpuId", "cudaId", "numMultiprocessors"]):
            if r["cudaId"] is not None:
                gpus[int(r["cudaId"])] = {"num_sms": r["numMultiprocessors"]}
    all_devs = set(gpus) | {d for s in used.values() for d in s}
    rows = []
    for rank in sorted(set(ranks.values())):
        for d in sorted(all_devs):
            g = gpus.get(d, {})
            rows.append({"rank": rank, "host": host, "device": d, "name": g.get("name"), "vendor": "nvidia",
                         "compute_major": g.get("compute_major"), "compute_minor": g.get("compute_minor"),
                         "total_memory_bytes": g.get("total_memory_bytes"), "num_sms": g.get("num_sms"),
                         "bus_id": g.get("bus_id"), "used": d in used.get(rank, set())})
    return rows


_STEP_RE = r"^ProfilerStep\s*#\s*\d+$"


def _steps(con, step_regex: str | None) -> pl.DataFrame:
    """Steps: NVTX ranges of rank processes named ProfilerStep#N, or matching step_regex; step
    number = the last integer in the name, else the range's order; ranges nested inside another
    matching range of the same rank are dropped (outermost wins)."""
    rx = step_regex or _STEP_RE
    con.execute("SET VARIABLE step_regex = ?", [rx])
    df = pl.from_arrow(con.sql("""
        SELECT m.rank, coalesce(n.text, s.value) AS name, n.start + getvariable('base_ns') AS start_ns,
               n."end" + getvariable('base_ns') AS end_ns, (n.globalTid >> 24) & 16777215 AS pid, n.globalTid & 16777215 AS tid
        FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215 LEFT JOIN strings s ON s.id = n.textId
        WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND n."end" IS NOT NULL
          AND regexp_matches(coalesce(n.text, s.value), getvariable('step_regex'))
        ORDER BY m.rank, start_ns, end_ns DESC""").to_arrow_table())
    schema = {"rank": pl.Int32, "step": pl.Int64, "name": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
              "dur_ns": pl.Int64, "source": pl.String, "pid": pl.Int64, "tid": pl.Int64}
    if df.height == 0:
        return pl.DataFrame(schema=schema)
    rows = []
    for (rank,), g in df.group_by(["rank"], maintain_order=True):
        outer_end = None
        order = 0
        for r in g.iter_rows(named=True):
            if outer_end is not None and r["end_ns"] <= outer_end:
                continue
            outer_end = r["end_ns"]
            m = re.findall(r"\d+", r["name"])
            rows.append({**r, "step": int(m[-1]) if m and len(m[-1]) < 18 else order,
                         "dur_ns": max(r["end_ns"] - r["start_ns"], 0), "source": "nvtx"})
            order += 1
    return pl.DataFrame(rows, schema=schema)


# ------------------------------------------------------------------ mapping SQL (staging -> schema v1)

_GP = "coalesce(g.globalPid, getvariable('single_gp'))"
GPU_SQL = f"""
WITH g AS (
  SELECT 'kernel' AS kind, k.start, k."end", k.deviceId, k.streamId, k.contextId, k.correlationId, k.globalPid,
         coalesce(d.value, s.value, '[unnamed kernel]') AS name, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ,
         k.registersPerThread, k.staticSharedMemory + coalesce(k.dynamicSharedMemory, 0) AS shared_memory_bytes,
         NULL::BIGINT AS bytes, NULL::VARCHAR AS copy_kind, NULL::VARCHAR AS src_kind, NULL::VARCHAR AS dst_kind,
         NULL::VARCHAR AS sync_kind, k.graphId AS graph_id, k.rowid AS idx
  FROM kernel k LEFT JOIN strings d ON d.id = k.demangledName LEFT JOIN strings s ON s.id = k.shortName
  UNION ALL BY NAME
  SELECT 'memcpy' AS kind, m.start, m."end", m.deviceId, m.streamId, m.contextId, m.correlationId, m.globalPid,
         'Memcpy ' || coalesce(ck.label, 'Unknown') || ' (' || coalesce(sk.label, 'Unknown') || ' -> ' || coalesce(dk.label, 'Unknown') || ')' AS name,
         m.bytes, ck.label AS copy_kind, sk.label AS src_kind, dk.label AS dst_kind,
         m.rowid + (SELECT count(*) FROM kernel) AS idx
  FROM memcpy m LEFT JOIN copy_kinds ck ON ck.id = m.copyKind LEFT JOIN mem_kinds sk ON sk.id = m.srcKind
  LEFT JOIN mem_kinds dk ON dk.id = m.dstKind
  UNION ALL BY NAME
  SELECT 'memset' AS kind, m.start, m."end", m.deviceId, m.streamId, m.contextId, m.correlationId, m.globalPid,
         'Memset (' || coalesce(mk.label, 'Unknown') || ')' AS name, m.bytes, mk.label AS dst_kind,
         m.rowid + (SELECT count(*) FROM kernel) + (SELECT count(*) FROM memcpy) AS idx
  FROM memset m LEFT JOIN mem_kinds mk ON mk.id = m.memKind
  UNION ALL BY NAME
  SELECT 'sync' AS kind, y.start, y."end", y.deviceId, y.streamId, y.contextId, y.correlationId, y.globalPid,
         coalesce(st.label, 'Unknown Sync') AS name, st.sync_kind,
         y.rowid + (SELECT count(*) FROM kernel) + (SELECT count(*) FROM memcpy) + (SELECT count(*) FROM memset) AS idx
  FROM sync y LEFT JOIN sync_types st ON st.id = y.syncType
)
SELECT r.rank, g.deviceId::INTEGER AS device, g.streamId AS stream, g.kind, g.name,
       g.start + getvariable('base_ns') AS start_ns, g.start + getvariable('base_ns') + greatest(g."end" - g.start, 0) AS end_ns,
       greatest(g."end" - g.start, 0) AS dur_ns, g.correlationId AS correlation, g.contextId AS context,
       g.gridX::INTEGER AS grid_x, g.gridY::INTEGER AS grid_y, g.gridZ::INTEGER AS grid_z,
       g.blockX::INTEGER AS block_x, g.blockY::INTEGER AS block_y, g.blockZ::INTEGER AS block_z,
       g.registersPerThread::INTEGER AS registers_per_thread, g.shared_memory_bytes, g.bytes, g.copy_kind, g.src_kind,
       g.dst_kind, g.sync_kind, g.graph_id, ({_GP} >> 24) & 16777215 AS pid, NULL::BIGINT AS tid, g.idx AS event_index,
       c.gp IS NOT NULL AS comm_launch
FROM g JOIN rank_map r ON r.gp = {_GP}
LEFT JOIN comm_launch c ON c.gp = {_GP} AND c.correlationId = g.correlationId
WHERE g.start IS NOT NULL
ORDER BY r.rank, start_ns, event_index
"""

CPU_SQL = r"""
SELECT m.rank, (rt.globalTid >> 24) & 16777215 AS pid, rt.globalTid & 16777215 AS tid,
       CASE WHEN rt.eventClass IN (SELECT unnest(getvariable('driver_classes'))) THEN 'driver' ELSE 'runtime' END AS kind,
       'CUPTI_ACTIVITY_KIND_RUNTIME' AS category,
       regexp_replace(coalesce(s.value, '[unnamed call]'), '_v\d{4,5}$', '') AS name,
       rt.start + getvariable('base_ns') AS start_ns, rt.start + getvariable('base_ns') + greatest(rt."end" - rt.start, 0) AS end_ns,
       greatest(rt."end" - rt.start, 0) AS dur_ns, rt.correlationId AS correlation, NULL::BIGINT AS sequence_number,
       NULL::VARCHAR AS input_dims, rt.rowid AS event_index
FROM runtime rt JOIN rank_map m ON m.gp = rt.globalTid & ~16777215 LEFT JOIN strings s ON s.id = rt.nameId
WHERE rt.start IS NOT NULL
UNION ALL BY NAME
SELECT m.rank, (n.globalTid >> 24) & 16777215 AS pid, n.globalTid & 16777215 AS tid, 'op' AS kind, 'NVTX_EVENTS' AS category,
       regexp_extract(n.text, '^([A-Za-z_][\w.]*::[\w.]+)', 1) AS name,
       n.start + getvariable('base_ns') AS start_ns, n.start + getvariable('base_ns') + greatest(n."end" - n.start, 0) AS end_ns,
       greatest(n."end" - n.start, 0) AS dur_ns, NULL::BIGINT AS correlation,
       TRY_CAST(nullif(regexp_extract(n.text, ',\s*seq\s*=\s*(\d+)', 1), '') AS BIGINT) AS sequence_number,
       nullif(regexp_extract(n.text, ',\s*sizes\s*=\s*(\[.*?\]\])', 1), '') AS input_dims,
       n.rowid + (SELECT count(*) FROM runtime) AS event_index
FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215
WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND coalesce(n.domainId, 0) = 0
  AND n."end" IS NOT NULL AND regexp_matches(n.text, '^[A-Za-z_][\w.]*::[\w.]+(,|$)')
ORDER BY rank, start_ns, event_index
"""

NVTX_SQL = """
SELECT m.rank, 'nvtx' AS kind, CASE WHEN coalesce(n.domainId, 0) = 0 THEN NULL ELSE coalesce(d.domain, 'domain ' || n.domainId) END AS domain,
       coalesce(n.text, s.value, '') AS name, n.start + getvariable('base_ns') AS start_ns,
       coalesce(n."end", n.start) + getvariable('base_ns') AS end_ns, NULL::INTEGER AS device, NULL::BIGINT AS stream,
       (n.globalTid >> 24) & 16777215 AS pid, n.globalTid & 16777215 AS tid
FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215
LEFT JOIN strings s ON s.id = n.textId LEFT JOIN domains d ON d.domainId = n.domainId
WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_ranges'))) AND n.start IS NOT NULL
ORDER BY m.rank, start_ns
"""

# GPU metric samples: GPU = typeId & 0xFF (Analysis Guide, nvlink_sum recipe); metric names carry
# their unit in brackets ("SM Active [Throughput %]").
COUNTER_SQL = r"""
SELECT u.rank, (g.typeId & 255)::INTEGER AS device, coalesce(n.metricName, 'metric ' || g.metricId) AS name,
       nullif(regexp_extract(n.metricName, '\[(?:Throughput )?([^\]]*)\]\s*$', 1), '') AS unit,
       g.timestamp + getvariable('base_ns') AS ts_ns, g.value
FROM gpu_metrics g LEFT JOIN gpu_metric_names n ON n.typeId = g.typeId AND n.metricId = g.metricId
LEFT JOIN (SELECT device, min(rank) AS rank FROM gpu_device_rank GROUP BY ALL) u ON u.device = (g.typeId & 255)
WHERE g.timestamp IS NOT NULL AND g.value IS NOT NULL
ORDER BY device, ts_ns
"""


def _enum_tables(con) -> None:
    cat = catalog.nsys()
    con.execute("CREATE TABLE copy_kinds (id BIGINT, label VARCHAR)")
    con.executemany("INSERT INTO copy_kinds VALUES (?, ?)", [(int(k), v) for k, v in cat["copy_kind"].items()])
    con.execute("CREATE TABLE mem_kinds (id BIGINT, label VARCHAR)")
    con.executemany("INSERT INTO mem_kinds VALUES (?, ?)", [(int(k), v) for k, v in cat["mem_kind"].items()])
    con.execute("CREATE TABLE sync_types (id BIGINT, label VARCHAR, sync_kind VARCHAR)")
    con.executemany("INSERT INTO sync_types VALUES (?, ?, ?)", [(int(k), v[0], v[1]) for k, v in cat["sync_type"].items()])
    con.execute(f"SET VARIABLE driver_classes = {cat['event_class']['driver']}::BIGINT[]")
    con.execute("""CREATE TABLE gpu_device_rank AS SELECT DISTINCT g.deviceId::INTEGER AS device, r.rank FROM (
        SELECT globalPid, deviceId FROM kernel UNION ALL SELECT globalPid, deviceId FROM memcpy) g
        JOIN rank_map r ON r.gp = coalesce(g.globalPid, getvariable('single_gp'))""")


def _op_flops(df: pl.DataFrame) -> pl.DataFrame:
    """FLOPs of PyTorch NVTX op ranges whose text carries `sizes = [...]` (emit_nvtx(record_shapes=True))."""
    flops = [None] * df.height
    src = [None] * df.height
    cand = df.with_row_index("_i").filter(pl.col("input_dims").is_not_null() & pl.col("name").is_in(list(MODELLED_OPS)))
    for i, name, dims in zip(cand["_i"], cand["name"], cand["input_dims"]):
        v, _ = op_flops(name, dims, None)
        if v is not None:
            flops[i], src[i] = v, "shapes"
    return df.with_columns(flops=pl.Series(flops, dtype=pl.Float64), flops_source=pl.Series(src, dtype=pl.String))


_COLL_SCHEMA = {
    "rank": pl.Int32, "op": pl.String, "op_raw": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64, "dur_ns": pl.Int64,
    "timing_source": pl.String, "device": pl.Int32, "stream": pl.Int64, "correlation": pl.Int64, "dtype": pl.String,
    "dtype_bytes": pl.Int32, "msg_bytes": pl.Int64, "msg_bytes_note": pl.String, "reduction": pl.String,
    "algorithm": pl.String, "protocol": pl.String, "comm_id": pl.String, "group_size": pl.Int32,
}


_COMM_COLS = ["rank", "name", "start_ns", "end_ns", "dur_ns", "device", "stream", "correlation"]

# NCCL's NVTX API ranges that carry a message size (NCCL src/collectives.cc NVTX3_FUNC_WITH_PARAMS;
# group and communicator ranges carry none)
_NCCL_API = re.compile(r"^nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Bcast|Reduce|Send|Recv|AlltoAll|Gather|Scatter)$")
_BLOB_HEADER = 32


def decode_payload_blob(blob, entries: list[dict], payload_size: int | None) -> dict[str, int]:
    """Fields of one NVTX extended payload as `nsys export --include-blobs=true` stores it:
    a 32-byte little-endian header [domainId u64][schemaId u64][payloadSize u64][payloadOffset u64]
    then the payload, laid out by NVTX_PAYLOAD_SCHEMA_ENTRIES (offset of each entry; an entry
    ends where the next begins, the last at the schema's payloadSize). Layout as decoded by
    GindaChen/nsys-ai src/nsys_ai/nccl_communicator.py; entries from NCCL's nvtx_payload_schemas.h.
    blob: bytes or hex text. Returns {entry name: unsigned int}; raises ValueError when malformed."""
    raw = bytes.fromhex(blob) if isinstance(blob, str) else bytes(blob)
    if len(raw) < _BLOB_HEADER:
        raise ValueError(f"payload blob of {len(raw)} bytes is shorter than its header")
    size = int.from_bytes(raw[16:24], "little")
    off = int.from_bytes(raw[24:32], "little")
    payload = raw[off:off + size]
    if off < _BLOB_HEADER or len(payload) != size:
        raise ValueError("payload blob offset/size do not fit the blob")
    out = {}
    ends = [e["offset"] or 0 for e in entries[1:]] + [payload_size or size]
    for e, end in zip(entries, ends):
        chunk = payload[(e["offset"] or 0):end]
        if chunk:
            out[e["name"]] = int.from_bytes(chunk[:8], "little")
    return out


def schema_of_blob(blob) -> tuple[int, int]:
    raw = bytes.fromhex(blob) if isinstance(blob, str) else bytes(blob)
    return int.from_bytes(raw[0:8], "little"), int.from_bytes(raw[8:16], "little")


def _nccl_payloads(ex, con, notes: list[str]) -> int:
    """Decode the NCCL API ranges' payloads into table nccl_payload and attach each to the CUDA
    launch inside it (launch_payload: the innermost NCCL API range on the launching thread that
    holds the whole call; NCCL's API ranges do not nest, so an ASOF join on the latest start finds
    it). Returns the number of payloads decoded."""
    con.execute("CREATE TABLE nccl_payload (globalTid BIGINT, start BIGINT, \"end\" BIGINT, api VARCHAR, "
                "bytes BIGINT, comm_id VARCHAR, nranks BIGINT)")
    rows = ex.payload_rows()
    if rows:
        strings = dict(con.execute("SELECT id, value FROM strings WHERE id IN (SELECT DISTINCT textId FROM nvtx "
                                   "WHERE textId IS NOT NULL AND domainId IN (SELECT domainId FROM domains WHERE domain = 'NCCL'))").fetchall())
        entries: dict[tuple, dict[int, dict]] = {}
        for r in _small(ex, "NVTX_PAYLOAD_SCHEMA_ENTRIES", ["domainId", "schemaId", "idx", "name", "offset"]):
            entries.setdefault((r["domainId"], r["schemaId"]), {}).setdefault(r["idx"], r)
        sizes = {(r["domainId"], r["schemaId"]): r["payloadSize"]
                 for r in _small(ex, "NVTX_PAYLOAD_SCHEMAS", ["domainId", "schemaId", "payloadSize"])}
        out, bad = [], 0
        for tid, start, end, text, text_id, blob in rows:
            api = text if text is not None else strings.get(text_id)
            if not api or not _NCCL_API.match(api):
                continue
            try:
                key = schema_of_blob(blob)
                ents = [entries[key][i] for i in sorted(entries.get(key, {}))]
                if not ents:
                    raise ValueError(f"no schema entries for domain {key[0]} schema {key[1]}")
                f = decode_payload_blob(blob, ents, sizes.get(key))
            except ValueError:
                bad += 1
                continue
            comm = f.get("NCCL communicator ID")
            out.append((tid, start, end, api, f.get("Message size [bytes]"), None if comm is None else f"0x{comm:016x}",
                        f.get("No. of ranks")))
        if out:
            con.executemany("INSERT INTO nccl_payload VALUES (?, ?, ?, ?, ?, ?, ?)", out)
        if bad:
            notes.append(f"{bad} NCCL NVTX payload blobs could not be decoded")
    con.execute("""CREATE TABLE launch_payload AS
        SELECT m.rank, rt.correlationId AS correlation, p.api, p.bytes, p.comm_id, p.nranks
        FROM (SELECT globalTid, start, "end", correlationId FROM runtime WHERE correlationId IS NOT NULL) rt
        ASOF JOIN nccl_payload p ON p.globalTid = rt.globalTid AND rt.start >= p.start
        JOIN rank_map m ON m.gp = rt.globalTid & ~16777215
        WHERE rt."end" <= p."end"
        """)
    return len(rows)


def _collectives(comm_rows: list[dict], con) -> pl.DataFrame:
    """One collectives row per communication kernel; op/reduction/dtype/algorithm/protocol from
    its name (ncclname.kernel_meta). Message size, communicator and group size from the NCCL NVTX
    payload of the API call that launched the kernel (launch_payload) when the export carries
    payload blobs; nccl-tests' S is the payload's bytes, times the group size for all_gather and
    reduce_scatter (NCCL passes "the size of one message", sendcount / recvcount x type size:
    src/collectives.cc). Otherwise msg_bytes is null with the reason."""
    if not comm_rows:
        return pl.DataFrame(schema=_COLL_SCHEMA)
    payload = {(r, c): (b, comm, n) for r, c, b, comm, n in con.execute(
        "SELECT rank, correlation, bytes, comm_id, nranks FROM launch_payload").fetchall()}
    n_payloads = con.execute("SELECT count(*) FROM nccl_payload").fetchone()[0]
    has_nccl_nvtx = con.execute("SELECT count(*) FROM domains WHERE domain = 'NCCL'").fetchone()[0] > 0
    note = ("message size not in the export: the kernel was not launched inside an NCCL API range with a payload "
            "(grouped calls launch in ncclGroupEnd)" if n_payloads
            else "message size not in the export: NCCL NVTX ranges without payload blobs (export with --include-blobs=true)"
            if has_nccl_nvtx else "message size not in the export: no NCCL NVTX ranges (kernel name only)")
    rows = []
    for r in comm_rows:
        km = kernel_meta(r["name"])
        op = catalog.normalize_op(km["op"] or r["name"])
        b, comm, n = payload.get((r["rank"], r["correlation"]), (None, None, None))
        msg = b * n if b is not None and n and op in ("all_gather", "reduce_scatter") else b
        if b is not None and op in ("all_gather", "reduce_scatter") and not n:
            msg = None
        rows.append({**r, "op": op, "op_raw": r.pop("name"),
                     "timing_source": "gpu_kernel", "dtype": km["dtype"], "dtype_bytes": catalog.dtype_bytes(km["dtype"]),
                     "msg_bytes": msg, "msg_bytes_note": None if msg is not None else
                     ("group size unknown: the payload gives one rank's bytes" if b is not None else note),
                     "reduction": km["reduction"], "algorithm": km["algorithm"], "protocol": km["protocol"],
                     "comm_id": comm, "group_size": n})
    return pl.DataFrame(rows, schema=_COLL_SCHEMA)
