"""The rank the others wait for in collectives, and what made it late.

straggler_profile(calls, rows, steps) reads the run's matched collective calls (the analysis's
`collectives`: queries/collective_matching.sql, with `wait_ns` per rank = that rank's duration -
the call's transfer time, TraceLens NcclAnalyser / torch-tb-profiler) and its step rows.

Who: over the consistent calls of the analysed steps (seen on two or more ranks that agree on op
and size, kernels overlapping in time: views/40_collective_calls.sql) that were traced on every
rank of their group (a call missing ranks cannot tell who came last: the late rank may be a
missing one; when no call is whole, cause "untraced_ranks" and no rank), each call's wait (the sum of
the other ranks' wait_ns) is caused by its straggler_rank, the rank that started last (none on a
tie). The rank that causes the most wait is named when it causes at least NAMED_SHARE of all
wait; otherwise the waiting is spread over ranks that arrive last in turn: load imbalance, no
single straggler.

Why (the straggler's own cause, where its trace shows one): its lateness at a call is the median
of the other ranks' waits there (how long a typical peer waited for it), summed over the calls it
was last in per step. Against the other ranks' medians in the same step it may have
  entered_step_late  begun the step later (step_start_ns; the delay lies before the step's first
                     kernel: work before the profiled step, or clock skew between hosts; skew is
                     not offered when the ranks' collective ends agree within a tenth of the
                     lateness: clock_skew_bound_ns),
  longer_compute     spent more time computing (compute_ns: load imbalance),
  data_loading       idled longer in DataLoader fetches (idle_input_ns),
  host               idled longer waiting for its host (idle_host_wait_ns + idle_kernel_wait_ns).
Each excess is clamped to [0, lateness] per step and summed; the largest names the cause when it
explains at least CAUSE_SHARE of the lateness, else the cause is "unknown" (nothing in the trace
explains it: look at the rank's host and GPU, or at host clocks).
This is tracelake's own rule (docs/report.md, Straggler); the shares are judgement, not a
published threshold.
"""

from __future__ import annotations

import statistics

NAMED_SHARE = 0.5
CAUSE_SHARE = 0.5

CAUSE_FIELDS = {
    "longer_compute": ("compute_ns",),
    "data_loading": ("idle_input_ns",),
    "host": ("idle_host_wait_ns", "idle_kernel_wait_ns"),
}


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms"


