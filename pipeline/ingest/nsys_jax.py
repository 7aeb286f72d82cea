"""nsys-jax archives -> schema v1 tables.

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
"""

from __future__ import annotations

import io
import json
import lzma
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .. import catalog
from .. import classify as classify_mod
from ..lake import one_line
from .errors import TraceError
from .nsys import ExportInfo

TRACE_MEMBER = "nvtx_gpu_proj_trace/trace.parquet"
ANALYSIS_MEMBER = "nvtx_gpu_proj_trace/nvtx_gpu_proj_trace.nsys-analysis"
PUSHPOP_MEMBER = "report_nvtx_pushpop_trace.csv.xz"
DEVICE_MEMBER = "device-metadata.parquet"
SYSTEM_MEMBER = "system-metadata.parquet"
THREAD_MEMBER = "thread-metadata.parquet"
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
RECIPE = "nvtx_gpu_proj_trace"
RANK_SOURCE = "xla_process"

# trace.parquet columns read (classic layout, nsys <= 2024.4 recipe) -> internal names
_TRACE_COLS = {"Name": "raw", "Projected Start": "pstart", "Projected Duration": "pdur", "Orig Start": "ostart",
               "Orig Duration": "odur", "PID": "pid", "TID": "tid", "NumGPUOps": "nops", "NumChild": "nchild",
               "RangeId": "rid", "ParentId": "parent"}
_ALT_LAYOUT = {"Text", "Start", "End", "Range ID"}
_XLA_DEVICE = re.compile(r"global=(\d+),local=(\d+),process=(\d+)")
_LAUNCHER = re.compile(r"^XlaLauncher:#global=(\d+),local=(\d+),process=(\d+),slice=(\d+)#$")
_HLO_OPCODE = r"hlo_op=([A-Za-z-]+?)(?:-start|-done)?(?:\.\d+)?[#,]"
_MSG_NOTE = "message size not decoded: it is in the archive's XLA HLO protos (dump/*.pb.xz)"
_NESTED_IN = ("XlaModule:", "XlaCompile", "XlaAutotuner")


def is_archive(path: Path) -> bool:
    """True for a file that starts like a zip. tracelake reads no other zip format, so a zip
    that is corrupt or lacks the projection trace is still routed here and open_archive names
    the problem (rather than a misleading 'not a Kineto trace')."""
    try:
        with open(path, "rb") as f:
            return f.read(4) in ZIP_MAGIC
    except OSError:
        return False


# ------------------------------------------------------------------ result

@dataclass
class JaxArchive(ExportInfo):
    """An opened nsys-jax archive: the ExportInfo attributes describe it for its sources row,
    tables() gives the lake tables."""
    _tables: dict[str, pl.DataFrame] = field(default_factory=dict)

    def tables(self, run_id: str, source_id: str) -> dict:
        ids = [pl.lit(run_id).alias("run_id"), pl.lit(source_id).alias("source_id")]
        return {name: df.with_columns(ids).to_arrow() for name, df in self._tables.items()}


# ------------------------------------------------------------------ reading members

def _limit() -> int:
    from . import max_uncompressed_bytes  # late: pipeline.ingest imports this module's importer

    return max_uncompressed_bytes()


def _read(z: zipfile.ZipFile, name: str, limit: int) -> bytes:
    info = z.getinfo(name)
    if info.file_size > limit:
        raise TraceError(f"zip member {name} expands to {info.file_size} bytes, beyond {limit} "
                         "(TRACELAKE_MAX_UNCOMPRESSED_BYTES); refusing a possible zip bomb")
    try:
        with z.open(info) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, NotImplementedError, RuntimeError) as e:
        raise TraceError(f"zip member {name} cannot be read ({one_line(str(e)) or type(e).__name__})") from None
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


# ------------------------------------------------------------------ opening

