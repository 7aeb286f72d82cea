"""Findings: what to change, ranked by estimated recoverable time.

A finding is a dict:
  kind            stable identifier (exposed_comm, straggler, host_idle, queued_idle, input_idle,
                  exposed_memcpy, slow_steps, low_mfu; other modules add their own, e.g. NCCL-log findings)
  title           one line
  recoverable_ns  estimated time one rank could win over the analysed time (int ns), or None when
                  the finding cannot be timed (e.g. a misconfiguration seen in a log)
  per_step_ns     the same per step (None on the whole-trace basis or when untimed)
  evidence        list of one-line strings (numbers from the analysis)
  recommendation  what to change
  sql             a query that reproduces the evidence in `tracelake sql` (the metric views)

Recoverable time = the time the cause costs one rank over the verdict's basis (pipeline/diagnosis/
verdict.py): on the steps basis the cause's time summed over the analysed steps and averaged over
ranks (for example exposed transfer per step x steps); on the whole-trace basis the cause's time
over the trace, averaged over ranks. It is an upper bound of what removing the cause wins
(hiding all exposed communication cannot make a step shorter than its compute).
Never counted twice: each instant of an analysed step is credited to at most one finding. The
timed findings take disjoint parts of the priority breakdown (queries/step_time.sql: every
instant goes to one of compute, exposed transfer, exposed waiting for peers, exposed copies,
exposed unknown, idle in data loading, idle before a graph replay, host wait, kernel wait, other
idle): exposed_comm = exposed transfer, straggler = exposed waiting for peers, exposed_memcpy =
exposed copies, input_idle = idle in data loading, host_idle = host wait + kernel wait,
queued_idle = other idle; slow_steps = the excess over the median of the steps left out of the
basis, which lie outside it. So the recoverable times of one run add up to at most its step time
per analysed rank (all its steps, analysed or left out; the GPU span on the whole-trace basis).
A cause becomes a finding when it reaches the verdict's moderate bar (MODERATE_PCT, 5 % of the
basis; the same bars as the verdict, so every cause that makes a verdict has a finding).
Ranking (rank_findings): timed findings by recoverable_ns, largest first; then untimed ones in the
order they were given.
"""

from __future__ import annotations

from .basis import basis_for_run, median, ms, quote
from .comm_findings import comm_findings
from .steady import kept_rows
from .verdict import INPUT_MODERATE_PCT, MODERATE_PCT

LOW_MFU_PCT = 20.0  # nsys-ai docs/agent_skills/skills/mfu.md: step MFU < 20 % is a problem (peers.md 4.2)
MIN_FLOP_COVERAGE_PCT = 50.0  # below this the MFU describes too little of the compute to act on


def mfu_measurable(mfu_pct: float | None, flop_coverage_pct: float | None) -> bool:
    """Whether an MFU describes enough of the compute to be stated: FLOP coverage of at least
    MIN_FLOP_COVERAGE_PCT (the report's, the fleet's and analyze's rank table's rule)."""
    return mfu_pct is not None and (flop_coverage_pct or 0) >= MIN_FLOP_COVERAGE_PCT


# pinned buffers are advised when pageable copies take at least this share of the host-device
# copy time (CUDA C++ Best Practices Guide, "Pinned Memory": pageable copies are staged and slower)
PAGEABLE_ADVICE_PCT = 10.0


def rank_findings(findings: list[dict]) -> list[dict]:
    """Order findings: those with a recoverable_ns first, largest first (stable), then those whose
    recoverable_ns is None, in their given order. Accepts findings from any module with the dict
    shape above (title, recoverable_ns, evidence, recommendation, sql)."""
    timed = [f for f in findings if f.get("recoverable_ns") is not None]
    untimed = [f for f in findings if f.get("recoverable_ns") is None]
    return sorted(timed, key=lambda f: -f["recoverable_ns"]) + untimed