def straggler_profile(calls: list[dict], rows: list[dict], steps: set | None) -> dict | None:
    """The straggler profile of one run, or None when it has no consistent call.

    calls: the run's `collectives` records (step, consistent, complete, ranks_seen, expected_ranks,
    straggler_rank, wait_ns {rank str: ns});
    rows: the run's analysed step rows (queries/step_time.sql: rank, step, step_start_ns,
    compute_ns, idle_input_ns, idle_host_wait_ns, idle_kernel_wait_ns), or the whole-trace rank
    rows when steps is None (then entered_step_late cannot be told); steps: the analysed step
    numbers, None on the whole-trace basis.
    Returns {rank (int | None: no single straggler), times_last, calls, caused_wait_ns,
    total_wait_ns, share_pct (0-100), lateness_ns, cause (entered_step_late | longer_compute |
    data_loading | host | unknown | imbalance | untraced_ranks), cause_ns, cause_text}."""
    sel = [c for c in calls if c.get("consistent") and (steps is None or c.get("step") in steps)]
    if not sel:
        return None
    # a call not traced on every rank of its group (complete false) cannot say who arrived last:
    # the rank the others waited for may be one of those missing (its shortest kernel, the
    # transfer, is missing too), so only complete calls (or calls of unknown group size) name one
    whole = [c for c in sel if c.get("complete") is not False]
    out = {
        "rank": None,
        "times_last": 0,
        "calls": len(whole or sel),
        "caused_wait_ns": 0,
        "total_wait_ns": 0,
        "share_pct": None,
        "lateness_ns": None,
        "cause": "imbalance",
        "cause_ns": None,
        "cause_text": None,
    }
    if not whole:
        seen = max(c.get("ranks_seen") or 0 for c in sel)
        expected = max(c.get("expected_ranks") or 0 for c in sel)
        out.update(
            total_wait_ns=int(sum(sum((c.get("wait_ns") or {}).values()) for c in sel)),
            cause="untraced_ranks",
            cause_text=f"the rank the others waited for may be one not in the traces: every matched "
            f"collective was traced on {seen} of its {expected} ranks",
        )
        return out
    sel = whole
    caused: dict[int, int] = {}
    times: dict[int, int] = {}
    total = 0
    for c in sel:
        waits = {int(k): v or 0 for k, v in (c.get("wait_ns") or {}).items()}
        w = sum(waits.values())
        total += w
        r = c.get("straggler_rank")
        if r is not None:
            caused[r] = caused.get(r, 0) + w - waits.get(r, 0)
            times[r] = times.get(r, 0) + 1
    out["total_wait_ns"] = int(total)
    if not caused or total <= 0:
        out["cause_text"] = "no rank arrives last on its own (ties or no wait)"
        return out
    top = max(caused, key=lambda r: (caused[r], -r))
    share = caused[top] / total
    out.update(share_pct=100 * share)
    if share < NAMED_SHARE:
        out["cause_text"] = (
            f"no single straggler: the rank causing the most wait, rank {top}, causes "
            f"{100 * share:.0f}% of it; ranks arrive last in turn (load imbalance across ranks)"
        )
        return out
    out.update(rank=top, times_last=times[top], caused_wait_ns=int(caused[top]), cause="unknown")
    # its lateness per step: the median wait of the other ranks at each call it was last in
    late: dict = {}
    for c in sel:
        if c.get("straggler_rank") != top:
            continue
        others = [v or 0 for k, v in (c.get("wait_ns") or {}).items() if int(k) != top]
        if others:
            key = c.get("step") if steps is not None else None
            late[key] = late.get(key, 0) + statistics.median(others)
    lateness = sum(late.values())
    out["lateness_ns"] = int(lateness)
    if lateness <= 0:
        out["cause_text"] = "it arrived last, but its peers barely waited"
        return out
    by_step: dict = {}
    for r in rows:
        by_step.setdefault(r.get("step") if steps is not None else None, []).append(r)
    excess = {"entered_step_late": 0.0, **{k: 0.0 for k in CAUSE_FIELDS}}
    compared = 0  # steps where its row and its peers' rows could be compared
    for key, L in late.items():
        rs = by_step.get(key, [])
        mine = [r for r in rs if r["rank"] == top]
        peers = [r for r in rs if r["rank"] != top]
        if not mine or not peers:
            continue
        compared += 1
        me = mine[0]
        if steps is not None and me.get("step_start_ns") is not None:
            d = me["step_start_ns"] - statistics.median(p["step_start_ns"] for p in peers)
            excess["entered_step_late"] += min(max(d, 0), L)
        for cause, fields in CAUSE_FIELDS.items():
            d = sum(me.get(f) or 0 for f in fields) - statistics.median(
                sum(p.get(f) or 0 for f in fields) for p in peers
            )
            excess[cause] += min(max(d, 0), L)
    if not compared:  # its rows of those steps are not among the rows given (left out: cut short)
        out["cause_text"] = (
            f"its own rows of the steps it was late in are left out of the verdict (cut short or "
            f"outliers), so its trace cannot tell what made it {_ms(lateness)} late"
        )
        return out
    cause = max(excess, key=lambda k: excess[k])
    if excess[cause] >= CAUSE_SHARE * lateness:
        out.update(cause=cause, cause_ns=int(excess[cause]))
    out["cause_text"] = _cause_text(
        out["cause"], excess.get(out["cause"], 0.0), lateness, clock_skew_bound_ns(calls)
    )
    return out


def clock_skew_bound_ns(calls: list[dict]) -> int | None:
    """How far apart the ranks' clocks can be, as their collectives show it: the median end spread
    (collective_matching.end_spread_ns: last end - first end) of the consistent calls. A call
    completes on every rank at about one instant, so clocks offset by D would spread the ends by
    about D. None when no consistent call has one."""
    spreads = [
        c["end_spread_ns"] for c in calls if c.get("consistent") and c.get("end_spread_ns") is not None
    ]
    return int(statistics.median(spreads)) if spreads else None


def _cause_text(cause: str, ns: float, lateness: float, skew_ns: int | None = None) -> str:
    of = f"{_ms(ns)} of its {_ms(lateness)} lateness"
    # clock skew is offered only where the clocks allow it: not when the ranks' collective ends
    # agree to within a tenth of the lateness (issue 39 item 10)
    clocks_agree = skew_ns is not None and skew_ns * 10 < lateness
    agree = f"; not clock skew: the ranks' collectives end within {skew_ns / 1e3:,.1f} µs of each other"
    return {
        "entered_step_late": f"it began the step later than the others ({of}): the delay lies before the "
        "step's first kernel ("
        + (
            "work before the profiled step: a slower previous step, data loading or a checkpoint" + agree
            if clocks_agree
            else "work before the profiled step, or clock skew between hosts"
        )
        + "), not inside the step",
        "longer_compute": f"its compute took longer than the other ranks' ({of}): load imbalance (a larger "
        "shard, uneven sequence lengths, expert routing)",
        "data_loading": f"its GPU idled longer in data loading than the others' ({of})",
        "host": f"its GPU idled longer waiting for its host to launch work ({of}): CPU contention, Python "
        "overhead, garbage collection on that rank",
        "unknown": f"nothing in its trace explains its {_ms(lateness)} lateness (compare its host and GPU: "
        + ("clocks, thermals" + agree + ")" if clocks_agree else "clocks, thermals; or host clock skew)"),
    }[cause]
