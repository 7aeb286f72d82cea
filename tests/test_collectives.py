"""Cross-rank matching by sequence number (hand-built traces, hand-computed answers).

Rank 0 records two calls of process group "1": Seq 7 all_reduce [100, 150) µs and Seq 8
all_gather [300, 340). Rank 1's profiler started late: it has only Seq 8 at [310, 340).
Matching by Seq (not by order) pairs rank 1's call with rank 0's Seq 8:
  Seq 8: transfer = min(40, 30) = 30 µs; wait rank 0 = 10 µs, rank 1 = 0; straggler = rank 1
         (started at 310 > 300); S = Out msg nelems 1000 x BFloat16 2 B = 2000 B;
         algbw = 2000 B / 30000 ns = 0.0667 GB/s; busbw = algbw x (n-1)/n = 0.0333 GB/s (n = 2).
  Seq 7: seen on rank 0 only -> complete = false, no straggler.
"""

import pytest
from conftest import X, write_trace

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run


def coll(name, ts, dur, corr, seq, cname, nelems_in, nelems_out):
    return X(
        "kernel",
        name,
        ts,
        dur,
        pid=0,
        tid=30,
        device=0,
        stream=30,
        correlation=corr,
        **{
            "Collective name": cname,
            "In msg nelems": nelems_in,
            "Out msg nelems": nelems_out,
            "Group size": 2,
            "dtype": "BFloat16",
            "Process Group Name": "1",
            "Process Group Ranks": "[0, 1]",
            "Seq": seq,
        },
    )


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    d = tmp_path_factory.mktemp("seq")
    write_trace(
        d / "job" / "r0.json",
        [
            X("cuda_runtime", "cudaLaunchKernel", 90, 2, correlation=1),
            X("cuda_runtime", "cudaLaunchKernel", 290, 2, correlation=2),
            coll("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100, 50, 1, 7, "allreduce", 1000, 1000),
            coll("ncclDevKernel_AllGather_RING_LL", 300, 40, 2, 8, "_allgather_base", 500, 1000),
        ],
        distributedInfo={"rank": 0, "world_size": 2},
    )
    write_trace(
        d / "job" / "r1.json",
        [
            X("cuda_runtime", "cudaLaunchKernel", 300, 2, correlation=5),
            coll("ncclDevKernel_AllGather_RING_LL", 310, 30, 5, 8, "_allgather_base", 500, 1000),
        ],
        distributedInfo={"rank": 1, "world_size": 2},
    )
    lake = Lake(d / "lake")
    assert [r.status for r in ingest_paths([d / "job"], lake)] == ["ok", "ok"]
    return connect(lake)


def test_matching_uses_seq(con):
    m = {r["seq"]: r for r in run(con, "collective_matching").to_dicts()}
    s8 = m[8]
    assert (s8["op"], s8["msg_bytes"], s8["ranks_seen"], s8["complete"]) == ("all_gather", 2000, 2, True)
    assert s8["transfer_ns"] == 30_000 and s8["wait_ns"] == {0: 10_000, 1: 0} and s8["straggler_rank"] == 1
    assert s8["algbw_gbps"] == pytest.approx(2000 / 30_000) and s8["busbw_gbps"] == pytest.approx(
        2000 / 30_000 / 2
    )
    s7 = m[7]
    assert (s7["ranks_seen"], s7["complete"], s7["straggler_rank"]) == (1, False, None)


def test_busbw_factors_from_catalog():
    from pipeline import catalog

    ops = catalog.collectives()
    assert ops["all_reduce"]["factor"] == "2(n-1)/n"
    assert (
        ops["all_gather"]["factor"]
        == ops["reduce_scatter"]["factor"]
        == ops["all_to_all"]["factor"]
        == "(n-1)/n"
    )
    assert ops["broadcast"]["factor"] == ops["send"]["factor"] == "1"
    for raw, op in [
        ("allreduce", "all_reduce"),
        ("_allgather_base", "all_gather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("ncclDevKernel_AllToAll", "all_to_all"),
        ("SendRecv", "send_recv"),
        ("nonsense", "unknown"),
    ]:
        assert catalog.normalize_op(raw) == op


# ------------------------------------------------------------------ ties for last arrival
# Two ranks, process group "1" (Seq recorded), ProfilerStep#1 [0, 1000) and #2 [1000, 2000) µs on
# both; each kernel's launch lies in the step of its kernel:
#   Seq 1: rank 0 [100, 150), rank 1 [100, 140): both start at 100 -> a tie for last arrival, no
#          straggler; transfer = min(50, 40) = 40; waits rank 0 = 10, rank 1 = 0 (real, caused by
#          no single rank); arrival spread 0.
#   Seq 2: rank 0 [300, 340), rank 1 [310, 340): rank 1 starts last -> straggler 1; transfer 30;
#          waits rank 0 = 10, rank 1 = 0; spread 10.
#   Seq 3 (step 2): rank 0 [1100, 1120), rank 1 [1100, 1130): tie -> no straggler; transfer 20;
#          waits rank 0 = 0, rank 1 = 10.
# stragglers: step 1 -> one row, rank 1: times_last 1, calls 2 (the tied Seq 1 counts), caused
# wait 10 µs (rank 0's wait at Seq 2), complete_calls 1; step 2 -> no row (its only call is tied).
# (Before: a tie named the lowest rank, so rank 0 was the straggler of Seq 1 and Seq 3.)


def tie_coll(ts, dur, corr, seq):
    return coll("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", ts, dur, corr, seq, "allreduce", 1000, 1000)


@pytest.fixture(scope="module")
def tie_con(tmp_path_factory):
    d = tmp_path_factory.mktemp("tie")
    steps = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("user_annotation", "ProfilerStep#2", 1000, 1000),
    ]
    launch = lambda ts, corr: X("cuda_runtime", "cudaLaunchKernel", ts, 2, correlation=corr)  # noqa: E731
    write_trace(
        d / "job" / "r0.json",
        steps
        + [
            launch(90, 1),
            launch(290, 2),
            launch(1090, 3),
            tie_coll(100, 50, 1, 1),
            tie_coll(300, 40, 2, 2),
            tie_coll(1100, 20, 3, 3),
        ],
        distributedInfo={"rank": 0, "world_size": 2},
    )
    write_trace(
        d / "job" / "r1.json",
        steps
        + [
            launch(95, 11),
            launch(305, 12),
            launch(1095, 13),
            tie_coll(100, 40, 11, 1),
            tie_coll(310, 30, 12, 2),
            tie_coll(1100, 30, 13, 3),
        ],
        distributedInfo={"rank": 1, "world_size": 2},
    )
    lake = Lake(d / "lake")
    assert [r.status for r in ingest_paths([d / "job"], lake)] == ["ok", "ok"]
    return connect(lake)


def test_a_tie_for_last_arrival_names_no_straggler(tie_con):
    m = {r["seq"]: r for r in run(tie_con, "collective_matching").to_dicts()}
    got = {
        s: (
            r["step"],
            r["ranks_seen"],
            r["complete"],
            r["transfer_ns"],
            r["arrival_spread_ns"],
            r["wait_ns"],
            r["straggler_rank"],
        )
        for s, r in m.items()
    }
    assert got == {
        1: (1, 2, True, 40_000, 0, {0: 10_000, 1: 0}, None),
        2: (1, 2, True, 30_000, 10_000, {0: 10_000, 1: 0}, 1),
        3: (2, 2, True, 20_000, 0, {0: 0, 1: 10_000}, None),
    }


def test_stragglers_charge_no_rank_with_a_tied_call(tie_con):
    rows = run(tie_con, "stragglers").to_dicts()
    assert [
        (
            r["step"],
            r["straggler_rank"],
            r["times_last"],
            r["calls"],
            r["caused_wait_ns"],
            r["complete_calls"],
        )
        for r in rows
    ] == [(1, 1, 1, 2, 10_000, 1)]
