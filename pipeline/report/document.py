"""The report as data: run summary, verdict, ranked findings and the comparison with a baseline.

build(result, baseline=None) turns an analysis (pipeline.analyze.analyze) into the document that
`tracelake report --format json` prints (contract "tracelake.report/2", docs/report.md) and that
the HTML (html.py) and markdown (markdown.py) renderings show, so all three carry the same verdict
and findings:
  {"schema": "tracelake.report/2", "tracelake_version": str, "window": "all" | "hta",
   "kernel_wait_threshold_ns": int, "baseline": bool,
   "runs": [{"run_id", "summary": {...}, "verdict": {...}, "findings": [...], "comparison": {...} | null,
             "throughput": {...} | null, "energy": {...} | null, "roofline": {...} | null,
             "gpu_metrics": str | null,
             "notes": [str]}],
   "notes": [str]}
"""

from __future__ import annotations

from .. import __version__
from ..diagnosis.caveats import lowers_confidence
from ..diagnosis.compare import compare_run, pick_baseline_run
from ..diagnosis.diff import diff as diff_runs
from ..diagnosis.roofline import metrics_text
from ..diagnosis.steady import OUTLIER_FACTOR
from ..diagnosis.verdict import LABELS
from ..kernelname import short_name

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
            "nccl_matching": run.get("nccl_matching"),
            "steps": len(run["steps"]),
            "steps_found_by": run.get("steps_found_by", []),
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
                "ranks",
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
                # the verdict of `tracelake diff` (pipeline/diagnosis/diff.py: a confidence interval
                # from both runs' steps, comparability checked) leads the comparison
                gate = diff_runs(baseline, base_id, result, rid)
                comparison["diff"] = {
                    k: gate[k] for k in ("verdict", "reason", "step_time", "who_waited_for")
                }
                comparison["diff"]["not_comparable"] = gate["comparability"]["reasons"]
                comparison["summary"] = (
                    f"{gate['verdict']}: {gate['reason']}. Components: {comparison['summary']}"
                )
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
                "throughput": next((t for t in result.get("throughput", []) if t["run_id"] == rid), None),
                "energy": next((x for x in result.get("energy", []) if x["run_id"] == rid), None),
                "roofline": next((x for x in result.get("roofline_summary", []) if x["run_id"] == rid), None),
                "gpu_metrics": metrics_text(rid, result.get("gpu_metrics", [])),
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


# how a run's steps were found (steps.source, pipeline/ingest/nsys/step_detect.py), for people
FOUND_BY = {
    "profiler_step": "the profiler's ProfilerStep ranges",
    "nvtx": "NVTX step ranges",
    "nvtx_repeat": "a repeating NVTX range (the trace has no ProfilerStep)",
    "kernel_period": "the period of the kernel sequence (no ProfilerStep or step range: a step is one "
    "repetition of the GPU work, which may be a layer rather than a training iteration)",
}


def steps_found_text(found_by: list[str]) -> str:
    """How the steps were found, in words ('' for an unknown list): shared by the HTML, markdown and CLI."""
    return " and ".join(FOUND_BY.get(f, f) for f in found_by) or "step ranges"


