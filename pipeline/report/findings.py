"""Findings: what to change, ranked by estimated recoverable time.

A finding is a dict:
  kind            stable identifier (exposed_comm, host_idle, input_idle, exposed_memcpy, straggler,
                  slow_steps, low_mfu; other modules add their own, e.g. NCCL-log findings)
  title           one line
  recoverable_ns  estimated time one rank could win over the analysed time (int ns), or None when
                  the finding cannot be timed (e.g. a misconfiguration seen in a log)
  per_step_ns     the same per step (None on the whole-trace basis or when untimed)
  evidence        list of one-line strings (numbers from the analysis)
  recommendation  what to change
  sql             a query that reproduces the evidence in `tracelake sql` (the metric views)

Recoverable time = the time the cause costs one rank over the verdict's basis (pipeline/report/
verdict.py): on the steps basis the cause's time summed over the analysed steps and averaged over
ranks (for example exposed communication per step x steps); on the whole-trace basis the cause's
time over the trace, averaged over ranks. It is an upper bound of what removing the cause wins
(hiding all exposed communication cannot make a step shorter than its compute).
A cause becomes a finding when it reaches the verdict's moderate bar (MODERATE_PCT, 5 % of the
basis; the same bars as the verdict, so every cause that makes a verdict has a finding).
Ranking (rank_findings): timed findings by recoverable_ns, largest first; then untimed ones in the
order they were given.
"""

from __future__ import annotations

import statistics

from .verdict import INPUT_MODERATE_PCT, MODERATE_PCT, kept_rows

LOW_MFU_PCT = 20.0  # nsys-ai docs/agent_skills/skills/mfu.md: step MFU < 20 % is a problem (peers.md 4.2)
MIN_FLOP_COVERAGE_PCT = 50.0  # below this the MFU describes too little of the compute to act on


def rank_findings(findings: list[dict]) -> list[dict]:
    """Order findings: those with a recoverable_ns first, largest first (stable), then those whose
    recoverable_ns is None, in their given order. Accepts findings from any module with the dict
    shape above (title, recoverable_ns, evidence, recommendation, sql)."""
    timed = [f for f in findings if f.get("recoverable_ns") is not None]
    untimed = [f for f in findings if f.get("recoverable_ns") is None]
    return sorted(timed, key=lambda f: -f["recoverable_ns"]) + untimed


def _q(run_id: str) -> str:
    return run_id.replace("'", "''")


