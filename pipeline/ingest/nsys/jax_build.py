"""Building the lake tables of an nsys-jax archive (mapping in .jax): the work ranges of the
projection trace and their devices, gpu_activities, cpu_ops, collectives, steps, annotations and
devices, and the JaxArchive that holds them. _build runs these steps in order."""

from __future__ import annotations

import io

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv

from ... import catalog
from ... import classify as classify_mod
from ...lake import one_line
from ..errors import TraceError
from .export import _DEVICE_SCHEMA, _STEP_SCHEMA, JaxArchive
from .jax_read import (
    PUSHPOP_MEMBER,
    RANK_SOURCE,
    RECIPE,
    TRACE_MEMBER,
    _devices,
    _launcher_devices,
    _parquet,
    _recipe_versions,
    _system_env,
    _xz,
)

# trace.parquet columns read (classic layout, nsys <= 2024.4 recipe) -> internal names
_TRACE_COLS = {
    "Name": "raw",
    "Projected Start": "pstart",
    "Projected Duration": "pdur",
    "Orig Start": "ostart",
    "Orig Duration": "odur",
    "PID": "pid",
    "TID": "tid",
    "NumGPUOps": "nops",
    "NumChild": "nchild",
    "RangeId": "rid",
    "ParentId": "parent",
}
_ALT_LAYOUT = {"Text", "Start", "End", "Range ID"}
_HLO_OPCODE = r"hlo_op=([A-Za-z-]+?)(?:-start|-done)?(?:\.\d+)?[#,]"
_MSG_NOTE = "message size not decoded: it is in the archive's XLA HLO protos (dump/*.pb.xz)"
_NESTED_IN = ("XlaModule:", "XlaCompile", "XlaAutotuner")


def _build(z, names, limit, file_rank, cli_rank, comm_patterns) -> JaxArchive:
    notes: list[str] = []
    df, event_count = _trace(z, limit)
    devices, dev_notes = _devices(z, names, limit)
    notes += dev_notes
    rank, rsrc = _rank(devices, file_rank, cli_rank, notes)
    named, work = _work_ranges(df, notes)
    work = _work_devices(z, names, limit, work, devices, notes)

    # ---- classification (pipeline/catalog/classification.toml via pipeline.classify)
    work = classify_mod.classify(
        work.with_columns(
            kind=pl.lit("kernel"),
            name=pl.col("text"),
            external_id=pl.lit(None, dtype=pl.Int64),
            has_comm_args=pl.lit(False),
        ),
        None,
        comm_patterns,
    )
    gpu, launches = _gpu_and_launches(work, rank)
    if work.height:
        notes.append(
            "GPU work = projected GPU intervals of the innermost NVTX ranges that launched it (XLA thunks; "
            "first..last GPU operation of each, stream unknown); cpu_ops 'runtime' rows are those ranges on "
            "the host (the archive has no CUDA API calls): launch times are range starts, at or before the "
            "real launch"
        )
    colls = _collectives(work, rank)

    # ---- steps
    steps, step_note = _steps(named, rank)
    notes.append(step_note)

    # ---- annotations
    ann, n_pushpop, ann_note = _annotations(z, names, limit, named, rank)
    event_count += n_pushpop
    if ann_note:
        notes.append(ann_note)

    host, versions = _host_versions(z, names, limit)
    dev_rows = _device_rows(devices, gpu, rank, host)

    notes.append(
        "times are ns relative to this process's capture start: the archive holds no session start time "
        "(base_time_ns NULL), so clocks of different archives are not comparable: cross-rank start order "
        "(straggler_rank, arrival_spread_ns) is meaningless across them; durations, transfer_ns and wait_ns "
        "are not affected"
    )
    if rsrc == RANK_SOURCE:
        notes.append(
            f"rank {rank} is XLA's process index in the NVTX CUDA device name (Xla:#...,process={rank},...#)"
        )

    starts = [s for s in (gpu["start_ns"].min(), launches["start_ns"].min()) if s is not None]
    ends = [e for e in (gpu["end_ns"].max(), launches["end_ns"].max()) if e is not None]
    pids = set(named["pid"].drop_nulls().unique().to_list()) or {0}
    return JaxArchive(
        format="nsys_jax",
        ranks={int(p): rank for p in pids},
        rank_source=rsrc,
        host=host,
        tool_versions=versions,
        base_time_ns=None,
        event_count=event_count,
        trace_start_ns=min(starts) if starts else None,
        trace_end_ns=max(ends) if ends else None,
        notes=notes,
        _tables={
            "gpu_activities": gpu,
            "cpu_ops": launches,
            "collectives": colls,
            "steps": steps,
            "annotations": ann,
            "devices": dev_rows,
        },
    )


