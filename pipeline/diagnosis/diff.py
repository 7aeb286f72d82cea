"""Run against run: the regression gate behind `tracelake diff` (docs/usage.md "Diff: the CI
gate"; its JSON document `tracelake.diff/1`: docs/diff-json.md).

diff(base_doc, base_run, cand_doc, cand_run, ...) takes two analysis documents (pipeline.analyze
results, computed with top_n=None so every kernel is listed) and one run of each, and says:

1. **Comparable or not** (`comparability`): not comparable when a side has no steps to compare
   (the gate compares step times; docs/usage.md "Steps"), steps defined differently (found by
   other rules or from other ranges: runs' steps_found_by and step_kinds; a ProfilerStep against
   a kernel period is an iteration against a layer), fewer than 2 samples on a side (no noise
   bound), another world size, other GPU models, or a kernel mix too different: less than
   MIN_SHARED_PCT of a side's step kernel time in kernel names the other side also ran (two
   models, not two versions of one). Other software versions (CUDA, NCCL, PyTorch: the runs'
   tool_versions) are warnings: a version upgrade is often the change being measured.
2. **The step-time change with a 95 % confidence interval from the runs' own steps**: each
   side's samples are its complete steps from its first steady step on (the warm-up outliers
   before it left out, pipeline/diagnosis/steady.py; later slow steps kept: a recurring stall is
   a regression, and the document warns of them), one sample per step = the mean over ranks of
   step_ns (queries/step_time.sql). Sides whose mean GPU activities per step differ more than
   twofold are not comparable (an iteration against a layer). With `align="step"` only step
   numbers found on both sides are used. When a side has fewer than 2 steps, the samples are its
   (rank, step) rows and the unit says so, with a warning (ranks of one step are not
   independent: the interval then holds the rank-to-rank spread only). The interval is
   Welch's: change = mean_c - mean_b, se = sqrt(s_b^2/n_b + s_c^2/n_c), Welch-Satterthwaite
   degrees of freedom, Student's t at 0.975 (T975, rounded down to a listed df: conservative).
   A run of 20 steps with 1 % jitter gives a far tighter interval than a run of 2, which is the
   point: no fixed noise floor.
3. **Attribution**: the change split into COMPONENTS, which partition step_ns in step_time.sql
   (compute + exposed transfer + waiting for peers + memory copies + host-bound idle +
   input-bound idle + other = step), averaged the same way as the step time, so the components'
   changes add up to the step-time change exactly. Waiting for peers names the candidate's
   straggler (the verdict's: the rank last into most collectives) when there is one.
4. **Kernels and ops that moved**: time per step and rank of each kernel launched inside the steps
   (queries/step_kernels.sql, as pipeline/diagnosis/compare.py), the TOP_KERNELS largest changes,
   each with a label that tells it apart from the others (pipeline/kernelname.short_names); and
   the same for the GPU time of each launching op (queries/step_ops.sql) when it is given.
5. **Verdict**: `not comparable`; `regression` when the whole interval is above 0 and the change
   is at least min_change_pct of the baseline; `improvement` when the whole interval is below 0
   and the change is at most -min_change_pct; else `no change`.
6. **Gate**: fail_on_regression_pct fails a regression whose change is at least that share of the
   baseline step; fail_on {component: pct} fails when that component grew by at least pct % of
   the baseline step time (a point estimate; a component that did not grow never fails
   it). exit_code: EXIT_GATE when the gate fails,
   EXIT_NOT_COMPARABLE for a pair that is not comparable, else 0.
"""

from __future__ import annotations

import math

from ..kernelname import short_names
from .compare import kernel_times
from .steady import kept_rows

SCHEMA = "tracelake.diff/1"
EXIT_GATE = 1
EXIT_NOT_COMPARABLE = 5
MIN_SHARED_PCT = 50.0
TOP_KERNELS = 10
# Student's t, two-sided 95 % (upper 0.025 quantile) by degrees of freedom: NIST/SEMATECH
# e-Handbook of Statistical Methods, section 1.3.6.7.2 "Critical values of the Student's t
# distribution"; above 120 the normal 1.960
T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
    18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
    26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 50: 2.009, 60: 2.000,
    80: 1.990, 100: 1.984, 120: 1.980,
}  # fmt: skip
# key, label, the step_time fields (analysis document names) that make it; together they are step_ns
COMPONENTS = [
    ("compute", "compute", ("compute_ns",)),
    ("exposed_transfer", "exposed transfer", ("exposed_comm_transfer_ns",)),
    ("peer_wait", "waiting for peers", ("exposed_comm_wait_ns",)),
    ("memory_copies", "memory copies", ("exposed_memory_ns",)),
    ("host_idle", "host-bound idle", ("idle_host_wait_ns", "idle_kernel_wait_ns")),
    ("input_idle", "input-bound idle", ("idle_input_ns",)),
    ("other", "other (unknown work, other waits, graph replays)",
     ("exposed_unknown_ns", "idle_other_ns", "idle_unreliable_ns")),
]  # fmt: skip
COMPONENT_KEYS = [c[0] for c in COMPONENTS]


