"""The verdict: is a run network-bound, host-bound, compute-bound or balanced?

Rules, on shares of the ranks' summed GPU span (span = first to last GPU activity per rank;
../shared/reference/peers.md section 4):
- exposed_comm_pct = 100 * sum(exposed_comm_ns) / sum(span_ns): communication not hidden under
  compute (exposed, not total, as XProf and TraceLens report it).
- host_wait_pct = 100 * sum(idle_host_wait_ns) / sum(span_ns): device idle time that ended
  with work launched only after the device had drained (HTA's host-wait rule applied to the
  device's idle intervals, queries/breakdown.sql).
- compute_pct = 100 * sum(compute_ns) / sum(span_ns).
Two levels, as XProf's input/collective analysis uses them (moderate >= 3 %, high >= 15 %;
xprof op_stats_to_input_pipeline_analysis.cc) with TraceLens's 5 % exposed-NCCL flag as the
moderate bar here (TraceLens Agent skills: "exposed NCCL > 5 % of total GPU time"):
  1. the larger of exposed_comm_pct and host_wait_pct >= 15 -> network-bound / host-bound, high;
  2. else compute_pct >= 80 (TraceLens: "computation > 80 % = efficient") -> compute-bound;
  3. else the larger of the two >= 5 -> network-bound / host-bound, moderate;
  4. else balanced.
No GPU work -> verdict "unknown" with the reason (abstain rather than guess).
"""

from __future__ import annotations

import polars as pl

HIGH_PCT = 15.0
MODERATE_PCT = 5.0
COMPUTE_BOUND_PCT = 80.0


def verdict_for_run(run_id: str, ranks: pl.DataFrame) -> dict:
    """ranks: the `ranks` rows of one run (analyze.py). Returns verdict, confidence, numbers, reason."""
    if ranks.height == 0 or ranks["span_ns"].sum() == 0:
        return {"run_id": run_id, "verdict": "unknown", "confidence": None,
                "reason": "no GPU activity in the traces: nothing to attribute", "numbers": {}}
    span = float(ranks["span_ns"].sum())
    idle = float(ranks["gpu_idle_ns"].sum())
    numbers = {
        "exposed_comm_pct": 100 * float(ranks["exposed_comm_ns"].sum()) / span,
        "host_wait_pct": 100 * float(ranks["idle_host_wait_ns"].sum()) / span,
        "compute_pct": 100 * float(ranks["compute_ns"].sum()) / span,
        "gpu_idle_pct": 100 * idle / span,
        "exposed_memcpy_pct": 100 * float(ranks["exposed_memcpy_ns"].sum()) / span,
    }
    net, host = numbers["exposed_comm_pct"], numbers["host_wait_pct"]
    top_name, top_val = ("network-bound", net) if net >= host else ("host-bound", host)
    if top_val >= HIGH_PCT:
        v, conf = top_name, "high"
    elif numbers["compute_pct"] >= COMPUTE_BOUND_PCT:
        v, conf = "compute-bound", "high"
    elif top_val >= MODERATE_PCT:
        v, conf = top_name, "moderate"
    else:
        v, conf = "balanced", "moderate"
    reason = {
        "network-bound": f"{net:.1f}% of GPU time is communication not hidden under compute",
        "host-bound": f"{host:.1f}% of GPU time is idle waiting for the host to launch work",
        "compute-bound": f"compute kernels cover {numbers['compute_pct']:.1f}% of GPU time",
        "balanced": f"no single cause exceeds {MODERATE_PCT:.0f}% of GPU time (exposed comm {net:.1f}%, host wait {host:.1f}%)",
    }[v]
    return {"run_id": run_id, "verdict": v, "confidence": conf, "reason": reason, "numbers": numbers}