def _trace(z, limit) -> tuple[pl.DataFrame, int]:
    """The projection trace as a frame (_trace_frame) and its row count; TraceError for a layout
    tracelake does not read."""
    raw = _parquet(z, TRACE_MEMBER, limit)
    have = set(raw.column_names)
    missing = [c for c in _TRACE_COLS if c not in have]
    if missing and _ALT_LAYOUT <= have:
        raise TraceError(
            f"{TRACE_MEMBER} is in the newer recipe layout (Text, Start, End; no CPU times or GPU-op "
            "counts), which tracelake does not read yet"
        )
    if missing:
        raise TraceError(f"{TRACE_MEMBER} lacks columns {missing}")
    return _trace_frame(raw), raw.num_rows


def _rank(devices: list[dict], file_rank, cli_rank, notes: list[str]) -> tuple[int, str]:
    """(rank, rank_source): XLA's process index when the devices name exactly one, else the file
    name, --rank, 0."""
    processes = {d["process"] for d in devices if d["process"] is not None}
    if len(processes) == 1:
        return processes.pop(), RANK_SOURCE
    if len(processes) > 1:
        notes.append(
            f"device-metadata names GPUs of several XLA processes {sorted(processes)}: rank not taken from it"
        )
    if file_rank is not None:
        return file_rank, "file_name"
    if cli_rank is not None:
        return cli_rank, "cli"
    return 0, "default"