def t975(df: float) -> float:
    """Student's t 0.975 quantile for df degrees of freedom (the listed df at or below it)."""
    if not df or df < 1:
        return T975[1]
    if df > 120:
        return 1.960
    return T975[max(k for k in T975 if k <= df)]


def welch(b: list[float], c: list[float]) -> tuple[float, float, float]:
    """(change = mean(c) - mean(b), half-width of its 95 % interval, degrees of freedom) by
    Welch's t; needs 2 or more samples on each side (ValueError otherwise)."""
    nb, nc = len(b), len(c)
    if nb < 2 or nc < 2:
        raise ValueError("Welch's interval needs 2 or more samples on each side")
    mb, mc = sum(b) / nb, sum(c) / nc
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1) / nb
    vc = sum((x - mc) ** 2 for x in c) / (nc - 1) / nc
    se = math.sqrt(vb + vc)
    if se == 0:
        return mc - mb, 0.0, float(nb + nc - 2)
    df = (vb + vc) ** 2 / ((vb**2 / (nb - 1) if vb else 0) + (vc**2 / (nc - 1) if vc else 0))
    return mc - mb, t975(df) * se, df


def _run(doc: dict, run_id: str) -> dict:
    return next((r for r in doc["runs"] if r["run_id"] == run_id), {})


def _verdict(doc: dict, run_id: str) -> dict:
    return next((v for v in doc["verdicts"] if v["run_id"] == run_id), {})


def _rows(doc: dict, run_id: str) -> tuple[list[dict], int]:
    """The step_time rows a side compares, and how many slow steps among them the verdict had left
    out: incomplete (rank, step) rows and the warm-up (the outlier steps before the first steady
    step) are left out; slow steps after it are kept, since a stall that recurs is exactly what a
    gate must see (the verdict's steady selection, pipeline/diagnosis/steady.py, leaves every
    outlier out: a stall every 4th step read as no change)."""
    rows = [s for s in doc["step_time"] if s["run_id"] == run_id and s.get("step_ns") is not None]
    v = _verdict(doc, run_id)
    outliers = {e["step"] for e in v.get("excluded_steps", []) if e["why"] == "outlier"}
    rows = kept_rows(
        rows, {"excluded_steps": [e for e in v.get("excluded_steps", []) if e["why"] != "outlier"]}
    )
    steady = sorted({r["step"] for r in rows} - outliers)
    if not steady:
        return rows, 0
    rows = [r for r in rows if r["step"] >= steady[0]]
    return rows, len({r["step"] for r in rows} & outliers)


def _samples(rows: list[dict], by_step: bool) -> list[dict]:
    """One sample per step (the mean over its ranks) or per (rank, step) row: step_ns and each
    component, in ns."""
    fields = ["step_ns"] + [f for _, _, fs in COMPONENTS for f in fs]
    if not by_step:
        return [{f: float(r.get(f) or 0) for f in fields} for r in rows]
    steps: dict[int, list[dict]] = {}
    for r in rows:
        steps.setdefault(r["step"], []).append(r)
    return [
        {f: sum(float(r.get(f) or 0) for r in rs) / len(rs) for f in fields}
        for _, rs in sorted(steps.items())
    ]


def _mean(samples: list[dict], fields) -> float:
    return sum(sum(s[f] for f in fields) for s in samples) / len(samples) if samples else 0.0


def _versions(run: dict) -> dict[str, list[str]]:
    return {k: v for k, v in (run.get("tool_versions") or {}).items() if k.lower() != "host"}


