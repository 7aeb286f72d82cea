"""Findings from NCCL logs and nccl-tests output (issue 5 part 5), in the shape of
pipeline/diagnosis/findings.py: title, recoverable_ns (None: the logs say what is wrong, not how
much time it costs), evidence, recommendation, sql, plus severity ('high' | 'moderate').

Rules are the SQL of queries/nccl_checks.sql and queries/nccl_tests_bandwidth.sql; this module
only groups their rows per run and attaches the advice. Advice sources: NCCL environment and
troubleshooting docs and the line formats in ../shared/reference/nccl.md (sections 1.5, 1.8, 1.10, 5).
"""

from __future__ import annotations

import duckdb

from .. import schema as sch
from . import link_findings

# busbw below this share of the per-direction link peak is reported: nccl.md section 5 gives
# ~77-82 % of the per-direction NVLink rate as what NCCL reaches on healthy A100/H100 nodes, so
# half of the line rate is well below anything healthy.
LOW_BUSBW_PCT = 50.0

TITLES = {
    "watchdog_timeout": "Collective timed out (hang)",
    "coll_mismatch": "Ranks issued different collectives",
    "socket_transport": "Inter-node traffic on TCP sockets",
    "nccl_warn": "NCCL reported errors",
    "gdr_off": "GPUDirect RDMA off",
    "shm_transport": "Intra-node traffic through host memory (SHM, not P2P)",
    "p2p_disabled": "P2P disabled by the environment",
    "channels_limited": "NCCL channel count forced by the environment",
    "channels_asymmetric": "Ranks of one communicator chose different channel counts",
    "ras_issue": "NCCL RAS reports a communicator problem",
}
ADVICE = {
    "watchdog_timeout": "A collective never completed. Inspect the rank(s) that never enqueued it (they "
    "stopped first): their stacks (py-spy dump, or PyTorch's Flight Recorder with "
    "TORCH_NCCL_TRACE_BUFFER_SIZE>0 read by torchfrtrace) show where they are stuck - usually a "
    "rank-dependent code path, a crashed or stalled data loader, or a dead process; NCCL WARN lines of "
    "the same time point to network failures.",
    "coll_mismatch": "Ranks called different collectives (or sizes) at the same sequence number: find the "
    "rank-dependent code path (uneven last batch, a metric all-reduce on some ranks only, different "
    "parameter sets) and make every rank issue the same collectives in the same order.",
    "socket_transport": "NCCL fell back to TCP sockets between nodes. Make the RDMA network visible to "
    "NCCL: IB/RoCE devices and libibverbs inside the container (a 'Failed to open libibverbs' WARN means "
    "they are not), NCCL_IB_DISABLE unset, NCCL_IB_HCA naming the right HCAs; on AWS the aws-ofi-nccl "
    "plugin with EFA. NCCL_SOCKET_IFNAME only chooses the bootstrap/socket interface.",
    "nccl_warn": "Read the WARN lines and their error chain: an IB completion with status=12 (retry "
    "exceeded) means the peer or the fabric stopped answering - check the link (ibstat, port error "
    "counters), the peer process, and NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT; plugin or library failures "
    "mean NCCL runs on a fallback transport.",
    "gdr_off": "NIC traffic is staged through host memory. Enable GPUDirect RDMA: load nvidia-peermem (or "
    "use DMA-BUF), check NCCL_NET_GDR_LEVEL, and that GPU and NIC share a PCIe switch (nvidia-smi topo "
    "-m).",
    "shm_transport": "Peers on one node exchange data through host shared memory. Check nvidia-smi topo "
    "-m for NVLink/PCIe peer access, remove NCCL_P2P_DISABLE / NCCL_P2P_LEVEL limits, and allow "
    "peer-to-peer in the container or VM (ACS / IOMMU settings).",
    "p2p_disabled": "Unset NCCL_P2P_DISABLE unless a known hardware problem requires it: intra-node "
    "traffic then leaves NVLink.",
    "channels_limited": "Unset NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS / NCCL_MAX_CTAS unless a "
    "measurement showed the forced count is faster: NCCL chooses the channel count from the topology.",
    "channels_asymmetric": "Ranks detected the topology differently: compare `nvidia-smi topo -m` and "
    "NCCL_TOPO_DUMP_FILE output across the nodes - a missing NIC or NVLink on one node limits the whole "
    "communicator.",
    "ras_issue": "MISMATCH: the communicator's ranks launched different numbers of operations, so the "
    "ranks with the smaller count have not reached the next collective (a desync, or a hang in "
    "progress): see where those ranks are (py-spy dump, PyTorch's Flight Recorder) for a rank-dependent "
    "code path or a stalled process. DEAD / INCOMPLETE: a process died or stopped answering - check its "
    "node and the NCCL WARN lines of the same time (NCCL docs, troubleshooting/ras.rst).",
}
ORDER = list(TITLES)