def _work_ranges(df: pl.DataFrame, notes: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(named ranges, work ranges): work ranges are the innermost ranges that launched GPU work,
    NCCL API ranges folded into their parent (comm_launch: the range holds one)."""
    named = df.filter(pl.col("raw").is_not_null() & pl.col("rid").is_not_null())
    folded = (pl.col("domain") == "NCCL") & pl.col("parent").is_not_null()
    cand = named.filter(~folded)
    cand_parents = cand["parent"].drop_nulls().unique().implode()
    nccl_parents = named.filter(folded)["parent"].unique().implode()
    work = cand.filter(~pl.col("rid").is_in(cand_parents)).with_columns(
        comm_launch=pl.col("rid").is_in(nccl_parents)
    )
    if work.height == 0:
        raise TraceError(
            f"no NVTX range of {TRACE_MEMBER} launched GPU work (profiled without NVTX or CUDA tracing?)"
        )
    child_ops = cand.group_by("parent").agg(child_ops=pl.col("nops").sum())
    inner = cand.filter(pl.col("rid").is_in(cand_parents)).join(
        child_ops, left_on="rid", right_on="parent", how="left"
    )
    self_ops = int(
        inner.select((pl.col("nops") - pl.col("child_ops").fill_null(0)).clip(lower_bound=0).sum()).item()
        or 0
    )
    outside = int(df.filter(pl.col("raw").is_null())["nops"].fill_null(0).sum() or 0)
    total_ops = int(named.filter(pl.col("parent").is_null())["nops"].fill_null(0).sum() or 0) + outside
    if outside:
        notes.append(
            f"{outside} of {total_ops} GPU operations were launched outside any NVTX range; the projection "
            "keeps only their overall span, so they are not in gpu_activities"
        )
    if self_ops:
        notes.append(
            f"{self_ops} of {total_ops} GPU operations were launched by an enclosing range (XlaModule, "
            "compilation, autotuning) outside its child ranges; the projection has no times for them, so "
            "they are not in gpu_activities"
        )
    return named, work


def _work_devices(z, names, limit, work: pl.DataFrame, devices: list[dict], notes: list[str]) -> pl.DataFrame:
    """Column device of each work range: the process's one GPU, else its launcher thread's GPU."""
    used_dev = [d["device"] for d in devices if d["xla_name"]] or [d["device"] for d in devices]
    if len(used_dev) == 1:
        return work.with_columns(device=pl.lit(used_dev[0], dtype=pl.Int32))
    if not devices:
        return work.with_columns(device=pl.lit(None, dtype=pl.Int32))
    thread_dev = _launcher_devices(z, names, limit, devices)
    work = (
        work.join(thread_dev, on=["pid", "tid"], how="left")
        if thread_dev.height
        else work.with_columns(device=pl.lit(None, dtype=pl.Int32))
    )
    unmapped = work["device"].null_count()
    if unmapped:
        notes.append(
            f"the process drove {len(devices)} GPUs and {unmapped} GPU work ranges ran on threads without "
            "an XlaLauncher device name: their device is unknown (NULL)"
        )
    return work


def _gpu_and_launches(work: pl.DataFrame, rank: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """gpu_activities (projected GPU intervals) and cpu_ops (the same ranges on the host) of the
    classified work ranges."""
    gpu = work.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        "device",
        pl.lit(None, dtype=pl.Int64).alias("stream"),
        "kind",
        "category",
        "classified_by",
        "name",
        pl.col("pstart").alias("start_ns"),
        (pl.col("pstart") + pl.col("pdur")).alias("end_ns"),
        pl.col("pdur").alias("dur_ns"),
        pl.col("rid").alias("correlation"),
        "pid",
        pl.lit(None, dtype=pl.Int64).alias("tid"),
        "event_index",
    ).sort("start_ns", "event_index")
    launches = (
        work.filter(pl.col("ostart").is_not_null())
        .select(
            pl.lit(rank, dtype=pl.Int32).alias("rank"),
            "pid",
            "tid",
            pl.lit("runtime").alias("kind"),
            pl.lit(RECIPE).alias("category"),
            pl.col("text").alias("name"),
            pl.col("ostart").alias("start_ns"),
            (pl.col("ostart") + pl.col("odur")).alias("end_ns"),
            pl.col("odur").alias("dur_ns"),
            pl.col("rid").alias("correlation"),
            "event_index",
        )
        .sort("start_ns", "event_index")
    )
    return gpu, launches


def _collectives(work: pl.DataFrame, rank: int) -> pl.DataFrame:
    """One collectives row per communication work range that is not a '-done' thunk."""
    comm = work.filter(
        (pl.col("category") == "communication") & ~pl.col("text").str.contains(r"hlo_op=[^#,]*-done[.#,]")
    )
    opcode = comm["text"].str.extract(_HLO_OPCODE, 1)
    return comm.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.Series(
            "op", [catalog.normalize_op(o or t) for o, t in zip(opcode, comm["text"])], dtype=pl.String
        ),
        pl.col("text").alias("op_raw"),
        pl.col("pstart").alias("start_ns"),
        (pl.col("pstart") + pl.col("pdur")).alias("end_ns"),
        pl.col("pdur").alias("dur_ns"),
        pl.lit("gpu_kernel").alias("timing_source"),
        "device",
        pl.lit(None, dtype=pl.Int64).alias("stream"),
        pl.col("rid").alias("correlation"),
        pl.lit(None, dtype=pl.Int64).alias("msg_bytes"),
        pl.lit(_MSG_NOTE).alias("msg_bytes_note"),
    ).sort("start_ns", "correlation")


def _host_versions(z, names, limit) -> tuple[str | None, dict]:
    """Host name and versions (allow-listed system environment names, recipe versions)."""
    env = _system_env(z, names, limit)
    host = env.get("Hostname") or None
    versions = {"nsys_recipe": RECIPE, **_recipe_versions(z, names, limit)}
    versions.update(
        {
            k: v
            for k, v in (
                ("nvidia_driver_version", env.get("NvDriverVersion")),
                ("cuda_driver_version", env.get("CudaDriverVersion")),
            )
            if v
        }
    )
    return host, versions


def _device_rows(devices: list[dict], gpu: pl.DataFrame, rank: int, host: str | None) -> pl.DataFrame:
    used = set(gpu["device"].drop_nulls().unique().to_list())
    return pl.DataFrame(
        [
            {k: v for k, v in d.items() if k not in ("process", "xla_name")}
            | {"rank": rank, "host": host, "vendor": "nvidia", "used": d["device"] in used}
            for d in devices
        ],
        schema=_DEVICE_SCHEMA,
    )


def _trace_frame(raw: pa.Table) -> pl.DataFrame:
    """trace.parquet -> frame with internal names, int64 times (Orig times are stored as doubles
    holding integers), domain and text split at the first ':' (the recipe writes
    '<domain name>:<text>', an empty domain for the default one)."""
    df = pl.from_arrow(raw.select(list(_TRACE_COLS)).rename_columns(list(_TRACE_COLS.values())))
    ints = ["pstart", "pdur", "ostart", "odur", "pid", "tid", "nops", "nchild", "rid", "parent"]
    df = df.with_columns(
        [pl.col(c).cast(pl.Int64, strict=False) for c in ints] + [pl.col("raw").cast(pl.String)]
    )
    df = df.with_row_index("event_index")
    df = df.with_columns(
        pl.col("event_index").cast(pl.Int64),
        pl.col("pdur").clip(lower_bound=0),
        pl.col("odur").clip(lower_bound=0),
        *_split_domain("text"),
    )
    return df.filter(pl.col("pstart").is_not_null() | pl.col("raw").is_null())


def _split_domain(text_alias: str) -> list[pl.Expr]:
    """'<domain>:<text>' -> domain (NULL when empty: NVTX's default domain) and text."""
    dom = pl.col("raw").str.extract(r"^([^:]*):", 1)
    return [
        pl.when(dom != "").then(dom).alias("domain"),
        pl.when(pl.col("raw").str.contains(":", literal=True))
        .then(pl.col("raw").str.replace(r"^[^:]*:", ""))
        .otherwise(pl.col("raw"))
        .alias(text_alias),
    ]


def _steps(named: pl.DataFrame, rank: int) -> tuple[pl.DataFrame, str]:
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
    best = (
        mods.group_by("text")
        .agg(n=pl.len(), gpu_ns=pl.col("pdur").sum())
        .filter(pl.col("n") >= 2)
        .sort(["gpu_ns", "n", "text"], descending=[True, True, False])
    )
    if best.height == 0:
        return pl.DataFrame(
            schema=_STEP_SCHEMA
        ), "no XlaModule outside compilation ran twice or more: no steps"
    name = best["text"][0]
    ex = mods.filter(pl.col("text") == name)
    tids = ex.group_by("tid").agg(n=pl.len()).sort(["n", "tid"], descending=[True, False])
    if tids.height > 1:  # one execution per launcher thread when a process drives several GPUs
        ex = ex.filter(pl.col("tid") == tids["tid"][0])
    ex = ex.sort("ostart", "event_index")
    steps = ex.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("step"),
        pl.col("text").alias("name"),
        pl.col("ostart").alias("start_ns"),
        (pl.col("ostart") + pl.col("odur")).alias("end_ns"),
        pl.col("odur").alias("dur_ns"),
        pl.lit("nvtx").alias("source"),
        "pid",
        "tid",
    )
    others = best.height - 1
    return steps, (
        f"steps: the {steps.height} executions of {name} (the XlaModule outside compilation with the most "
        f"projected GPU time among those run twice or more; {others} other such module(s)); step windows "
        "are its host-side range, numbered from 0"
    )


def _annotations(z, names, limit, named: pl.DataFrame, rank: int) -> tuple[pl.DataFrame, int, str | None]:
    cols = {
        "Start (ns)": pa.int64(),
        "End (ns)": pa.int64(),
        "Name": pa.string(),
        "PID": pa.int64(),
        "TID": pa.int64(),
    }
    note = None
    if PUSHPOP_MEMBER in names:
        try:
            data = _xz(z, PUSHPOP_MEMBER, limit)
            t = pacsv.read_csv(
                io.BytesIO(data),
                convert_options=pacsv.ConvertOptions(
                    column_types=cols, include_columns=list(cols), strings_can_be_null=False
                ),
            )
            del data
            df = pl.from_arrow(t.rename_columns(["start", "end", "raw", "pid", "tid"]))
            df = df.filter(pl.col("start").is_not_null() & pl.col("raw").is_not_null())
            n = t.num_rows
        except (TraceError, pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError) as e:
            df, n = None, 0
            note = (
                f"{PUSHPOP_MEMBER} not usable ({one_line(str(e))[:160]}): "
                f"annotations are the ranges of {TRACE_MEMBER} only"
            )
    else:
        df, n = None, 0
        note = (
            f"archive has no {PUSHPOP_MEMBER}: annotations are the ranges of {TRACE_MEMBER} only "
            "(those that launched GPU work)"
        )
    if df is None:
        df = named.filter(pl.col("ostart").is_not_null()).select(
            pl.col("ostart").alias("start"),
            (pl.col("ostart") + pl.col("odur")).alias("end"),
            "raw",
            "pid",
            "tid",
        )
    df = df.with_columns(*_split_domain("name"))
    ann = df.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.lit("nvtx").alias("kind"),
        "domain",
        "name",
        pl.col("start").alias("start_ns"),
        pl.max_horizontal(pl.col("end").fill_null(pl.col("start")), pl.col("start")).alias("end_ns"),
        pl.lit(None, dtype=pl.Int32).alias("device"),
        pl.lit(None, dtype=pl.Int64).alias("stream"),
        "pid",
        "tid",
    ).sort("start_ns")
    return ann, n, note
