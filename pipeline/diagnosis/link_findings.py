"""Findings about the network NCCL describes in its own lines (issue 36): a size-dependent cliff in
nccl-tests bus bandwidth, topology anomalies (a slow path to a NIC, a far NIC chosen over a near
one, a NIC much slower than its siblings, ranks on different inter-node transports) and NCCL
configuration that differs between the ranks of one job. Rows come from the lake's views
(nccl_tests_results, nccl_link_rates, views/50_nccl.sql nccl_line_rate and
nccl_process_settings); this module only applies the rules below and words them, in the shape of
nccl_findings.py (title, severity, evidence, recommendation, sql; recoverable_ns None: the logs
say what is wrong, not how much step time it costs). Called by nccl_findings.findings.

Rules (sources: ../shared/reference/nccl.md sections 1.11 and 5; NCCL's topology search,
src/graph/search.cc and paths.cc):
- cliff: in one nccl-tests table, test and placement, sizes in order, the split that leaves at
  least CLIFF_MIN_SIZES sizes on each side and whose median busbw after it is the smallest share of
  the median before; a cliff when that share is at most CLIFF_RATIO (busbw does not fall with size
  on a healthy fabric: it rises to a plateau).
- slow_path: a GPU's path to a NIC (GRAPH path line) carries less than SLOW_SHARE of the NIC's
  rate: a link on the way (PCIe through the CPU, a narrow or degraded slot) limits it.
- far_nic: NCCL's channels go through a NIC whose path from the GPU crosses the CPU interconnect
  (path type SYS) while another NIC of the host has a closer path; or a search result with
  crossNic 1.
- slow_nic: a NIC of a host at most SLOW_SHARE of the fastest NIC of that host.
- mixed_transport: processes of one job whose channels leave the node over different NET
  transports (IB on some, Socket on others).
- drift: a setting (NCCL or CUDA version, the network chosen, the NET transport, an NCCL_*
  variable set by environment) with different values on processes of one job; a variable set on
  some processes counts as unset on a process whose log shows its communicator's Init COMPLETE
  without it (NCCL prints the variables it reads during init).
"""

from __future__ import annotations

import statistics

CLIFF_RATIO = 0.7
CLIFF_MIN_SIZES = 3
SLOW_SHARE = 0.5

ADVICE = {
    "cliff": "A step down at large messages on a fabric that holds its rate below them points to a "
    "difference that only large transfers reach: a setting on one node only (nccl-tests#350: "
    "NCCL_NET_GDR_LEVEL passed to one node; see the configuration-drift finding when the logs show it), "
    "GPUDirect RDMA off on one side (staging through host memory), memory registration limits, or "
    "PCIe/NIC errors. Run the test node pair by node pair with NCCL_DEBUG=INFO "
    "NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET and compare the nodes' lines.",
    "slow_path": "Check the slot and its link (lspci -vv: LnkSta against LnkCap) and `nvidia-smi topo -m`: "
    "a NIC behind a narrow or degraded PCIe link, or reached through the CPU, cannot give its line rate "
    "to the GPU.",
    "far_nic": "Give each GPU the NIC on its own PCIe switch or socket (NCCL_IB_HCA listing the near NIC, "
    "or fix the topology NCCL detects); traffic through the CPU interconnect (SYS) loses bandwidth and "
    "adds latency.",
    "slow_nic": "Check the slower NIC's link (ibstat: Rate, Link layer) and whether NCCL should use it: "
    "exclude it with NCCL_IB_HCA when it is a management port; when NCCL's channels use it, it bounds "
    "every ring that crosses the node.",
    "mixed_transport": "Make the RDMA devices visible to NCCL on every node (libibverbs and the IB/RoCE "
    "devices in the container, NCCL_IB_DISABLE unset, the same NCCL_IB_HCA): one rank on TCP sockets "
    "slows every collective of its communicators to the socket rate.",
    "drift": "Launch every rank with the same NCCL environment and library: pass the variable to every "
    "node (mpirun -x VAR, srun --export, the same container image) or to none.",
}
TITLES = {
    "cliff": "nccl-tests bus bandwidth falls at large messages",
    "slow_path": "A GPU reaches its NIC through a link slower than the NIC",
    "far_nic": "NCCL uses a NIC across the CPU interconnect",
    "slow_nic": "A NIC much slower than the others of its host",
    "mixed_transport": "Ranks of one job leave the node over different transports",
    "drift": "NCCL configuration differs between the ranks of one job",
}


