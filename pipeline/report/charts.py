"""The altair chart builders of the HTML report (html.py embeds their specs).

Each builder returns (chart | None, note | None): None with the reason when the data cannot support
the chart, else the chart and a note on any aggregation. Never more than MAX_BARS bars or heat-map
rows: beyond that, ranks and steps are aggregated (means over ranks per step, consecutive ranks or
steps in groups, histograms).
  1. step-time breakdown per rank x step (compute, exposed communication, exposed memory, idle by
     cause) — whole trace per rank when the run has no steps (breakdown_chart);
  2. to 4. the communication's charts, in collective_charts.py: comm-compute overlap per rank
     (overlap_chart), bus bandwidth against message size (busbw_chart) and the rank x step heat
     map of collective wait (wait_heatmap);
  5. MFU per step (mfu_chart);
  6. top kernels by time (top_kernels_chart);
  7. idle-gap histogram by cause (idle_gap_chart);
  8. with a baseline: the step-time components of both runs (comparison_chart);
  9. the step's phases per rank x step: forward, backward, optimizer, other (phase_chart).
 10. each step's critical path across ranks by kind (critical_path_chart; docs/whatif.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..kernelname import hover_name, short_names
from .altair_lib import alt
from .spec_cache import Spec


@dataclass
class Table:
    """What a builder returns instead of a chart when a chart would be a single dot or an empty
    axis (one step, a 0 % bar): a sentence, with a small table when there is more than one row
    (html.py renders it where the chart would be, with the same data-chart name)."""

    title: str
    text: str
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


MAX_BARS = 64
MAX_STEP_COLS = 60
WIDTH = 680

_CATEGORY_COLORS = {
    "compute": "#4c78a8",
    "communication": "#e45756",
    "memory": "#f58518",
    "unknown": "#b279a2",
    "sync": "#9d755d",
}
_CAUSE_COLORS = {
    "host_wait": "#9d755d",
    "kernel_wait": "#bab0ac",
    "other": "#d8d4d0",
    "unreliable": "#e7e1ef",
}
STEP_PARTS = [  # (step_time column, label, colour)
    ("compute_ns", "compute", _CATEGORY_COLORS["compute"]),
    ("exposed_comm_transfer_ns", "exposed comm: transfer", _CATEGORY_COLORS["communication"]),
    ("exposed_comm_wait_ns", "exposed comm: waiting for peers", "#ff9d98"),
    ("exposed_memory_ns", "exposed copies", _CATEGORY_COLORS["memory"]),
    ("exposed_unknown_ns", "exposed unknown", _CATEGORY_COLORS["unknown"]),
    ("idle_input_ns", "idle: data loading", "#eeca3b"),
    ("idle_host_wait_ns", "idle: host launched late", _CAUSE_COLORS["host_wait"]),
    ("idle_kernel_wait_ns", "idle: launch gaps", _CAUSE_COLORS["kernel_wait"]),
    ("idle_other_ns", "idle: other waits", _CAUSE_COLORS["other"]),
    ("idle_unreliable_ns", "idle: before graph replays", _CAUSE_COLORS["unreliable"]),
]
# the same parts on the whole-trace basis (ranks rows): memory is exposed_memcpy_ns there, and
# without steps there is no DataLoader split of idle
TRACE_PARTS = [
    ("exposed_memcpy_ns" if c == "exposed_memory_ns" else c, label, color)
    for c, label, color in STEP_PARTS
    if c != "idle_input_ns"
]
_CAUSE_LABELS = {
    "host_wait": "host launched late",
    "kernel_wait": "launch gap",
    "other": "other wait",
    "unreliable": "before graph replay",
}


def group_values(values: list[int], limit: int) -> list[list[int]]:
    """Split sorted distinct values into at most `limit` runs of consecutive items."""
    if len(values) <= limit:
        return [[v] for v in values]
    size = math.ceil(len(values) / limit)
    return [values[i : i + size] for i in range(0, len(values), size)]


def median(values: list[float]) -> float:
    """The median of values (not empty) as polars computes it (its linear quantile 0.5: the lower
    middle value plus half the way to the upper one), so that the charts built from Python rows
    give the numbers a polars group_by gave (the report of kept results imports no polars)."""
    s = sorted(values)
    lo, hi = s[(len(s) - 1) // 2], s[len(s) // 2]
    return lo + (hi - lo) * 0.5


def group_label(name: str, g: list[int]) -> str:
    return f"{name} {g[0]}" if len(g) == 1 else f"{name}s {g[0]}–{g[-1]}"


def _stacked(rows: list[dict], labels: list[str], parts, title: str, x_title: str) -> Spec:
    data = []
    for row, label in zip(rows, labels):
        for i, (col, name, _) in enumerate(parts):
            data.append({"bar": label, "part": name, "order": i, "ms": (row.get(col) or 0) / 1e6})
    names = [p[1] for p in parts]
    colors = [p[2] for p in parts]
    return Spec(
        _draw_stacked, data=data, labels=labels, names=names, colors=colors, title=title, x_title=x_title
    )


def _draw_stacked(data, labels, names, colors, title, x_title):
    return (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            y=alt.Y("bar:N", title=None, sort=labels),
            x=alt.X("ms:Q", title=x_title, stack="zero"),
            color=alt.Color(
                "part:N",
                title=None,
                scale=alt.Scale(domain=names, range=colors),
                legend=alt.Legend(orient="bottom", columns=3),
            ),
            order=alt.Order("order:Q"),
            tooltip=[alt.Tooltip("bar:N"), alt.Tooltip("part:N"), alt.Tooltip("ms:Q", format=",.3f")],
        )
        .properties(width=WIDTH, height=alt.Step(16), title=title)
    )


def _mean_rows(rows: list[dict], cols: list[str]) -> dict:
    return {c: sum(r.get(c) or 0 for r in rows) / len(rows) for c in cols}


def _rank_step_bars(step_rows: list[dict], cols: list[str], view: str):
    """(rows, labels, note) for one bar per rank x step, or, beyond MAX_BARS bars, one per group
    of consecutive ranks with each column the mean over its steps and ranks (note says so and
    names the tracelake sql view holding every row)."""
    if len(step_rows) <= MAX_BARS:
        rows = sorted(step_rows, key=lambda r: (r["rank"], r["step"]))
        return rows, [f"rank {r['rank']} · step {r['step']}" for r in rows], None
    n_ranks = len({r["rank"] for r in step_rows})
    n_steps = len({r["step"] for r in step_rows})
    groups = group_values(sorted({r["rank"] for r in step_rows}), MAX_BARS)
    rows = [_mean_rows([r for r in step_rows if r["rank"] in set(g)], cols) for g in groups]
    note = (
        f"{n_ranks} ranks × {n_steps} steps: each bar is the mean over the steps"
        + (" and the ranks named" if len(groups) < n_ranks else "")
        + f"; every row is in the {view} view of tracelake sql"
    )
    return rows, [group_label("rank", g) for g in groups], note


def breakdown_chart(step_rows: list[dict], ranks: list[dict]):
    """Stacked time per rank x step (step_time rows), or per rank over the whole trace (ranks rows)
    when the run has no steps. Returns (chart | None, note | None)."""
    if step_rows:
        rows, labels, note = _rank_step_bars(step_rows, [p[0] for p in STEP_PARTS], "step_time")
        return _stacked(
            rows, labels, STEP_PARTS, "Step time by rank and step: where it went", "time (ms)"
        ), note
    if not ranks:
        return None, "no GPU activity in this run"
    cols = [p[0] for p in TRACE_PARTS]
    rows = [
        {
            **r,
            "exposed_unknown_ns": r["span_ns"]
            - r["compute_ns"]
            - r["exposed_comm_ns"]
            - r["exposed_memcpy_ns"]
            - r["gpu_idle_ns"],
        }
        for r in sorted(ranks, key=lambda r: r["rank"])
    ]
    groups = group_values([r["rank"] for r in rows], MAX_BARS)
    if len(groups) == len(rows):
        labels, note = [f"rank {r['rank']} (whole trace)" for r in rows], None
    else:
        by = {r["rank"]: r for r in rows}
        rows = [_mean_rows([by[x] for x in g], cols) for g in groups]
        labels = [group_label("rank", g) for g in groups]
        note = f"{len(by)} ranks: each bar is the mean over the ranks named"
    return _stacked(
        rows, labels, TRACE_PARTS, "GPU time by rank over the whole trace (the run has no steps)", "time (ms)"
    ), note


PHASE_PARTS = [  # (column of phase_chart's rows, label, colour): queries/phases.sql phase_ns
    ("forward", "forward", "#4c78a8"),
    ("backward", "backward", "#72b7b2"),
    ("optimizer", "optimizer", "#f58518"),
    ("other", "other", "#bab0ac"),
]


def phase_chart(phases: list[dict]):
    """Each analysed step window split into forward, backward, optimizer and other (queries/
    phases.sql phase_ns, rows of one run), per rank x step; means over steps per group of ranks
    beyond MAX_BARS bars. Returns (chart | None, note | None)."""
    if not phases:
        return None, "no step with backward ops (forward and backward cannot be told apart)"
    by: dict[tuple, dict] = {}
    for r in phases:
        by.setdefault((r["rank"], r["step"]), {"rank": r["rank"], "step": r["step"]})[r["phase"]] = r[
            "phase_ns"
        ]
    rows, labels, note = _rank_step_bars(list(by.values()), [p[0] for p in PHASE_PARTS], "phases")
    return _stacked(
        rows, labels, PHASE_PARTS, "Step time by phase (the phase that launched the GPU work)", "time (ms)"
    ), note


# the critical path's segment kinds (pipeline/whatif/kinds.py KINDS) and their colours
CRITICAL_COLOURS = {
    "compute": "#4c78a8",
    "communication": "#e45756",
    "memory": "#b279a2",
    "unknown": "#bab0ac",
    "transfer": "#ff9d98",
    "gpu_gap": "#9ecae9",
    "launch": "#f58518",
    "cross_stream": "#72b7b2",
    "sync": "#eeca3b",
    "host": "#ffbf79",
    "data_loading": "#54a24b",
    "untraced": "#d6d6d6",
}


def critical_path_chart(rows: list[dict]):
    """What each step's time was spent on along its critical path across ranks (analyze's
    critical_path rows of one run: step, end_rank, kind, rank, ns), one bar per step (at most
    MAX_BARS: the longest). Returns (chart | None, note | None)."""
    from ..whatif.kinds import KINDS

    if not rows:
        return None, "no critical path: the run has no steps or no GPU work to replay (docs/whatif.md)"
    by: dict[int, dict] = {}
    for r in rows:
        b = by.setdefault(r["step"], {"step": r["step"], "end_rank": r["end_rank"], "others": set()})
        b[r["kind"]] = b.get(r["kind"], 0) + r["ns"]
        if r["rank"] != r["end_rank"]:
            b["others"].add(r["rank"])
    bars = sorted(by.values(), key=lambda b: -sum(b.get(k, 0) for k in KINDS))[:MAX_BARS]
    bars.sort(key=lambda b: b["step"])
    note = f"the {MAX_BARS} longest of {len(by)} steps" if len(by) > MAX_BARS else None
    labels = [
        f"step {b['step']} · ends on rank {b['end_rank']}"
        + (
            f" · through rank{'s' if len(b['others']) > 1 else ''} {', '.join(map(str, sorted(b['others'])))}"
            if b["others"]
            else ""
        )
        for b in bars
    ]
    parts = [(k, k.replace("_", " "), CRITICAL_COLOURS[k]) for k in KINDS if any(b.get(k) for b in bars)]
    return _stacked(bars, labels, parts, "Each step's critical path across ranks, by kind", "time (ms)"), note


def mfu_chart(steps: list[dict], reason: str | None):
    """MFU per step: mean over ranks, with the min–max band. The means are summed in order, as
    the polars group_by this replaced did up to 64 ranks (past that polars summed in blocks: the
    last bit may differ), so a report of kept results imports no polars."""
    rows = [s for s in steps if s["mfu_pct"] is not None]
    if not steps:
        return None, "the run has no steps (MFU is per step)"
    if not rows:
        return None, reason or "MFU not available for this run"
    by: dict[int, list[float]] = {}
    for s in rows:
        by.setdefault(s["step"], []).append(s["mfu_pct"])
    data = [
        {"step": step, "mean": sum(v) / len(v), "lo": min(v), "hi": max(v), "ranks": len(v)}
        for step, v in sorted(by.items())
    ]
    if len(data) == 1:  # one step: a sentence and its ranks, not a single dot
        (d,) = data
        per = sorted(rows, key=lambda s: s["rank"])
        text = f"MFU in step {d['step']}: {d['mean']:.2f} % (mean over {d['ranks']} rank(s)" + (
            f"; min {d['lo']:.2f} %, max {d['hi']:.2f} %)" if d["ranks"] > 1 else ")"
        )
        table = [[str(s["rank"]), f"{s['mfu_pct']:.2f} %"] for s in per[:MAX_BARS]] if len(per) > 1 else []
        return Table("Model FLOPs utilisation", text, ["rank", "MFU"] if table else [], table), (
            f"first {MAX_BARS} of {len(per)} ranks shown" if len(per) > MAX_BARS else None
        )
    return Spec(_draw_mfu, data=data), None


def _draw_mfu(data):
    base = alt.Chart(alt.Data(values=data)).encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d"))
    )
    band = base.mark_area(opacity=0.25, color="#4c78a8").encode(
        y=alt.Y("lo:Q", title="MFU (%)"), y2=alt.Y2("hi:Q")
    )
    line = base.mark_line(point=True, color="#4c78a8").encode(
        y=alt.Y("mean:Q"),
        tooltip=[
            alt.Tooltip("step:Q", format="d"),
            alt.Tooltip("mean:Q", format=".2f"),
            alt.Tooltip("lo:Q", format=".2f"),
            alt.Tooltip("hi:Q", format=".2f"),
            alt.Tooltip("ranks:Q", format="d"),
        ],
    )
    return alt.layer(band, line).properties(
        width=WIDTH, height=220, title="Model FLOPs utilisation per step (mean over ranks, band: min–max)"
    )


def top_kernels_chart(top: list[dict]):
    if not top:
        return None, "no GPU activity in this run"
    label = short_names(t["name"] for t in top[:15])
    data = [
        {
            "kernel": label[t["name"]],
            "name": hover_name(t["name"]),
            "category": t["category"],
            "ms": t["total_ns"] / 1e6,
            "calls": t["calls"],
        }
        for t in top[:15]
    ]
    return Spec(_draw_top_kernels, data=data), None


def _draw_top_kernels(data):
    cats = list(_CATEGORY_COLORS)
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            y=alt.Y("kernel:N", sort="-x", title=None, axis=alt.Axis(labelLimit=380)),
            x=alt.X("ms:Q", title="total time, all ranks (ms)"),
            color=alt.Color(
                "category:N",
                title=None,
                scale=alt.Scale(domain=cats, range=[_CATEGORY_COLORS[c] for c in cats]),
            ),
            tooltip=[
                alt.Tooltip("name:N", title="kernel"),
                alt.Tooltip("category:N"),
                alt.Tooltip("calls:Q"),
                alt.Tooltip("ms:Q", format=",.3f"),
            ],
        )
    )
    return chart.properties(width=420, height=alt.Step(18), title="Top kernels by time")


def _dur(ns: float) -> str:
    for unit, d in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= d:
            return f"{ns / d:.3g}\u00a0{unit}"
    return f"{ns:.3g}\u00a0ns"


def idle_gap_chart(gaps: list[dict]):
    """The GPU's idle time by gap length (power-of-two buckets, queries/idle_gaps.sql), stacked by
    cause: each bar is the summed length of its gaps over all ranks (their count in the tooltip),
    so a million 1 µs gaps weigh what they cost, not what they number."""
    if not gaps:
        return None, "no idle gaps between GPU work"
    data = [
        {
            "bucket": f"{_dur(g['bucket_lo_ns'])}–{_dur(g['bucket_hi_ns'])}",
            "lo": g["bucket_lo_ns"],
            "cause": _CAUSE_LABELS.get(g["cause"], g["cause"]),
            "gaps": g["gaps"],
            "total_ms": g["total_ns"] / 1e6,
        }
        for g in gaps
    ]
    order = [d["bucket"] for d in sorted({d["lo"]: d for d in data}.values(), key=lambda d: d["lo"])]
    return Spec(_draw_idle_gaps, data=data, order=order), None


def _draw_idle_gaps(data, order):
    causes = list(_CAUSE_LABELS)
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            x=alt.X("bucket:N", sort=order, title="idle gap length"),
            y=alt.Y("total_ms:Q", title="idle time, all ranks (ms)", stack="zero"),
            color=alt.Color(
                "cause:N",
                title=None,
                scale=alt.Scale(
                    domain=[_CAUSE_LABELS[c] for c in causes], range=[_CAUSE_COLORS[c] for c in causes]
                ),
            ),
            tooltip=[
                alt.Tooltip("bucket:N"),
                alt.Tooltip("cause:N"),
                alt.Tooltip("total_ms:Q", format=",.3f", title="idle time (ms)"),
                alt.Tooltip("gaps:Q", format="d", title="gaps"),
            ],
        )
    )
    return chart.properties(
        width=WIDTH, height=220, title="GPU idle time by gap length and cause (all ranks, whole trace)"
    )


def comparison_chart(comp: dict):
    rows = [c for c in comp["components"] if c["baseline_ns"] or c["current_ns"]]
    if not rows:
        return None, comp.get("reason") or "nothing to compare"
    data = []
    for c in rows:
        data.append({"component": c["label"], "run": "baseline", "ms": c["baseline_ns"] / 1e6})
        data.append({"component": c["label"], "run": "this run", "ms": c["current_ns"] / 1e6})
    return Spec(
        _draw_comparison, data=data, order=[c["label"] for c in rows], x_title=f"ms {comp['per']}"
    ), None


def _draw_comparison(data, order, x_title):
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            y=alt.Y("component:N", sort=order, title=None),
            yOffset=alt.YOffset("run:N", sort=["baseline", "this run"]),
            x=alt.X("ms:Q", title=x_title),
            color=alt.Color(
                "run:N",
                scale=alt.Scale(domain=["baseline", "this run"], range=["#bab0ac", "#4c78a8"]),
                title=None,
            ),
            tooltip=[alt.Tooltip("component:N"), alt.Tooltip("run:N"), alt.Tooltip("ms:Q", format=",.3f")],
        )
    )
    return chart.properties(
        width=WIDTH, height=alt.Step(12), title="Step-time components: baseline against this run"
    )
