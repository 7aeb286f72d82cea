"""Communication findings of a run: exposed transfer (exposed_comm) and waiting for peers
(straggler), with the collective op that cost the time and what to change for it.

exposed_comm is the exposed transfer of the priority breakdown (queries/step_time.sql: exposed
communication after the last rank of the collective arrived, pipeline/diagnosis/straggler.py);
straggler is the exposed waiting for peers, named after the rank the others waited for. When no
collective was matched consistently on two ranks the split is unknown and all exposed
communication is reported as exposed_comm (verdict.network_key). The op evidence weighs each
collective op by its time (queries/collective_exposure.sql), and the bus bandwidth is the
nccl-tests busbw of the main op's calls (queries/collective_matching.sql) against the link peak
of the device catalog. Shapes, bars and recoverable time: pipeline/diagnosis/findings.py.
"""

from __future__ import annotations

from .basis import Basis, median, ms, quote
from .verdict import MODERATE_PCT

MAX_SIZES = 4  # message sizes listed one by one in the bus bandwidth evidence


def busbw_text(calls: list[dict]) -> str:
    """The bus bandwidth of collective calls (collective_matching rows of one op: busbw_gbps,
    transfer_ns, msg_bytes, link_peak_gbps) in words: the busbw weighted by transfer time (the bus
    bytes of all calls over their total transfer time, so a call counts as long as it took), against
    the link peak, then the sizes apart (each size's call count and busbw range; at most MAX_SIZES
    sizes, else the range of sizes and the size that took the most time). A median of the calls
    would average two calls of different sizes and describe none (issue 39 item 7)."""
    t = sum(c["transfer_ns"] for c in calls)
    w = (
        sum(c["busbw_gbps"] * c["transfer_ns"] for c in calls) / t
        if t
        else median([c["busbw_gbps"] for c in calls])
    )
    peak = median([c["link_peak_gbps"] for c in calls])
    head = f"{w:.1f} GB/s weighted by transfer time over {len(calls)} call(s)" + (
        f" = {100 * w / peak:.0f}% of the {peak:.0f} GB/s link peak"
        if peak
        else " (link peak unknown: the group spans hosts or the device is not in the catalog)"
    )
    sizes: dict[int, list[dict]] = {}
    for c in calls:
        sizes.setdefault(c["msg_bytes"], []).append(c)

    def one(size: int, cs: list[dict]) -> str:
        lo, hi = min(c["busbw_gbps"] for c in cs), max(c["busbw_gbps"] for c in cs)
        rng = f"{lo:.1f} GB/s" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f} GB/s"
        return f"{_size(size)} x{len(cs)}: {rng}"

    if len(sizes) <= MAX_SIZES:
        return head + "; by message size: " + ", ".join(one(s, sizes[s]) for s in sorted(sizes))
    top = max(sizes, key=lambda s: (sum(c["transfer_ns"] for c in sizes[s]), s))
    return (
        head
        + f"; {len(sizes)} message sizes from {_size(min(sizes))} to {_size(max(sizes))}, "
        + f"the most time at {one(top, sizes[top])}"
    )


def _size(n: int) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n} B"


