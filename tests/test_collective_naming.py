"""Collectives named by what they are: a kernel's op and message size come from the trace's own
host records (its Collective name args; the record_param_comms with its External id; the
nccl:<op> / record_param_comms / c10d:: ops around the runtime event that launched it), the
kernel name only last (pipeline/ingest/kineto/comm.py).

Hand-built 4-rank job (times in µs; world_size 4 from distributedInfo, no process group named),
on every rank r, host thread pid 10 / tid 10:
  c10d::alltoall_base_ [100, 180)  Input Dims [[6144], [6144], ...] (output, input) float
    record_param_comms [104, 179)  Input Dims [[6144], [], ...] float (no Collective name: old trace)
      nccl:all_to_all  [110, 170)  Input Dims [[6144]] float
        nccl:broadcast [112, 118)  [[10]] long int: a decoy that ends before the launch
        cudaLaunchKernel at 130, correlation 1
  -> ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t [200, 200 + 100 + 10 r), "External id" 1 (its
     own correlation, as in PARAM's dlrm_kineto): all_to_all, S = 6144 x 4 B = 24,576 B
     (nccl-tests: alltoall S = count x typesize x n = the whole input buffer).
  c10d::allreduce_ [300, 380) TensorList; record_param_comms [304, 374) TensorList;
      nccl:all_reduce [310, 360) Input Dims [[1000000]] float; cudaLaunchKernel at 320, corr 2
  -> ncclKernel_AllReduce_RING_LL_Sum_float [400, 400 + 200 + 20 r): all_reduce, S = 4,000,000 B.
  tid 11: nccl:all_gather [300, 500) [[5]] float (another thread: not around the tid-10 launch).
Matched over the 4 ranks (nccl-tests doc/PERFORMANCE.md: algbw = S / t; busbw = algbw x (n-1)/n
for alltoall, x 2(n-1)/n for allreduce; n = the world size 4 for an unnamed group):
  all_to_all: t = min(100, 110, 120, 130) = 100 µs; algbw = 24576 / 100000 ns = 0.24576 GB/s;
              busbw = 0.24576 x 3/4 = 0.18432 GB/s
  all_reduce: t = 200 µs; algbw = 4e6 / 200000 = 20 GB/s; busbw = 20 x 6/4 = 30 GB/s
"""

from __future__ import annotations

import json
import math
import random

import pytest
from conftest import X, corpus, write_trace

from pipeline import catalog
from pipeline.ingest import ingest_paths, kineto
from pipeline.ingest.kineto import comm as kineto_comm
from pipeline.lake import Lake
from pipeline.query import connect, run

US = 1000
DLRM = ("param", "et_replay", "tests", "inputs", "dlrm_kineto")
A2A = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def host(cat, name, ts, dur, dims, types, tid=10):
    return X(cat, name, ts, dur, pid=10, tid=tid, **{"Input Dims": dims, "Input type": types})


def launch(ts, corr, tid=10):
    return X("cuda_runtime", "cudaLaunchKernel", ts, 5, pid=10, tid=tid, correlation=corr)


def kernel(name, ts, dur, corr, **args):
    return X("kernel", name, ts, dur, pid=0, tid=20, device=0, stream=20, correlation=corr, **args)


def rank_events(r: int) -> list[dict]:
    return [
        host(
            "cpu_op",
            "c10d::alltoall_base_",
            100,
            80,
            [[6144], [6144], [], [], [], []],
            ["float", "float", "", "", "", "Scalar"],
        ),
        host(
            "cpu_op",
            "record_param_comms",
            104,
            75,
            [[6144], [], [], [], [], [], []],
            ["float", "Scalar", "Scalar", "Scalar", "", "", ""],
        ),
        host("user_annotation", "nccl:all_to_all", 110, 60, [[6144]], ["float"]),
        host("user_annotation", "nccl:broadcast", 112, 6, [[10]], ["long int"]),
        launch(130, 1),
        kernel(A2A, 200, 100 + 10 * r, 1, **{"External id": 1}),
        host("cpu_op", "c10d::allreduce_", 300, 80, [[], [], [], []], ["TensorList", "", "", "Scalar"]),
        host(
            "cpu_op",
            "record_param_comms",
            304,
            70,
            [[], [], [], [], [], [], []],
            ["TensorList", "Scalar", "Scalar", "Scalar", "", "", ""],
        ),
        host("user_annotation", "nccl:all_reduce", 310, 50, [[1000000]], ["float"]),
        host("user_annotation", "nccl:all_gather", 300, 200, [[5]], ["float"], tid=11),
        launch(320, 2),
        kernel(AR, 400, 200 + 20 * r, 2, **{"External id": 2}),
    ]


