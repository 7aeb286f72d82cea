"""What the waste costs (issue 17, point 5): each finding's recoverable time as GPU-hours per
1,000 steps at the run's world size, and as money with a price per GPU-hour; energy per step and
per token where the lake holds power counters (queries/energy.sql).

GPU-hours per 1,000 steps = per-step recoverable time (s) x 1,000 x world size / 3,600: a
finding's recoverable time is what one rank could win (pipeline/diagnosis/findings.py), and
every rank of a synchronous job waits for the slowest, so the job's GPUs all get that time back.
The per-step time is the finding's per_step_ns; a finding without one gets None: untimed, timed
over a trace without steps, or timed over the profiled window as a whole (slow_steps: how often
a slow step such as a warm-up comes in the whole run is not known from the window; dividing its
excess by the profiled steps would price a one-off JIT compilation as if it came every N steps).
world size: the run's world_size, else the ranks traced.
cost_per_1000_steps = gpu_hours_per_1000_steps x gpu_hour_cost (any currency, as given), only
when a cost is given.

energy(run_id, rows, tokens) -> dict or None: over the run's rank-steps with power samples
(energy.sql): energy_j_per_step (median over rank-steps, per GPU), mean_power_w (median),
covered_pct (median share of the step window the samples cover) and, when tokens per step are
known, energy_j_per_token = energy per GPU and step / tokens per GPU and step.
"""

from __future__ import annotations

import math
import statistics

NS_PER_HOUR = 3.6e12


def annotate(findings: list[dict], run: dict, gpu_hour_cost: float | None) -> None:
    """Add gpu_hours_per_1000_steps and cost_per_1000_steps to each finding of `run` in place."""
    world = run.get("world_size") or len(run.get("ranks") or []) or None
    for f in findings:
        per_step = f.get("per_step_ns")
        hours = per_step * 1000 * world / NS_PER_HOUR if per_step is not None and world else None
        money = hours * gpu_hour_cost if hours is not None and gpu_hour_cost else None
        f["gpu_hours_per_1000_steps"] = hours
        f["cost_per_1000_steps"] = money if money is None or math.isfinite(money) else None


def energy(run_id: str, rows: list[dict], tokens_per_step: float | None) -> dict | None:
    rs = [r for r in rows if r["run_id"] == run_id and r["energy_j"] is not None]
    if not rs:
        return None
    per_step = statistics.median(r["energy_j"] for r in rs)
    return {
        "run_id": run_id,
        "series": sorted({r["series"] for r in rs}),
        "rank_steps": len(rs),
        "energy_j_per_step": per_step,
        "mean_power_w": statistics.median(r["mean_power_w"] for r in rs),
        "covered_pct": statistics.median(r["covered_pct"] for r in rs),
        "energy_j_per_token": per_step / tokens_per_step if tokens_per_step else None,
    }
