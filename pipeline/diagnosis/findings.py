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

Recoverable time = the time the cause costs one rank over the verdict's basis (pipeline/report/
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
        basis_sql = (
            "SELECT rank, step, step_ns, compute_ns, exposed_comm_ns, exposed_comm_wait_ns, "
            "exposed_comm_transfer_ns, exposed_memory_ns, idle_ns, idle_input_ns, idle_host_wait_ns, "
            f"idle_kernel_wait_ns, idle_other_ns FROM step_time WHERE run_id = '{q}'"
        )
        get = {
            "total": "step_ns",
            "exposed_comm": "exposed_comm_ns",
            "exposed_memory": "exposed_memory_ns",
            "idle": "idle_ns",
            "exposed_wait": "exposed_comm_wait_ns",
            "exposed_transfer": "exposed_comm_transfer_ns",
            "input": "idle_input_ns",
            "host_wait": "idle_host_wait_ns",
            "kernel_wait": "idle_kernel_wait_ns",
            "other": "idle_other_ns",
            "unreliable": "idle_unreliable_ns",
            "comm": "comm_ns",
            "overlap": "overlap_ns",
        }
    else:
        rows = [r for r in result["ranks"] if r["run_id"] == run_id]
        analysed = None
        basis_sql = (
            "SELECT rank, span_ns, compute_ns, exposed_comm_ns, exposed_comm_wait_ns, "
            "exposed_comm_transfer_ns, exposed_memory_ns, gpu_idle_ns, idle_host_wait_ns, "
            f"idle_kernel_wait_ns, idle_other_ns FROM breakdown WHERE level = 'rank' AND run_id = '{q}'"
        )
        get = {
            "total": "span_ns",
            "exposed_comm": "exposed_comm_ns",
            "exposed_memory": "exposed_memcpy_ns",
            "idle": "gpu_idle_ns",
            "exposed_wait": "exposed_comm_wait_ns",
            "exposed_transfer": "exposed_comm_transfer_ns",
            "input": None,
            "host_wait": "idle_host_wait_ns",
            "kernel_wait": "idle_kernel_wait_ns",
            "other": "idle_other_ns",
            "unreliable": "idle_unreliable_ns",
            "comm": "comm_ns",
            "overlap": "overlap_ns",
        }
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

    # exposed communication: transfer (the network); waiting for peers is the straggler finding
    exp, xfer, wait = total("exposed_comm"), total("exposed_transfer"), total("exposed_wait")
    comm, ovl = total("comm"), total("overlap")
    by_op = _op_costs(result, run_id, analysed)
    split_known = v["numbers"].get("exposed_comm_transfer_pct") is not None
    xfer_key = "exposed_transfer"
    if split_known:
        split = (
            f"exposed communication {share(exp):.1f}% {of}: transfer {share(xfer):.1f}%, "
            f"waiting for peers {share(wait):.1f}%"
        )
    else:  # no collective matched consistently on two ranks: the split is unknown (verdict.network_key)
        xfer, wait, xfer_key = exp, 0, "exposed_comm"
        split = (
            f"exposed communication {share(exp):.1f}% {of}; transfer vs waiting for peers unknown: no "
            "collective was matched consistently on two or more ranks"
        )
    if share(xfer) >= MODERATE_PCT:
        by_rank: dict[int, int] = {}
        for r in rows:
            by_rank[r["rank"]] = by_rank.get(r["rank"], 0) + (r[get[xfer_key]] or 0)
        worst = max(by_rank, key=by_rank.get)
        op_key = "exposed_transfer_ns" if split_known else "exposed_ns"
        ranked = sorted(by_op.items(), key=lambda kv: (-kv[1][op_key], -kv[1]["kernel_ns"], kv[0]))
        main_op = ranked[0][0] if ranked and ranked[0][1][op_key] > 0 else None
        ev = [
            (
                f"exposed transfer {share(xfer):.1f}% {of}: {_ms(xfer / n_ranks)} per rank {over} ({split})"
                if split_known
                else f"{split}: {_ms(xfer / n_ranks)} per rank {over}"
            ),
            f"communication hidden under compute: {100 * ovl / comm:.1f}% of communication time"
            if comm
            else "overlap unknown",
            f"worst rank {worst}: {_ms(by_rank[worst])} exposed "
            f"{'transfer' if split_known else 'communication'}",
        ]
        ev += _op_evidence(ranked, op_key, "exposed transfer" if split_known else "exposed communication")
        if main_op:
            per_rank_calls = [c for c in result.get("collectives_per_rank", []) if c["run_id"] == run_id]
            mine = [
                c
                for c in result.get("collectives", [])
                if c["run_id"] == run_id and c["op"] == main_op and c["busbw_gbps"] is not None
            ]
            # a call that does not line up across ranks has no transfer time of its own
            bw = [c for c in mine if c["consistent"]] or [c for c in mine if c["ranks_seen"] == 1]
            if bw:
                med = _median([c["busbw_gbps"] for c in bw])
                peak = _median([c["link_peak_gbps"] for c in bw])
                size = _median([c["msg_bytes"] for c in bw])
                over_t = (
                    "over its transfer time (after the last rank arrived)"
                    if any(c["consistent"] for c in bw)
                    else "over its kernel time (not matched across ranks: waiting for peers included)"
                )
                ev.append(
                    f"{main_op} bus bandwidth {over_t}: median {med:.1f} GB/s "
                    f"at a median message of {size / 2**20:.2f} MiB"
                    + (
                        f" = {100 * med / peak:.0f}% of the {peak:.0f} GB/s link peak"
                        if peak
                        else " (link peak unknown: the group spans hosts or the device is not in the catalog)"
                    )
                )
            elif per_rank_calls and all(c["msg_bytes"] is None for c in per_rank_calls if c["op"] == main_op):
                ev.append(f"{main_op} bus bandwidth unknown: no message size in the trace (see the notes)")
        out.append(
            {
                "kind": "exposed_comm",
                "title": (
                    "Exposed communication: collectives transferring data not hidden under compute"
                    if split_known
                    else "Exposed communication: collectives not hidden under compute"
                ),
                **timing(xfer),
                "evidence": ev,
                "recommendation": COMM_ADVICE.get(main_op, COMM_ADVICE[None]),
                "sql": basis_sql + " ORDER BY exposed_comm_transfer_ns DESC",
            }
        )

    # waiting for peers: the rank the others wait for in collectives (pipeline/diagnosis/straggler.py)
    if split_known and share(wait) >= MODERATE_PCT and n_ranks > 1:
        st = v.get("straggler") or {}
        ev = [
            f"exposed waiting for peers {share(wait):.1f}% {of}: {_ms(wait / n_ranks)} per rank {over} "
            f"({split}): the ranks' collectives had started but the last rank of the group had not arrived"
        ]
        if st.get("rank") is not None:
            title = f"Waiting for a straggler: rank {st['rank']} arrives last"
            ev.append(
                f"rank {st['rank']} started last in {st['times_last']} of {st['calls']} matched "
                f"collectives; the others waited {_ms(st['caused_wait_ns'])} for it in total "
                f"({st['share_pct']:.0f}% of all waiting)"
            )
            ev.append(f"its cause: {st['cause_text']}")
            rec = STRAGGLER_ADVICE.get(st["cause"], STRAGGLER_ADVICE["unknown"]).format(rank=st["rank"])
        else:
            title = "Waiting for peers: load imbalance across ranks"
            if st.get("cause_text"):
                ev.append(st["cause_text"])
            rec = STRAGGLER_ADVICE["imbalance"]
        ranked = sorted(by_op.items(), key=lambda kv: (-kv[1]["exposed_wait_ns"], -kv[1]["kernel_ns"], kv[0]))
        ev += _op_evidence(ranked, "exposed_wait_ns", "exposed waiting")
        out.append(
            {
                "kind": "straggler",
                "title": title,
                **timing(wait),
                "evidence": ev,
                "recommendation": rec,
                "sql": f"SELECT * FROM stragglers WHERE run_id = '{q}' ORDER BY caused_wait_ns DESC",
            }
        )

    # GPU idle waiting for the host (everything idle except data loading)
    idle, inp = total("idle"), total("input")
    hw, kw, oth, unr = total("host_wait"), total("kernel_wait"), total("other"), total("unreliable")
    host = hw + kw  # as the verdict counts it (pipeline/diagnosis/verdict.py): launched late or in small gaps
    order_idle = f" ORDER BY {get['idle']} DESC"
    if share(host) >= MODERATE_PCT:
        ev = [
            f"GPU idle waiting for the host to launch work {share(host):.1f}% {of}: {_ms(host / n_ranks)} "
            f"per rank {over}",
            f"of which: host launched late {share(hw):.1f}%, launch gaps under the kernel-wait threshold "
            f"{share(kw):.1f}% (all GPU idle {share(idle):.1f}%)",
        ]
        rec = (
            "The host launches work too late: capture the step with CUDA graphs (torch.compile "
            "mode='reduce-overhead' or torch.cuda.graphs), raise the batch size per GPU so each kernel "
            "does more work, fuse small kernels, and remove host syncs (.item(), .cpu()) from the step."
        )
        out.append(
            {
                "kind": "host_idle",
                "title": "GPU idle waiting for the host",
                **timing(host),
                "evidence": ev,
                "recommendation": rec,
                "sql": basis_sql + order_idle,
            }
        )
    if share(oth) >= MODERATE_PCT:
        ev = [
            f"GPU idle with its next work already queued {share(oth):.1f}% {of}: {_ms(oth / n_ranks)} per "
            f"rank {over}",
            "the work was launched before the GPU went idle, so it waited on a dependency (an event, a "
            "synchronization, another stream or device), not on the host"
            + (f"; before graph replays {share(unr):.1f}%" if unr else ""),
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
                **timing(oth),
                "evidence": ev,
                "recommendation": rec,
                "sql": basis_sql + order_idle,
            }
        )

    # input: GPU idle while the host loads data
    if get["input"] and share(inp) >= INPUT_MODERATE_PCT:
        out.append(
            {
                "kind": "input_idle",
                "title": "GPU idle while the host loads data (DataLoader)",
                **timing(inp),
                "evidence": [
                    f"GPU idle during DataLoader fetches {share(inp):.1f}% {of}: {_ms(inp / n_ranks)} per "
                    f"rank {over}"
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
    mem = total("exposed_memory")
    if share(mem) >= MODERATE_PCT:
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
            f"copies hidden by neither compute nor communication {share(mem):.1f}% {of}: "
            f"{_ms(mem / n_ranks)} per rank {over}"
        ]
        if main:
            ev.append(
                f"most copy time is {main}: {_ms(by_kind[main])} over all ranks, "
                f"{100 * by_kind[main] / max(sum(by_kind.values()), 1):.0f}% of it"
            )
        if pageable:
            ev.append(
                f"{sum(m['copies'] for m in pageable)} copies from/to pageable host memory, "
                f"{sum(m['total_bytes'] or 0 for m in pageable) / 2**20:.1f} MiB"
            )
        if main == "DtoD":
            rec = (
                "Device-to-device copies dominate: they come from .contiguous(), .clone(), "
                "torch.cat/stack, dtype casts and non-fused optimizers; use in-place or fused ops (fused "
                "AdamW, foreach) and preallocated buffers."
            )
        else:
            rec = (
                "Use pinned host buffers (DataLoader pin_memory=True, tensor.pin_memory()) with "
                "non_blocking=True copies on a side stream so they overlap compute, and avoid "
                "device-to-host copies (.item(), .cpu()) inside the step."
            )
        out.append(
            {
                "kind": "exposed_memcpy",
                "title": "Exposed memory copies",
                **timing(mem),
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
                    f"step {e['step']}: rank {e['rank']} took {_ms(e['step_ns'])}, "
                    f"{e['step_ns'] / med:.1f}x the median step ({_ms(med)})"
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
        mfu = _median([s["mfu_pct"] for s in steps_mfu])
        cov = _median([s["flop_coverage_pct"] for s in steps_mfu])
        if mfu is not None and mfu < LOW_MFU_PCT and (cov or 0) >= MIN_FLOP_COVERAGE_PCT:
            peak = _median([s["peak_tflops"] for s in steps_mfu])
            out.append(
                {
                    "kind": "low_mfu",
                    "title": f"Low model FLOPs utilisation: {mfu:.1f}%",
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


def _op_costs(result: dict, run_id: str, steps: set | None) -> dict[str, dict]:
    """Per collective op of a run (queries/collective_exposure.sql rows of the analysed steps;
    all rows on the whole-trace basis): {op: {kernel_ns, exposed_ns, exposed_wait_ns,
    exposed_transfer_ns}}, each summed over ranks."""
    out: dict[str, dict] = {}
    for r in result.get("collective_exposure", []):
        if r["run_id"] != run_id or (steps is not None and r["step"] not in steps):
            continue
        t = out.setdefault(
            r["op"], {"kernel_ns": 0, "exposed_ns": 0, "exposed_wait_ns": 0, "exposed_transfer_ns": 0}
        )
        for k in t:
            t[k] += r[k] or 0
    return out


def _op_evidence(ranked: list, key: str, label: str) -> list[str]:
    """'Most collective time is X' weighted by time: the op first in `ranked` (by `key`), with its
    share of all collective kernel time and of the exposed time `key`, both shown."""
    if not ranked:
        return []
    kernel = sum(c["kernel_ns"] for _, c in ranked) or 1
    exposed = sum(c[key] for _, c in ranked) or 1
    op, c = ranked[0]
    line = (
        f"most {label} is {op}: {100 * c[key] / exposed:.0f}% of it ({_ms(c[key])} summed over ranks), "
        f"{100 * c['kernel_ns'] / kernel:.0f}% of all collective kernel time ({_ms(c['kernel_ns'])})"
    )
    rest = [
        f"{o} {100 * x[key] / exposed:.0f}% / {100 * x['kernel_ns'] / kernel:.0f}%" for o, x in ranked[1:4]
    ]
    return [line] + ([f"then (share of {label} / of kernel time): " + ", ".join(rest)] if rest else [])


STRAGGLER_ADVICE = {
    "entered_step_late": "Rank {rank} starts its steps late: look at what it does between steps "
    "(checkpointing, logging, evaluation, a slower data shard, garbage collection) and profile a window "
    "that includes the previous step; if the ranks run on several hosts, check their clocks are "
    "synchronized (chrony/PTP), since skew shifts arrival order.",
    "longer_compute": "Rank {rank} computes longer than its peers: balance the work per rank (equal "
    "shards, sequence-length bucketing or packing, expert-capacity limits in MoE routing) and compare its "
    "GPU (clocks, thermals, ECC errors: nvidia-smi -q) with the others.",
    "data_loading": "Rank {rank} waits for data longer than its peers: give its DataLoader more workers, "
    "pin memory and prefetch, and check its shard's storage and decode cost.",
    "host": "Rank {rank}'s host launches work late: look for CPU contention on its host (other processes, "
    "too few cores per rank, NUMA placement), Python overhead or GC pauses, and host syncs (.item(), "
    ".cpu()) on that rank.",
    "unknown": "Inspect rank {rank}: its host (CPU contention, data loading, GC pauses), its GPU (clocks, "
    "thermals, ECC errors), and load imbalance in its shard of the data or model; if ranks span hosts, "
    "check clock sync.",
    "imbalance": "Ranks take turns arriving last: the work per rank varies from step to step. Balance it "
    "(sequence-length bucketing or packing, equal shards, MoE capacity limits) or make the collective "
    "asynchronous so the wait overlaps compute.",
}


COMM_ADVICE = {
    "all_reduce": "Overlap gradient all-reduces with backward: with DDP, tune bucket_cap_mb (default 25) "
    "so the first buckets fill and launch early while backward still runs, keep "
    "gradient_as_bucket_view=True, and consider a larger micro-batch per rank (more compute to hide "
    "behind) or gradient accumulation with no_sync(); check busbw against the link peak and the NCCL "
    "transport (NCCL_DEBUG=INFO).",
    "all_gather": "With FSDP, enable forward/backward prefetch and limit_all_gathers so parameter "
    "all-gathers overlap compute; larger wrapping units mean fewer, larger all-gathers; check busbw "
    "against the link peak.",
    "reduce_scatter": "With FSDP, overlap gradient reduce-scatters with backward "
    "(backward_prefetch=BACKWARD_PRE) and use larger wrapping units; check busbw against the link peak.",
    "all_to_all": "All-to-all (expert or embedding sharding) is latency- and balance-bound: pipeline it "
    "with compute (split the batch into chunks), balance the splits across ranks, and prefer hierarchical "
    "all-to-all across hosts.",
    "send_recv": "Point-to-point / all-to-all traffic (SendRecv kernels) is exposed: overlap it with compute "
    "(pipeline micro-batches, chunked all-to-all), balance what each rank sends, and check the "
    "transport between hosts (NCCL_DEBUG=INFO).",
    None: "Overlap collectives with compute (DDP bucket_cap_mb, FSDP prefetch, chunked all-to-all) and check "
    "collective busbw against the link peak and the NCCL transport (NCCL_DEBUG=INFO).",
}