def basis_text(summary: dict, verdict: dict) -> str:
    """One sentence saying what the verdict's shares divide (shared by the HTML and markdown)."""
    if verdict["basis"] == "steps":
        s = (
            f"Basis: step time — {summary['steps_analysed']} step(s) on {verdict['ranks']} rank(s)"
            + (
                f" of {summary['ranks_with_gpu_work']}"
                if verdict["ranks"] != summary["ranks_with_gpu_work"]
                else ""
            )
            + f", {summary['analysed_ns'] / 1e6:,.3f} ms in all (steps from "
            + steps_found_text(summary.get("steps_found_by", []))
            + "; each from the start of its host step window to the end of the GPU work it launched)"
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


def _cuda_int(v: str) -> str:
    """CUDA's integer versions (1000 x major + 10 x minor: 12040 -> 12.4), other text as it is."""
    return f"{int(v) // 1000}.{int(v) % 1000 // 10}" if v.isdigit() and int(v) >= 1000 else v


def _hip_int(v: str) -> str:
    """HIP_VERSION (10^7 x major + 10^5 x minor + patch: 60443483 -> 6.4.43483), other text as it is."""
    n = int(v) if v.isdigit() else 0
    return f"{n // 10**7}.{n // 10**5 % 100}.{n % 10**5}" if n >= 10**7 else v


def _nv_driver(v: str) -> str:
    """An NVIDIA driver version as older Nsight Systems exports store it, an integer of major x 10^5
    + minor x 100 + patch (pipit's Perlmutter exports: 52510517 = 525.105.17, a CUDA 12.0 driver);
    text (580.95.05) as it is."""
    if not (v.isdigit() and len(v) == 8):
        return v
    n = int(v)
    return f"{n // 100000}.{n // 100 % 1000}.{n % 100:02d}"


# sources.tool_versions key -> (label, formatter): the software of the job first (the CUDA stack,
# NCCL, the driver), then the tools that wrote the inputs; other keys follow as they are
_SOFTWARE = {
    "cuda_runtime_version": ("CUDA runtime", _cuda_int),
    "cuda_version": ("CUDA (NCCL's build)", str),
    "nccl_version": ("NCCL", str),
    "nvidia_driver_version": ("NVIDIA driver", _nv_driver),
    "cuda_driver_version": ("CUDA driver API", _cuda_int),
    "hip_runtime_version": ("HIP runtime", _hip_int),
    "hip_driver_version": ("HIP driver", _hip_int),
    "cupti_version": ("CUPTI API", str),
    "roctracer_version": ("roctracer", str),
    "aws_ofi_nccl": ("aws-ofi-nccl", str),
}
_TOOLS = {
    "nccl_tests_version": ("nccl-tests", str),
    "nsys_version": ("Nsight Systems", str),
    "nsys_export_schema": ("Nsight Systems export schema", str),
    "flight_recorder_version": ("Flight Recorder format", str),
    "schemaVersion": ("Kineto trace schema", str),
}


def nccl_matching_lines(m: dict | None) -> list[str]:
    """The run summary's list of how each NCCL log was matched to the traced ranks (analysis
    runs[].nccl_matching), then the logs that matched no traced rank and the traced ranks without a
    log; [] when the run does not hold both traces and NCCL logs."""
    if not m:
        return []
    how = {"host_pid": "host + pid", "rank": "rank in the world communicator"}

    def ranks(rs: list[int]) -> str:
        return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))

    out = [
        f"NCCL log {x['file']}: {ranks(x['ranks'])}, matched by "
        + " and ".join(how.get(b, b) for b in (x["matched_by"] or "").split(", "))
        for x in m["logs"]
        if x["ranks"]
    ]
    if m["unmatched_logs"]:
        out.append("NCCL log(s) matching no traced rank: " + ", ".join(m["unmatched_logs"]))
    if m["ranks_without_log"]:
        out.append(f"traced {ranks(m['ranks_without_log'])} without an NCCL log")
    return out


def versions_text(versions: dict) -> str:
    """The summary's software line from the run's tool_versions ({key: [values]}): 'CUDA runtime
    12.0; NCCL 2.17.1; CUPTI API 18; Kineto trace schema 1'; when the inputs hold none of the
    job's software, says so before the tool versions they do hold."""

    def item(key: str, label: str, fmt) -> str:
        return f"{label} {', '.join(dict.fromkeys(fmt(str(v)) for v in versions[key]))}"

    soft = [item(k, *_SOFTWARE[k]) for k in _SOFTWARE if versions.get(k)]
    tools = [item(k, *_TOOLS[k]) for k in _TOOLS if versions.get(k)]
    tools += [item(k, k, str) for k in versions if k not in _SOFTWARE and k not in _TOOLS and versions[k]]
    if soft:
        return "; ".join(soft + tools)
    none = "PyTorch, CUDA, NCCL and driver versions not recorded in the inputs"
    return none + (f" (they record: {'; '.join(tools)})" if tools else "")


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
    """'12.345 ms per rank (0.617 ms per rank and step; 1.37 GPU-hours per 1,000 steps, cost 4.11)' or
    'not timed' (pipeline/diagnosis/cost.py for the GPU-hours); a replayed finding starts with
    'if fixed, the step goes from A to B ms (replayed across ranks, identity replay error E %): '."""
    if f.get("recoverable_ns") is None:
        return "not timed"
    s = f"{f['recoverable_ns'] / 1e6:,.3f} ms per rank"
    rp = f.get("replay")
    if rp and rp["gain_ns"] <= 0:  # the step's end does not wait for what the finding names
        return (
            "replayed across ranks, fixing it alone does not shorten the step "
            f"({rp['baseline_step_ns'] / 1e6:,.3f} ms; identity replay error "
            f"{rp['identity_error_pct']:.2f} %): the step waits for other work"
        )
    if rp:  # the fix's gain replayed across ranks (docs/whatif.md): say the step before and after
        s = (
            f"if fixed, the step goes from {rp['baseline_step_ns'] / 1e6:,.3f} to "
            f"{rp['predicted_step_ns'] / 1e6:,.3f} ms (replayed across ranks, identity replay error "
            f"{rp['identity_error_pct']:.2f} %)"
            + (
                f"; counted {s}, the time it names (findings never count an instant twice)"
                if f.get("per_step_ns") is not None and rp["gain_ns"] > f["per_step_ns"] + 500
                else f": {s}"
            )
        )
    extra = []
    if f.get("per_step_ns") is not None:
        extra.append(f"{f['per_step_ns'] / 1e6:,.3f} ms per rank and step")
    if f.get("gpu_hours_per_1000_steps") is not None:
        hours = f"{f['gpu_hours_per_1000_steps']:,.3g} GPU-hours per 1,000 steps"
        if f.get("cost_per_1000_steps") is not None:
            hours += f", cost {f['cost_per_1000_steps']:,.3g}"
        extra.append(hours)
    return s + (f" ({'; '.join(extra)})" if extra else "")


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.3g}"


