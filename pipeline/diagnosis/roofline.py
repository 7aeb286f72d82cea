"""Kernels against the roofline (queries/roofline.sql, views/80_kernel_roofline.sql): the per-run
summary, the note when the roofline cannot be drawn, and the finding "GPU compute runs at X % of
peak because its kernels are memory- / latency-bound" (issue 17, point 3).

summary(run_id, rows) -> dict or None, over the run's roofline rows:
  modelled_ns        compute-kernel time with modelled work (sum of dur_ns)
  run_compute_ns     all compute-kernel time of the run in scope
  coverage_pct       100 * modelled_ns / run_compute_ns: the share of compute the roofline describes
  compute_bound_pct, memory_bound_pct, latency_bound_pct, unknown_bound_pct
                     shares of modelled_ns by the kernels' bound (views/80_kernel_roofline.sql)
  peak_pct           100 * sum(flops) / sum(dur_ns * peak): the share of the device's peak FLOP/s
                     the modelled kernel time delivered (each kernel against the peak of its own
                     precision and class)
  roof_pct           100 * (1 - sum(lost_ns) / modelled_ns): how close the modelled kernels came
                     to their own roofs, time-weighted
  lost_ns            sum of the kernels' lost_ns (time at their roofs saved: an upper bound)
  above_roof_pct     share of modelled_ns in kernels above 100 % of their roof (modelled work
                     beyond what the device can do: misrecorded shapes or dtypes, or the timing
                     resolution of short kernels); a note names it when it is ABOVE_ROOF_NOTE_PCT
                     or more, since those kernels' figures cannot be trusted
  top                the TOP_KERNELS groups by lost_ns (kernel, op, bound, roof_pct, lost_ns)
  device_name        the device the peaks are from

The finding (kind roofline_bound, untimed: its time is compute time, which the timed findings do
not claim, but datasheet roofs are rarely reached, so lost_ns is evidence, not a promise):
raised when the roofline describes at least MIN_COVERAGE_PCT of the compute time and at least
BOUND_PCT of the modelled time is in memory-bound and latency-bound kernels together, while
those kernels reach under ROOF_LOW_PCT of their roof. The bars: MIN_COVERAGE_PCT is the MFU
finding's FLOP-coverage bar (findings.MIN_FLOP_COVERAGE_PCT, 50 %): below it the figure
describes too little of the compute to act on; BOUND_PCT = 50 % (most of the modelled time);
ROOF_LOW_PCT = 50 % (TraceLens measures 60-70 % of the datasheet roof as attainable for GEMMs,
../shared/reference/peers.md 3.7: under 50 % there is room even against attainable peaks).
"""

from __future__ import annotations

import statistics

from ..kernelname import short_names
from .basis import ms as _ms
from .findings import MIN_FLOP_COVERAGE_PCT

MIN_COVERAGE_PCT = MIN_FLOP_COVERAGE_PCT
BOUND_PCT = 50.0
ROOF_LOW_PCT = 50.0
TOP_KERNELS = 5
ABOVE_ROOF_NOTE_PCT = 1.0  # a note when this share of modelled time runs "above" its roof


def _pct(a, b):
    return 100.0 * a / b if b else None