def findings_for_run(run_id: str, result: dict) -> list[dict]:
    """Findings for one run of an analysis (pipeline.analyze.analyze result, which must hold the
    run's verdict and, for the steps basis, its step_time rows). Returns them ranked (rank_findings):
    the communication findings (pipeline/diagnosis/comm_findings.py), then those below."""
    v = next((x for x in result["verdicts"] if x["run_id"] == run_id), None)
    b = None if v is None else basis_for_run(run_id, result, v)
    if b is None:
        return []
    q = quote(run_id)
    outliers = [e for e in v["excluded_steps"] if e["why"] == "outlier"]
    left_out = {e["step"] for e in outliers}
    out = comm_findings(b, v, result)
    # advice speaks of PyTorch only for a PyTorch program (analyze's runs[].pytorch)
    pytorch = next((r.get("pytorch", True) for r in result.get("runs", []) if r["run_id"] == run_id), True)

    # GPU idle waiting for the host (everything idle except data loading)
    idle, inp = b.total("idle"), b.total("input")
    hw, kw, oth, unr = b.total("host_wait"), b.total("kernel_wait"), b.total("other"), b.total("unreliable")
    host = hw + kw  # as the verdict counts it (pipeline/diagnosis/verdict.py): launched late or in small gaps
    order_idle = f" ORDER BY {b.get['idle']} DESC"
    if b.share(host) >= MODERATE_PCT:
        ev = [
            f"GPU idle waiting for the host to launch work {b.share(host):.1f}% {b.of}: "
            f"{ms(host / b.n_ranks)} per rank {b.over}",
            f"of which: host launched late {b.share(hw):.1f}%, launch gaps under the kernel-wait threshold "
            f"{b.share(kw):.1f}% (all GPU idle {b.share(idle):.1f}%)",
        ]
        rec = (
            "The host launches work too late: capture the step with CUDA graphs (torch.compile "
            "mode='reduce-overhead' or torch.cuda.graphs), raise the batch size per GPU so each kernel "
            "does more work, fuse small kernels, and remove host syncs (.item(), .cpu()) from the step."
            if pytorch
            else "The host launches work too late: capture the loop's launches in a CUDA graph "
            "(cudaStreamBeginCapture / cudaGraphLaunch), give each kernel more work per launch, fuse "
            "small kernels, and remove host synchronizations (cudaDeviceSynchronize, "
            "cudaStreamSynchronize, synchronous cudaMemcpy) from the loop."
        )
        out.append(
            {
                "kind": "host_idle",
                "title": "GPU idle waiting for the host",
                **b.timing(host),
                "evidence": ev,
                "recommendation": rec,
                "sql": b.sql + order_idle,
            }
        )
    if b.share(oth) >= MODERATE_PCT:
        ev = [
            f"GPU idle with its next work already queued {b.share(oth):.1f}% {b.of}: "
            f"{ms(oth / b.n_ranks)} per rank {b.over}",
            "the work was launched before the GPU went idle, so it waited on a dependency (an event, a "
            "synchronization, another stream or device), not on the host"
            + (f"; before graph replays {b.share(unr):.1f}%" if unr else ""),
        ]
        rec = (
            "Look for cudaStreamWaitEvent / cudaEventSynchronize chains and cross-stream or cross-device "
            "dependencies around the gaps (the idle-gap histogram gives their lengths): a compute stream "
            "waiting on a collective or copy stream, or a host synchronization (.item(), .cpu(), "
            "torch.cuda.synchronize()) that drains the queue."
        )
        out.append(
            {
                "kind": "queued_idle",
                "title": "GPU idle with work queued (dependency waits)",
                **b.timing(oth),
                "evidence": ev,
                "recommendation": rec,
                "sql": b.sql + order_idle,
            }
        )

    # input: GPU idle while the host loads data
    if b.get["input"] and b.share(inp) >= INPUT_MODERATE_PCT:
        out.append(
            {
                "kind": "input_idle",
                "title": "GPU idle while the host loads data (DataLoader)",
                **b.timing(inp),
                "evidence": [
                    f"GPU idle during DataLoader fetches {b.share(inp):.1f}% {b.of}: "
                    f"{ms(inp / b.n_ranks)} per rank {b.over}"
                ],
                "recommendation": "Load data off the training thread: DataLoader(num_workers>0, "
                "pin_memory=True, persistent_workers=True, prefetch_factor>=2); move decoding and "
                "augmentation to the GPU (e.g. NVIDIA DALI) or pre-process the data set offline.",
                "sql": (
                    "SELECT rank, name, count(*) AS fetches, sum(dur_ns) / 1e6 AS total_ms FROM cpu_ops "
                    f"WHERE run_id = '{q}' AND name LIKE 'enumerate(Data%' GROUP BY ALL ORDER BY total_ms "
                    "DESC"
                ),
            }
        )

    # exposed memory copies
    mem = b.total("exposed_memory")
    if b.share(mem) >= MODERATE_PCT:
        copies = [m for m in result["memcpy"] if m["run_id"] == run_id and m["kind"] == "memcpy"]
        pageable = [
            m for m in copies if "Pageable" in ((m.get("src_kind") or "") + (m.get("dst_kind") or ""))
        ]
        by_kind: dict[str, int] = {}
        for m in copies:
            by_kind[m["copy_kind"] or "unknown"] = by_kind.get(m["copy_kind"] or "unknown", 0) + (
                m["total_ns"] or 0
            )
        main = max(by_kind, key=by_kind.get) if by_kind else None
        ev = [
            f"copies hidden by neither compute nor communication {b.share(mem):.1f}% {b.of}: "
            f"{ms(mem / b.n_ranks)} per rank {b.over}"
        ]
        if main:
            ev.append(
                f"most copy time is {main}: {ms(by_kind[main])} over all ranks, "
                f"{100 * by_kind[main] / max(sum(by_kind.values()), 1):.0f}% of it"
            )
        # host-device copies by host memory kind: advice must follow what the copies already do
        host = [m for m in copies if m["copy_kind"] in ("HtoD", "DtoH")]
        host_ns = sum(m["total_ns"] or 0 for m in host)
        pinned_ns = sum(
            m["total_ns"] or 0
            for m in host
            if "Pinned" in ((m.get("src_kind") or "") + (m.get("dst_kind") or ""))
        )
        pageable_ns = sum(m["total_ns"] or 0 for m in pageable)
        if pageable:
            ev.append(
                f"{sum(m['copies'] for m in pageable)} copies from/to pageable host memory, "
                f"{sum(m['total_bytes'] or 0 for m in pageable) / 2**20:.1f} MiB"
            )
        if host_ns and pinned_ns:
            ev.append(
                f"{100 * pinned_ns / host_ns:.0f}% of the host-device copy time is from/to pinned host memory"
            )
        if main == "DtoD":
            rec = (
                "Device-to-device copies dominate: they come from .contiguous(), .clone(), "
                "torch.cat/stack, dtype casts and non-fused optimizers; use in-place or fused ops (fused "
                "AdamW, foreach) and preallocated buffers."
                if pytorch
                else "Device-to-device copies dominate: compute in place or into the final buffer instead "
                "of staging through temporaries, and fuse the kernels around each copy."
            )
        elif host_ns and pageable_ns < PAGEABLE_ADVICE_PCT / 100 * host_ns and pinned_ns:
            # already pinned (issue 39 item 8): pinning is not the fix
            rec = (
                "The host-device copies already use pinned host memory, so pinning will not help: overlap "
                "them with compute (non_blocking=True copies on a side stream, prefetch the next batch) "
                "and copy less (keep tensors on the GPU; avoid .item() and .cpu() inside the step)."
                if pytorch
                else "The host-device copies already use pinned host memory, so pinning will not help: "
                "overlap them with compute (cudaMemcpyAsync on a side stream, double buffering) and copy "
                "less (keep data resident on the GPU between iterations)."
            )
            if b.kind != "steps" and main == "HtoD":
                rec += (
                    " This trace has no training step and is mostly host-to-device copies, as a weight "
                    "or checkpoint load is: profile the training steps to see what limits them."
                )
        else:
            rec = (
                "Use pinned host buffers (DataLoader pin_memory=True, tensor.pin_memory()) with "
                "non_blocking=True copies on a side stream so they overlap compute, and avoid "
                "device-to-host copies (.item(), .cpu()) inside the step."
                if pytorch
                else "Use pinned host buffers (cudaMallocHost / cudaHostRegister) with cudaMemcpyAsync on a "
                "side stream so copies overlap compute, and avoid synchronous device-to-host copies inside "
                "the loop."
            )
        out.append(
            {
                "kind": "exposed_memcpy",
                "title": "Exposed memory copies",
                **b.timing(mem),
                "evidence": ev,
                "recommendation": rec,
                "sql": f"SELECT * FROM memcpy_bandwidth WHERE run_id = '{q}' ORDER BY total_ns DESC",
            }
        )

    # steps left out of the verdict
    if outliers:
        all_rows = [s for s in result["step_time"] if s["run_id"] == run_id and s["step"] in left_out]
        med = v["median_step_ns"]
        excess = sum(max(0, s["step_ns"] - med) for s in all_rows)
        ex = outliers
        out.append(
            {
                "kind": "slow_steps",
                "title": f"{len(ex)} slow step(s) left out of the verdict",
                "recoverable_ns": int(excess / max(len({s["rank"] for s in all_rows}), 1)),
                "per_step_ns": None,
                "evidence": [
                    f"step {e['step']}: rank {e['rank']} took {ms(e['step_ns'])}, "
                    f"{e['step_ns'] / med:.1f}x the median step ({ms(med)})"
                    for e in ex[:5]
                ]
                + ([f"... and {len(ex) - 5} more"] if len(ex) > 5 else []),
                "recommendation": "Warm-up (JIT compilation, autotuning, NCCL communicator set-up, first "
                "allocations) belongs outside the profiled window: profile with "
                "torch.profiler.schedule(wait=1, warmup=2, active=N). If slow steps recur in steady "
                "state, inspect the rank named (checkpointing, evaluation, garbage collection, a peer's "
                "late arrival).",
                "sql": f"SELECT rank, step, step_ns, host_step_ns, exposed_comm_ns, idle_ns FROM step_time "
                f"WHERE run_id = '{q}' ORDER BY step_ns DESC",
            }
        )

    # low MFU (untimed: what a higher MFU would win depends on the model)
    steps_mfu = [
        s
        for s in kept_rows([s for s in result["steps"] if s["run_id"] == run_id], v)
        if s["mfu_pct"] is not None
    ]
    if steps_mfu:
        mfu = median([s["mfu_pct"] for s in steps_mfu])
        cov = median([s["flop_coverage_pct"] for s in steps_mfu])
        if mfu_measurable(mfu, cov) and mfu < LOW_MFU_PCT:
            peak = median([s["peak_tflops"] for s in steps_mfu])
            out.append(
                {
                    "kind": "low_mfu",
                    "title": f"Low model FLOPs utilisation: {mfu:.1f}% per analysed step",
                    "recoverable_ns": None,
                    "per_step_ns": None,
                    "evidence": [
                        f"median MFU per step {mfu:.1f}% of a {peak:g} TFLOP/s peak (below "
                        f"{LOW_MFU_PCT:.0f}%: nsys-ai's 'problem' band)",
                        f"FLOP coverage {cov:.0f}% of compute-kernel time (the share the MFU describes)",
                    ],
                    "recommendation": "Give the tensor cores bigger, denser work: larger micro-batch or "
                    "sequence per GPU, bf16/fp8 matmuls, fused attention (FlashAttention / SDPA), fused "
                    "optimizers and torch.compile for elementwise chains.",
                    "sql": "SELECT rank, step, mfu_pct, flop_coverage_pct, model_flops, peak_tflops FROM "
                    f"mfu WHERE run_id = '{q}'",
                }
            )
    return rank_findings(out)
