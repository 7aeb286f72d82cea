"""The analysis document's row fields (STEP_FIELDS, RANK_FIELDS), the conversion of metric rows
to its records (NaN and infinity become null: docs/analyze-json.md), the run summary
(hosts, GPUs, formats, tool versions) and how a run's NCCL logs were matched to its traced ranks
(nccl_matching), for pipeline/analyze_compute.py; also the steps and ranks frames
(step_frame, rank_frame) and the link peak of each collective (link_kind, nic_peak)."""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

from . import schema as sch

# per rank and step, all over the step's wall-clock window (views/25_step_window.sql), the window
# MFU, tokens/s and the verdict divide by; gpu_span_ns (first to last GPU work launched in the
# step) is a named extra, never a denominator
STEP_FIELDS = [
    "run_id",
    "rank",
    "step",
    "step_ns",
    "host_step_ns",
    "gpu_span_ns",
    "gpu_busy_ns",
    "gpu_idle_ns",
    "compute_ns",
    "comm_ns",
    "memcpy_ns",
    "overlap_ns",
    "comm_comp_overlap_pct",
    "exposed_comm_ns",
    "exposed_comm_wait_ns",
    "exposed_comm_transfer_ns",
    "exposed_memcpy_ns",
    "exposed_unknown_ns",
    "idle_input_ns",
    "idle_host_wait_ns",
    "idle_kernel_wait_ns",
    "idle_other_ns",
    "idle_unreliable_ns",
    "mfu_pct",
    "flop_coverage_pct",
    "peak_tflops",
    "tokens_per_s",
    "complete",
]
# per rank over the whole trace window (queries/breakdown.sql level 'rank': first to last GPU work)
RANK_FIELDS = [
    "run_id",
    "rank",
    "span_ns",
    "gpu_busy_ns",
    "gpu_idle_ns",
    "compute_ns",
    "comm_ns",
    "memcpy_ns",
    "overlap_ns",
    "comm_comp_overlap_pct",
    "exposed_comm_ns",
    "exposed_comm_wait_ns",
    "exposed_comm_transfer_ns",
    "exposed_memcpy_ns",
    "idle_host_wait_ns",
    "idle_kernel_wait_ns",
    "idle_other_ns",
    "idle_unreliable_ns",
    "mfu_pct",
    "flop_coverage_pct",
    "peak_tflops",
    "tokens_per_s",
]


def _clean(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v


def _records(df: pl.DataFrame) -> list[dict]:
    return [{k: _clean(v) for k, v in r.items()} for r in df.iter_rows(named=True)]


def _summary(s: pl.DataFrame, devices: pl.DataFrame, inputs: pl.DataFrame | None = None) -> dict:
    """Run summary from its sources rows and its devices rows: hosts, GPUs by name and tool
    versions (each key of sources.tool_versions with its distinct values) from s, the input
    formats from inputs (every file of the run, matched or not; default s)."""
    versions: dict[str, set] = {}
    for raw in s["tool_versions"].drop_nulls().to_list():
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict):
            for k, v in doc.items():
                if v is not None and not isinstance(v, (dict, list)):
                    versions.setdefault(str(k), set()).add(str(v))
    used = devices.filter(pl.col("used")) if devices.height else devices
    gpus = (
        (
            used.with_columns(name=pl.col("name").fill_null("(unnamed)"))
            .group_by("name")
            .agg(ranks=pl.col("rank").n_unique())
            .sort("name")
            .to_dicts()
        )
        if used.height
        else []
    )
    return {
        "hosts": sorted({str(h) for h in s["host"].drop_nulls().to_list() if h}),
        "gpus": [{"name": g["name"], "ranks": int(g["ranks"])} for g in gpus],
        "formats": sorted(
            {str(f) for f in (s if inputs is None else inputs)["format"].drop_nulls().to_list()}
        ),
        "tool_versions": {k: sorted(v) for k, v in sorted(versions.items())},
    }


