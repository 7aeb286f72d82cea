"""The report as data: run summary, verdict, ranked findings and the comparison with a baseline.

build(result, baseline=None) turns an analysis (pipeline.analyze.analyze) into the document that
`tracelake report --format json` prints (contract "tracelake.report/2", docs/report.md) and that
the HTML (html.py) and markdown (markdown.py) renderings show, so all three carry the same verdict
and findings:
  {"schema": "tracelake.report/2", "tracelake_version": str, "window": "all" | "hta",
   "kernel_wait_threshold_ns": int, "baseline": bool,
   "runs": [{"run_id", "summary": {...}, "verdict": {...}, "findings": [...], "comparison": {...} | null,
             "notes": [str]}],
   "notes": [str]}
"""

from __future__ import annotations

from .. import __version__
from ..diagnosis.compare import compare_run, pick_baseline_run
from ..diagnosis.verdict import LABELS, OUTLIER_FACTOR, lowers_confidence

SCHEMA = "tracelake.report/2"


def _run_notes(run_id: str, notes: list[str]) -> list[str]:
    prefix = f"run {run_id}:"
    return [n for n in notes if n.startswith(prefix)]


def build(result: dict, baseline: dict | None = None) -> dict:
    """The report document for every run of `result`; with `baseline` (another analysis), each
    run also gets a comparison with the baseline run chosen by compare.pick_baseline_run (null and
    a note when none fits)."""
    runs = []
    verdicts = {v["run_id"]: v for v in result["verdicts"]}
    doc_notes = [n for n in result["notes"] if not n.startswith("run ")]
    for run in result["runs"]:
        rid = run["run_id"]
        v = verdicts[rid]
        summary = {
            "ranks": len(run["ranks"]),
            "rank_ids": run["ranks"],
            "world_size": run["world_size"],
            "ranks_with_gpu_work": run["ranks_with_gpu_work"],
            "sources": run["sources"],
            "hosts": run.get("hosts", []),
            "gpus": run.get("gpus", []),
            "formats": run.get("formats", []),
            "tool_versions": run.get("tool_versions", {}),
            "steps": len(run["steps"]),
            "steps_analysed": v["steps_used"],
            "basis": v["basis"],
            "analysed_ns": v["analysed_ns"],
        }
        verdict = {
            k: v[k]
            for k in (
                "verdict",
                "confidence",
                "reason",
                "basis",
                "numbers",
                "excluded_steps",
                "median_step_ns",
            )
        }
        verdict["headline"] = [
            {"key": k, "label": LABELS[k], "pct": v["numbers"].get(k)} for k in v["headline"]
        ]
        verdict["also"] = v.get("also", [])
        verdict["straggler"] = v.get("straggler")
        verdict["caveats"] = [
            {"kind": c["kind"], "text": c["text"], "lowers_confidence": lowers_confidence(c, v["verdict"])}
            for c in v.get("caveats", [])
        ]
        notes = _run_notes(rid, result["notes"])
        comparison = None
        if baseline is not None:
            base_id = pick_baseline_run(rid, baseline)
            if base_id is None:
                notes.append(
                    f"run {rid}: no baseline run to compare with (the baseline lake has no run of that id "
                    "and not exactly one run with GPU work)"
                )
            else:
                comparison = compare_run(result, rid, baseline, base_id)
        findings = [
            {k: x for k, x in f.items() if k != "run_id"}
            for f in result.get("findings", [])
            if f["run_id"] == rid
        ]
        runs.append(
            {
                "run_id": rid,
                "summary": summary,
                "verdict": verdict,
                "findings": findings,
                "comparison": comparison,
                "notes": notes,
            }
        )
    return {
        "schema": SCHEMA,
        "tracelake_version": __version__,
        "window": result["window"],
        "kernel_wait_threshold_ns": result["kernel_wait_threshold_ns"],
        "baseline": baseline is not None,
        "runs": runs,
        "notes": doc_notes,
    }


def basis_text(summary: dict, verdict: dict) -> str:
    """One sentence saying what the verdict's shares divide (shared by the HTML and markdown)."""
    if verdict["basis"] == "steps":
        s = (
            f"Basis: step time — {summary['steps_analysed']} step(s) on {summary['ranks_with_gpu_work']} "
            f"rank(s), {summary['analysed_ns'] / 1e6:,.3f} ms in all (each step from the start of its host "
            "step range, ProfilerStep or NVTX, to the end of the GPU work it launched)"
        )
        out = [e for e in verdict["excluded_steps"] if e["why"] == "outlier"]
        inc = [e for e in verdict["excluded_steps"] if e["why"] == "incomplete"]
        if out:
            ex = ", ".join(str(e["step"]) for e in out[:10]) + (" ..." if len(out) > 10 else "")
            s += (
                f"; step(s) {ex} left out: more than {OUTLIER_FACTOR:g}x the median step of "
                f"{verdict['median_step_ns'] / 1e6:,.3f} ms"
            )
        if inc:
            ex = ", ".join(f"{e['step']} on rank {e['rank']}" for e in inc[:10]) + (
                " ..." if len(inc) > 10 else ""
            )
            s += f"; incomplete (GPU work cut off by the end of the trace) and left out: step {ex}"
        return s + "."
    if verdict["basis"] == "trace":
        return (
            "Basis: the whole trace — the run has no steps, so shares are of each rank's GPU span (first "
            f"to last GPU activity), {summary['analysed_ns'] / 1e6:,.3f} ms over "
            f"{summary['ranks_with_gpu_work']} rank(s); input-bound cannot be told without steps."
        )
    return "Basis: none — the run has no GPU activity."


def versions_text(versions: dict) -> str:
    return "; ".join(f"{k} {', '.join(v)}" for k, v in versions.items()) or "not recorded in the inputs"


def gpus_text(gpus: list[dict]) -> str:
    return (
        ", ".join(
            f"{g['ranks']} × {g['name']}"
            if g["name"] != "(unnamed)"
            else f"{g['ranks']} (model not named in the trace)"
            for g in gpus
        )
        or "none recorded"
    )


def timing_text(f: dict) -> str:
    """'12.345 ms per rank (0.617 ms per step)' or 'not timed'."""
    if f.get("recoverable_ns") is None:
        return "not timed"
    s = f"{f['recoverable_ns'] / 1e6:,.3f} ms per rank"
    if f.get("per_step_ns") is not None:
        s += f" ({f['per_step_ns'] / 1e6:,.3f} ms per step)"
    return s
