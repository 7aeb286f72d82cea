"""Caveats: what limits a run's verdict, shown beside it (docs/report.md, Caveats).

Each caveat is {kind, text, lowers}: lowers = "all" (every verdict's confidence drops one level,
high -> moderate -> low) or the list of verdicts whose confidence it lowers. Missing ranks, a
truncated input, no steps and a single analysed step lower every verdict (the sample, the
window or the step may not be the job's); collectives that do not line up across ranks lower
network- and straggler-bound when they are at least a tenth of the matched calls (no wait can be
derived from them, so their time counts as transfer); MFU unavailable lowers compute-bound and
balanced (the claim is then about compute efficiency the trace cannot measure). The verdict
(pipeline/diagnosis/verdict.py) applies them.
"""

from __future__ import annotations

__all__ = ["SINGLE_STEP_CAVEAT", "caveats_for_run", "lowers_confidence"]


# a profiled window is seconds to minutes: events of one trace spread over more than a day are on
# two clocks (an attack zeroed the kernels' ts beside host events on the epoch: a 53-year span)
MAX_SPAN_NS = 86_400 * 10**9


def caveats_for_run(
    run: dict,
    partial_paths: list[str],
    mfu_why: str | None,
    calls: list[dict] | None = None,
    has_steps: bool = True,
    long_spans: list[str] = (),
) -> list[dict]:
    """What limits a run's verdict, shown beside it (docs/report.md, Caveats).

    run: the analysis's `runs` entry (ranks, world_size, formats: a run of NCCL logs alone gets no
    no-steps caveat, its verdict is not on a trace); partial_paths: its sources with status
    'partial' (truncated); mfu_why: why MFU is unavailable, with the option that would give it
    (None: available); calls: its matched collectives (`collectives` records: ranks_seen,
    consistent); has_steps: whether it has steps (else the verdict is on the whole trace);
    long_spans: its sources whose events span more than MAX_SPAN_NS (events on two clocks).
    Returns [{kind, text, lowers}], lowers = "all" (every verdict's confidence drops one level)
    or a list of the verdicts whose confidence it lowers. verdict_for_run adds the single-step
    caveat itself (it knows how many steps it used)."""
    out = []
    world, ranks = run.get("world_size"), run.get("ranks") or []
    if world and len(ranks) < world:
        missing = sorted(set(range(world)) - set(ranks))
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        out.append(
            {
                "kind": "missing_ranks",
                "lowers": "all",
                "text": f"{len(ranks)} of {world} ranks ingested (a sample of the job; missing: {shown}): "
                "a collective waiting for a rank that was not ingested counts as transfer, and that "
                "rank's own behaviour is not seen",
            }
        )
    if partial_paths:
        out.append(
            {
                "kind": "truncated_input",
                "lowers": "all",
                "text": f"{len(partial_paths)} input(s) truncated ({', '.join(partial_paths[:3])}"
                f"{' ...' if len(partial_paths) > 3 else ''}): events after the cut are missing, from any "
                "step (Kineto does not write in time order), so those steps are left out when others remain",
            }
        )
    if long_spans:
        out.append(
            {
                "kind": "clock_mismatch",
                "lowers": "all",
                "text": f"{len(long_spans)} input(s) span more than a day of clock "
                f"({', '.join(long_spans[:3])}{' ...' if len(long_spans) > 3 else ''}): their events are "
                "on different clocks (timestamps at 0, or GPU and host clocks far apart), so spans, idle "
                "and the shares across them are not trustworthy",
            }
        )
    from ..schema import NCCL_FORMATS  # (here: a report of kept results imports no pyarrow for it)

    formats = set(run.get("formats") or [])
    traced = formats - set(NCCL_FORMATS)
    if not has_steps and (traced or not formats):
        # the hint names what the run's own inputs allow (issue 39 item 10: an NCCL-logs-only run
        # was told to give --step-range for Nsight Systems exports it does not have)
        hints = []
        if not formats or "kineto_json" in traced:
            hints.append(
                "PyTorch profiler traces: record ProfilerStep ranges with "
                "torch.profiler.profile(schedule=...) and prof.step() each iteration"
            )
        if any(f.startswith("nsys") for f in traced):
            hints.append(
                "Nsight Systems exports: give --step-range REGEX naming the NVTX range of an iteration"
            )
        out.append(
            {
                "kind": "no_steps",
                "lowers": "all",
                "text": "no steps in the trace: the verdict is on the whole trace, start-up and idle time "
                "between steps included" + (f" ({'; '.join(hints)})" if hints else ""),
            }
        )
    multi = [c for c in (calls or []) if (c.get("ranks_seen") or 0) >= 2]
    bad = [c for c in multi if not c.get("consistent")]
    if bad:
        out.append(
            {
                "kind": "inconsistent_collectives",
                "lowers": ["network-bound", "straggler-bound"] if len(bad) >= 0.1 * len(multi) else [],
                "text": f"{len(bad)} of {len(multi)} collective calls seen on several ranks do not line up "
                "(their kernels do not overlap in time, or the ranks disagree on op or size: sampled "
                "traces, different calls matched by order, or host clocks far apart): no wait or "
                "straggler is derived from them, and their time counts as transfer",
            }
        )
    if mfu_why:
        out.append(
            {
                "kind": "mfu_unavailable",
                "lowers": ["compute-bound", "balanced"],
                "text": f"MFU not available: {mfu_why}",
            }
        )
    return out


def lowers_confidence(caveat: dict, verdict: str) -> bool:
    """Whether a caveat lowers the confidence of this verdict (caveats_for_run's `lowers`)."""
    lw = caveat.get("lowers")
    return lw == "all" or (isinstance(lw, (list, tuple)) and verdict in lw)


# the caveat of a verdict that rests on one analysed step (verdict_for_run adds it)
SINGLE_STEP_CAVEAT = {
    "kind": "single_step",
    "lowers": "all",
    "text": "one step analysed: step-to-step variation (and whether this step is typical) is unknown",
}