def timeline_fields(run_id: str, findings: list[dict], doc: dict) -> None:
    """Give each finding of run_id its `timeline` (docs/analyze-json.md): {"id", "steps", "ranks",
    "command"}, the window `tracelake timeline --around ID` writes. id: the finding's kind, with
    "#2", "#3", ... for a kind repeated in the run. steps [lo, hi]: slow_steps: its slowest
    left-out step; any other: the run's worst step (the longest step time of any rank,
    doc["step_time"]) among the rows the verdict kept; null when the run has no steps (the whole
    run). ranks: null (every rank: the others are what a rank is compared with). A run without
    GPU work (NCCL logs only) has nothing to draw: its findings' timeline is null."""
    import shlex

    run = next((r for r in doc.get("runs", []) if r["run_id"] == run_id), None) or {}
    if not run.get("ranks_with_gpu_work"):
        for f in findings:
            f["timeline"] = None
        return

    v = next((x for x in doc.get("verdicts", []) if x["run_id"] == run_id), None) or {}
    excluded = v.get("excluded_steps") or []
    out_steps = {e["step"] for e in excluded if e.get("why") == "outlier"}
    out_rows = {(e.get("rank"), e["step"]) for e in excluded if e.get("why") != "outlier"}
    rows = [s for s in doc.get("step_time", []) if s["run_id"] == run_id and s.get("step_ns") is not None]
    kept = [s for s in rows if s["step"] not in out_steps and (s["rank"], s["step"]) not in out_rows] or rows
    worst = max(kept, key=lambda s: (s["step_ns"], -s["step"]))["step"] if kept else None
    seen: dict[str, int] = {}
    for f in findings:
        seen[f["kind"]] = seen.get(f["kind"], 0) + 1
        fid = f["kind"] + (f"#{seen[f['kind']]}" if seen[f["kind"]] > 1 else "")
        step = worst
        if f["kind"] == "slow_steps":
            outliers = [e for e in excluded if e.get("why") == "outlier" and e.get("step_ns") is not None]
            if outliers:
                step = max(outliers, key=lambda e: (e["step_ns"], -e["step"]))["step"]
        f["timeline"] = {
            "id": fid,
            "steps": None if step is None else [step, step],
            "ranks": None,
            "command": f"tracelake timeline --run {shlex.quote(run_id)} --around {shlex.quote(fid)} "
            f"-o {shlex.quote(f'timeline-{fid}.json.gz')}",
        }


def nccl_matching(s: pl.DataFrame, match: list[dict]) -> tuple[dict | None, pl.DataFrame]:
    """How the NCCL-family files of one run were matched to its traced ranks, and the sources rows
    the run summary reads. s: the run's sources rows; match: its nccl_log_match rows
    (queries/views/50_nccl.sql). When the run holds both traces and NCCL files: {"logs": [{file,
    source_id, ranks, matched_by}], "unmatched_logs": [file], "ranks_without_log": [rank]}, and the
    summary reads the traces' rows and those of the logs that matched a traced rank (a stray log's
    hosts and world size are not the run's); else None and every row."""
    is_log = pl.col("format").is_in(sch.NCCL_FORMATS)
    traces = s.filter(~is_log)
    traced = sorted(
        {int(x) for x in traces["rank"].drop_nulls().to_list()}
        | {int(x) for lst in traces["ranks"].drop_nulls().to_list() for x in lst}
    )
    if not traced or not match:
        return None, s
    logs = [
        {
            "file": m["file"],
            "source_id": m["source_id"],
            "ranks": sorted(m["ranks"] or []),
            "matched_by": m["matched_by"],
        }
        for m in sorted(match, key=lambda m: (m["file"] or "", m["source_id"]))
    ]
    with_log = {r for m in logs for r in m["ranks"]}
    doc = {
        "logs": logs,
        "unmatched_logs": [m["file"] for m in logs if not m["ranks"]],
        "ranks_without_log": [r for r in traced if r not in with_log],
    }
    matched = [m["source_id"] for m in logs if m["ranks"]]
    return doc, s.filter(~is_log | pl.col("source_id").is_in(matched))


def is_pytorch(con, run_id: str, formats: list[str]) -> bool:
    """Whether the run is a PyTorch program, so that advice may speak of PyTorch: a PyTorch profiler
    trace is one; an Nsight Systems export is one when its host recorded PyTorch's NVTX ranges
    (aten:: ops or ProfilerStep#N); a CUDA C/C++ or Fortran application is not (issue 39 item 10)."""
    if "kineto_json" in formats:
        return True
    if not any(f.startswith("nsys") for f in formats):
        return False
    return bool(
        con.execute(
            "SELECT count(*) FROM (SELECT 1 FROM cpu_ops WHERE run_id = ? AND (starts_with(name, 'aten::') "
            "OR starts_with(name, 'ProfilerStep#')) LIMIT 1)",
            [run_id],
        ).fetchall()[0][0]
    )


