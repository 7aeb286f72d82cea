"""The verdict: what bounds a run — network, waiting for peers, compute, copies, host or input — or
is it balanced?

Basis (which time the shares divide):
- "steps" when the run has step rows (queries/step_time.sql): the steps' wall-clock windows on
  each rank (views/25_step_window.sql: torch-tb-profiler's step time, the host ProfilerStep window
  stretched to the end of the GPU work launched in it; the same window MFU and the per-step shares
  divide by), so a long start-up before the first step (JIT compilation, data set loading,
  communicator set-up) does not count. Left out (steady_steps): a rank's incomplete steps (GPU
  work cut off by the end of the trace: torch-tb-profiler and HTA drop them too), and steps that
  ran more than OUTLIER_FACTOR times the run's median step on some rank (warm-up, compilation,
  one-off stalls: benchmark practice discards warm-up iterations, e.g. nccl-tests' -w); they are
  listed in `excluded_steps`, and slow steps become a finding of their own.
- "trace" when the run has no steps: the whole trace per rank, first to last GPU activity
  (queries/breakdown.sql, level 'rank'). Input-bound cannot be told on this basis (no step
  windows to attribute host data loading to), so idle_input_pct is null.

Shares of the basis time (percent, summed over ranks, then divided; each instant of a rank's GPU
timeline goes to the first active of compute > communication (transfer > waiting for peers) >
memory > unknown > idle, so compute + exposed comm + exposed memcpy + unknown + idle = 100):
- exposed_comm_pct: communication not hidden under compute (exposed, not total: XProf counts a
  collective only where no compute runs; TraceLens exposed_comm = COMM - COMP), split into
  exposed_comm_transfer_pct (some collective is moving data: the network or NVLink) and
  exposed_comm_wait_pct (the rank's collective has started but the last rank of its group has
  not yet arrived: arrival skew, load imbalance, a straggler; views/44_comm_wait.sql);
- idle_input_pct: GPU idle while the host was inside a DataLoader fetch (torch-tb-profiler's
  DataLoader category; XProf "input");
- host_bound_pct: GPU idle because the host launched the next work late or in small gaps (HTA host
  wait + kernel wait; XProf "kernel launch" time). Idle while the next work was already queued
  ("other waits": events, synchronizations, other streams) is not the host's doing: it is shown
  (idle_other_pct) but counts for no cause, and when it reaches the high bar the verdict's
  confidence is at most moderate (the largest share of the time is unexplained);
- exposed_memcpy_pct: copies/memsets hidden by neither compute nor communication (copy-bound:
  the copies themselves, not kernels limited by HBM bandwidth, which traces cannot tell);
- compute_pct; unknown_pct (GPU work of no known kind, e.g. CUPTI range-profiler events).

Thresholds: two levels on shares of step time, moderate and high (../shared/reference/peers.md
section 4.2):
- network (exposed transfer), waiting for peers, host, copies: moderate >= 5 % (TraceLens Agent
  flags exposed NCCL and memcpy above 5 % of GPU time), high >= 15 % (XProf
  op_stats_to_input_pipeline_analysis.cc: kernel launch, all other and device collectives are
  "high" from 15 %; TraceLens flags GPU idle above 15 %);
- input: moderate >= 5 %, high >= 20 % (XProf's input bands, not / moderately / highly input-bound
  at 5 and 20 %; torch-tb-profiler flags a DataLoader share of step time above 5 %);
- compute-bound: compute >= 80 % (TraceLens's reading of gpu_timeline: "computation > 80 % =
  efficient").
Rules, in order:
  0. no GPU work -> "unknown" (abstain); unknown_pct >= 50 -> "unknown";
  1. the causes (network, straggler, host, input, copy) at or above their high bar: the largest
     share wins, confidence high; the others at their high bar are named in the reason ("also");
  2. else compute_pct >= 80 -> "compute-bound", high;
  3. else the causes at or above their moderate bar: the largest wins, confidence moderate;
  4. else "balanced", moderate.
"straggler-bound" carries `straggler` (pipeline/diagnosis/straggler.py): the rank the others waited
for, or none when the waiting is spread over ranks (load imbalance), and its own cause where the
data shows one.
Confidence drops to "low" when the evidence is thin: less than 1 ms of analysed time per rank on
average (a handful of kernels says little about a training run). Caveats (caveats.py) are shown
beside the verdict, and each of missing ranks, a single analysed step and a truncated input
lowers the confidence one level (high -> moderate -> low); MFU unavailable lowers a compute-bound
or balanced verdict's (the claim is about compute efficiency the trace cannot measure then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .caveats import SINGLE_STEP_CAVEAT, lowers_confidence
from .steady import steady_steps

if TYPE_CHECKING:  # (annotations only: a report of kept results imports no polars for LABELS)
    import polars as pl

MODERATE_PCT = 5.0
HIGH_PCT = 15.0
INPUT_MODERATE_PCT = 5.0
INPUT_HIGH_PCT = 20.0
COMPUTE_BOUND_PCT = 80.0
UNKNOWN_PCT = 50.0
THIN_NS = 1_000_000

VERDICTS = (
    "network-bound",
    "straggler-bound",
    "compute-bound",
    "copy-bound",
    "host-bound",
    "input-bound",
    "balanced",
    "unknown",
)
CONFIDENCE = ("high", "moderate", "low")

# cause -> (verdict, number key, moderate bar, high bar)
CAUSES = {
    "network": ("network-bound", "exposed_comm_transfer_pct", MODERATE_PCT, HIGH_PCT),
    "straggler": ("straggler-bound", "exposed_comm_wait_pct", MODERATE_PCT, HIGH_PCT),
    "host": ("host-bound", "host_bound_pct", MODERATE_PCT, HIGH_PCT),
    "input": ("input-bound", "idle_input_pct", INPUT_MODERATE_PCT, INPUT_HIGH_PCT),
    "copy": ("copy-bound", "exposed_memcpy_pct", MODERATE_PCT, HIGH_PCT),
}

LABELS = {
    "compute_pct": "compute",
    "exposed_comm_pct": "exposed communication",
    "exposed_comm_transfer_pct": "exposed communication: transfer",
    "exposed_comm_wait_pct": "exposed communication: waiting for peers",
    "exposed_memcpy_pct": "exposed memory copies",
    "unknown_pct": "GPU work of unknown kind",
    "gpu_idle_pct": "GPU idle",
    "host_bound_pct": "GPU idle waiting for the host",
    "idle_input_pct": "GPU idle during data loading",
    "host_wait_pct": "GPU idle: host launched late",
    "kernel_wait_pct": "GPU idle: launch gaps",
    "idle_other_pct": "GPU idle: other waits",
    "comm_comp_overlap_pct": "communication hidden under compute",
}

# the numbers shown next to each verdict (the two or three behind it): disjoint parts of the basis
# time (or, for comm_comp_overlap_pct, a share of communication time), never a part beside its
# whole (headline_keys also puts the other causes at their high bar right after the verdict's)
HEADLINE = {
    "network-bound": ["exposed_comm_transfer_pct", "exposed_comm_wait_pct", "comm_comp_overlap_pct"],
    "straggler-bound": ["exposed_comm_wait_pct", "exposed_comm_transfer_pct", "compute_pct"],
    "host-bound": ["host_bound_pct", "compute_pct", "exposed_comm_pct"],
    "input-bound": ["idle_input_pct", "host_bound_pct", "compute_pct"],
    "copy-bound": ["exposed_memcpy_pct", "compute_pct", "gpu_idle_pct"],
    "compute-bound": ["compute_pct", "exposed_comm_pct", "gpu_idle_pct"],
    "balanced": ["compute_pct", "exposed_comm_pct", "gpu_idle_pct"],
    "unknown": ["unknown_pct", "compute_pct"],
}
# the numbers of an abstention because idle with work queued is the largest share
QUEUED_HEADLINE = ["idle_other_pct", "compute_pct", "exposed_comm_pct"]


# number key -> the keys that are parts of it (the idle causes of GPU idle, host wait and launch
# gaps of host-bound, transfer and waiting of exposed communication)
_IDLE_PARTS = ("host_bound_pct", "host_wait_pct", "kernel_wait_pct", "idle_input_pct", "idle_other_pct")
PARTS = {
    "gpu_idle_pct": set(_IDLE_PARTS),
    "host_bound_pct": {"host_wait_pct", "kernel_wait_pct"},
    "exposed_comm_pct": {"exposed_comm_transfer_pct", "exposed_comm_wait_pct"},
}


def _overlap(a: str, b: str) -> bool:
    """Whether one number is the other or a part of it (PARTS, transitively through gpu_idle)."""
    return a == b or b in PARTS.get(a, ()) or a in PARTS.get(b, ())


def headline_keys(keys: list[str], also: list[str], n: int = 3) -> list[str]:
    """The headline under a verdict: its first number, then the other causes at their high bar,
    then the rest of its list, leaving out any number that is another one shown or a part of it
    (host wait beside host-bound), at most n."""
    out: list[str] = []
    for k in keys[:1] + also + keys[1:]:
        if len(out) < n and not any(_overlap(k, o) for o in out):
            out.append(k)
    return out


def _numbers(total: float, sums: dict[str, float | None], comm: float, overlap: float) -> dict:
    def pct(v):
        return None if v is None else 100 * v / total

    idle = sums["idle"]
    inp = sums["input"]
    return {
        "compute_pct": pct(sums["compute"]),
        "exposed_comm_pct": pct(sums["exposed_comm"]),
        "exposed_comm_transfer_pct": pct(sums["exposed_transfer"]),
        "exposed_comm_wait_pct": pct(sums["exposed_wait"]),
        "exposed_memcpy_pct": pct(sums["exposed_memory"]),
        "unknown_pct": pct(sums["unknown"]),
        "gpu_idle_pct": pct(idle),
        "idle_input_pct": pct(inp),
        "host_bound_pct": pct(sums["host_wait"] + sums["kernel_wait"]),
        "host_wait_pct": pct(sums["host_wait"]),
        "kernel_wait_pct": pct(sums["kernel_wait"]),
        "idle_other_pct": pct(sums["other"]),
        "comm_comp_overlap_pct": 100 * overlap / comm if comm > 0 else None,
    }


def network_key(numbers: dict) -> str:
    """The share the network cause reads: exposed transfer, or all exposed communication when the
    split is unknown (no collective matched consistently on two or more ranks)."""
    return (
        "exposed_comm_transfer_pct"
        if numbers.get("exposed_comm_transfer_pct") is not None
        else "exposed_comm_pct"
    )


# the reason of a run of NCCL logs alone (its findings come from the logs: diagnosis/nccl_findings.py)
NO_TRACE_REASON = "NCCL logs only, no trace: GPU time cannot be attributed (the findings come from the logs)"


def verdict_for_run(
    run_id: str,
    ranks: pl.DataFrame,
    step_time: pl.DataFrame | None = None,
    straggler_of=None,
    caveats: list[dict] | None = None,
    split_known: bool = True,
    no_trace: bool = False,
) -> dict:
    """The verdict for one run.

    ranks: the run's `ranks` rows of the analysis (pipeline.analyze: span_ns, compute_ns,
    exposed_comm_ns, exposed_comm_wait_ns, exposed_comm_transfer_ns, exposed_memcpy_ns,
    gpu_idle_ns, idle_*_ns, comm_ns, overlap_ns); step_time: the run's rows of
    queries/step_time.sql, or None / empty when the run has no steps. straggler_of: called with
    the set of analysed steps (None on the trace basis) and the step rows kept on the steps basis
    (None on the trace basis: a step left out, cut short or an outlier, tells no cause), returns
    the straggler profile
    (pipeline/diagnosis/straggler.py) or None; caveats: caveats.caveats_for_run's list (None: none);
    split_known: whether any collective was matched consistently on two or more ranks (else the
    split of exposed communication into waiting and transfer is unknown: both shares are None and
    the network cause reads all exposed communication). no_trace: the run holds NCCL logs or
    nccl-tests output and no trace, so the "unknown" verdict says that, not that the traces had
    no GPU activity.
    Returns {run_id, verdict (one of VERDICTS), confidence ("high" | "moderate" | "low" | None),
    reason (one sentence), basis ("steps" | "trace" | None), numbers ({key: pct 0-100 or None},
    keys of LABELS), headline (the number keys behind the verdict), also (the other causes at
    their high bar: [{verdict, key, pct}]), straggler (profile or None), caveats ([{kind, text}]),
    ranks (int), steps_used (int), analysed_ns (basis time summed over ranks), excluded_steps
    ([{step, rank, step_ns, why}]), median_step_ns (int | None)}. Never raises on empty input:
    abstains with "unknown".
    """
    out = {
        "run_id": run_id,
        "verdict": "unknown",
        "confidence": None,
        "basis": None,
        "numbers": {},
        "headline": [],
        "also": [],
        "straggler": None,
        "caveats": list(caveats or []),
        "ranks": 0,
        "steps_used": 0,
        "analysed_ns": 0,
        "excluded_steps": [],
        "median_step_ns": None,
    }
    analysed_steps = None
    steady = None
    if step_time is not None and step_time.height and step_time["step_ns"].sum() > 0:
        steady = steady_steps(step_time)
        if not steady[0]["step_ns"].sum() > 0:  # the steps kept hold no time: the trace basis below
            steady = None
    if steady is not None:
        kept, excluded, median = steady
        total = float(kept["step_ns"].sum())
        s = {
            k: float(kept[c].sum())
            for k, c in (
                ("compute", "compute_ns"),
                ("exposed_comm", "exposed_comm_ns"),
                ("exposed_wait", "exposed_comm_wait_ns"),
                ("exposed_transfer", "exposed_comm_transfer_ns"),
                ("exposed_memory", "exposed_memory_ns"),
                ("unknown", "exposed_unknown_ns"),
                ("idle", "idle_ns"),
                ("input", "idle_input_ns"),
                ("host_wait", "idle_host_wait_ns"),
                ("kernel_wait", "idle_kernel_wait_ns"),
                ("other", "idle_other_ns"),
            )
        }
        n_ranks = kept["rank"].n_unique()
        analysed_steps = set(kept["step"].to_list())
        out.update(
            basis="steps",
            ranks=n_ranks,
            steps_used=len(analysed_steps),
            analysed_ns=int(total),
            excluded_steps=excluded,
            median_step_ns=median,
        )
        numbers = _numbers(total, s, float(kept["comm_ns"].sum()), float(kept["overlap_ns"].sum()))
    elif ranks.height and ranks["span_ns"].sum() > 0:
        total = float(ranks["span_ns"].sum())
        s = {
            k: float(ranks[c].sum())
            for k, c in (
                ("compute", "compute_ns"),
                ("exposed_comm", "exposed_comm_ns"),
                ("exposed_wait", "exposed_comm_wait_ns"),
                ("exposed_transfer", "exposed_comm_transfer_ns"),
                ("exposed_memory", "exposed_memcpy_ns"),
                ("idle", "gpu_idle_ns"),
                ("host_wait", "idle_host_wait_ns"),
                ("kernel_wait", "idle_kernel_wait_ns"),
                ("other", "idle_other_ns"),
            )
        }
        s["unknown"] = total - s["compute"] - s["exposed_comm"] - s["exposed_memory"] - s["idle"]
        s["input"] = None
        n_ranks = ranks.height
        out.update(basis="trace", ranks=n_ranks, analysed_ns=int(total))
        numbers = _numbers(total, s, float(ranks["comm_ns"].sum()), float(ranks["overlap_ns"].sum()))
    else:
        out["reason"] = NO_TRACE_REASON if no_trace else "no GPU activity in the traces: nothing to attribute"
        return out
    if not split_known:
        numbers["exposed_comm_transfer_pct"] = numbers["exposed_comm_wait_pct"] = None
    out["numbers"] = numbers
    if out["basis"] == "steps" and out["steps_used"] == 1:
        out["caveats"].append(SINGLE_STEP_CAVEAT)

    def level(cause: str) -> tuple[float, float, float]:
        _, key, mod, high = CAUSES[cause]
        v = numbers[network_key(numbers) if cause == "network" else key]
        return (v if v is not None else -1.0), mod, high

    high = sorted((c for c in CAUSES if level(c)[0] >= level(c)[2]), key=lambda c: -level(c)[0])
    moderate = sorted((c for c in CAUSES if level(c)[0] >= level(c)[1]), key=lambda c: -level(c)[0])
    other = numbers["idle_other_pct"] or 0.0
    lead = level((high or moderate)[0])[0] if high or moderate else 0.0  # the largest cause's share
    queued = False
    if numbers["unknown_pct"] >= UNKNOWN_PCT:
        v, conf = "unknown", None
    elif numbers["compute_pct"] < COMPUTE_BOUND_PCT and other >= HIGH_PCT and other > lead:
        # idle with the next work already queued (events, synchronizations, other streams) is the
        # largest share and no cause explains it: abstain rather than name a smaller cause or
        # call the run balanced while the GPU idles (the queued-idle finding names it)
        v, conf, queued = "unknown", None, True
    elif high:
        v, conf = CAUSES[high[0]][0], "high"
        keys = {c: network_key(numbers) if c == "network" else CAUSES[c][1] for c in high[1:]}
        out["also"] = [{"verdict": CAUSES[c][0], "key": keys[c], "pct": numbers[keys[c]]} for c in high[1:]]
    elif numbers["compute_pct"] >= COMPUTE_BOUND_PCT:
        v, conf = "compute-bound", "high"
    elif moderate:
        v, conf = CAUSES[moderate[0]][0], "moderate"
    else:
        v, conf = "balanced", "moderate"
    if straggler_of is not None and (numbers["exposed_comm_wait_pct"] or 0) >= MODERATE_PCT:
        out["straggler"] = straggler_of(
            analysed_steps, kept.to_dicts() if analysed_steps is not None else None
        )
    capped = conf == "high" and other >= HIGH_PCT
    if capped:
        conf = "moderate"
    per_rank_ns = out["analysed_ns"] / max(n_ranks, 1)
    if conf and per_rank_ns < THIN_NS:
        conf = "low"
    lowered = [c for c in out["caveats"] if lowers_confidence(c, v)]
    for _ in lowered:
        if conf in ("high", "moderate"):
            conf = CONFIDENCE[CONFIDENCE.index(conf) + 1]
    headline = headline_keys(
        QUEUED_HEADLINE
        if queued
        else HEADLINE[v]
        if split_known or v != "network-bound"
        else ["exposed_comm_pct", "comm_comp_overlap_pct", "compute_pct"],
        [a["key"] for a in out["also"]],
    )
    reason = _queued_reason(numbers, out, (high or moderate)[:1]) if queued else _reason(v, numbers, out)
    clock = next((c for c in out["caveats"] if c["kind"] == "clock_mismatch"), None)
    if clock is not None:  # shares of a span that crosses two clocks mean nothing: abstain
        v, conf, capped, lowered, out["also"] = "unknown", None, False, [], []
        reason = "no verdict: " + clock["text"]
    out.update(verdict=v, confidence=conf, headline=headline, reason=reason)
    if out["also"]:
        out["reason"] += "; also above the high bar: " + ", ".join(
            f"{LABELS[a['key']]} {_f(a['pct'])}"
            + (
                f" (not the network: transfer is {_f(numbers['exposed_comm_transfer_pct'])}; "
                f"{_who(out['straggler'])})"
                if a["verdict"] == "straggler-bound"
                else ""
            )
            for a in out["also"]
        )
    if v == "network-bound" and (numbers["exposed_comm_wait_pct"] or 0) >= MODERATE_PCT:
        out["reason"] += (
            f"; a further {_f(numbers['exposed_comm_wait_pct'])} is waiting for late peers, not transfer"
        )
    if capped:
        out["reason"] += (
            f"; confidence at most moderate: the GPU also idled {_f(other)} with work already queued "
            "(waiting on events, synchronizations or other streams), which no cause explains"
        )
    if conf == "low" and per_rank_ns < THIN_NS:
        out["reason"] += f"; low confidence: only {per_rank_ns / 1e6:.3f} ms of GPU time per rank"
    if lowered and conf is not None:  # an abstention has no confidence to lower
        out["reason"] += "; confidence lowered: " + "; ".join(c["kind"].replace("_", " ") for c in lowered)
    return out


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def _who(st: dict | None) -> str:
    """Who the others waited for, in words (straggler profile of pipeline/diagnosis/straggler.py)."""
    if not st:
        return "no matched collectives to name the late rank"
    if st.get("rank") is not None:
        return (
            f"rank {st['rank']} arrived last in {st['times_last']} of {st['calls']} matched collectives"
            + (f"; {st['cause_text']}" if st.get("cause_text") else "")
        )
    return st.get("cause_text") or "no single rank is last (load imbalance)"


def _of(out: dict) -> str:
    """What the shares of a verdict are of, in words."""
    return "of step time" if out["basis"] == "steps" else "of GPU time (whole trace: the run has no steps)"


def _queued_reason(n: dict, out: dict, top: list[str]) -> str:
    """The reason of an abstention because idle with work already queued is the largest share."""
    of = _of(out)
    largest = (
        f"; the largest cause, {LABELS[CAUSES[top[0]][1]]}, is {_f(n[CAUSES[top[0]][1]])}"
        if top and top[0] != "network"
        else f"; the largest cause, {LABELS[network_key(n)]}, is {_f(n[network_key(n)])}"
        if top
        else ""
    )
    return (
        f"the GPU idles {_f(n['idle_other_pct'])} {of} with its next work already queued (waiting on "
        "events, synchronizations or other streams), which no cause explains (GPU idle in all "
        f"{_f(n['gpu_idle_pct'])}, compute {_f(n['compute_pct'])}){largest}: see the queued-idle finding"
    )


def _reason(v: str, n: dict, out: dict) -> str:
    of = _of(out)
    split = (
        f"host launched late {_f(n['host_wait_pct'])}, launch gaps {_f(n['kernel_wait_pct'])}; not counted: "
        f"idle with the next work already queued {_f(n['idle_other_pct'])}"
    )
    who = _who(out.get("straggler"))
    return {
        "network-bound": (
            f"{_f(n['exposed_comm_transfer_pct'])} {of} is collectives transferring data not hidden under "
            "compute"
            if n["exposed_comm_transfer_pct"] is not None
            else f"{_f(n['exposed_comm_pct'])} {of} is communication not hidden under compute (whether it is "
            "transfer or waiting for peers is unknown: no collective was matched consistently on two or "
            "more ranks)"
        )
        + (
            f" (only {_f(n['comm_comp_overlap_pct'])} of communication overlaps compute)"
            if n["comm_comp_overlap_pct"] is not None
            else ""
        ),
        "straggler-bound": f"{_f(n['exposed_comm_wait_pct'])} {of} is collectives waiting for late peers, "
        f"not the network (transfer {_f(n['exposed_comm_transfer_pct'])}): {who}",
        "host-bound": f"the GPU is idle waiting for the host to launch work {_f(n['host_bound_pct'])} {of} "
        f"({split})",
        "input-bound": f"the GPU is idle while the host loads data (DataLoader) {_f(n['idle_input_pct'])} "
        f"{of}",
        "copy-bound": f"{_f(n['exposed_memcpy_pct'])} {of} is memory copies hidden by neither compute nor "
        "communication",
        "compute-bound": f"compute kernels cover {_f(n['compute_pct'])} {of}",
        "balanced": f"no single cause reaches {MODERATE_PCT:.0f}% {of} (exposed communication "
        f"{_f(n['exposed_comm_pct'])}, GPU idle {_f(n['gpu_idle_pct'])}, exposed copies "
        f"{_f(n['exposed_memcpy_pct'])})",
        "unknown": f"{_f(n['unknown_pct'])} {of} is GPU work of a kind tracelake cannot classify (e.g. "
        "CUPTI range-profiler events)",
    }[v]
