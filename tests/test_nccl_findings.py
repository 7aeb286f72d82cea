"""NCCL logs joined to traces of the same run (queries/views/50_nccl.sql) and the problems the
logs state (queries/nccl_checks.sql, queries/nccl_tests_bandwidth.sql,
pipeline/diagnosis/nccl_findings.py). Expected values are read by hand from the corpus files (lines
cited) or from the small hand-written inputs below."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CORPUS, X, write_trace

from pipeline.diagnosis.nccl_findings import findings
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

NCCL = CORPUS / "nccl"


def lake_of(tmp_path: Path, *names: str) -> Lake:
    """Each file in its own run (run id = file name stem), as separate jobs would be."""
    lake = Lake(tmp_path / "lake")
    for n in names:
        (r,) = ingest_paths([NCCL / n], lake, run=Path(n).stem[:60])
        assert r.status == "ok", r.error
    return lake


def checks(con, run_id: str) -> list[tuple]:
    return con.execute(
        "SELECT kind, severity, host, pid, rank, line_no, n, detail FROM nccl_checks WHERE run_id = ? "
        "ORDER BY kind, line_no",
        [run_id],
    ).fetchall()


def test_socket_transport(tmp_path):
    f = "nccl-tests-issue-284-socket-transport-info-interleaved-in-table.log"
    con = connect(lake_of(tmp_path, f))
    rows = checks(con, Path(f).stem[:60])
    # lines 4-7: node01:3867861 ... via NET/Socket/0 (4 channels); lines 8-11: node02:475220 (4 channels)
    assert [(k, s, h, p, ln, n) for k, s, h, p, _, ln, n, _ in rows] == [
        ("socket_transport", "high", "node01", 3867861, 4, 4),
        ("socket_transport", "high", "node02", 475220, 8, 4),
    ]
    (fd,) = findings(con, Path(f).stem[:60])
    assert (
        fd["title"] == "Inter-node traffic on TCP sockets"
        and fd["severity"] == "high"
        and fd["recoverable_ns"] is None
    )
    assert "line 4" in fd["evidence"][0] and "NCCL_IB_HCA" in fd["recommendation"]
    assert fd["sql"].startswith("SELECT * FROM nccl_checks WHERE")
    assert con.execute(fd["sql"]).fetchall()  # the SQL shown reproduces the evidence


def test_gdr_off_on_nccl_2_4_ib(tmp_path):
    f = "tensorflow-issue-34375-nccl-2.4.7-legacy-ring-format-empty-hostname.log"
    con = connect(lake_of(tmp_path, f))
    # lines 7-8: ":5202:5683 [0] NCCL INFO Ring 00 : 1 -> 0 [receive] via NET/IB/0" and
    # "... [send] via NET/IB/0"
    assert [(k, p, ln, n) for k, _, _, p, _, ln, n, _ in checks(con, Path(f).stem[:60])] == [
        ("gdr_off", 5202, 7, 2)
    ]


def test_healthy_transports_raise_nothing(tmp_path):
    # 1189: NET/IB/.../GDRDMA and P2P/CUMEM; 892: single node, P2P/direct pointer
    names = (
        "nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log",
        "nccl-issue-892-single-node-h800-p2p-direct-pointer-channels.log",
    )
    con = connect(lake_of(tmp_path, *names))
    assert con.execute("SELECT count(*) FROM nccl_checks").fetchone()[0] == 0
    for n in names:
        assert findings(con, Path(n).stem[:60]) == []


def test_docs_sample_socket_shm_and_warn(tmp_path):
    f = "nvidia-nccl-docs-2.30-logging-examples-by-subsystem.log"
    con = connect(lake_of(tmp_path, f))
    got = {(k, ln) for k, _, _, _, _, ln, _, _ in checks(con, Path(f).stem[:60])}
    # line 2: "... plugin/net.cc:334 NCCL WARN Failed to initialize any NET plugin";
    # line 28: "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"; line 70: "... [send] via NET/Socket/0"
    assert got == {("nccl_warn", 2), ("shm_transport", 28), ("socket_transport", 70)}


def test_ib_completion_error(tmp_path):
    f = "nccl-issue-1405-warn-net-ib-completion-status12-error-chain.log"
    con = connect(lake_of(tmp_path, f))
    ((k, sev, host, pid, _, ln, n, detail),) = checks(con, Path(f).stem[:60])
    # line 1: "... NCCL WARN NET/IB : Got completion from peer 192.0.2.1<54862> with status=12 ..."
    assert (k, sev, host, pid, ln) == ("nccl_warn", "high", "node01", 3468, 1) and "status=12" in detail


@pytest.mark.parametrize(
    "name,want",
    [
        # line 1/3/5: "[Rank N] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808,
        #  OpType=ALLREDUCE, ... Timeout(ms)=600000) ran for 600020/600030/600061 milliseconds"
        #  on ranks 1, 0, 2
        (
            "basicsr-issue-737-torch-watchdog-timeout-allreduce.log",
            "ALLREDUCE SeqNum 808 of process group ? timed out after 600.1 s on rank(s) 0, 1, 2",
        ),
        # lines 1/3/5: SeqNum=7753, OpType=_REDUCE_SCATTER_BASE on ranks 0, 4, 3; longest ran for 600099 ms
        (
            "llamafactory-issue-6269-torch-watchdog-timeout-reduce-scatter-base.log",
            "_REDUCE_SCATTER_BASE SeqNum 7753 of process group ? timed out after 600.1 s on rank(s) 0, 3, 4",
        ),
        # lines 1-5: SeqNum=469508 ALLREDUCE, Timeout(ms)=1800000, ranks 1, 3, 2, 6, 7;
        # longest ran for 1802222 ms
        (
            "ofa-issue-271-torch-watchdog-timeout-legacy-format.log",
            "ALLREDUCE SeqNum 469508 of process group ? timed out after 1802.2 s on rank(s) 1, 2, 3, 6, 7",
        ),
    ],
)
def test_watchdog_timeouts(tmp_path, name, want):
    con = connect(lake_of(tmp_path, name))
    rows = [r for r in checks(con, Path(name).stem[:60]) if r[0] == "watchdog_timeout"]
    assert [r[7] for r in rows] == [want]
    (fd,) = [f for f in findings(con, Path(name).stem[:60]) if f["title"] == "Collective timed out (hang)"]
    assert fd["severity"] == "high" and "Flight Recorder" in fd["recommendation"]


def test_hang_names_the_rank_that_stopped_first(tmp_path):
    """Hand-written: ranks 0 and 1 time out on SeqNum 12; rank 2's failure summary says its last
    enqueued work was 11, so it never issued 12 (wording of the basicsr corpus log, line 2)."""
    log = tmp_path / "job" / "stderr.log"
    log.parent.mkdir()
    log.write_text(
        "[rank0]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 0] "
        "Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) "
        "ran for 600030 milliseconds before timing out.\n"
        "[rank1]:[E626 06:24:44.903881999 ProcessGroupNCCL.cpp:616] [Rank 1] "
        "Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, Timeout(ms)=600000) "
        "ran for 600020 milliseconds before timing out.\n"
        "[rank2]:[E626 06:24:45.001000000 ProcessGroupNCCL.cpp:1664] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
        "Exception (either an error "
        "or timeout) detected by watchdog at work: 11, last enqueued NCCL work: 11, "
        "last completed NCCL work: 11.\n"
    )
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([log], lake)[0].status == "ok"
    (row,) = (
        connect(lake).execute("SELECT detail FROM nccl_checks WHERE kind = 'watchdog_timeout'").fetchall()
    )
    assert row[0] == (
        "ALLREDUCE SeqNum 12 of process group ? timed out after 600.0 s on rank(s) 0, 1; "
        "rank(s) that never enqueued it (stopped first): 2; known rank(s) that did not report it: 2"
    )


def test_torchfrtrace_mismatch(tmp_path):
    f = "pytorch-tutorial-torchfrtrace-output-missing-rank.txt"
    con = connect(lake_of(tmp_path, f))
    rows = checks(con, Path(f).stem[:60])
    # line 1: "Not all ranks joining collective 5 at entry 4"
    assert [(k, d) for k, _, _, _, _, _, _, d in rows] == [
        ("coll_mismatch", "torchfrtrace: Not all ranks joining collective 5 at entry 4")
    ]


def test_coll_lines_that_disagree(tmp_path):
    """Hand-written: two ranks of commId 0xabc (Init COMPLETE lines in the 2.22 wording of corpus
    nccl-issue-1412 line 2); opCount 5 is an AllReduce of 1000 floats on rank 0 but 2000 on rank 1
    (COLL wording of nccl-issue-1193 line 1); opCount 6 agrees."""
    log = tmp_path / "job" / "nccl.log"
    log.parent.mkdir()
    init = (
        "node01:{pid}:{pid} [{r}] NCCL INFO ncclCommInitRank comm 0x{c} rank {r} nranks 2 "
        "cudaDev {r} nvmlDev {r} "
        "busId {r}000 commId 0xabc - Init COMPLETE\n"
    )
    coll = (
        "node01:{pid}:{pid} [{r}] NCCL INFO AllReduce: opCount {op} sendbuff 0x1 recvbuff 0x1 count {n} "
        "datatype 7 op 0 "
        "root 0 comm 0x{c} [nranks=2] stream 0x9\n"
    )
    log.write_text(
        init.format(pid=10, r=0, c="aa")
        + init.format(pid=11, r=1, c="bb")
        + coll.format(pid=10, r=0, c="aa", op=5, n=1000)
        + coll.format(pid=11, r=1, c="bb", op=5, n=2000)
        + coll.format(pid=10, r=0, c="aa", op=6, n=10)
        + coll.format(pid=11, r=1, c="bb", op=6, n=10)
    )
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([log], lake)[0].status == "ok"
    rows = (
        connect(lake)
        .execute("SELECT detail, line_no, n FROM nccl_checks WHERE kind = 'coll_mismatch'")
        .fetchall()
    )
    assert rows == [("communicator 0xabc opCount 5: ranks disagree (ops AllReduce, counts 1000/2000)", 3, 2)]


def test_nccl_tests_bandwidth_against_link_peak(tmp_path):
    f = "ncclTests-gcp-a3mega-h100-16rank-allreduce.txt"
    con = connect(lake_of(tmp_path, f))
    rows = con.execute(
        "SELECT placement, n_ranks, n_nodes, gpu_name, peak_busbw_gbps, size_at_peak_bytes, "
        "link_peak_gbps, link_note "
        "FROM nccl_tests_bandwidth ORDER BY placement"
    ).fetchall()
    # line 54: "8589934592 2147483648 float sum -1 47535 180.71 338.82 0 47743 179.92 337.35 0";
    # 16 ranks on node01/node02
    assert rows == [
        (
            "in_place",
            16,
            2,
            "NVIDIA H100 80GB HBM3",
            337.35,
            8589934592,
            None,
            "spans 2 nodes: line rate unknown: run with NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET",
        ),
        (
            "out_of_place",
            16,
            2,
            "NVIDIA H100 80GB HBM3",
            338.82,
            8589934592,
            None,
            "spans 2 nodes: line rate unknown: run with NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET",
        ),
    ]
    # the same table as if all 16 ranks sat on one node: compared with H100 NVLink 450 GB/s per direction
    one = tmp_path / "one" / "single_node.txt"
    one.parent.mkdir()
    one.write_text((NCCL / f).read_text().replace("node02", "node01"))
    lake = Lake(tmp_path / "lake1")
    assert ingest_paths([one], lake)[0].status == "ok"
    r = (
        connect(lake)
        .execute(
            "SELECT link_peak_gbps, busbw_pct_of_link FROM nccl_tests_bandwidth "
            "WHERE placement = 'out_of_place'"
        )
        .fetchone()
    )
    assert r[0] == 450.0 and r[1] == pytest.approx(100 * 338.82 / 450)


def test_low_busbw_finding(tmp_path):
    """The GCP file's header and device list (lines 1-23) with all 16 ranks on node01 and one
    hand-written result row: busbw 100.00 GB/s = 22% of H100 NVLink's 450 GB/s, below the 50% bar."""
    lines = (
        (NCCL / "ncclTests-gcp-a3mega-h100-16rank-allreduce.txt")
        .read_text()
        .replace("node02", "node01")
        .splitlines()[:23]
    )
    lines.append(
        "  8589934592    2147483648     float     sum      -1   161061   53.33  100.00      0"
        "   161061   53.33  100.00      0"
    )
    p = tmp_path / "j" / "slow.txt"
    p.parent.mkdir()
    p.write_text("\n".join(lines) + "\n")
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([p], lake, run="slow")[0].status == "ok"
    con = connect(lake)
    assert con.execute(
        "SELECT DISTINCT n_nodes, peak_busbw_gbps, link_peak_gbps FROM nccl_tests_bandwidth"
    ).fetchall() == [(1, 100.0, 450.0)]
    (fd,) = [f for f in findings(con, "slow") if f["source"] == "nccl_tests"]
    assert fd["title"] == "nccl-tests bus bandwidth far below the link peak"
    assert fd["evidence"][0].startswith(
        "all_reduce_perf (in_place): best busbw 100.0 GB/s at 8589934592 B = 22% of 450 GB/s"
    )