def step_frame(step_time: pl.DataFrame, mfu: pl.DataFrame) -> pl.DataFrame:
    """The document's `steps` rows (STEP_FIELDS): step_time.sql's rows (with step_status's
    complete) renamed for the document, the comm/compute overlap share and mfu.sql's per-step
    MFU and tokens/s, ordered by run, rank and step."""
    keys = ["run_id", "rank", "step"]
    return (
        step_time.rename(
            {"memory_ns": "memcpy_ns", "exposed_memory_ns": "exposed_memcpy_ns", "idle_ns": "gpu_idle_ns"}
        )
        .with_columns(
            comm_comp_overlap_pct=pl.when(pl.col("comm_ns") > 0).then(
                100.0 * pl.col("overlap_ns") / pl.col("comm_ns")
            )
        )
        .join(
            mfu.select(*keys, "mfu_pct", "flop_coverage_pct", "peak_tflops", "tokens_per_s"),
            on=keys,
            how="left",
        )
        .select(STEP_FIELDS)
        .sort(keys)
    )


def rank_frame(bd: pl.DataFrame, mfu: pl.DataFrame) -> pl.DataFrame:
    """The document's `ranks` rows (RANK_FIELDS): breakdown.sql's rank level, with whole-run MFU
    and tokens/s per rank (FLOPs, tokens and step time summed over the rank's steps; FLOP
    coverage weighted by compute time), ordered by run and rank."""
    base = bd.rename({"memory_ns": "memcpy_ns", "exposed_memory_ns": "exposed_memcpy_ns"})
    # whole-run MFU and tokens/s per rank: FLOPs, tokens and step time summed over the rank's steps
    mfu_rank = (
        mfu.filter(pl.col("mfu_pct").is_not_null() | pl.col("tokens_per_s").is_not_null())
        .group_by("run_id", "rank")
        .agg(
            model_flops=pl.col("model_flops").sum(),
            step_ns=pl.col("step_ns").sum(),
            peak=pl.col("peak_tflops").first(),
            tokens=(pl.col("tokens_per_s") * pl.col("step_ns") * 1e-9).sum(),
            has_mfu=pl.col("mfu_pct").is_not_null().any(),
            has_tok=pl.col("tokens_per_s").is_not_null().any(),
            cov_num=(pl.col("flop_coverage_pct") * pl.col("compute_kernel_ns")).sum(),
            cov_den=pl.col("compute_kernel_ns").sum(),
        )
        .with_columns(
            mfu_pct=pl.when(pl.col("has_mfu")).then(
                100 * pl.col("model_flops") / (pl.col("step_ns") * 1e-9 * pl.col("peak") * 1e12)
            ),
            tokens_per_s=pl.when(pl.col("has_tok")).then(pl.col("tokens") / (pl.col("step_ns") * 1e-9)),
            flop_coverage_pct=pl.when(pl.col("cov_den") > 0).then(pl.col("cov_num") / pl.col("cov_den")),
        )
        .select(
            "run_id",
            "rank",
            "mfu_pct",
            "flop_coverage_pct",
            pl.col("peak").alias("peak_tflops"),
            "tokens_per_s",
        )
    )
    return (
        base.filter(pl.col("level") == "rank")
        .drop("step")
        .join(mfu_rank, on=["run_id", "rank"], how="left")
        .select(RANK_FIELDS)
        .sort("run_id", "rank")
    )


def link_kind(coll: pl.DataFrame) -> pl.Expr:
    """ "nvlink" where the device catalog gives the collective's link peak, else null."""
    return (
        pl.when(pl.col("link_peak_gbps").is_not_null())
        .then(pl.lit("nvlink"))
        .otherwise(pl.lit(None, pl.String))
    )


def nic_peak(con, coll: pl.DataFrame) -> pl.DataFrame:
    """Collectives per rank with the NICs' rate as the link peak where the device catalog's NVLink
    peak does not apply (the group spans hosts) and the rank's NCCL log states its host's NICs
    (views/50_nccl.sql rank_line_rate; docs/nccl.md "Line rate"); link_kind says which peak."""
    from .query import frame  # planned once on a small lake

    rates = frame(con, "SELECT run_id, rank, nic_rate_gbps FROM rank_line_rate")
    if rates.height == 0:
        return coll.with_columns(link_kind=link_kind(coll))
    out = coll.join(rates, on=["run_id", "rank"], how="left")
    nic = pl.col("link_peak_gbps").is_null() & pl.col("nic_rate_gbps").is_not_null()
    return (
        out.with_columns(
            link_kind=pl.when(nic).then(pl.lit("nic")).otherwise(link_kind(out)),
            link_peak_gbps=pl.when(nic).then(pl.col("nic_rate_gbps")).otherwise(pl.col("link_peak_gbps")),
        )
        .with_columns(busbw_util_pct=100.0 * pl.col("busbw_gbps") / pl.col("link_peak_gbps"))
        .drop("nic_rate_gbps")
    )