def open_archive(path: Path, scratch: Path, *, file_rank: int | None = None, cli_rank: int | None = None,
                 comm_patterns: list[str] | None = None) -> JaxArchive:
    """Read the nsys-jax archive at `path` (scratch is unused: everything is read in memory).
    Raises TraceError (one line) for a corrupt zip, a missing or unreadable trace member, or a
    member beyond the decompression limit; re.error for an invalid comm pattern."""
    limit = _limit()
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:
        raise TraceError(f"corrupt or truncated zip archive ({one_line(str(e)) or type(e).__name__})") from None
    with z:
        names = set(z.namelist())
        if TRACE_MEMBER not in names:
            raise TraceError(f"zip archive without {TRACE_MEMBER}: not an nsys-jax archive "
                             f"(or one made without the {RECIPE} recipe)")
        return _build(z, names, limit, file_rank, cli_rank, comm_patterns)


def _build(z, names, limit, file_rank, cli_rank, comm_patterns) -> JaxArchive:
    notes: list[str] = []
    raw = _parquet(z, TRACE_MEMBER, limit)
    have = set(raw.column_names)
    missing = [c for c in _TRACE_COLS if c not in have]
    if missing and _ALT_LAYOUT <= have:
        raise TraceError(f"{TRACE_MEMBER} is in the newer recipe layout (Text, Start, End; no CPU times or GPU-op "
                         "counts), which tracelake does not read yet")
    if missing:
        raise TraceError(f"{TRACE_MEMBER} lacks columns {missing}")
    df = _trace_frame(raw)
    event_count = raw.num_rows
    del raw

    devices, dev_notes = _devices(z, names, limit)
    notes += dev_notes
    processes = {d["process"] for d in devices if d["process"] is not None}
    if len(processes) == 1:
        rank, rsrc = processes.pop(), RANK_SOURCE
    else:
        if len(processes) > 1:
            notes.append(f"device-metadata names GPUs of several XLA processes {sorted(processes)}: rank not taken from it")
        if file_rank is not None:
            rank, rsrc = file_rank, "file_name"
        elif cli_rank is not None:
            rank, rsrc = cli_rank, "cli"
        else:
            rank, rsrc = 0, "default"

    # ---- work ranges (innermost ranges that launched GPU work; NCCL API ranges folded into their parent)
    named = df.filter(pl.col("raw").is_not_null() & pl.col("rid").is_not_null())
    folded = (pl.col("domain") == "NCCL") & pl.col("parent").is_not_null()
    cand = named.filter(~folded)
    cand_parents = cand["parent"].drop_nulls().unique().implode()
    nccl_parents = named.filter(folded)["parent"].unique().implode()
    work = cand.filter(~pl.col("rid").is_in(cand_parents)).with_columns(comm_launch=pl.col("rid").is_in(nccl_parents))
    if work.height == 0:
        raise TraceError(f"no NVTX range of {TRACE_MEMBER} launched GPU work (profiled without NVTX or CUDA tracing?)")
    child_ops = cand.group_by("parent").agg(child_ops=pl.col("nops").sum())
    inner = cand.filter(pl.col("rid").is_in(cand_parents)).join(child_ops, left_on="rid", right_on="parent", how="left")
    self_ops = int(inner.select((pl.col("nops") - pl.col("child_ops").fill_null(0)).clip(lower_bound=0).sum()).item() or 0)
    outside = int(df.filter(pl.col("raw").is_null())["nops"].fill_null(0).sum() or 0)
    total_ops = int(named.filter(pl.col("parent").is_null())["nops"].fill_null(0).sum() or 0) + outside
    if outside:
        notes.append(f"{outside} of {total_ops} GPU operations were launched outside any NVTX range; the projection "
                     "keeps only their overall span, so they are not in gpu_activities")
    if self_ops:
        notes.append(f"{self_ops} of {total_ops} GPU operations were launched by an enclosing range (XlaModule, "
                     "compilation, autotuning) outside its child ranges; the projection has no times for them, so "
                     "they are not in gpu_activities")

    # ---- device of each work range
    used_dev = [d["device"] for d in devices if d["xla_name"]] or [d["device"] for d in devices]
    if len(used_dev) == 1:
        work = work.with_columns(device=pl.lit(used_dev[0], dtype=pl.Int32))
    elif devices:
        thread_dev = _launcher_devices(z, names, limit, devices)
        work = work.join(thread_dev, on=["pid", "tid"], how="left") if thread_dev.height else \
            work.with_columns(device=pl.lit(None, dtype=pl.Int32))
        unmapped = work["device"].null_count()
        if unmapped:
            notes.append(f"the process drove {len(devices)} GPUs and {unmapped} GPU work ranges ran on threads without "
                         "an XlaLauncher device name: their device is unknown (NULL)")
    else:
        work = work.with_columns(device=pl.lit(None, dtype=pl.Int32))

    # ---- classification (pipeline/catalog/classification.toml via pipeline.classify)
    work = classify_mod.classify(
        work.with_columns(kind=pl.lit("kernel"), name=pl.col("text"), external_id=pl.lit(None, dtype=pl.Int64),
                          has_comm_args=pl.lit(False)),
        None, comm_patterns)
    gpu = work.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"), "device", pl.lit(None, dtype=pl.Int64).alias("stream"), "kind",
        "category", "classified_by", "name", pl.col("pstart").alias("start_ns"),
        (pl.col("pstart") + pl.col("pdur")).alias("end_ns"), pl.col("pdur").alias("dur_ns"),
        pl.col("rid").alias("correlation"), "pid", pl.lit(None, dtype=pl.Int64).alias("tid"), "event_index",
    ).sort("start_ns", "event_index")
    launches = work.filter(pl.col("ostart").is_not_null()).select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"), "pid", "tid", pl.lit("runtime").alias("kind"),
        pl.lit(RECIPE).alias("category"), pl.col("text").alias("name"), pl.col("ostart").alias("start_ns"),
        (pl.col("ostart") + pl.col("odur")).alias("end_ns"), pl.col("odur").alias("dur_ns"),
        pl.col("rid").alias("correlation"), "event_index",
    ).sort("start_ns", "event_index")
    if work.height:
        notes.append("GPU work = projected GPU intervals of the innermost NVTX ranges that launched it (XLA thunks; "
                     "first..last GPU operation of each, stream unknown); cpu_ops 'runtime' rows are those ranges on "
                     "the host (the archive has no CUDA API calls): launch times are range starts, at or before the "
                     "real launch")

    # ---- collectives
    comm = work.filter((pl.col("category") == "communication") & ~pl.col("text").str.contains(r"hlo_op=[^#,]*-done[.#,]"))
    opcode = comm["text"].str.extract(_HLO_OPCODE, 1)
    colls = comm.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.Series("op", [catalog.normalize_op(o or t) for o, t in zip(opcode, comm["text"])], dtype=pl.String),
        pl.col("text").alias("op_raw"), pl.col("pstart").alias("start_ns"),
        (pl.col("pstart") + pl.col("pdur")).alias("end_ns"), pl.col("pdur").alias("dur_ns"),
        pl.lit("gpu_kernel").alias("timing_source"), "device", pl.lit(None, dtype=pl.Int64).alias("stream"),
        pl.col("rid").alias("correlation"), pl.lit(None, dtype=pl.Int64).alias("msg_bytes"),
        pl.lit(_MSG_NOTE).alias("msg_bytes_note"),
    ).sort("start_ns", "correlation")

    # ---- steps
    steps, step_note = _steps(named, rank)
    notes.append(step_note)

    # ---- annotations
    ann, n_pushpop, ann_note = _annotations(z, names, limit, named, rank)
    event_count += n_pushpop
    if ann_note:
        notes.append(ann_note)

    # ---- host, versions (allow-listed)
    env = _system_env(z, names, limit)
    host = env.get("Hostname") or None
    versions = {"nsys_recipe": RECIPE, **_recipe_versions(z, names, limit)}
    versions.update({k: v for k, v in (("nvidia_driver_version", env.get("NvDriverVersion")),
                                       ("cuda_driver_version", env.get("CudaDriverVersion"))) if v})

    used = set(gpu["device"].drop_nulls().unique().to_list())
    dev_rows = pl.DataFrame([{k: v for k, v in d.items() if k not in ("process", "xla_name")} |
                             {"rank": rank, "host": host, "vendor": "nvidia", "used": d["device"] in used} for d in devices],
                            schema=_DEVICE_SCHEMA)

    notes.append("times are ns relative to this process's capture start: the archive holds no session start time "
                 "(base_time_ns NULL), so clocks of different archives are not comparable: cross-rank start order "
                 "(straggler_rank, arrival_spread_ns) is meaningless across them; durations, transfer_ns and wait_ns "
                 "are not affected")
    if rsrc == RANK_SOURCE:
        notes.append(f"rank {rank} is XLA's process index in the NVTX CUDA device name (Xla:#...,process={rank},...#)")

    starts = [s for s in (gpu["start_ns"].min(), launches["start_ns"].min()) if s is not None]
    ends = [e for e in (gpu["end_ns"].max(), launches["end_ns"].max()) if e is not None]
    pids = set(named["pid"].drop_nulls().unique().to_list()) or {0}
    return JaxArchive(
        format="nsys_jax", ranks={int(p): rank for p in pids}, rank_source=rsrc, host=host, tool_versions=versions,
        base_time_ns=None, event_count=event_count, trace_start_ns=min(starts) if starts else None,
        trace_end_ns=max(ends) if ends else None, notes=notes,
        _tables={"gpu_activities": gpu, "cpu_ops": launches, "collectives": colls, "steps": steps,
                 "annotations": ann, "devices": dev_rows})