def summary(run_id: str, rows: list[dict]) -> dict | None:
    """The run's roofline summary (module doc), or None when it has no modelled kernel."""
    rs = [r for r in rows if r["run_id"] == run_id]
    if not rs:
        return None
    modelled = sum(r["dur_ns"] for r in rs)
    run_compute = rs[0]["run_compute_ns"] or 0
    by = {b: sum(r[f"{b}_bound_ns"] for r in rs) for b in ("compute", "memory", "latency", "unknown")}
    above = sum(r["above_roof_ns"] for r in rs)
    peak_work = sum(r["dur_ns"] * r["peak_tflops"] * 1e3 for r in rs if r["peak_tflops"])
    flops = sum(r["flops"] or 0 for r in rs if r["peak_tflops"])
    lost = [r["lost_ns"] for r in rs if r["lost_ns"] is not None]
    roofed = sum(r["dur_ns"] for r in rs if r["lost_ns"] is not None)
    top = sorted((r for r in rs if r["lost_ns"] is not None), key=lambda r: -r["lost_ns"])[:TOP_KERNELS]
    return {
        "run_id": run_id,
        "device_name": next((r["device_name"] for r in rs if r["device_name"]), None),
        "modelled_ns": int(modelled),
        "run_compute_ns": int(run_compute),
        "coverage_pct": _pct(modelled, run_compute),
        **{f"{b}_bound_pct": _pct(ns, modelled) for b, ns in by.items()},
        "peak_pct": _pct(flops, peak_work),
        "roof_pct": 100.0 * (1 - sum(lost) / roofed) if roofed else None,
        "above_roof_pct": _pct(above, modelled),
        "lost_ns": float(sum(lost)) if lost else None,
        "top": [
            {
                k: r[k]
                for k in (
                    "kernel_name",
                    "op_name",
                    "bound",
                    "kernels",
                    "dur_ns",
                    "intensity",
                    "achieved_tflops",
                    "achieved_gbps",
                    "roof_pct",
                    "lost_ns",
                )
            }
            for r in top
        ],
    }


def note(run_id: str, s: dict | None, has_shapes: bool, has_compute: bool, device_known: bool) -> str | None:
    """Why a run has no roofline (or only part of one), as one note line; None when it has one."""
    if not has_compute:
        return None
    if s is None:
        why = (
            "no op in the trace has input shapes (record the trace with record_shapes=True)"
            if not has_shapes
            else "no compute kernel was launched by an op whose work is modelled (pipeline/flops.py, "
            "pipeline/opbytes.py)"
        )
        return f"run {run_id}: roofline not available: {why}"
    if s["above_roof_pct"] is not None and s["above_roof_pct"] >= ABOVE_ROOF_NOTE_PCT:
        return (
            f"run {run_id}: roofline: {s['above_roof_pct']:.0f}% of the modelled kernel time is in "
            "kernels above 100% of their roof: their modelled work is more than the device can do "
            "in that time (shapes or element types misrecorded, or the trace's timing resolution "
            "on short kernels); their roof figures are not to be trusted"
        )
    if not device_known or s["peak_pct"] is None:
        return (
            f"run {run_id}: roofline without roofs: the device ({s['device_name'] or 'unnamed'}) has no "
            "compute or memory-bandwidth peak in pipeline/catalog/devices.toml"
        )
    return None


def metrics_text(run_id: str, gpu_metrics: list[dict]) -> str | None:
    """'nsys GPU metrics over the trace (median over N rank(s)): SM active 41%, ...' from the
    whole-trace rows of queries/gpu_metrics.sql, or None when the run has none."""
    rows = [r for r in gpu_metrics if r["run_id"] == run_id and r["step"] is None]
    parts = []
    for col, label in (
        ("sm_active_pct", "SM active"),
        ("sm_issue_pct", "SM issue"),
        ("tensor_active_pct", "tensor active"),
        ("dram_read_pct", "DRAM read"),
        ("dram_write_pct", "DRAM write"),
    ):
        vals = [r[col] for r in rows if r[col] is not None]
        if vals:
            parts.append(f"{label} {statistics.median(vals):.0f}%")
    if not parts:
        return None
    return f"nsys GPU metrics over the trace (median over {len(rows)} rank(s), % of peak): " + ", ".join(
        parts
    )