def _side(doc: dict, run_id: str, rows: list[dict], samples: list[dict], unit: str) -> dict:
    run = _run(doc, run_id)
    return {
        "run_id": run_id,
        "world_size": run.get("world_size"),
        "ranks_with_gpu_work": run.get("ranks_with_gpu_work"),
        "gpus": sorted(g["name"] for g in run.get("gpus", [])),
        "steps": sorted({r["step"] for r in rows}),
        "steps_found_by": run.get("steps_found_by", []),
        "samples": len(samples),
        "unit": unit,
        "step_ns_mean": _mean(samples, ["step_ns"]) if samples else None,
    }


def comparability(base_doc, base_run, cand_doc, cand_run, kb, kc, nb, nc) -> dict:
    """Reasons the pair is not comparable (empty: comparable) and warnings; kb/kc: kernel ns per
    (name, category) of each side; nb/nc: samples of each side."""
    rb, rc = _run(base_doc, base_run), _run(cand_doc, cand_run)
    reasons, warnings = [], []
    for side, doc, rid in (("baseline", base_doc, base_run), ("candidate", cand_doc, cand_run)):
        if _verdict(doc, rid).get("basis") != "steps":
            reasons.append(
                f"the {side} run {rid} has no steps to compare (the gate compares step times; for an "
                "Nsight Systems export whose steps are not found give --step-range, or check the one given)"
            )
    fb, fc = (
        (rb.get("steps_found_by"), rb.get("step_kinds")),
        (rc.get("steps_found_by"), rc.get("step_kinds")),
    )
    if not reasons and fb != fc and None not in (fb[0], fc[0]):
        reasons.append(
            f"steps defined differently: {_steps_text(fb)} against {_steps_text(fc)} (one step of each is "
            "not the same unit of work; give both the same --step-range)"
        )
    if not reasons and (nb < 2 or nc < 2):
        reasons.append(f"fewer than 2 samples of the step time on a side ({nb} and {nc}): no noise bound")
    wb = rb.get("world_size") or rb.get("ranks_with_gpu_work")
    wc = rc.get("world_size") or rc.get("ranks_with_gpu_work")
    if wb and wc and wb != wc:
        reasons.append(f"world size {wb} against {wc}")
    gb = sorted({g["name"] for g in rb.get("gpus", [])})
    gc = sorted({g["name"] for g in rc.get("gpus", [])})
    if gb and gc and gb != gc:
        reasons.append(f"GPU models {', '.join(gb)} against {', '.join(gc)}")
    if any("has no steps" in r for r in reasons):  # no step kernels: the mix would say nothing more
        kb = kc = {}
    names_b = {k[0] for k in kb}
    names_c = {k[0] for k in kc}
    shared = names_b & names_c
    tb, tc = sum(kb.values()), sum(kc.values())
    shared_b = 100 * sum(v for k, v in kb.items() if k[0] in shared) / tb if tb else None
    shared_c = 100 * sum(v for k, v in kc.items() if k[0] in shared) / tc if tc else None
    low = [p for p in (shared_b, shared_c) if p is not None and p < MIN_SHARED_PCT]
    if low:
        reasons.append(
            f"different kernel mix: {shared_b or 0:.1f} % of the baseline's and {shared_c or 0:.1f} % of the "
            f"candidate's step kernel time is in kernels both ran (under {MIN_SHARED_PCT:g} %: another "
            "model?)"
        )
    vb, vc = _versions(rb), _versions(rc)
    versions = {k: [vb.get(k), vc.get(k)] for k in sorted(set(vb) | set(vc)) if vb.get(k) != vc.get(k)}
    for k, (a, b) in versions.items():
        warnings.append(f"versions differ: {k}: {', '.join(a or ['?'])} against {', '.join(b or ['?'])}")
    return {
        "comparable": not reasons,
        "reasons": reasons,
        "warnings": warnings,
        "shared_kernel_pct": [shared_b, shared_c],
        "versions": versions,
    }


def _steps_text(found: tuple) -> str:
    by, kinds = found
    return f"{', '.join(repr(k) for k in (kinds or [])[:3]) or '?'} ({', '.join(by or []) or '?'})"


def _who(cand_doc: dict, cand_run: str) -> dict | None:
    s = (_verdict(cand_doc, cand_run) or {}).get("straggler")
    if not s or s.get("rank") is None:
        return None
    return {k: s.get(k) for k in ("rank", "times_last", "calls", "cause")}