@pytest.fixture(scope="module")
def hand_con(tmp_path_factory):
    d = tmp_path_factory.mktemp("naming")
    for r in range(4):
        write_trace(
            d / "job" / f"r{r}.json",
            rank_events(r),
            distributedInfo={"backend": "nccl", "rank": r, "world_size": 4},
        )
    lake = Lake(d / "lake")
    assert [x.status for x in ingest_paths([d / "job"], lake)] == ["ok"] * 4
    return connect(lake)


def test_hand_built_ops_and_sizes_from_the_records_around_the_launch(hand_con):
    rows = hand_con.execute(
        "SELECT rank, correlation, op, op_raw, in_nelems, out_nelems, dtype, msg_bytes, msg_bytes_note, "
        "group_size "
        "FROM collectives ORDER BY rank, start_ns"
    ).fetchall()
    assert len(rows) == 8
    for r in range(4):
        a2a, ar = [x[1:] for x in rows if x[0] == r]
        # out_nelems 6144: c10d::alltoall_base_'s first Input Dims entry (its output)
        assert a2a == (1, "all_to_all", "nccl:all_to_all", 6144, 6144, "float", 6144 * 4, None, None)
        assert ar == (2, "all_reduce", "nccl:all_reduce", 1_000_000, None, "float", 4_000_000, None, None)


def test_hand_built_busbw_by_hand(hand_con):
    m = {x["op"]: x for x in run(hand_con, "collective_matching").to_dicts()}
    a2a, ar = m["all_to_all"], m["all_reduce"]
    assert (a2a["msg_bytes"], a2a["expected_ranks"], a2a["ranks_seen"], a2a["complete"]) == (
        24576,
        4,
        4,
        True,
    )
    assert a2a["transfer_ns"] == 100 * US
    assert a2a["algbw_gbps"] == pytest.approx(0.24576) and a2a["busbw_gbps"] == pytest.approx(0.18432)
    assert (ar["msg_bytes"], ar["transfer_ns"], ar["complete"]) == (4_000_000, 200 * US, True)
    assert ar["algbw_gbps"] == pytest.approx(20.0) and ar["busbw_gbps"] == pytest.approx(30.0)


def _parse(events, **top):
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    return kineto.parse(json.dumps(doc).encode()).collectives.sort("start_ns").to_dicts()


def test_precedence_own_args_then_external_id_then_launch_then_kernel_name():
    # k1: its own Collective name args (allreduce 100 Float) win over the nccl:all_to_all around its launch;
    # k2: the record_param_comms with its External id 7 (broadcast 10 Long) wins over the nccl:all_reduce
    # around the launch;
    # k3: only the launch: nccl:send "0->1" names it send (a SendRecv kernel), [[256]] c10::BFloat16 -> 512 B;
    # k4: nccl:recv "0<-1" -> recv; k5: no host record around the launch -> the kernel name (send_recv, no
    # size);
    # k6: nccl:all_reduce_coalesced over [[4], [6]] float -> all_reduce of (4 + 6) x 4 B = 40 B.
    own = {
        "Collective name": "allreduce",
        "In msg nelems": 100,
        "Out msg nelems": 100,
        "dtype": "Float",
        "Group size": 2,
    }
    rpc = {
        "External id": 7,
        "Collective name": "broadcast",
        "In msg nelems": 10,
        "Out msg nelems": 10,
        "dtype": "Long",
        "Group size": 2,
    }
    rows = _parse(
        [
            host("user_annotation", "nccl:all_to_all", 100, 50, [[6144]], ["float"]),
            launch(110, 1),
            kernel(A2A, 1000, 10, 1, **own),
            X("cpu_op", "record_param_comms", 200, 50, pid=10, tid=10, **rpc),
            host("user_annotation", "nccl:all_reduce", 210, 30, [[64]], ["float"]),
            launch(220, 2),
            kernel(AR, 1100, 10, 2, **{"External id": 7}),
            host("user_annotation", "nccl:send 0->1", 300, 30, [[256]], ["c10::BFloat16"]),
            launch(310, 3),
            kernel(A2A, 1200, 10, 3),
            host("user_annotation", "nccl:recv 0<-1", 400, 30, [[256]], ["c10::BFloat16"]),
            launch(410, 4),
            kernel(A2A, 1300, 10, 4),
            launch(510, 5),
            kernel(A2A, 1400, 10, 5),
            host("user_annotation", "nccl:all_reduce_coalesced", 600, 30, [[4], [6]], ["float", "float"]),
            launch(610, 6),
            kernel(AR, 1500, 10, 6),
        ],
        distributedInfo={"rank": 0, "world_size": 2},
    )
    got = [(r["op"], r["msg_bytes"]) for r in rows]
    assert got == [
        ("all_reduce", 400),
        ("broadcast", 80),
        ("send", 512),
        ("recv", 512),
        ("send_recv", None),
        ("all_reduce", 40),
    ]
    assert rows[2]["op_raw"] == "nccl:send" and rows[2]["dtype"] == "c10::BFloat16"