def test_join_log_to_trace(tmp_path):
    """Hand-written run: rank 0's Kineto trace (pid 4242, one NCCL all-reduce kernel) and the NCCL
    log of the same process (node01:4242: Init COMPLETE with commId 0xfeed, channels over
    NET/IB/0/GDRDMA and P2P/CUMEM). The trace's collective gets the log's communicator and transports."""
    job = tmp_path / "job"
    write_trace(
        job / "rank0.json",
        [
            X("cuda_runtime", "cudaLaunchKernel", 90, 2, pid=4242, tid=4242, correlation=1),
            X(
                "kernel",
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                100,
                50,
                pid=0,
                tid=7,
                device=0,
                stream=7,
                correlation=1,
            ),
        ],
        distributedInfo={"rank": 0, "world_size": 2},
    )
    (job / "nccl_rank0.log").write_text(
        "node01:4242:4250 [0] NCCL INFO ncclCommInitRank comm 0x55 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
        "busId 7000 commId 0xfeed - Init COMPLETE\n"
        "node01:4242:4260 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/IB/0/GDRDMA\n"
        "node01:4242:4260 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM\n"
    )
    lake = Lake(tmp_path / "lake")
    assert sorted(r.status for r in ingest_paths([job], lake)) == ["ok", "ok"]
    con = connect(lake)
    assert con.execute("SELECT rank, nccl_host, nccl_pid, matched_by FROM rank_nccl").fetchall() == [
        (0, "node01", 4242, "host_pid")
    ]
    row = con.execute(
        "SELECT op, comm_id, transport, net_name, nccl_matched_by FROM collectives_nccl"
    ).fetchall()
    assert row == [("all_reduce", "0xfeed", "NET/IB/GDRDMA, P2P/CUMEM", "IB", "host_pid")]