def diff(
    base_doc: dict,
    base_run: str,
    cand_doc: dict,
    cand_run: str,
    *,
    align: str = "steady",
    min_change_pct: float = 1.0,
    fail_on_regression_pct: float | None = None,
    fail_on: dict[str, float] | None = None,
    ops: tuple[list[dict], list[dict]] | None = None,
) -> dict:
    """The `tracelake.diff/1` document of candidate run cand_run against baseline run base_run
    (module doc). align: "steady" (each side's complete steps from its first steady step on) or
    "step" (step numbers on both sides only). ops: the rows of queries/step_ops.sql of each side
    (GPU time per launching op), for the ops that moved (None: no `ops` list). Raises ValueError
    for an unknown align or fail_on component."""
    if align not in ("steady", "step"):
        raise ValueError(f"align: 'steady' or 'step', not {align!r}")
    bad = sorted(set(fail_on or {}) - set(COMPONENT_KEYS))
    if bad:
        raise ValueError(f"unknown component(s) {', '.join(bad)}: one of {', '.join(COMPONENT_KEYS)}")
    (rb, slow_b), (rc, slow_c) = _rows(base_doc, base_run), _rows(cand_doc, cand_run)
    no_common = False
    if align == "step":
        common = {r["step"] for r in rb} & {r["step"] for r in rc}
        no_common = bool(rb and rc and not common)
        rb, rc = [r for r in rb if r["step"] in common], [r for r in rc if r["step"] in common]
    by_step = len({r["step"] for r in rb}) >= 2 and len({r["step"] for r in rc}) >= 2
    unit = "step (mean over ranks)" if by_step else "rank and step"
    sb, sc = _samples(rb, by_step), _samples(rc, by_step)
    kb = kernel_times(base_doc, base_run, "steps")
    kc = kernel_times(cand_doc, cand_run, "steps")
    comp = comparability(base_doc, base_run, cand_doc, cand_run, kb, kc, len(sb), len(sc))
    if no_common:
        comp["reasons"].append("no step number is on both sides (--align step): use --align steady")
    work = [sum(r.get("activities") or 0 for r in rows) / len(rows) for rows in (rb, rc) if rows]
    if len(work) == 2 and min(work) > 0 and max(work) > 2 * min(work) and not comp["reasons"]:
        comp["reasons"].append(
            f"steps hold different amounts of work: {work[0]:,.0f} against {work[1]:,.0f} GPU activities per "
            "step and rank (one side's step is not the other's: an iteration against a layer?)"
        )
    if not by_step and len(sb) >= 2 and len(sc) >= 2:
        comp["warnings"].append(
            "fewer than 2 steps on a side: the samples are its ranks, so the interval holds the ranks' "
            "spread, not step-to-step noise; profile several steps before trusting a gate on it"
        )
    for side, slow in (("baseline", slow_b), ("candidate", slow_c)):
        if slow:
            comp["warnings"].append(
                f"the {side} has {slow} slow step(s) (over the verdict's outlier bar) after its first steady "
                "step: they are compared, as a recurring stall should be"
            )
    comp["comparable"] = not comp["reasons"]
    doc = {
        "schema": SCHEMA,
        "baseline": _side(base_doc, base_run, rb, sb, unit),
        "candidate": _side(cand_doc, cand_run, rc, sc, unit),
        "align": align,
        "comparability": comp,
        "verdict": "not comparable",
        "reason": "; ".join(comp["reasons"]),
        "step_time": None,
        "components": [],
        "who_waited_for": None,
        "kernels": [],
        "ops": [],
        "gate": {"fail_on_regression_pct": fail_on_regression_pct, "fail_on": fail_on or {}, "failed": False,
                 "reasons": []},
        "exit_code": EXIT_NOT_COMPARABLE,
    }  # fmt: skip
    if not comp["comparable"]:
        return doc
    change, half, df = welch([s["step_ns"] for s in sb], [s["step_ns"] for s in sc])
    mb = _mean(sb, ["step_ns"])
    pct = 100 * change / mb if mb else 0.0
    lo, hi = change - half, change + half
    doc["step_time"] = {
        "baseline_ns": mb,
        "candidate_ns": _mean(sc, ["step_ns"]),
        "change_ns": change,
        "change_pct": pct,
        "ci_low_ns": lo,
        "ci_high_ns": hi,
        "ci_low_pct": 100 * lo / mb if mb else None,
        "ci_high_pct": 100 * hi / mb if mb else None,
        "confidence": 0.95,
        "df": df,
        "samples": [len(sb), len(sc)],
    }
    comps = []
    for key, label, fields in COMPONENTS:
        b, c = _mean(sb, fields), _mean(sc, fields)
        comps.append(
            {
                "key": key,
                "label": label,
                "baseline_ns": b,
                "candidate_ns": c,
                "delta_ns": c - b,
                "delta_pct_of_step": 100 * (c - b) / mb if mb else None,
            }
        )
    doc["components"] = comps
    doc["who_waited_for"] = _who(cand_doc, cand_run)
    moved = [
        {"name": k[0], "category": k[1], "baseline_ns": kb.get(k, 0.0), "candidate_ns": kc.get(k, 0.0)}
        for k in set(kb) | set(kc)
    ]
    for m in moved:
        m["delta_ns"] = m["candidate_ns"] - m["baseline_ns"]
    moved = [m for m in moved if m["delta_ns"] != 0]  # a kernel that did not move is not listed
    moved.sort(key=lambda m: (-abs(m["delta_ns"]), m["name"], m["category"]))
    moved = moved[:TOP_KERNELS]
    labels = short_names([m["name"] for m in moved])
    for m in moved:
        m["label"] = labels.get(m["name"], m["name"])
    doc["kernels"] = moved
    if ops is not None:
        doc["ops"] = _ops_moved(base_doc, base_run, ops[0], cand_doc, cand_run, ops[1])
    if lo > 0 and pct >= min_change_pct:
        verdict = "regression"
    elif hi < 0 and pct <= -min_change_pct:
        verdict = "improvement"
    else:
        verdict = "no change"
    doc["verdict"] = verdict
    doc["reason"] = _reason(verdict, doc["step_time"], min_change_pct, comps)
    gate = doc["gate"]
    if fail_on_regression_pct is not None and verdict == "regression" and pct >= fail_on_regression_pct:
        gate["reasons"].append(f"step time +{pct:.1f} % (at least {fail_on_regression_pct:g} %)")
    for key, limit in sorted((fail_on or {}).items()):
        c = next(x for x in comps if x["key"] == key)
        if c["delta_ns"] > 0 and c["delta_pct_of_step"] is not None and c["delta_pct_of_step"] >= limit:
            gate["reasons"].append(
                f"{c['label']} +{c['delta_pct_of_step']:.1f} % of the baseline step (at least {limit:g} %)"
            )
    gate["failed"] = bool(gate["reasons"])
    doc["exit_code"] = EXIT_GATE if gate["failed"] else 0
    return doc


