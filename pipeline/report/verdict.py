"""The verdict: is a run network-bound, host-bound, compute-bound or balanced?

Shares of the ranks' summed GPU span (span = first to last GPU activity of a rank;
../shared/reference/peers.md section 4):
- exposed_comm_pct = 100 * sum(exposed_comm_ns) / sum(span_ns): communication not hidden under
  compute (exposed, not total, as XProf and TraceLens report it).
- gpu_idle_pct = 100 * sum(gpu_idle_ns) / sum(span_ns): no GPU work at all, so the GPU waits for
  the host (late launches, synchronizations, data loading). Its split by cause (host wait,
  kernel wait, other; queries/breakdown.sql) goes into the reason.
- compute_pct = 100 * sum(compute_ns) / sum(span_ns).
- unknown_pct = GPU time of unknown kind (e.g. CUPTI range-profiler events), not hidden by others.
Two levels, as XProf's step-time analysis uses them (moderate >= 3 %, high >= 15 %;
xprof op_stats_to_input_pipeline_analysis.cc), with TraceLens's 5 % exposed-NCCL flag as the
moderate bar (TraceLens Agent skills), and torch-tb-profiler's "GPU utilization" reading:
  0. unknown_pct >= 50 -> "unknown": the trace's GPU events cannot be classified (abstain);
  1. the larger of exposed_comm_pct and gpu_idle_pct >= 15 -> network-bound / host-bound, high;
  2. else compute_pct >= 80 (TraceLens: "computation > 80 % = efficient") -> compute-bound, high;
  3. else the larger of the two >= 5 -> network-bound / host-bound, moderate;
  4. else balanced, moderate.
Confidence drops to "low" when the evidence is thin: less than 1 ms of GPU span per rank on
average (a handful of kernels says little about a training run).
No GPU work -> verdict "unknown" with the reason (abstain rather than guess).
"""

from __future__ import annotations

import polars as pl

HIGH_PCT = 15.0
MODERATE_PCT = 5.0
COMPUTE_BOUND_PCT = 80.0
UNKNOWN_PCT = 50.0
THIN_SPAN_NS = 1_000_000

LABELS = {
    "exposed_comm_pct": "exposed communication",
    "gpu_idle_pct": "GPU idle",
    "host_wait_pct": "GPU idle: host launched late",
    "compute_pct": "compute",
    "exposed_memcpy_pct": "exposed memory copies",
    "unknown_pct": "GPU work of unknown kind",
}


def verdict_for_run(run_id: str, ranks: pl.DataFrame) -> dict:
    """ranks: the `ranks` rows of one run (analyze.py). Returns verdict, confidence, numbers, reason."""
    if ranks.height == 0 or ranks["span_ns"].sum() == 0:
        return {"run_id": run_id, "verdict": "unknown", "confidence": None,
                "reason": "no GPU activity in the traces: nothing to attribute", "numbers": {}}
    span = float(ranks["span_ns"].sum())

    def pct(col: str) -> float:
        return 100 * float(ranks[col].sum()) / span

    unknown = span - float(ranks["compute_ns"].sum() + ranks["exposed_comm_ns"].sum() + ranks["exposed_memcpy_ns"].sum()
                           + ranks["gpu_idle_ns"].sum())
    numbers = {
        "exposed_comm_pct": pct("exposed_comm_ns"),
        "gpu_idle_pct": pct("gpu_idle_ns"),
        "host_wait_pct": pct("idle_host_wait_ns"),
        "compute_pct": pct("compute_ns"),
        "exposed_memcpy_pct": pct("exposed_memcpy_ns"),
        "unknown_pct": 100 * unknown / span,
    }
    net, idle = numbers["exposed_comm_pct"], numbers["gpu_idle_pct"]
    top_name, top_val = ("network-bound", net) if net >= idle else ("host-bound", idle)
    if numbers["unknown_pct"] >= UNKNOWN_PCT:
        v, conf = "unknown", None
    elif top_val >= HIGH_PCT:
        v, conf = top_name, "high"
    elif numbers["compute_pct"] >= COMPUTE_BOUND_PCT:
        v, conf = "compute-bound", "high"
    elif top_val >= MODERATE_PCT:
        v, conf = top_name, "moderate"
    else:
        v, conf = "balanced", "moderate"
    if conf and span / ranks.height < THIN_SPAN_NS:
        conf = "low"
    split = (f"host launched late {numbers['host_wait_pct']:.1f}%, launch gaps {pct('idle_kernel_wait_ns'):.1f}%, "
             f"other waits {pct('idle_other_ns'):.1f}%")
    reason = {
        "network-bound": f"{net:.1f}% of GPU time is communication not hidden under compute",
        "host-bound": f"the GPU is idle {idle:.1f}% of its span, waiting for the host ({split})",
        "compute-bound": f"compute kernels cover {numbers['compute_pct']:.1f}% of GPU time",
        "balanced": f"no single cause exceeds {MODERATE_PCT:.0f}% of GPU time (exposed communication {net:.1f}%, idle {idle:.1f}%)",
        "unknown": f"{numbers['unknown_pct']:.1f}% of GPU time is of a kind tracelake cannot classify (e.g. CUPTI range-profiler events)",
    }[v]
    if conf == "low":
        reason += f"; low confidence: only {span / ranks.height / 1e6:.3f} ms of GPU time per rank"
    return {"run_id": run_id, "verdict": v, "confidence": conf, "reason": reason, "numbers": numbers}