_DEVICE_SCHEMA = {"rank": pl.Int32, "host": pl.String, "device": pl.Int32, "name": pl.String, "vendor": pl.String,
                  "compute_major": pl.Int32, "compute_minor": pl.Int32, "total_memory_bytes": pl.Int64,
                  "num_sms": pl.Int32, "bus_id": pl.String, "used": pl.Boolean}


def _trace_frame(raw: pa.Table) -> pl.DataFrame:
    """trace.parquet -> frame with internal names, int64 times (Orig times are stored as doubles
    holding integers), domain and text split at the first ':' (the recipe writes
    '<domain name>:<text>', an empty domain for the default one)."""
    df = pl.from_arrow(raw.select(list(_TRACE_COLS)).rename_columns(list(_TRACE_COLS.values())))
    ints = ["pstart", "pdur", "ostart", "odur", "pid", "tid", "nops", "nchild", "rid", "parent"]
    df = df.with_columns([pl.col(c).cast(pl.Int64, strict=False) for c in ints] + [pl.col("raw").cast(pl.String)])
    df = df.with_row_index("event_index")
    df = df.with_columns(
        pl.col("event_index").cast(pl.Int64),
        pl.col("pdur").clip(lower_bound=0), pl.col("odur").clip(lower_bound=0),
        *_split_domain("text"))
    return df.filter(pl.col("pstart").is_not_null() | pl.col("raw").is_null())