# the metric views these findings read (pipeline/query.py connect metric_views)
VIEWS = ("nccl_checks", "nccl_tests_bandwidth")
# the views findings() reads once per run (nccl_checks through nccl_process_transport and the
# rest of views/50_nccl.sql): analysis computes them into tables first (query.materialize), or
# each run's findings computed every one of them over the whole lake again (a lake of 36 runs, 28
# of them NCCL logs: 19 s against 2 s, the same findings)
PER_RUN_VIEWS = ("nccl_process_settings", "nccl_checks", "nccl_tests_bandwidth")
# the schema tables every row of those views comes from (NCCL logs, flight-recorder dumps,
# nccl-tests output): a run with no part of any has no NCCL finding
TABLES = tuple(t for t in sch.tables() if t.startswith(("nccl_", "flight_recorder")))


def has_inputs(lake, runs: list[str] | None = None) -> bool:
    """Whether a run in scope (runs; None: every run) has a part of one of TABLES. The lake's
    committed parts are taken once for all of them (each taking reads every compaction manifest:
    0.25 s for one run of a 5,000-file archive lake otherwise)."""
    view = lake.committed()
    return any(lake.table_files(t, runs, committed=view) for t in TABLES)


def _q(s: str) -> str:
    return s.replace("'", "''")