def _mfu(p: float) -> str:
    return f"{p:.1f}%" if p >= 1 else f"{p:.2g}%"


def roofline_text(s: dict | None) -> str | None:
    """The roofline line under the verdict (pipeline/diagnosis/roofline.py summary): how much of
    the compute the roofline covers, the time by bound, the share of peak, the top loser; None
    when the run has no modelled kernel."""
    if s is None:
        return None
    if not s["modelled_ns"] or s["coverage_pct"] is None:  # modelled kernels of 0 ns: no share to state
        return (
            "Roofline: the compute kernels with modelled work took no measured time (0 ns in the trace), "
            "so no bound or share of peak is stated."
        )
    out = (
        f"Roofline: {s['coverage_pct']:.0f}% of compute-kernel time has modelled work (op shapes); of it "
        f"{s['latency_bound_pct']:.0f}% latency-bound, {s['memory_bound_pct']:.0f}% memory-bound, "
        f"{s['compute_bound_pct']:.0f}% compute-bound"
        + (f", {s['unknown_bound_pct']:.0f}% unknown" if s["unknown_bound_pct"] else "")
    )
    if s["peak_pct"] is not None:
        out += f", delivering {s['peak_pct']:.2g}% of the {s['device_name']}'s peak FLOP/s"
    if s["top"]:
        t = s["top"][0]
        out += (
            f"; most time lost against its roof: {short_name(t['kernel_name'])} ({t['op_name']}, "
            f"{t['bound']}-bound, {t['lost_ns'] / 1e6:,.3f} ms over all ranks)"
        )
    return out + "."


def throughput_text(t: dict | None, energy: dict | None, findings: list[dict] = ()) -> str | None:
    """The throughput line under the verdict: tokens/s per GPU and for the job with their source,
    MFU from op shapes (or that it is not measurable, when too little of the compute has op shapes:
    throughput.mfu_measurable) and by PaLM's formula with their inputs, energy per step and token;
    None when the run has none of them (pipeline/diagnosis/throughput.py, cost.py). findings: the
    run's, so that the line refers to the low-MFU finding only when there is one."""
    parts = []
    if t is not None and t["tokens_per_s_per_gpu"] is not None:
        src = {
            "user": "--tokens-per-step",
            "global_batch": "--global-batch x --seq-len",
            "embedding": "tokens read from aten::embedding shapes",
        }.get(t["tokens_source"], t["tokens_source"])
        parts.append(
            f"{_rate(t['tokens_per_s_per_gpu'])} tokens/s per GPU, {_rate(t['tokens_per_s'])} for the job "
            f"({t['world_size']} GPU(s); {src}, {t['tokens_per_step']:,.0f} tokens per GPU and step)"
        )
    if t is not None and t["mfu_pct"] is not None:
        cov = t["flop_coverage_pct"]
        if not t.get("mfu_measurable", True):
            # too little of the compute has op shapes: a figure would describe the rest as idle
            parts.append(
                f"MFU not measurable from op shapes: only {cov or 0:.0f}% of compute-kernel time has "
                "modelled FLOPs (give --model-flops-per-step for a figure)"
            )
        else:
            low = any(f.get("kind") == "low_mfu" for f in findings)
            parts.append(
                f"MFU {_mfu(t['mfu_pct'])} from op shapes over the whole trace (median of the ranks"
                + ("; the low-MFU finding is per analysed step)" if low else ")")
                + (f" (FLOP coverage {cov:.0f}%)" if cov is not None else "")
                + (f" of {t['peak_tflops']:g} TFLOP/s" if t["peak_tflops"] else "")
            )
    if t is not None and t["palm_mfu_pct"] is not None:
        parts.append(
            f"MFU {_mfu(t['palm_mfu_pct'])} by PaLM's formula "
            f"({t['palm_flops_per_token']:.3g} FLOP per token)"
        )
    if energy is not None:
        s = f"{energy['energy_j_per_step']:,.3g} J per GPU and step ({energy['mean_power_w']:,.0f} W mean)"
        if energy["energy_j_per_token"] is not None:
            s += f", {energy['energy_j_per_token']:.3g} J per token"
        parts.append(s)
    return "Throughput: " + "; ".join(parts) + "." if parts else None