def comm_findings(b: Basis, v: dict, result: dict) -> list[dict]:
    """The exposed_comm and straggler findings of the run of basis b (its verdict v, the analysis
    result), each when its share reaches MODERATE_PCT; unranked."""
    run_id = b.run_id
    out: list[dict] = []
    # exposed communication: transfer (the network); waiting for peers is the straggler finding
    exp, xfer, wait = b.total("exposed_comm"), b.total("exposed_transfer"), b.total("exposed_wait")
    comm, ovl = b.total("comm"), b.total("overlap")
    by_op = _op_costs(result, run_id, b.analysed)
    split_known = v["numbers"].get("exposed_comm_transfer_pct") is not None
    xfer_key = "exposed_transfer"
    if split_known:
        split = (
            f"exposed communication {b.share(exp):.1f}% {b.of}: transfer {b.share(xfer):.1f}%, "
            f"waiting for peers {b.share(wait):.1f}%"
        )
    else:  # no collective matched consistently on two ranks: the split is unknown (verdict.network_key)
        xfer, wait, xfer_key = exp, 0, "exposed_comm"
        split = (
            f"exposed communication {b.share(exp):.1f}% {b.of}; transfer vs waiting for peers unknown: no "
            "collective was matched consistently on two or more ranks"
        )
    if b.share(xfer) >= MODERATE_PCT:
        by_rank = b.by_rank(xfer_key)
        worst = max(by_rank, key=by_rank.get)
        op_key = "exposed_transfer_ns" if split_known else "exposed_ns"
        ranked = sorted(by_op.items(), key=lambda kv: (-kv[1][op_key], -kv[1]["kernel_ns"], kv[0]))
        main_op = ranked[0][0] if ranked and ranked[0][1][op_key] > 0 else None
        ev = [
            (
                f"exposed transfer {b.share(xfer):.1f}% {b.of}: {ms(xfer / b.n_ranks)} per rank "
                f"{b.over} ({split})"
                if split_known
                else f"{split}: {ms(xfer / b.n_ranks)} per rank {b.over}"
            ),
            f"communication hidden under compute: {100 * ovl / comm:.1f}% of communication time"
            if comm
            else "overlap unknown",
            f"worst rank {worst}: {ms(by_rank[worst])} exposed "
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
                over_t = (
                    "over its transfer time (after the last rank arrived)"
                    if any(c["consistent"] for c in bw)
                    else "over its kernel time (not matched across ranks: waiting for peers included)"
                )
                ev.append(f"{main_op} bus bandwidth {over_t}: {busbw_text(bw)}")
            elif per_rank_calls and all(c["msg_bytes"] is None for c in per_rank_calls if c["op"] == main_op):
                ev.append(f"{main_op} bus bandwidth unknown: no message size in the trace (see the notes)")
        part = [
            c
            for c in result.get("collectives", [])
            if c["run_id"] == run_id and c["consistent"] and c.get("complete") is False
        ]
        if split_known and part:
            # transfer = the shortest kernel of a call, which would be the missing late rank's:
            # on the ranks traced it is an upper bound, part of it perhaps waiting for that rank
            ev.append(
                f"an upper bound: {len(part)} matched collective(s) were traced on "
                f"{max(c['ranks_seen'] for c in part)} of {max(c['expected_ranks'] for c in part)} ranks, "
                "and a missing rank that arrived last would turn part of this transfer into waiting for it"
            )
        out.append(
            {
                "kind": "exposed_comm",
                "title": (
                    "Exposed communication: collectives transferring data not hidden under compute"
                    if split_known
                    else "Exposed communication: collectives not hidden under compute"
                ),
                **b.timing(xfer),
                "evidence": ev,
                "recommendation": COMM_ADVICE.get(main_op, COMM_ADVICE[None]),
                "sql": b.sql + " ORDER BY exposed_comm_transfer_ns DESC",
            }
        )

    # waiting for peers: the rank the others wait for in collectives (pipeline/diagnosis/straggler.py)
    if split_known and b.share(wait) >= MODERATE_PCT and b.n_ranks > 1:
        st = v.get("straggler") or {}
        ev = [
            f"exposed waiting for peers {b.share(wait):.1f}% {b.of}: {ms(wait / b.n_ranks)} per rank "
            f"{b.over} "
            f"({split}): the ranks' collectives had started but the last rank of the group had not arrived"
        ]
        if st.get("rank") is not None:
            title = f"Waiting for a straggler: rank {st['rank']} arrives last"
            ev.append(
                f"rank {st['rank']} started last in {st['times_last']} of {st['calls']} matched "
                f"collectives; the others waited {ms(st['caused_wait_ns'])} for it in total "
                f"({st['share_pct']:.0f}% of all waiting)"
            )
            ev.append(f"its cause: {st['cause_text']}")
            rec = STRAGGLER_ADVICE.get(st["cause"], STRAGGLER_ADVICE["unknown"]).format(rank=st["rank"])
        elif st.get("cause") == "untraced_ranks":
            title = "Waiting for peers: the late rank may not be in the traces"
            ev.append(st["cause_text"])
            rec = STRAGGLER_ADVICE["untraced_ranks"]
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
                **b.timing(wait),
                "evidence": ev,
                "recommendation": rec,
                "sql": f"SELECT * FROM stragglers WHERE run_id = '{quote(run_id)}' "
                "ORDER BY caused_wait_ns DESC",
            }
        )

    return out


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
        f"most {label} is {op}: {100 * c[key] / exposed:.0f}% of it ({ms(c[key])} summed over ranks), "
        f"{100 * c['kernel_ns'] / kernel:.0f}% of all collective kernel time ({ms(c['kernel_ns'])})"
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
    "untraced_ranks": "Trace every rank of the job (the profiler on all of them, the same steps): the "
    "collectives waited for a rank whose trace is missing, so who was late, and why, cannot be told "
    "from these files.",
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