def findings(con: duckdb.DuckDBPyConnection, run_id: str, stray: set[str] = frozenset()) -> list[dict]:
    """NCCL findings of one run, most severe first. con: pipeline.query.connect() of the lake;
    stray: source ids of the run's NCCL logs that matched no traced rank (analyze_fields.
    nccl_matching): a finding seen only in those is marked as possibly another job's, ranked
    after the others and never high. Returns [] for runs without NCCL logs or nccl-tests output."""
    rid = _q(run_id)
    rows = con.execute(f"""
        SELECT c.kind, c.severity, c.detail, c.line_no, c.n, c.file, c.source_id
        FROM nccl_checks c
        WHERE c.run_id = '{rid}' ORDER BY c.source_id, c.line_no""").fetchall()
    by_kind: dict[str, list] = {}
    for r in rows:
        by_kind.setdefault(r[0], []).append(r)
    out = []

    def only_stray(k: str) -> bool:
        return all(r[6] in stray for r in by_kind[k])

    for kind in sorted(
        by_kind,
        key=lambda k: (
            only_stray(k),
            min(0 if r[1] == "high" else 1 for r in by_kind[k]),
            ORDER.index(k) if k in ORDER else 99,
        ),
    ):
        rs = by_kind[kind]
        ev = [f"{d} ({f}{', line ' + str(ln) if ln is not None else ''})" for _, _, d, ln, _, f, _ in rs[:5]]
        if len(rs) > 5:
            ev.append(f"... and {len(rs) - 5} more")
        elsewhere = only_stray(kind)
        if elsewhere:
            files = ", ".join(sorted({r[5] for r in rs}))
            ev.insert(
                0,
                f"seen only in {files}, which matched no traced rank of this run: it may be another job's "
                "log; check that it belongs to this job before acting on it",
            )
        out.append(
            {
                "kind": f"nccl_{kind}",  # the nccl_checks kind it groups
                "title": TITLES.get(kind, kind)
                + (" (in a log matching no traced rank)" if elsewhere else ""),
                "severity": "high" if any(r[1] == "high" for r in rs) and not elsewhere else "moderate",
                "recoverable_ns": None,
                "evidence": ev,
                "recommendation": ADVICE.get(kind, ""),
                "sql": f"SELECT * FROM nccl_checks WHERE run_id = '{rid}' AND kind = '{kind}'",
                "source": "nccl_log",
            }
        )
    sql = (
        """
        SELECT b.test, b.placement, b.peak_busbw_gbps, b.link_peak_gbps, b.busbw_pct_of_link,"""
        f""" b.size_at_peak_bytes,
               b.gpu_name, b.file, b.link_kind, b.nic_names
        FROM nccl_tests_bandwidth b
        WHERE b.run_id = '{rid}' AND b.busbw_pct_of_link < {LOW_BUSBW_PCT} ORDER BY b.busbw_pct_of_link"""
    )
    low = con.execute(sql).fetchall()
    if low:
        out.append(
            {
                "kind": "nccl_tests_low_busbw",
                "title": "nccl-tests bus bandwidth far below the link peak",
                "severity": "moderate",
                "recoverable_ns": None,
                "evidence": [
                    f"{t} ({p}): best busbw {bw:.1f} GB/s at {size} B = {pct:.0f}% of "
                    + (
                        f"the {peak:g} GB/s the NICs give ({nics}; {f})"
                        if kind == "nic"
                        else f"{peak:.0f} GB/s per direction ({gpu}; {f})"
                    )
                    for t, p, bw, peak, pct, size, gpu, f, kind, nics in low[:5]
                ],
                "recommendation": "Healthy NVLink nodes reach ~77-82% of the per-direction line rate in "
                "nccl-tests, and IB/RoCE fabrics ~90 % of the NIC rate (HDR 200 Gb/s gives ~20-24 GB/s per "
                "NIC, NDR 400 Gb/s 46-48 GB/s: nccl.md sections 1.11 and 5). Check the transport lines of an "
                "NCCL_DEBUG=INFO run (SHM or Socket instead of P2P/NET/IB, GDRDMA missing), NVLink health "
                "(nvidia-smi nvlink -s), and test node by node to find the slow link.",
                "sql": f"SELECT * FROM nccl_tests_bandwidth WHERE run_id = '{rid}'",
                "source": "nccl_tests",
            }
        )
    return out + link_findings.findings(con, run_id)


def _dicts(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def tests_results(con: duckdb.DuckDBPyConnection) -> tuple[list[dict], list[dict]]:
    """(rows, peaks) of the nccl-tests output in scope, for the report's chart: one row per
    measured size and placement (nccl_tests_results, with the file's name; rows without a busbw
    left out), and queries/nccl_tests_bandwidth.sql's best busbw and link peak per test."""
    rows = _dicts(
        con,
        """SELECT r.run_id, r.source_id, regexp_extract(s.path, '[^/!]+$') AS file, r.line_no,
                  r.table_index, r.test, r.placement, r.size_bytes, r.count, r.type, r.redop,
                  r.time_ns, r.algbw_gbps, r.busbw_gbps
           FROM nccl_tests_results r LEFT JOIN sources s ON s.run_id = r.run_id AND s.source_id = r.source_id
           WHERE r.busbw_gbps IS NOT NULL
           ORDER BY r.run_id, file, r.table_index, r.test, r.placement, r.size_bytes""",
    )
    peaks = _dicts(con, "SELECT * FROM nccl_tests_bandwidth") if rows else []
    return rows, peaks
