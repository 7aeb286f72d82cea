"""Findings: what to change, ranked by estimated recoverable GPU time per rank.

Each finding has a title, the recoverable time (mean over ranks of the time the cause costs),
evidence (numbers from the analysis), the SQL that reproduces the evidence in `tracelake sql`,
and a recommendation. Thresholds are those of pipeline/report/verdict.py (MODERATE_PCT).
"""

from __future__ import annotations

from .verdict import MODERATE_PCT


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def findings_for_run(run_id: str, result: dict) -> list[dict]:
    ranks = [r for r in result["ranks"] if r["run_id"] == run_id]
    if not ranks:
        return []
    span = _mean([r["span_ns"] for r in ranks]) or 0
    if span <= 0:
        return []
    q = run_id.replace("'", "''")
    out = []
    exp = _mean([r["exposed_comm_ns"] for r in ranks])
    ovl = _mean([r["comm_comp_overlap_pct"] for r in ranks])
    if exp and 100 * exp / span >= MODERATE_PCT:
        worst = max(ranks, key=lambda r: r["exposed_comm_ns"])
        out.append({
            "title": "Exposed communication",
            "recoverable_ns": exp,
            "evidence": [
                f"exposed communication {100 * exp / span:.1f}% of GPU span (mean over {len(ranks)} rank(s))",
                f"comm-compute overlap {ovl:.1f}% (mean)" if ovl is not None else "overlap unknown",
                f"worst rank {worst['rank']}: {worst['exposed_comm_ns'] / 1e6:.3f} ms exposed",
            ],
            "recommendation": "Overlap collectives with compute: for DDP tune bucket_cap_mb so gradient all-reduces "
                              "start during backward; for FSDP enable forward/backward prefetch; check collective "
                              "busbw against the link peak and the transport (NCCL_DEBUG=INFO).",
            "sql": f"SELECT rank, step, exposed_comm_ns, comm_ns, overlap_ns FROM ({'{breakdown}'}) WHERE run_id = '{q}'",
        })
    hw = _mean([r["idle_host_wait_ns"] for r in ranks])
    idle = _mean([r["gpu_idle_ns"] for r in ranks]) or 0
    if hw and hw >= MODERATE_PCT / 100 * span:
        rec = hw
        out.append({
            "title": "GPU idle waiting for the host (host wait)",
            "recoverable_ns": rec,
            "evidence": [
                f"GPU idle {100 * idle / span:.1f}% of GPU span, of which host wait {100 * hw / span:.1f}% "
                "(the next work was launched only after the GPU had drained)",
            ],
            "recommendation": "The host launches work too late: capture the step with CUDA graphs or torch.compile "
                              "(mode='reduce-overhead'), raise the batch size per GPU, and move data loading off the "
                              "critical path (DataLoader num_workers, pin_memory).",
            "sql": f"SELECT rank, step, gpu_idle_ns, idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns "
                   f"FROM ({'{breakdown}'}) WHERE run_id = '{q}'",
        })
    mem = _mean([r["exposed_memcpy_ns"] for r in ranks])
    if mem and 100 * mem / span >= MODERATE_PCT:
        pageable = [m for m in result["memcpy"] if m["run_id"] == run_id and "Pageable" in (m["src_kind"] or "", m["dst_kind"] or "")]
        out.append({
            "title": "Exposed memory copies",
            "recoverable_ns": mem,
            "evidence": [f"copies not hidden under compute or communication: {100 * mem / span:.1f}% of GPU span",
                         f"{sum(m['copies'] for m in pageable)} copies from/to pageable host memory" if pageable else "no pageable copies"],
            "recommendation": "Use pinned host buffers (pin_memory=True) with non_blocking=True copies on a side "
                              "stream, and avoid device-to-host syncs (.item(), .cpu()) inside the step.",
            "sql": f"SELECT * FROM ({'{memcpy_bandwidth}'}) WHERE run_id = '{q}'",
        })
    from ..query import sql_text  # late import: findings render SQL text only

    for f in out:
        for name in ("breakdown", "idle_breakdown", "memcpy_bandwidth"):
            f["sql"] = f["sql"].replace("{" + name + "}", sql_text(name).strip().rstrip(";"))
    return sorted(out, key=lambda f: -f["recoverable_ns"])