def _split_domain(text_alias: str) -> list[pl.Expr]:
    """'<domain>:<text>' -> domain (NULL when empty: NVTX's default domain) and text."""
    dom = pl.col("raw").str.extract(r"^([^:]*):", 1)
    return [pl.when(dom != "").then(dom).alias("domain"),
            pl.when(pl.col("raw").str.contains(":", literal=True)).then(pl.col("raw").str.replace(r"^[^:]*:", ""))
              .otherwise(pl.col("raw")).alias(text_alias)]


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
        dev = next((v for v in (get(row, None, "cuDevice"), get(row, "TARGET_INFO_NVTX_CUDA_DEVICE", "deviceId"),
                                get(row, "TARGET_INFO_GPU", "id")) if v is not None), None)
        if dev is None:
            continue
        xla = get(row, "TARGET_INFO_NVTX_CUDA_DEVICE", "name")
        m = _XLA_DEVICE.search(xla or "")
        out.append({"device": int(dev), "name": get(row, "TARGET_INFO_GPU", "name"),
                    "compute_major": get(row, "TARGET_INFO_GPU", "computeMajor"),
                    "compute_minor": get(row, "TARGET_INFO_GPU", "computeMinor"),
                    "total_memory_bytes": get(row, "TARGET_INFO_GPU", "totalMemory"),
                    "num_sms": get(row, "TARGET_INFO_GPU", "smCount"),
                    "bus_id": get(row, "TARGET_INFO_GPU", "busLocation"),
                    "xla_name": bool(m), "global": int(m.group(1)) if m else None,
                    "process": int(m.group(3)) if m else None})
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


