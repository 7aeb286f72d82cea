"""The step's phases (forward, backward, optimizer: queries/phases.sql): the note for steps whose
phases cannot be told, and the findings that compare phases (issue 17, point 2).

Findings, in the shape of pipeline/diagnosis/findings.py, each over the steps the run's verdict
analyses (its kept rows) and untimed (recoverable_ns None): the time they name is already
claimed by the timed findings (exposed communication, waiting for peers) or is compute, so
crediting it again would count an instant twice.
- comm_over_forward: the step's exposed communication transfer (step_time's) is longer than its
  forward compute (the typical failure of data-parallel training named "the all-reduce takes longer than
  the forward pass"), with the phase that launched it. Transfer only: exposed time spent waiting
  for a late peer is the straggler finding's, not the network's (queries/step_time.sql split);
- backward_forward_ratio: backward compute above BWD_FWD_HIGH times forward compute. Backward
  costs about twice the forward (it computes the gradients of both the inputs and the weights:
  PaLM appendix B's 6N FLOPs per token = 2N forward + 4N backward; DeepSpeed's Flops Profiler
  estimates backward as 2x forward), about 3x with activation checkpointing (one forward is
  recomputed inside backward); above 2.5 points at recomputation or a slow backward kernel;
- optimizer_share: the optimizer's share of the step window at least OPTIMIZER_PCT, with its
  kernel count (an unfused optimizer launches a few kernels per parameter tensor).
Every finding needs the phases of at least one analysed step; steps without them are named in
the note (phase_note) and give none.
"""

from __future__ import annotations

import statistics

from .steady import kept_rows
from .verdict import MODERATE_PCT

BWD_FWD_HIGH = 2.5  # expected ~2 (PaLM appendix B), ~3 with activation checkpointing: module doc
OPTIMIZER_PCT = 2 * MODERATE_PCT  # tracelake's bar: twice the verdict's moderate share (10 %)


def _ms(ns) -> str:
    return f"{ns / 1e6:,.3f} ms"


def phase_note(run_id: str, phases: list[dict], step_time: list[dict]) -> str | None:
    """The note naming the steps of a run that have no phases (no autograd backward op in their
    host window: views/70_phases.sql), or None when every step has them."""
    have = {(r["rank"], r["step"]) for r in phases if r["run_id"] == run_id}
    missing = sorted(
        (s["rank"], s["step"])
        for s in step_time
        if s["run_id"] == run_id and (s["rank"], s["step"]) not in have
    )
    if not missing:
        return None
    shown = ", ".join(f"rank {r} step {s}" for r, s in missing[:5]) + (" ..." if len(missing) > 5 else "")
    return (
        f"run {run_id}: forward / backward / optimizer phases not available for {len(missing)} step(s) "
        f"({shown}): no autograd::engine::evaluate_function op in the step (an inference or "
        "evaluation step, or a capture without CPU ops), so forward and backward cannot be told apart"
    )


