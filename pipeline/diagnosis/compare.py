"""Two runs side by side: which step-time components moved, by how much, and which kernels.

compare_run(current, run_id, baseline, base_run_id) compares one run of an analysis (pipeline.
analyze.analyze result) against a run of another (the baseline), on a common basis:
- both runs have steps (verdict basis "steps"): the mean over the analysed steps and ranks of each
  step_time component (queries/step_time.sql; steps the verdict left out as outliers are left out
  here too), i.e. "per step and rank";
- otherwise, both with GPU work: the whole-trace breakdown per rank (queries/breakdown.sql,
  level 'rank'), mean over ranks, i.e. "per rank over the trace".
Kernels: on the steps basis the kernels launched inside steps (queries/step_kernels.sql), total
time / (ranks x steps); otherwise top_kernels (run analyze with top_n=None for the full list) /
ranks. A component "moved" when it changed by at least MOVED_PCT % of the baseline step (or
trace) time: smaller changes are within step-to-step noise of real runs.
"""

from __future__ import annotations

from .steady import kept_rows

MOVED_PCT = 1.0
TOP_KERNELS = 15

STEP_PARTS = [
    ("step_ns", "step time"),
    ("compute_ns", "compute"),
    ("exposed_comm_ns", "exposed communication"),
    ("exposed_memory_ns", "exposed memory copies"),
    ("exposed_unknown_ns", "exposed unknown GPU work"),
    ("idle_ns", "GPU idle"),
    ("idle_input_ns", "idle: data loading"),
    ("idle_host_wait_ns", "idle: host launched late"),
    ("idle_kernel_wait_ns", "idle: launch gaps"),
    ("idle_other_ns", "idle: other waits"),
    ("idle_unreliable_ns", "idle: before graph replays"),
]
# the parts that sum to the step (or span) time; the idle_* causes split idle
TOP_LEVEL = {
    "compute_ns",
    "exposed_comm_ns",
    "exposed_memory_ns",
    "exposed_memcpy_ns",
    "exposed_unknown_ns",
    "idle_ns",
    "gpu_idle_ns",
}
TRACE_PARTS = [
    ("span_ns", "GPU span"),
    ("compute_ns", "compute"),
    ("exposed_comm_ns", "exposed communication"),
    ("exposed_memcpy_ns", "exposed memory copies"),
    ("gpu_idle_ns", "GPU idle"),
    ("idle_host_wait_ns", "idle: host launched late"),
    ("idle_kernel_wait_ns", "idle: launch gaps"),
    ("idle_other_ns", "idle: other waits"),
    ("idle_unreliable_ns", "idle: before graph replays"),
]


def _verdict(result: dict, run_id: str) -> dict | None:
    return next((v for v in result["verdicts"] if v["run_id"] == run_id), None)


def _basis_rows(result: dict, run_id: str, basis: str) -> list[dict]:
    if basis == "steps":
        v = _verdict(result, run_id) or {}
        return kept_rows([s for s in result["step_time"] if s["run_id"] == run_id], v)
    return [r for r in result["ranks"] if r["run_id"] == run_id]


def kernel_times(result: dict, run_id: str, basis: str) -> dict[tuple[str, str], float]:
    """(name, category) -> ns per rank (and per step on the steps basis)."""
    if basis == "steps":
        rows = [s for s in result["step_time"] if s["run_id"] == run_id]
        n = len({s["rank"] for s in rows}) * len({s["step"] for s in rows})
        src = [k for k in result.get("step_kernels", []) if k["run_id"] == run_id]
    else:
        n = len([r for r in result["ranks"] if r["run_id"] == run_id])
        src = [k for k in result["top_kernels"] if k["run_id"] == run_id]
    if not n:
        return {}
    return {(k["name"], k["category"]): k["total_ns"] / n for k in src}