def test_missing_sizes_name_the_missing_records():
    rows = _parse(
        [
            # k1: nccl:all_reduce and record_param_comms around the launch, neither with Input Dims (HTA
            # df_index_resolver)
            X("cpu_op", "record_param_comms", 100, 50, pid=10, tid=10),
            X("user_annotation", "nccl:all_reduce", 105, 40, pid=10, tid=10),
            launch(110, 1),
            kernel(AR, 1000, 10, 1),
            # k2: a launch with no comm host op around it
            launch(210, 2),
            kernel(A2A, 1100, 10, 2),
            # k3: no launch event with its correlation
            kernel(A2A, 1200, 10, 3),
            # k4: an element type no catalog knows
            host("user_annotation", "nccl:all_to_all", 300, 30, [[64]], ["c10::Float3_made_up"]),
            launch(310, 4),
            kernel(A2A, 1300, 10, 4),
            # k5: all_gather is sized by its output, and nccl:_all_gather_base records only the input (no c10d
            # op here)
            host("user_annotation", "nccl:_all_gather_base", 400, 30, [[16]], ["float"]),
            launch(410, 5),
            kernel(A2A, 1400, 10, 5),
            # k6: a coalesced call over tensors of two element types: no one element size
            host("user_annotation", "nccl:all_reduce_coalesced", 500, 30, [[4], [4]], ["float", "c10::Half"]),
            launch(510, 6),
            kernel(AR, 1500, 10, 6),
        ]
    )
    notes = [(r["op"], r["msg_bytes"], r["msg_bytes_note"]) for r in rows]
    assert notes == [
        ("all_reduce", None, "nccl:all_reduce / record_param_comms around the launch have no Input Dims"),
        (
            "send_recv",
            None,
            "no collective metadata: no Collective name args, no record_param_comms / nccl: op around the "
            "launch (kernel name only)",
        ),
        (
            "send_recv",
            None,
            "no collective metadata: no Collective name args, no launch event for the kernel (kernel name "
            "only)",
        ),
        ("all_to_all", None, "element type 'c10::Float3_made_up' unknown"),
        (
            "all_gather",
            None,
            "all_gather is sized by its output; nccl:_all_gather_base around the launch has only the input",
        ),
        (
            "all_reduce",
            None,
            "nccl:all_reduce_coalesced around the launch: input tensors of different element types",
        ),
    ]
    assert not any("kernel name only" in n for _, _, n in notes[3:] + notes[:1])  # size records exist there