def _dicts(con, sql: str, params=()) -> list[dict]:
    cur = con.execute(sql, list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _size(n: int) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


def _finding(kind: str, evidence: list[str], sql: str, severity: str = "moderate") -> dict:
    return {
        "kind": f"nccl_{kind}",
        "title": TITLES[kind],
        "severity": severity,
        "recoverable_ns": None,
        "evidence": evidence[:6] + ([f"... and {len(evidence) - 6} more"] if len(evidence) > 6 else []),
        "recommendation": ADVICE[kind],
        "sql": sql,
        "source": "nccl_log",
    }


def cliff(points: list[tuple[int, float]]) -> dict | None:
    """The cliff of one busbw curve [(size_bytes, busbw_gbps)] (module doc), or None:
    {start_bytes, before_gbps, after_gbps, ratio, sizes_before, sizes_after, first_bytes}."""
    pts = sorted((s, b) for s, b in points if b is not None)
    if len(pts) < 2 * CLIFF_MIN_SIZES:
        return None
    best = None
    for k in range(CLIFF_MIN_SIZES, len(pts) - CLIFF_MIN_SIZES + 1):
        before = statistics.median(b for _, b in pts[:k])
        after = statistics.median(b for _, b in pts[k:])
        if before > 0 and (best is None or after / before < best[0]):
            best = (after / before, k, before, after)
    if best is None or best[0] > CLIFF_RATIO:
        return None
    ratio, k, before, after = best
    return {
        "start_bytes": pts[k][0],
        "first_bytes": pts[0][0],
        "last_before_bytes": pts[k - 1][0],
        "before_gbps": before,
        "after_gbps": after,
        "ratio": ratio,
        "sizes_before": k,
        "sizes_after": len(pts) - k,
    }


def cliff_findings(con, run_id: str) -> list[dict]:
    rows = _dicts(
        con,
        """SELECT r.source_id, regexp_extract(s.path, '[^/!]+$') AS file, r.table_index, r.test, r.placement,
                  r.size_bytes, r.busbw_gbps
           FROM nccl_tests_results r LEFT JOIN sources s ON s.run_id = r.run_id AND s.source_id = r.source_id
           WHERE r.run_id = ? AND r.busbw_gbps IS NOT NULL AND r.size_bytes > 0""",
        [run_id],
    )
    rate = _dicts(con, "SELECT * FROM nccl_tests_bandwidth WHERE run_id = ?", [run_id])
    link = {(r["source_id"], r["test"], r["placement"]): r for r in rate}
    curves: dict[tuple, list] = {}
    for r in rows:
        curves.setdefault(
            (r["source_id"], r["file"], r["table_index"], r["test"], r["placement"]), []
        ).append((r["size_bytes"], r["busbw_gbps"]))
    ev = []
    for (sid, file, tab, test, place), pts in sorted(curves.items(), key=lambda kv: kv[0][1:]):
        c = cliff(pts)
        if c is None:
            continue
        line = (
            f"{test} {place.replace('_', '-')} ({file}, table {tab + 1}): busbw falls from a median "
            f"{c['before_gbps']:.1f} GB/s ({_size(c['first_bytes'])} to {_size(c['last_before_bytes'])}, "
            f"{c['sizes_before']} sizes) to {c['after_gbps']:.1f} GB/s from {_size(c['start_bytes'])} on "
            f"({c['sizes_after']} sizes, {100 * c['ratio']:.0f} % of it)"
        )
        lk = link.get((sid, test, place))
        if lk and lk.get("link_kind") == "nic" and lk.get("link_peak_gbps"):
            peak = lk["link_peak_gbps"]
            line += (
                f"; {100 * c['before_gbps'] / peak:.0f} % then {100 * c['after_gbps'] / peak:.0f} % of the "
                f"{peak:g} GB/s the NICs give ({lk['nic_names']})"
            )
        elif lk and lk.get("n_nodes") and lk["n_nodes"] > 1:
            line += "; line rate unknown: run with NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET"
        ev.append(line)
    if not ev:
        return []
    return [
        _finding(
            "cliff", ev, f"SELECT * FROM nccl_tests_results WHERE run_id = '{_q(run_id)}' ORDER BY size_bytes"
        )
    ]


def _q(s: str) -> str:
    return s.replace("'", "''")


def topology_findings(con, run_id: str) -> list[dict]:
    rid = _q(run_id)
    out = []
    rates = _dicts(con, "SELECT * FROM nccl_link_rates WHERE run_id = ?", [run_id])
    nic_bw: dict[tuple, float] = {}
    for r in rates:
        if r["kind"] == "nic" and r["bw_gbps"] and r["dev_index"] is not None:
            key = (r["host"], r["pid"], r["dev_index"])
            nic_bw[key] = max(nic_bw.get(key, 0.0), r["bw_gbps"])
    used = {
        (h, p, i)
        for h, p, i in con.execute(
            "SELECT DISTINCT host, pid, net_dev FROM nccl_channels WHERE run_id = ? AND transport = 'NET'",
            [run_id],
        ).fetchall()
        if i is not None
    }
    paths = [r for r in rates if r["form"] == "graph_path"]
    slow, far = [], []
    for p in paths:
        nic = nic_bw.get((p["host"], p["pid"], p["dev_index"]))
        name = p["dev_name"] or p["dst_node"]
        if nic and p["bw_gbps"] is not None and p["bw_gbps"] < SLOW_SHARE * nic:
            slow.append(
                f"{p['src_node']} to {name} on {p['host']}: {p['bw_gbps']:g} GB/s over {p['hops']} link(s) "
                f"({p['link_type']}) against the NIC's {nic:g} GB/s (line {p['line_no']})"
            )
        if (p["host"], p["pid"], p["dev_index"]) in used and p["link_type"] == "SYS":
            near = [
                q
                for q in paths
                if (q["host"], q["pid"], q["src_node"]) == (p["host"], p["pid"], p["src_node"])
                and q["link_type"] not in ("SYS", None)
                and q["dev_index"] != p["dev_index"]
            ]
            if near:
                far.append(
                    f"{p['src_node']} on {p['host']}: channels use {name} (path SYS) while "
                    f"{near[0]['dev_name'] or near[0]['dst_node']} is {near[0]['link_type']} "
                    f"(line {p['line_no']})"
                )
    far += [
        f"search result with crossNic {r['cross_nic']} on {r['host']} (line {r['line_no']}): a channel may "
        "enter and leave the node through different NICs"
        for r in rates
        if r["form"] == "pattern" and r["cross_nic"] == 1
    ]
    sql = f"SELECT * FROM nccl_link_rates WHERE run_id = '{rid}' ORDER BY line_no"
    if slow:
        out.append(_finding("slow_path", slow, sql))
    if far:
        out.append(_finding("far_nic", far, sql))
    by_host: dict = {}
    for r in rates:
        if r["kind"] == "nic" and r["bw_gbps"]:
            name = r["dev_name"] or r["dst_node"] or f"NET/{r['dev_index']}"
            by_host.setdefault(r["host"], {})
            by_host[r["host"]][name] = max(by_host[r["host"]].get(name, 0.0), r["bw_gbps"])
    named = {(r["host"], r["pid"], r["dev_index"]): r["dev_name"] for r in rates if r["dev_name"]}
    used_names = {(h, named.get((h, p, i))) for h, p, i in used}
    slow_nics = []
    for host, nics in sorted(by_host.items(), key=lambda kv: str(kv[0])):
        top = max(nics.values())
        fast = max(nics, key=nics.get)
        for name, bw in sorted(nics.items()):
            if bw > SLOW_SHARE * top:
                continue
            use = ""
            if used:
                use = (
                    "; NCCL's channels use it"
                    if (host, name) in used_names
                    else "; NCCL's channels do not use it"
                )
            slow_nics.append(
                f"{name} on {host or 'the topology dump'}: {bw:g} GB/s ({8 * bw:g} Gb/s) beside {fast} at "
                f"{top:g} GB/s ({8 * top:g} Gb/s){use}"
            )
    if slow_nics:
        out.append(_finding("slow_nic", slow_nics, sql))
    mixed = _dicts(
        con,
        """SELECT job, value, list(DISTINCT host || ':' || pid ORDER BY host || ':' || pid) AS procs
           FROM nccl_process_settings WHERE run_id = ? AND setting = 'net_transport'
           GROUP BY ALL ORDER BY job, value""",
        [run_id],
    )
    jobs: dict = {}
    for m in mixed:
        jobs.setdefault(m["job"], []).append(m)
    ev = [
        "; ".join(
            f"{m['value']} on {', '.join(m['procs'][:4])}{' ...' if len(m['procs']) > 4 else ''}" for m in ms
        )
        for ms in jobs.values()
        if len({v for m in ms for v in m["value"].replace("/GDRDMA", "").split(", ")}) > 1
    ]
    if ev:
        out.append(
            _finding(
                "mixed_transport",
                ev,
                f"SELECT * FROM nccl_process_settings WHERE run_id = '{rid}' AND setting = 'net_transport'",
                severity="high",
            )
        )
    return out


def drift_findings(con, run_id: str) -> list[dict]:
    rows = _dicts(
        con,
        """SELECT s.job, s.host, s.pid, s.rank, s.setting, s.value, s.line_no,
                  regexp_extract(src.path, '[^/!]+$') AS file
           FROM nccl_process_settings s
           LEFT JOIN sources src ON src.run_id = s.run_id AND src.source_id = s.source_id
           WHERE s.run_id = ? ORDER BY s.setting, s.host, s.pid""",
        [run_id],
    )
    complete = {
        (h, p)
        for h, p in con.execute(
            "SELECT DISTINCT host, pid FROM nccl_processes "
            "WHERE run_id = ? AND init_complete_line_no IS NOT NULL",
            [run_id],
        ).fetchall()
    }
    procs_of_job: dict = {}
    for r in rows:
        procs_of_job.setdefault(r["job"], {})[(r["host"], r["pid"])] = r["rank"]
    ev = []
    by: dict = {}
    for r in rows:
        by.setdefault((r["job"], r["setting"]), []).append(r)
    for (job, setting), rs in sorted(by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        values: dict[str, list[str]] = {}
        for r in rs:
            who = f"{r['host']}:{r['pid']}" + (f" (rank {r['rank']})" if r["rank"] is not None else "")
            values.setdefault(r["value"], []).append(f"{who}, {r['file']} line {r['line_no']}")
        if setting.startswith("NCCL_"):
            stated = {(r["host"], r["pid"]) for r in rs}
            for proc, rank in sorted(procs_of_job[job].items(), key=str):
                if proc not in stated and proc in complete:
                    who = f"{proc[0]}:{proc[1]}" + (f" (rank {rank})" if rank is not None else "")
                    values.setdefault("(unset)", []).append(f"{who}: its init completed without it")
        if len(values) > 1:
            ev.append(
                f"{setting}: "
                + "; ".join(
                    f"{v} on {', '.join(w[:3])}{' ...' if len(w) > 3 else ''}"
                    for v, w in sorted(values.items())
                )
            )
    if not ev:
        return []
    return [
        _finding(
            "drift",
            ev,
            f"SELECT * FROM nccl_process_settings WHERE run_id = '{_q(run_id)}' ORDER BY setting, host, pid",
            severity="high",
        )
    ]


def findings(con, run_id: str) -> list[dict]:
    """The run's findings of this module, drift first (module doc)."""
    return drift_findings(con, run_id) + cliff_findings(con, run_id) + topology_findings(con, run_id)