def pick_baseline_run(run_id: str, baseline: dict) -> str | None:
    """The baseline run to compare run_id with: the run of the same id when the baseline has it,
    else the baseline's only run with GPU work; None when neither exists."""
    ids = [v["run_id"] for v in baseline["verdicts"] if v["basis"] is not None]
    if run_id in ids:
        return run_id
    return ids[0] if len(ids) == 1 else None


def compare_run(current: dict, run_id: str, baseline: dict, base_run_id: str) -> dict:
    """Compare run run_id of `current` against run base_run_id of `baseline` (both analysis
    results). Returns {baseline_run_id, basis ("steps" | "trace" | None), per (what the
    numbers are: "per step and rank" / "per rank over the trace"), components [{key, label,
    baseline_ns, current_ns, delta_ns, delta_pct (of the baseline component; None when it is 0),
    moved}], kernels [{name, category, baseline_ns, current_ns, delta_ns}] (the TOP_KERNELS largest
    changes), summary (one sentence), reason (why not comparable, when basis is None)}."""
    out = {
        "baseline_run_id": base_run_id,
        "basis": None,
        "per": None,
        "components": [],
        "kernels": [],
        "summary": "",
        "reason": None,
    }
    vc, vb = _verdict(current, run_id), _verdict(baseline, base_run_id)
    if not vc or not vb or vc["basis"] is None or vb["basis"] is None:
        out["reason"] = "one of the runs has no GPU work to compare"
        out["summary"] = out["reason"]
        return out
    basis = "steps" if vc["basis"] == vb["basis"] == "steps" else "trace"
    parts = STEP_PARTS if basis == "steps" else TRACE_PARTS
    rc, rb = _basis_rows(current, run_id, basis), _basis_rows(baseline, base_run_id, basis)
    if not rc or not rb:
        out["reason"] = "one of the runs has no rows on a common basis"
        out["summary"] = out["reason"]
        return out

    def mean(rows, key):
        return sum(r.get(key) or 0 for r in rows) / len(rows)

    total_b = mean(rb, parts[0][0])
    comps = []
    for key, label in parts:
        b, c = mean(rb, key), mean(rc, key)
        d = c - b
        comps.append(
            {
                "key": key,
                "label": label,
                "baseline_ns": b,
                "current_ns": c,
                "delta_ns": d,
                "delta_pct": 100 * d / b if b else None,
                "moved": total_b > 0 and abs(d) >= MOVED_PCT / 100 * total_b,
            }
        )
    kb, kc = kernel_times(baseline, base_run_id, basis), kernel_times(current, run_id, basis)
    ks = [
        {
            "name": k[0],
            "category": k[1],
            "baseline_ns": kb.get(k, 0.0),
            "current_ns": kc.get(k, 0.0),
            "delta_ns": kc.get(k, 0.0) - kb.get(k, 0.0),
        }
        for k in set(kb) | set(kc)
    ]
    ks.sort(key=lambda x: (-abs(x["delta_ns"]), x["name"]))
    per = "per step and rank" if basis == "steps" else "per rank over the trace"
    head = comps[0]
    moved = sorted(
        (x for x in comps[1:] if x["moved"] and x["key"] in TOP_LEVEL), key=lambda x: -abs(x["delta_ns"])
    )
    sign = "+" if head["delta_ns"] >= 0 else "−"
    summary = (
        f"{head['label']} {head['baseline_ns'] / 1e6:,.3f} → {head['current_ns'] / 1e6:,.3f} ms {per} "
        f"({sign}{abs(head['delta_ns']) / 1e6:,.3f} ms"
        + (f", {head['delta_pct']:+.1f}%" if head["delta_pct"] is not None else "")
        + ")"
    )
    if moved:
        summary += "; moved: " + ", ".join(
            f"{x['label']} {'+' if x['delta_ns'] >= 0 else '−'}{abs(x['delta_ns']) / 1e6:,.3f} ms"
            for x in moved
        )
    else:
        summary += f"; no component moved by {MOVED_PCT:g}% of the baseline {head['label']} or more"
    out.update(basis=basis, per=per, components=comps, kernels=ks[:TOP_KERNELS], summary=summary)
    return out