def test_pytorch_spellings_in_the_catalogs():
    # ProcessGroupNCCL titles and c10d / functional op names (collectives.toml aliases)
    for raw, op in [
        ("all_gather_into_tensor_coalesced", "all_gather"),
        ("all_to_all_single", "all_to_all"),
        ("_broadcast_oop", "broadcast"),
        ("_reduce_oop", "reduce"),
        ("alltoall_base", "all_to_all"),
        ("_all_gather_base", "all_gather"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("all_reduce_coalesced", "all_reduce"),
    ]:
        assert catalog.normalize_op(raw) == op, raw
    # Kineto "Input type" names (caffe2 TypeMeta: the C++ type as the compiler spells it) -> sizeof
    for t, n in [
        ("float", 4),
        ("double", 8),
        ("c10::Half", 2),
        ("c10::BFloat16", 2),
        ("long int", 8),
        ("int", 4),
        ("short int", 2),
        ("signed char", 1),
        ("unsigned char", 1),
        ("bool", 1),
        ("c10::complex<float>", 8),
    ]:
        assert catalog.dtype_bytes(t) == n, t


def test_launch_chains_match_a_brute_force_scan():
    rng = random.Random(14)
    hosts, launches, ei = [], [], 0
    for tid in (1, 2):
        t = 0
        for _ in range(60):  # properly nested ranges: a few levels under each top-level one
            t += rng.randint(1, 20)
            start, depth, end = t, rng.randint(1, 3), t + rng.randint(30, 90)
            for d in range(depth):
                hosts.append(
                    {
                        "event_index": ei,
                        "pid": 1,
                        "tid": tid,
                        "start_ns": start + 2 * d,
                        "end_ns": end - 2 * d,
                    }
                )
                ei += 1
            t = end
    for c in range(400):
        launches.append(
            {
                "correlation": c,
                "pid": 1,
                "tid": rng.choice((1, 2, 3)),
                "start_ns": rng.randint(0, max(h["end_ns"] for h in hosts)),
            }
        )
    import polars as pl

    got = kineto_comm.launch_chains(pl.DataFrame(launches), pl.DataFrame(hosts))
    for ln in launches:
        inside = [
            h for h in hosts if h["tid"] == ln["tid"] and h["start_ns"] <= ln["start_ns"] <= h["end_ns"]
        ]
        want = [
            h["event_index"] for h in sorted(inside, key=lambda h: -h["start_ns"])
        ]  # innermost = latest start
        assert got[ln["correlation"]] == want


# ---------------------------------------------------------------- PARAM's 8-rank DLRM run


def _dlrm_reference(path) -> list[tuple[int, str, int, int]]:
    """(kernel ts µs, op, msg bytes, dur µs) of each NCCL kernel, read from the raw events with a
    plain scan: its cudaLaunchKernel (same correlation), the nccl:<op> user_annotation on the
    launch's tid whose [ts, ts + dur] holds the launch, S = prod(Input Dims[0]) x sizeof(Input type[0])."""
    sizeof = {"float": 4, "int": 4, "long int": 8}  # C++ sizes of the element types these files use
    ev = json.loads(path.read_bytes())["traceEvents"]
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    ann = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    out = []
    for k in sorted(
        (e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")), key=lambda e: e["ts"]
    ):
        ln = launch[k["args"]["correlation"]]
        (a,) = [a for a in ann if a["tid"] == ln["tid"] and a["ts"] <= ln["ts"] <= a["ts"] + a["dur"]]
        out.append(
            (
                k["ts"],
                a["name"][len("nccl:") :],
                math.prod(a["args"]["Input Dims"][0]) * sizeof[a["args"]["Input type"][0]],
                k["dur"],
            )
        )
    return out


@pytest.fixture(scope="module")
def dlrm_con(tmp_path_factory):
    lake = Lake(tmp_path_factory.mktemp("dlrm") / "lake")
    res = ingest_paths([corpus(*DLRM)], lake, run="dlrm")
    assert [r.status for r in res] == ["ok"] * 8
    return connect(lake)


def test_dlrm_worker0_by_hand(dlrm_con):
    # worker0_step_12.1694128201545.pt.trace.json, each NCCL kernel (ts µs) <- the nccl: annotation around its
    # cudaLaunchKernel (tid 59811 forward, 59976 backward): name, ts, Input Dims, Input type -> S
    #  1694128201429795 SendRecv <- nccl:all_to_all 1694128201429757 [[6144]] float     -> 24,576
    #  1694128201433686 SendRecv <- nccl:all_to_all 1694128201433653 [[24]] long int    -> 192
    #  1694128201434943 SendRecv <- nccl:all_to_all 1694128201434908 [[384]] int        -> 1,536
    #  1694128201435120 SendRecv <- nccl:all_to_all 1694128201435041 [[3392]] int       -> 13,568
    #     (c10d::alltoall_base_ 1694128201435026: Input Dims [[768], [3392], ...] = output 768, input 3392)
    #  1694128201436304 AllReduce <- nccl:all_reduce 1694128201436271 [[394241]] float  -> 1,576,964
    #  1694128201437789 SendRecv <- nccl:all_to_all 1694128201437756 [[6144]] float     -> 24,576
    #  1694128201438305 AllReduce <- nccl:all_reduce 1694128201438257 [[112]] float     -> 448
    #  1694128201439384 AllReduce <- nccl:all_reduce 1694128201439358 [[226960]] float  -> 907,840
    rows = dlrm_con.execute(
        "SELECT start_ns, op, msg_bytes, in_nelems, out_nelems, dtype, msg_bytes_note FROM collectives "
        "WHERE rank = 0 ORDER BY start_ns"
    ).fetchall()
    assert [(s // US, op, mb) for s, op, mb, *_ in rows] == [
        (1694128201429795, "all_to_all", 24576),
        (1694128201433686, "all_to_all", 192),
        (1694128201434943, "all_to_all", 1536),
        (1694128201435120, "all_to_all", 13568),
        (1694128201436304, "all_reduce", 1576964),
        (1694128201437789, "all_to_all", 24576),
        (1694128201438305, "all_reduce", 448),
        (1694128201439384, "all_reduce", 907840),
    ]
    assert rows[3][3:6] == (3392, 768, "int") and rows[1][5] == "long int"
    assert all(r[6] is None for r in rows)


def test_dlrm_every_rank_matches_the_raw_events(dlrm_con):
    files = sorted(corpus(*DLRM).glob("worker*.json"))
    for f in files:
        rank = int(f.name[len("worker")])
        got = dlrm_con.execute(
            "SELECT start_ns // 1000, op, msg_bytes, dur_ns // 1000 FROM collectives WHERE rank = ? ORDER "
            "BY start_ns",
            [rank],
        ).fetchall()
        assert [tuple(g) for g in got] == _dlrm_reference(f), f.name


def test_dlrm_matched_calls_use_the_all_to_all_factor(dlrm_con):
    refs = [_dlrm_reference(f) for f in sorted(corpus(*DLRM).glob("worker*.json"))]
    calls = run(dlrm_con, "collective_matching").sort("call_key").to_dicts()
    assert [c["op"] for c in calls] == [op for _, op, _, _ in refs[0]]
    assert sum(c["op"] == "all_to_all" for c in calls) == 5
    for i, c in enumerate(calls):
        transfer_us = min(ref[i][3] for ref in refs)  # the shortest of the 8 ranks' kernel durations
        n = 8  # world_size in distributedInfo; the trace names no process group
        factor = (n - 1) / n if c["op"] == "all_to_all" else 2 * (n - 1) / n
        assert (c["msg_bytes"], c["expected_ranks"], c["ranks_seen"], c["complete"]) == (
            refs[0][i][2],
            8,
            8,
            True,
        )
        assert c["transfer_ns"] == transfer_us * US
        assert c["busbw_gbps"] == pytest.approx(c["msg_bytes"] / (transfer_us * US) * factor)


def test_all_gather_group_size_from_its_shapes(tmp_path):
    """HTA's trace_filter sampled_rank-0 (also sample_traces/): c10d::_allgather_base_ at ts
    1682725898522854 has Input Dims [[1073741824], [16777216], []] (output, input) "signed char",
    inside it nccl:_all_gather_base [[16777216]]. No record states the group; all_gather's output
    is its input times the group size: 1073741824 / 16777216 = 64 ranks (not the world's 128),
    and S = the output, 1,073,741,824 B."""
    lk = Lake(tmp_path / "lake")
    ingest_paths([corpus("hta", "tests", "data", "trace_filter", "sampled_rank-0.json.gz")], lk)
    ag = run(connect(lk), "collective_bandwidth").filter(op="all_gather").to_dicts()
    assert ag and all((c["group_size"], c["msg_bytes"]) == (64, 1073741824) for c in ag)


def test_wait_is_not_a_collective(tmp_path):
    """A CPU-only (gloo) trace: record_param_comms ops get one collectives row each when they name
    a collective, but a Work's wait() and a communicator's init record themselves the same way
    ("wait" / "init" with 0 elements: ProcessGroupNCCL::WorkNCCL::wait) and are not collective
    calls (issue 39 item 10: "collective bandwidth not available for 10 of 45 calls" counted the
    waits). Here: 3 all-reduces (4,000 B each) and 3 waits, 1 init: 3 rows, every one sized."""
    from conftest import X, write_trace

    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake
    from pipeline.query import connect

    def rpc(name, ts, n):
        args = {
            "Collective name": name,
            "In msg nelems": n,
            "Out msg nelems": n,
            "Group size": 1,
            "dtype": "Float",
        }
        return X("cpu_op", "record_param_comms", ts, 10, pid=1, tid=1, **{"External id": ts, **args})

    ev = [rpc("init", 0, 0)]
    for k in range(3):
        ev += [rpc("allreduce", 100 + 100 * k, 1000), rpc("wait", 150 + 100 * k, 0)]
    write_trace(
        tmp_path / "t" / "cpu.json", ev, distributedInfo={"backend": "gloo", "rank": 0, "world_size": 1}
    )
    lk = Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([tmp_path / "t"], lk)] == ["ok"]
    rows = connect(lk).execute("SELECT op, msg_bytes FROM collectives ORDER BY start_ns").fetchall()
    assert rows == [("all_reduce", 4000)] * 3
