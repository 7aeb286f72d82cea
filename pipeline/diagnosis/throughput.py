"""Throughput and MFU per run, with their inputs stated (issue 17, point 4), from mfu.sql's rows
(queries/mfu.sql has the per-step definitions: tokens_per_step and its source, tokens_per_s,
palm_flops_per_token, palm_mfu_pct, mfu_pct).

run_throughput(run_id, mfu_rows, rank_rows, world_size) -> dict or None (None: the run has
neither tokens nor an MFU):
  tokens_source         user | global_batch | embedding (mfu.sql)
  tokens_per_step       median over the run's rank-steps of the tokens one rank processed
  tokens_per_s_per_gpu  median over ranks of (tokens over the rank's steps / their step time)
  tokens_per_s          tokens_per_s_per_gpu x world size (the run's world_size, else the ranks
                        traced): the job's throughput when every rank processes its own share
                        (data parallelism, or --global-batch, which states the job's tokens);
                        with tensor or pipeline parallelism and --tokens-per-step, ranks share
                        tokens and this overstates it: give --global-batch instead
  world_size            the multiplier used
  mfu_pct               median over ranks of the shape-derived whole-run MFU (analyze's ranks rows)
  flop_coverage_pct     median over ranks of its FLOP coverage
  mfu_measurable        mfu_pct describes enough of the compute to be stated: FLOP coverage at
                        least findings.MIN_FLOP_COVERAGE_PCT (findings.mfu_measurable)
  palm_mfu_pct          median over ranks of the step-time-weighted palm_mfu_pct of their steps
  palm_flops_per_token  PaLM's 6N + 12LHQT as given (FLOP/token)
  peak_tflops           the peak the shape-derived MFU used (median over ranks)
note(run) -> the line saying where the tokens came from when the trace gave them.
"""

from __future__ import annotations

from .basis import median as _median
from .findings import mfu_measurable


def run_throughput(run_id: str, mfu_rows: list[dict], rank_rows: list[dict], world_size) -> dict | None:
    rows = [r for r in mfu_rows if r["run_id"] == run_id]
    ranks = [r for r in rank_rows if r["run_id"] == run_id]
    tok = [r for r in rows if r["tokens_per_step"] is not None and r["step_ns"]]
    per_rank: dict[int, list] = {}
    palm: dict[int, list] = {}
    for r in tok:
        per_rank.setdefault(r["rank"], []).append((r["tokens_per_step"], r["step_ns"]))
    for r in rows:
        if r["palm_mfu_pct"] is not None and r["step_ns"]:
            palm.setdefault(r["rank"], []).append((r["palm_mfu_pct"], r["step_ns"]))
    per_gpu = _median(sum(t for t, _ in v) / (sum(ns for _, ns in v) * 1e-9) for v in per_rank.values())
    mfu = _median(r["mfu_pct"] for r in ranks)
    cov = _median(r["flop_coverage_pct"] for r in ranks)
    if per_gpu is None and mfu is None and not palm:
        return None
    world = world_size or len({r["rank"] for r in rows}) or None
    sources = sorted({r["tokens_source"] for r in tok})
    return {
        "run_id": run_id,
        "tokens_source": ", ".join(sources) if sources else None,
        "tokens_per_step": _median(r["tokens_per_step"] for r in tok),
        "tokens_per_s_per_gpu": per_gpu,
        "tokens_per_s": per_gpu * world if per_gpu is not None and world else None,
        "world_size": world,
        "mfu_pct": mfu,
        "flop_coverage_pct": cov,
        "palm_mfu_pct": _median(sum(p * ns for p, ns in v) / sum(ns for _, ns in v) for v in palm.values()),
        "palm_flops_per_token": next(
            (r["palm_flops_per_token"] for r in rows if r["palm_flops_per_token"]), None
        ),
        "peak_tflops": _median(r["peak_tflops"] for r in ranks),
        "mfu_measurable": mfu_measurable(mfu, cov),
    }


def palm_note(t: dict | None, phase_rows: list[dict], step_rows: list[dict]) -> str | None:
    """The note for a PaLM MFU over steps without backward: 6N + 12LHQT counts forward and
    backward (PaLM appendix B: 2N forward, 4N backward per token), so over a forward-only step
    (inference, evaluation: no autograd evaluate_function op, views/70_phases.sql) it is about 3x
    what ran; None when the run's steps have phases or no PaLM MFU was computed."""
    if t is None or t["palm_mfu_pct"] is None:
        return None
    rid = t["run_id"]
    if not any(s["run_id"] == rid for s in step_rows) or any(p["run_id"] == rid for p in phase_rows):
        return None
    return (
        f"run {rid}: PaLM's 6N + 12LHQT counts a training step (forward and backward), but these steps "
        "have no backward op (inference or evaluation): palm_mfu_pct is about 3x what ran (a forward "
        "pass is 2N + 4LHQT per token)"
    )


def note(t: dict | None) -> str | None:
    """The note for tokens read from the trace (tokens_source embedding), else None."""
    if t is None or t["tokens_source"] != "embedding":
        return None
    return (
        f"run {t['run_id']}: tokens per step read from the trace: aten::embedding indices [batch, sequence] "
        f"give {t['tokens_per_step']:,.0f} tokens per rank and step (queries/mfu.sql tokens_per_step); "
        "give --tokens-per-step or --global-batch with --seq-len if that is not the step's tokens"
    )