def findings(run_id: str, result: dict) -> list[dict]:
    """Phase findings for one run of an analysis (pipeline.analyze.analyze result, with its
    `phases`, `step_time` and `verdicts`), in the order of the module doc."""
    v = next((x for x in result["verdicts"] if x["run_id"] == run_id), None)
    if v is None or v["basis"] != "steps":
        return []
    rows = kept_rows([s for s in result["step_time"] if s["run_id"] == run_id], v)
    kept = {(r["rank"], r["step"]) for r in rows}
    by_step: dict[tuple, dict[str, dict]] = {}
    for r in result.get("phases", []):
        if r["run_id"] == run_id and (r["rank"], r["step"]) in kept:
            by_step.setdefault((r["rank"], r["step"]), {})[r["phase"]] = r
    if not by_step:
        return []
    steps = list(by_step.values())
    over = (
        f"median per step over {len({k[1] for k in by_step})} analysed step(s) of "
        f"{len({k[0] for k in by_step})} rank(s)"
    )
    q = run_id.replace("'", "''")
    sql = (
        "SELECT rank, step, phase, phase_ns, phase_pct, activities, compute_ns, comm_ns, exposed_comm_ns, "
        f"exposed_comm_wait_ns, exposed_comm_transfer_ns, idle_ns FROM phases WHERE run_id = '{q}' "
        "ORDER BY rank, step, phase"
    )

    def med(phase: str, col: str) -> float:
        return statistics.median(s[phase][col] for s in steps)

    step_ns = statistics.median(s["forward"]["step_ns"] for s in steps)
    out = []
    fwd_c, bwd_c = med("forward", "compute_ns"), med("backward", "compute_ns")
    phases = ("forward", "backward", "optimizer", "other")
    transfer = {p: med(p, "exposed_comm_transfer_ns") for p in phases}
    # the step's own exposed transfer and waiting (step_time): the phases' can overlap (two
    # phases' collectives exposed at the same instant count in both), so their sum would overstate it
    st = {(r["rank"], r["step"]): r for r in rows if (r["rank"], r["step"]) in by_step}
    total = statistics.median(r["exposed_comm_transfer_ns"] for r in st.values())
    waiting = statistics.median(r["exposed_comm_wait_ns"] for r in st.values())
    if total > fwd_c and total >= MODERATE_PCT / 100 * step_ns:
        # no collective matched on two or more ranks (one rank traced): the verdict's split of
        # exposed communication into transfer and waiting is unknown, and all of it is in the
        # transfer columns, so the finding says exposed communication and no 0 ms of waiting
        split = v["numbers"].get("exposed_comm_transfer_pct") is not None
        worst = max(transfer, key=transfer.get)
        by = ", ".join(f"{p} {_ms(ns)}" for p, ns in transfer.items() if ns > 0)
        advice = {
            "backward": "The exposed transfer is launched in backward (DDP's gradient all-reduce, "
            "FSDP's reduce-scatter): let it overlap the backward compute (DDP bucket_cap_mb sized so "
            "the first buckets are ready early, gradient_as_bucket_view, static_graph; FSDP "
            "backward_prefetch), send less (bf16 gradient compression hooks), or give each rank "
            "more compute per step (a larger per-GPU batch) so the same traffic hides behind it.",
            "forward": "The exposed transfer is launched in forward (FSDP's parameter all-gathers, "
            "model-parallel all-to-alls): prefetch it (FSDP forward_prefetch, limit_all_gathers), shard "
            "in larger units, or overlap the all-to-all with dense compute (embedding pipelining).",
        }.get(
            worst,
            "The exposed transfer is launched outside forward and backward: move it off the "
            "critical path (asynchronous metric reductions, fewer barriers) or overlap it with compute.",
        )
        if not split:
            advice += (
                " Part of it may be waiting for a late peer rather than transfer: trace every rank of "
                "the job to tell them apart before tuning communication."
            )
        what = "exposed transfer" if split else "exposed communication"
        out.append(
            {
                "kind": "comm_over_forward",
                "title": "Exposed communication transfer takes longer than the forward pass"
                if split
                else "Exposed communication takes longer than the forward pass",
                "recoverable_ns": None,
                "per_step_ns": None,
                "evidence": [
                    f"{over}: {what} {_ms(total)} against forward compute {_ms(fwd_c)} (step {_ms(step_ns)}; "
                    + (
                        f"exposed waiting for peers, not counted here: {_ms(waiting)})"
                        if split
                        else "whether it is transfer or waiting for peers is unknown: no collective was "
                        "matched on two or more ranks)"
                    ),
                    f"{what} launched in (phases can overlap): {by}",
                ],
                "recommendation": advice,
                "sql": sql,
            }
        )
    if fwd_c > 0 and bwd_c / fwd_c > BWD_FWD_HIGH:
        out.append(
            {
                "kind": "backward_forward_ratio",
                "title": f"Backward compute is {bwd_c / fwd_c:.1f}x the forward's (about 2x expected)",
                "recoverable_ns": None,
                "per_step_ns": None,
                "evidence": [
                    f"{over}: backward compute {_ms(bwd_c)}, forward compute {_ms(fwd_c)}",
                    "backward is about 2x forward (gradients of inputs and weights: PaLM appendix B), "
                    "about 3x with activation checkpointing",
                ],
                "recommendation": "Check for recomputation (activation checkpointing recomputes one forward "
                "inside backward: worth it only when memory requires it; checkpoint fewer layers) and for "
                "slow backward kernels in top kernels (embedding or index backward with atomics, "
                "non-deterministic algorithms forced off, fp32 gradients where bf16 would do).",
                "sql": sql,
            }
        )
    opt_pct = statistics.median(
        100 * s["optimizer"]["phase_ns"] / s["optimizer"]["step_ns"] if s["optimizer"]["step_ns"] else 0.0
        for s in steps
    )
    if opt_pct >= OPTIMIZER_PCT:
        kernels = med("optimizer", "activities")
        busy = med("optimizer", "gpu_busy_ns")
        out.append(
            {
                "kind": "optimizer_share",
                "title": f"The optimizer takes {opt_pct:.0f} % of the step",
                "recoverable_ns": None,
                "per_step_ns": None,
                "evidence": [
                    f"{over}: optimizer {_ms(med('optimizer', 'phase_ns'))} of {_ms(step_ns)}, "
                    f"{kernels:.0f} GPU activities"
                    + (f" of {busy / kernels / 1e3:.1f} µs mean busy time" if kernels else ""),
                ],
                "recommendation": "Use a fused or multi-tensor optimizer (torch.optim's fused=True or "
                "foreach=True for Adam/AdamW/SGD, apex FusedAdam): one kernel per parameter tensor and "
                "step becomes a few per step; zero gradients with set_to_none=True; with many data-parallel "
                "ranks, shard the optimizer state (ZeRO, FSDP) so each rank updates its share.",
                "sql": sql,
            }
        )
    return out