def _ms(ns) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:,.3f} ms"


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def findings_for_run(run_id: str, result: dict) -> list[dict]:
    """Findings for one run of an analysis (pipeline.analyze.analyze result, which must hold the
    run's verdict and, for the steps basis, its step_time rows). Returns them ranked (rank_findings)."""
    v = next((x for x in result["verdicts"] if x["run_id"] == run_id), None)
    if v is None or v["basis"] is None:
        return []
    q = _q(run_id)
    outliers = [e for e in v["excluded_steps"] if e["why"] == "outlier"]
    left_out = {e["step"] for e in outliers}
    if v["basis"] == "steps":
        rows = kept_rows([s for s in result["step_time"] if s["run_id"] == run_id], v)
        analysed = {s["step"] for s in rows}
        basis_sql = (f"SELECT rank, step, step_ns, compute_ns, exposed_comm_ns, exposed_memory_ns, idle_ns, idle_input_ns, "
                     f"idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns FROM step_time WHERE run_id = '{q}'")
        get = {"total": "step_ns", "exposed_comm": "exposed_comm_ns", "exposed_memory": "exposed_memory_ns", "idle": "idle_ns",
               "input": "idle_input_ns", "host_wait": "idle_host_wait_ns", "kernel_wait": "idle_kernel_wait_ns",
               "other": "idle_other_ns", "unreliable": "idle_unreliable_ns", "comm": "comm_ns", "overlap": "overlap_ns"}
    else:
        rows = [r for r in result["ranks"] if r["run_id"] == run_id]
        basis_sql = (f"SELECT rank, span_ns, compute_ns, exposed_comm_ns, exposed_memory_ns, gpu_idle_ns, idle_host_wait_ns, "
                     f"idle_kernel_wait_ns, idle_other_ns FROM breakdown WHERE level = 'rank' AND run_id = '{q}'")
        get = {"total": "span_ns", "exposed_comm": "exposed_comm_ns", "exposed_memory": "exposed_memcpy_ns", "idle": "gpu_idle_ns",
               "input": None, "host_wait": "idle_host_wait_ns", "kernel_wait": "idle_kernel_wait_ns",
               "other": "idle_other_ns", "unreliable": "idle_unreliable_ns", "comm": "comm_ns", "overlap": "overlap_ns"}
    if not rows:
        return []
    n_ranks = len({r["rank"] for r in rows})
    n_steps = len({r["step"] for r in rows}) if v["basis"] == "steps" else None

    def total(key: str) -> int:
        col = get[key]
        return 0 if col is None else sum(r[col] or 0 for r in rows)

    basis_total = total("total")
    if basis_total <= 0:
        return []

    def share(ns: float) -> float:
        return 100 * ns / basis_total

    of = "of step time" if v["basis"] == "steps" else "of GPU time (whole trace)"
    over = f"over {n_steps} step(s)" if n_steps else "over the trace"

    def timing(key_total: float) -> dict:
        rec = key_total / n_ranks
        return {"recoverable_ns": int(rec), "per_step_ns": int(rec / n_steps) if n_steps else None}

    out: list[dict] = []

    # exposed communication
    exp = total("exposed_comm")
    if share(exp) >= MODERATE_PCT:
        comm, ovl = total("comm"), total("overlap")
        by_rank: dict[int, int] = {}
        for r in rows:
            by_rank[r["rank"]] = by_rank.get(r["rank"], 0) + (r[get["exposed_comm"]] or 0)
        worst = max(by_rank, key=by_rank.get)
        calls = [c for c in result.get("collectives", []) if c["run_id"] == run_id]
        by_op: dict[str, int] = {}
        for c in calls:
            by_op[c["op"]] = by_op.get(c["op"], 0) + (c["transfer_ns"] or 0)
        per_rank_calls = [c for c in result.get("collectives_per_rank", []) if c["run_id"] == run_id]
        if not by_op:
            for c in per_rank_calls:
                by_op[c["op"]] = by_op.get(c["op"], 0) + (c["dur_ns"] or 0)
        main_op = max(by_op, key=by_op.get) if by_op else None
        ev = [f"exposed communication {share(exp):.1f}% {of}: {_ms(exp / n_ranks)} per rank {over}",
              f"communication hidden under compute: {100 * ovl / comm:.1f}% of communication time" if comm else "overlap unknown",
              f"worst rank {worst}: {_ms(by_rank[worst])} exposed"]
        if main_op:
            ev.append(f"most collective time is {main_op} ({100 * by_op[main_op] / max(sum(by_op.values()), 1):.0f}% of it)")
            bw = [c for c in per_rank_calls if c["op"] == main_op and c["busbw_gbps"] is not None]
            if bw:
                med = _median([c["busbw_gbps"] for c in bw])
                peak = _median([c["link_peak_gbps"] for c in bw])
                size = _median([c["msg_bytes"] for c in bw])
                ev.append(f"{main_op} bus bandwidth: median {med:.1f} GB/s at a median message of {size / 2**20:.2f} MiB"
                          + (f" = {100 * med / peak:.0f}% of the {peak:.0f} GB/s link peak" if peak else " (link peak unknown: the group spans hosts or the device is not in the catalog)"))
        out.append({"kind": "exposed_comm", "title": "Exposed communication: collectives not hidden under compute",
                    **timing(exp), "evidence": ev, "recommendation": COMM_ADVICE.get(main_op, COMM_ADVICE[None]),
                    "sql": basis_sql + " ORDER BY exposed_comm_ns DESC"})

    # GPU idle waiting for the host (everything idle except data loading)
    idle, inp = total("idle"), total("input")
    hw, kw, oth, unr = total("host_wait"), total("kernel_wait"), total("other"), total("unreliable")
    host = hw + kw  # as the verdict counts it (pipeline/report/verdict.py): launched late or in small gaps
    order_idle = f" ORDER BY {get['idle']} DESC"
    if share(host) >= MODERATE_PCT:
        ev = [f"GPU idle waiting for the host to launch work {share(host):.1f}% {of}: {_ms(host / n_ranks)} per rank {over}",
              f"of which: host launched late {share(hw):.1f}%, launch gaps under the kernel-wait threshold {share(kw):.1f}% "
              f"(all GPU idle {share(idle):.1f}%)"]
        rec = ("The host launches work too late: capture the step with CUDA graphs (torch.compile "
               "mode='reduce-overhead' or torch.cuda.graphs), raise the batch size per GPU so each kernel does more "
               "work, fuse small kernels, and remove host syncs (.item(), .cpu()) from the step.")
        out.append({"kind": "host_idle", "title": "GPU idle waiting for the host", **timing(host), "evidence": ev,
                    "recommendation": rec, "sql": basis_sql + order_idle})
    if share(oth) >= MODERATE_PCT:
        ev = [f"GPU idle with its next work already queued {share(oth):.1f}% {of}: {_ms(oth / n_ranks)} per rank {over}",
              "the work was launched before the GPU went idle, so it waited on a dependency (an event, a "
              "synchronization, another stream or device), not on the host"
              + (f"; before graph replays {share(unr):.1f}%" if unr else "")]
        rec = ("Look for cudaStreamWaitEvent / cudaEventSynchronize chains and cross-stream or cross-device dependencies "
               "around the gaps (the idle-gap histogram gives their lengths): a compute stream waiting on a collective "
               "or copy stream, or a host synchronization (.item(), .cpu(), torch.cuda.synchronize()) that drains the queue.")
        out.append({"kind": "queued_idle", "title": "GPU idle with work queued (dependency waits)", **timing(oth),
                    "evidence": ev, "recommendation": rec, "sql": basis_sql + order_idle})

    # input: GPU idle while the host loads data
    if get["input"] and share(inp) >= INPUT_MODERATE_PCT:
        out.append({"kind": "input_idle", "title": "GPU idle while the host loads data (DataLoader)", **timing(inp),
                    "evidence": [f"GPU idle during DataLoader fetches {share(inp):.1f}% {of}: {_ms(inp / n_ranks)} per rank {over}"],
                    "recommendation": "Load data off the training thread: DataLoader(num_workers>0, pin_memory=True, "
                                      "persistent_workers=True, prefetch_factor>=2); move decoding and augmentation to the GPU "
                                      "(e.g. NVIDIA DALI) or pre-process the data set offline.",
                    "sql": (f"SELECT rank, name, count(*) AS fetches, sum(dur_ns) / 1e6 AS total_ms FROM cpu_ops "
                            f"WHERE run_id = '{q}' AND name LIKE 'enumerate(Data%' GROUP BY ALL ORDER BY total_ms DESC")})

    # exposed memory copies
    mem = total("exposed_memory")
    if share(mem) >= MODERATE_PCT:
        copies = [m for m in result["memcpy"] if m["run_id"] == run_id and m["kind"] == "memcpy"]
        pageable = [m for m in copies if "Pageable" in ((m.get("src_kind") or "") + (m.get("dst_kind") or ""))]
        by_kind: dict[str, int] = {}
        for m in copies:
            by_kind[m["copy_kind"] or "unknown"] = by_kind.get(m["copy_kind"] or "unknown", 0) + (m["total_ns"] or 0)
        main = max(by_kind, key=by_kind.get) if by_kind else None
        ev = [f"copies hidden by neither compute nor communication {share(mem):.1f}% {of}: {_ms(mem / n_ranks)} per rank {over}"]
        if main:
            ev.append(f"most copy time is {main}: {_ms(by_kind[main])} over all ranks, "
                      f"{100 * by_kind[main] / max(sum(by_kind.values()), 1):.0f}% of it")
        if pageable:
            ev.append(f"{sum(m['copies'] for m in pageable)} copies from/to pageable host memory, "
                      f"{sum(m['total_bytes'] or 0 for m in pageable) / 2**20:.1f} MiB")
        if main == "DtoD":
            rec = ("Device-to-device copies dominate: they come from .contiguous(), .clone(), torch.cat/stack, dtype "
                   "casts and non-fused optimizers; use in-place or fused ops (fused AdamW, foreach) and "
                   "preallocated buffers.")
        else:
            rec = ("Use pinned host buffers (DataLoader pin_memory=True, tensor.pin_memory()) with non_blocking=True "
                   "copies on a side stream so they overlap compute, and avoid device-to-host copies (.item(), .cpu()) "
                   "inside the step.")
        out.append({"kind": "exposed_memcpy", "title": "Exposed memory copies", **timing(mem), "evidence": ev,
                    "recommendation": rec,
                    "sql": f"SELECT * FROM memcpy_bandwidth WHERE run_id = '{q}' ORDER BY total_ns DESC"})

    # straggler: the rank the others wait for in collectives
    strag = [s for s in result.get("stragglers", []) if s["run_id"] == run_id
             and (v["basis"] != "steps" or s["step"] in analysed)]
    if strag and n_ranks > 1:
        per: dict[int, list] = {}
        for s in strag:
            t = per.setdefault(s["straggler_rank"], [0, 0])
            t[0] += s["times_last"]
            t[1] += s["caused_wait_ns"] or 0
        worst_rank, (times, caused) = max(per.items(), key=lambda kv: kv[1][1])
        n_calls = sum({s["step"]: s["calls"] or 0 for s in strag}.values())
        if share(caused) >= MODERATE_PCT:
            out.append({"kind": "straggler", "title": f"Straggler: rank {worst_rank}", **timing(caused),
                        "evidence": [f"rank {worst_rank} started last in {times} of {n_calls} matched collectives",
                                     f"the other ranks waited {_ms(caused)} for it in total, {share(caused):.1f}% {of}"],
                        "recommendation": f"Inspect rank {worst_rank}: its host (CPU contention, data loading, GC pauses), "
                                          "its GPU (clocks, thermals, ECC errors), and load imbalance in its shard of the data "
                                          "or model (uneven sequence lengths, expert routing).",
                        "sql": f"SELECT * FROM stragglers WHERE run_id = '{q}' ORDER BY caused_wait_ns DESC"})

    # steps left out of the verdict
    if outliers:
        all_rows = [s for s in result["step_time"] if s["run_id"] == run_id and s["step"] in left_out]
        med = v["median_step_ns"]
        excess = sum(max(0, s["step_ns"] - med) for s in all_rows)
        ex = outliers
        out.append({"kind": "slow_steps", "title": f"{len(ex)} slow step(s) left out of the verdict",
                    "recoverable_ns": int(excess / max(len({s['rank'] for s in all_rows}), 1)), "per_step_ns": None,
                    "evidence": [f"step {e['step']}: rank {e['rank']} took {_ms(e['step_ns'])}, "
                                 f"{e['step_ns'] / med:.1f}x the median step ({_ms(med)})" for e in ex[:5]]
                                + ([f"... and {len(ex) - 5} more"] if len(ex) > 5 else []),
                    "recommendation": "Warm-up (JIT compilation, autotuning, NCCL communicator set-up, first allocations) "
                                      "belongs outside the profiled window: profile with torch.profiler.schedule(wait=1, "
                                      "warmup=2, active=N). If slow steps recur in steady state, inspect the rank named "
                                      "(checkpointing, evaluation, garbage collection, a peer's late arrival).",
                    "sql": f"SELECT rank, step, step_ns, host_step_ns, exposed_comm_ns, idle_ns FROM step_time "
                           f"WHERE run_id = '{q}' ORDER BY step_ns DESC"})

    # low MFU (untimed: what a higher MFU would win depends on the model)
    steps_mfu = [s for s in kept_rows([s for s in result["steps"] if s["run_id"] == run_id], v) if s["mfu_pct"] is not None]
    if steps_mfu:
        mfu = _median([s["mfu_pct"] for s in steps_mfu])
        cov = _median([s["flop_coverage_pct"] for s in steps_mfu])
        if mfu is not None and mfu < LOW_MFU_PCT and (cov or 0) >= MIN_FLOP_COVERAGE_PCT:
            peak = _median([s["peak_tflops"] for s in steps_mfu])
            out.append({"kind": "low_mfu", "title": f"Low model FLOPs utilisation: {mfu:.1f}%", "recoverable_ns": None,
                        "per_step_ns": None,
                        "evidence": [f"median MFU per step {mfu:.1f}% of a {peak:g} TFLOP/s peak (below {LOW_MFU_PCT:.0f}%: "
                                     "nsys-ai's 'problem' band)",
                                     f"FLOP coverage {cov:.0f}% of compute-kernel time (the share the MFU describes)"],
                        "recommendation": "Give the tensor cores bigger, denser work: larger micro-batch or sequence per GPU, "
                                          "bf16/fp8 matmuls, fused attention (FlashAttention / SDPA), fused optimizers and "
                                          "torch.compile for elementwise chains.",
                        "sql": f"SELECT rank, step, mfu_pct, flop_coverage_pct, model_flops, peak_tflops FROM mfu WHERE run_id = '{q}'"})
    return rank_findings(out)


COMM_ADVICE = {
    "all_reduce": "Overlap gradient all-reduces with backward: with DDP, tune bucket_cap_mb (default 25) so the first "
                  "buckets fill and launch early while backward still runs, keep gradient_as_bucket_view=True, and "
                  "consider a larger micro-batch per rank (more compute to hide behind) or gradient accumulation with "
                  "no_sync(); check busbw against the link peak and the NCCL transport (NCCL_DEBUG=INFO).",
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
          "collective busbw against the link peak and the NCCL transport (NCCL_DEBUG=INFO).",
}
