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
    calls = [c for c in result.get("collectives", []) if c["run_id"] == run_id]
    by_op: dict[str, int] = {}
    for c in calls:
        by_op[c["op"]] = by_op.get(c["op"], 0) + (c["transfer_ns"] or 0)
    main_op = max(by_op, key=by_op.get) if by_op else None
    if exp and 100 * exp / span >= MODERATE_PCT:
        worst = max(ranks, key=lambda r: r["exposed_comm_ns"])
        rec = COMM_ADVICE.get(main_op, COMM_ADVICE[None])
        out.append({
            "title": "Exposed communication",
            "recoverable_ns": exp,
            "evidence": [
                f"exposed communication {100 * exp / span:.1f}% of GPU span (mean over {len(ranks)} rank(s))",
                f"comm-compute overlap {ovl:.1f}% (mean)" if ovl is not None else "overlap unknown",
                f"worst rank {worst['rank']}: {worst['exposed_comm_ns'] / 1e6:.3f} ms exposed",
            ] + ([f"most collective time is {main_op} ({100 * by_op[main_op] / max(sum(by_op.values()), 1):.0f}% of matched transfer time)"]
                 if main_op else []),
            "recommendation": rec,
            "sql": f"SELECT rank, step, exposed_comm_ns, comm_ns, overlap_ns FROM breakdown WHERE run_id = '{q}'",
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
                   f"FROM breakdown WHERE run_id = '{q}'",
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
            "sql": f"SELECT * FROM memcpy_bandwidth WHERE run_id = '{q}'",
        })
    strag = [s for s in result.get("stragglers", []) if s["run_id"] == run_id]
    if strag and len(ranks) > 1:
        per_rank: dict[int, list] = {}
        for s in strag:
            t = per_rank.setdefault(s["straggler_rank"], [0, 0])
            t[0] += s["times_last"]
            t[1] += s["caused_wait_ns"] or 0
        worst_rank, (times, caused) = max(per_rank.items(), key=lambda kv: kv[1][1])
        n_calls = sum(s["times_last"] for s in strag)
        caused_per_rank = caused / len(ranks)
        if caused_per_rank >= MODERATE_PCT / 100 * span:
            out.append({
                "title": f"Straggler: rank {worst_rank}",
                "recoverable_ns": caused_per_rank,
                "evidence": [f"rank {worst_rank} started last in {times} of {n_calls} matched collectives",
                             f"the other ranks waited {caused / 1e6:.3f} ms for it in total ({caused_per_rank / 1e6:.3f} ms per rank)"],
                "recommendation": f"Inspect rank {worst_rank}: its host (CPU contention, data loading, GC pauses), its GPU "
                                  "(clocks, thermals, ECC), and load imbalance in its shard of the data or model "
                                  "(uneven sequence lengths, expert routing).",
                "sql": f"SELECT * FROM stragglers WHERE run_id = '{q}' ORDER BY caused_wait_ns DESC",
            })
    return sorted(out, key=lambda f: -f["recoverable_ns"])


COMM_ADVICE = {
    "all_reduce": "Overlap gradient all-reduces with backward: with DDP, tune bucket_cap_mb so buckets fill and "
                  "launch early (and keep gradient_as_bucket_view); consider gradient compression or a larger "
                  "micro-batch per rank; check busbw against the link peak and the transport (NCCL_DEBUG=INFO).",
    "all_gather": "With FSDP, enable forward/backward prefetch and limit_all_gathers so parameter all-gathers overlap "
                  "compute; larger wrapping units mean fewer, larger all-gathers; check busbw against the link peak.",
    "reduce_scatter": "With FSDP, overlap gradient reduce-scatters with backward (backward_prefetch=BACKWARD_PRE) and "
                      "use larger wrapping units; check busbw against the link peak.",
    "all_to_all": "All-to-all (expert or embedding sharding) is latency- and balance-bound: pipeline it with compute "
                  "(split the batch into chunks), balance the splits across ranks, and prefer hierarchical "
                  "all-to-all across hosts.",
    "send_recv": "Point-to-point / all-to-all traffic (SendRecv kernels) is exposed: overlap it with compute "
                 "(pipeline micro-batches, chunked all-to-all), balance what each rank sends, and check the "
                 "transport between hosts (NCCL_DEBUG=INFO).",
    None: "Overlap collectives with compute (DDP bucket_cap_mb, FSDP prefetch, chunked all-to-all) and check "
          "collective busbw against the link peak and the transport (NCCL_DEBUG=INFO).",
}