def _per_step(doc: dict, run_id: str, rows: list[dict]) -> dict[str, float]:
    """op -> GPU ns per step and rank (as compare._kernels divides the kernels)."""
    st = [s for s in doc["step_time"] if s["run_id"] == run_id]
    n = len({s["rank"] for s in st}) * len({s["step"] for s in st})
    return {r["op"]: r["total_ns"] / n for r in rows if r["run_id"] == run_id} if n else {}


def _ops_moved(base_doc, base_run, base_rows, cand_doc, cand_run, cand_rows) -> list[dict]:
    ob, oc = _per_step(base_doc, base_run, base_rows), _per_step(cand_doc, cand_run, cand_rows)
    out = [
        {
            "op": o,
            "baseline_ns": ob.get(o, 0.0),
            "candidate_ns": oc.get(o, 0.0),
            "delta_ns": oc.get(o, 0.0) - ob.get(o, 0.0),
        }
        for o in set(ob) | set(oc)
    ]
    out = [m for m in out if m["delta_ns"] != 0]
    out.sort(key=lambda m: (-abs(m["delta_ns"]), m["op"]))
    return out[:TOP_KERNELS]


def _reason(verdict: str, st: dict, min_change_pct: float, comps: list[dict]) -> str:
    ci = f"95 % interval {st['ci_low_pct']:+.1f} % to {st['ci_high_pct']:+.1f} %"
    head = (
        f"step time {st['baseline_ns'] / 1e6:,.3f} → {st['candidate_ns'] / 1e6:,.3f} ms "
        f"({st['change_pct']:+.1f} %, {ci})"
    )
    if verdict == "no change":
        why = (
            "the interval holds 0"
            if st["ci_low_ns"] <= 0 <= st["ci_high_ns"]
            else f"smaller than {min_change_pct:g} %"
        )
        return f"{head}: {why}"
    top = max(comps, key=lambda c: abs(c["delta_ns"])) if comps else None
    if top is None or top["delta_ns"] == 0:
        return head
    return f"{head}; most of it {top['label']} ({top['delta_ns'] / 1e6:+,.3f} ms per step)"