def findings(run_id: str, s: dict | None, gpu_metrics: list[dict] | None = None) -> list[dict]:
    """The roofline finding for one run (module doc), from its summary; the run's nsys GPU
    metrics (queries/gpu_metrics.sql rows), when captured, are added to its evidence."""
    if s is None or s["peak_pct"] is None or (s["coverage_pct"] or 0) < MIN_COVERAGE_PCT:
        return []
    slow = s["memory_bound_pct"] + s["latency_bound_pct"]
    if slow < BOUND_PCT or s["roof_pct"] is None or s["roof_pct"] >= ROOF_LOW_PCT:
        return []
    mem, lat = s["memory_bound_pct"], s["latency_bound_pct"]
    main = "memory-bound" if mem >= lat else "latency-bound"
    q = run_id.replace("'", "''")
    advice = {
        "memory-bound": "Most kernel time goes to kernels limited by HBM bandwidth: fuse elementwise, "
        "normalization and softmax chains so intermediates stay on chip (torch.compile, fused "
        "LayerNorm/RMSNorm, FlashAttention/SDPA instead of explicit softmax), keep activations in "
        "bf16/fp8, and avoid copies (.contiguous(), dtype casts) between kernels.",
        "latency-bound": "Most kernel time goes to kernels too short or too small to fill the GPU: "
        "give each kernel more work (larger micro-batch or sequence per GPU), fuse small ops "
        "(torch.compile, foreach/fused optimizers) and cut launch overhead with CUDA graphs "
        "(torch.compile mode='reduce-overhead').",
    }[main]
    ev = [
        f"compute kernels with modelled work, FLOPs or bytes ({s['coverage_pct']:.0f}% of compute-kernel "
        f"time, {_ms(s['modelled_ns'])} summed over ranks) "
        f"deliver {s['peak_pct']:.1f}% of the {s['device_name']}'s peak FLOP/s and reach "
        f"{s['roof_pct']:.0f}% of their roofs, time-weighted",
        f"kernel time by bound: memory {mem:.0f}%, latency {lat:.0f}%, compute {s['compute_bound_pct']:.0f}%"
        + (f", unknown {s['unknown_bound_pct']:.0f}%" if s["unknown_bound_pct"] else ""),
    ]
    hw = metrics_text(run_id, gpu_metrics or [])
    if hw:
        ev.append(hw)
    label = short_names(t["kernel_name"] for t in s["top"][:3])
    for t in s["top"][:3]:
        ev.append(
            f"{label[t['kernel_name']]} ({t['op_name']}, {t['kernels']} kernels, {t['bound']}-bound): "
            f"{t['roof_pct']:.0f}% of its roof, {_ms(t['lost_ns'])} lost against it"
        )
    return [
        {
            "kind": "roofline_bound",
            "title": f"GPU compute runs at {s['peak_pct']:.1f}% of peak: its kernels are {main}",
            "recoverable_ns": None,
            "per_step_ns": None,
            "evidence": ev,
            "recommendation": advice,
            "sql": "SELECT kernel_name, op_name, bound, kernels, dur_ns, intensity, achieved_tflops, "
            f"achieved_gbps, roof_pct, lost_ns FROM roofline WHERE run_id = '{q}' ORDER BY lost_ns DESC",
        }
    ]


def for_runs(con, rows: list[dict], run_ids: list[str], compute_runs: set[str], top_n: int | None):
    """(summaries, kept rows, notes) of the runs: summary() per run with modelled kernels, the
    roofline rows kept for the document and chart (top_n per run by lost time; None: all), and
    the note() lines as (run_id, text). con: the analysis connection (asked whether a run's ops
    have shapes only when the run has no modelled kernel)."""
    summaries, notes = [], []
    for rid in run_ids:
        s = summary(rid, rows)
        has_shapes = True
        if s is None and rid in compute_runs:
            has_shapes = bool(
                con.execute(
                    "SELECT count(*) FROM cpu_ops WHERE run_id = ? AND input_dims NOT IN ('[]', '')", [rid]
                ).fetchall()[0][0]
            )
        n = note(rid, s, has_shapes, rid in compute_runs, s is not None and s["peak_pct"] is not None)
        if n:
            notes.append((rid, n))
        if s is not None:
            summaries.append(s)
    kept, per_run = [], {}
    for r in rows:  # ordered by run, then lost time (queries/roofline.sql)
        per_run[r["run_id"]] = per_run.get(r["run_id"], 0) + 1
        if top_n is None or per_run[r["run_id"]] <= top_n:
            kept.append(r)
    return summaries, kept, notes