def _steps(named: pl.DataFrame, rank: int) -> tuple[pl.DataFrame, str]:
    schema = {"rank": pl.Int32, "step": pl.Int64, "name": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
              "dur_ns": pl.Int64, "source": pl.String, "pid": pl.Int64, "tid": pl.Int64}
    text_of = dict(zip(named["rid"].to_list(), named["text"].to_list()))
    parent_of = dict(zip(named["rid"].to_list(), named["parent"].to_list()))

    def nested(rid) -> bool:
        p = parent_of.get(rid)
        while p is not None:
            if (text_of.get(p) or "").startswith(_NESTED_IN):
                return True
            p = parent_of.get(p)
        return False

    mods = named.filter(pl.col("text").str.starts_with("XlaModule:") & pl.col("ostart").is_not_null())
    mods = mods.filter(pl.Series([not nested(r) for r in mods["rid"]], dtype=pl.Boolean))
    best = (mods.group_by("text").agg(n=pl.len(), gpu_ns=pl.col("pdur").sum())
            .filter(pl.col("n") >= 2).sort(["gpu_ns", "n", "text"], descending=[True, True, False]))
    if best.height == 0:
        return pl.DataFrame(schema=schema), "no XlaModule outside compilation ran twice or more: no steps"
    name = best["text"][0]
    ex = mods.filter(pl.col("text") == name)
    tids = ex.group_by("tid").agg(n=pl.len()).sort(["n", "tid"], descending=[True, False])
    if tids.height > 1:  # one execution per launcher thread when a process drives several GPUs
        ex = ex.filter(pl.col("tid") == tids["tid"][0])
    ex = ex.sort("ostart", "event_index")
    steps = ex.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"), pl.int_range(pl.len(), dtype=pl.Int64).alias("step"),
        pl.col("text").alias("name"), pl.col("ostart").alias("start_ns"),
        (pl.col("ostart") + pl.col("odur")).alias("end_ns"), pl.col("odur").alias("dur_ns"),
        pl.lit("nvtx").alias("source"), "pid", "tid")
    others = best.height - 1
    return steps, (f"steps: the {steps.height} executions of {name} (the XlaModule outside compilation with the most "
                   f"projected GPU time among those run twice or more; {others} other such module(s)); step windows "
                   "are its host-side range, numbered from 0")


def _annotations(z, names, limit, named: pl.DataFrame, rank: int) -> tuple[pl.DataFrame, int, str | None]:
    cols = {"Start (ns)": pa.int64(), "End (ns)": pa.int64(), "Name": pa.string(), "PID": pa.int64(), "TID": pa.int64()}
    note = None
    if PUSHPOP_MEMBER in names:
        try:
            data = _xz(z, PUSHPOP_MEMBER, limit)
            t = pacsv.read_csv(io.BytesIO(data), convert_options=pacsv.ConvertOptions(
                column_types=cols, include_columns=list(cols), strings_can_be_null=False))
            del data
            df = pl.from_arrow(t.rename_columns(["start", "end", "raw", "pid", "tid"]))
            df = df.filter(pl.col("start").is_not_null() & pl.col("raw").is_not_null())
            n = t.num_rows
        except (TraceError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError) as e:
            df, n = None, 0
            note = f"{PUSHPOP_MEMBER} not usable ({one_line(str(e))[:160]}): annotations are the ranges of {TRACE_MEMBER} only"
    else:
        df, n = None, 0
        note = f"archive has no {PUSHPOP_MEMBER}: annotations are the ranges of {TRACE_MEMBER} only (those that launched GPU work)"
    if df is None:
        df = named.filter(pl.col("ostart").is_not_null()).select(
            pl.col("ostart").alias("start"), (pl.col("ostart") + pl.col("odur")).alias("end"), "raw", "pid", "tid")
    df = df.with_columns(*_split_domain("name"))
    ann = df.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"), pl.lit("nvtx").alias("kind"), "domain", "name",
        pl.col("start").alias("start_ns"), pl.max_horizontal(pl.col("end").fill_null(pl.col("start")), pl.col("start")).alias("end_ns"),
        pl.lit(None, dtype=pl.Int32).alias("device"), pl.lit(None, dtype=pl.Int64).alias("stream"), "pid", "tid",
    ).sort("start_ns")
    return ann, n, note


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
    keys = {"RecipeJsonVersion": "nsys_recipe_json_version", "RecipeRuntimeVersion": "nsys_recipe_runtime_version"}
    return {out: str(doc[k]) for k, out in keys.items() if isinstance(doc.get(k), (str, int, float))}
