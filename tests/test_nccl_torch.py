"""PyTorch: ProcessGroupNCCL watchdog messages (three generations of wording), Flight Recorder dumps
(pickle through the allow-list unpickler, JSON, the tutorial's unpickled repr) and torchfrtrace."""

from __future__ import annotations

import collections
import json
import os
import pickle
from functools import lru_cache

import pytest
from conftest import corpus

from pipeline.ingest import nccl
from pipeline.ingest.kineto import TraceError


@lru_cache(maxsize=None)
def parsed(name: str):
    return nccl.parse(corpus("nccl", name).read_bytes(), name)


def wd(p, line_no: int) -> dict:
    (r,) = [r for r in p.tables["nccl_watchdog"].to_dicts() if r["line_no"] == line_no]
    return r


# --- watchdog -------------------------------------------------------------------------------------------


def test_watchdog_pytorch_2_5_wording():
    p = parsed("basicsr-issue-737-torch-watchdog-timeout-allreduce.log")
    assert p.format == "torch_watchdog"
    # line 1: "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught
    #          collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523,
    #          NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out."
    r = wd(p, 1)
    assert (r["kind"], r["rank"], r["seq"], r["op_type"], r["numel_in"], r["numel_out"]) == (
        "timeout",
        1,
        808,
        "ALLREDUCE",
        9801523,
        9801523,
    )
    assert (r["timeout_ns"], r["ran_for_ns"], r["level"], r["log_time"], r["src_file"], r["src_line"]) == (
        600_000_000_000,
        600_020_000_000,
        "E",
        "06-26 06:24:44.903881913",
        "ProcessGroupNCCL.cpp",
        616,
    )
    # line 2: "[rank1]:[E626 ... ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception
    #          (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811,
    #          last completed NCCL work: 807."
    r = wd(p, 2)
    assert (
        r["kind"],
        r["rank"],
        r["pg_id"],
        r["pg_name"],
        r["pg_desc"],
        r["seq"],
        r["last_enqueued"],
        r["last_completed"],
    ) == ("exception_detected", 1, 0, "0", "default_pg", 808, 811, 807)
    # line 5: "[rank2]:... [Rank 2] ... ran for 600061 milliseconds ..."
    assert (wd(p, 5)["rank"], wd(p, 5)["ran_for_ns"]) == (2, 600_061_000_000)


def test_watchdog_pytorch_2_4_wording():
    p = parsed("llamafactory-issue-6269-torch-watchdog-timeout-reduce-scatter-base.log")
    # line 1: "... WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672,
    #          Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
    r = wd(p, 1)
    assert (r["seq"], r["op_type"], r["numel_in"], r["numel_out"], r["log_time"]) == (
        7753,
        "_REDUCE_SCATTER_BASE",
        544997376,
        68124672,
        "12-06 18:44:12.715298746",
    )
    # line 4: "[rank4]:[E1206 ...:1664] [PG 1 Rank 4] Exception ... at work: 7753,
    #          last enqueued NCCL work: 7755, last completed NCCL work: 7752."
    r = wd(p, 4)
    assert (r["rank"], r["pg_id"], r["pg_name"], r["seq"], r["last_enqueued"], r["last_completed"]) == (
        4,
        1,
        None,
        7753,
        7755,
        7752,
    )
    assert wd(p, 5)["rank"] == 3 and wd(p, 5)["ran_for_ns"] == 600_089_000_000


def test_watchdog_legacy_wording():
    p = parsed("ofa-issue-271-torch-watchdog-timeout-legacy-format.log")
    # line 1: "[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout:
    #          WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds
    #          before timing out."
    r = wd(p, 1)
    assert (
        r["rank"],
        r["seq"],
        r["op_type"],
        r["numel_in"],
        r["timeout_ns"],
        r["ran_for_ns"],
        r["log_time"],
    ) == (1, 469508, "ALLREDUCE", None, 1_800_000_000_000, 1_802_212_000_000, None)
    # lines 1-5: ranks 1, 3, 2, 6, 7
    assert [wd(p, n)["rank"] for n in range(1, 6)] == [1, 3, 2, 6, 7]
    assert wd(p, 5)["ran_for_ns"] == 1_802_220_000_000


def test_processgroupnccl_init_options_and_environment():
    p = parsed("nccl-issue-1657-torch-processgroupnccl-init-env-and-nccl-bootstrap.log")
    # line 1: "[I323 21:57:01.972579519 ProcessGroupNCCL.cpp:968] [PG ID 0 PG GUID 0 Rank 0] ProcessGroupNCCL
    #          initialization options: size: 2, global rank: 0, TIMEOUT(ms): 600000, ..."
    r = wd(p, 1)
    assert (r["kind"], r["group_size"], r["rank"], r["timeout_ns"], r["pg_id"], r["pg_name"], r["level"]) == (
        "init_options",
        2,
        0,
        600_000_000_000,
        0,
        "0",
        "I",
    )
    assert json.loads(r["detail"])["SPLIT_COLOR"] == "-2"
    # line 2: "... ProcessGroupNCCL environments: NCCL version: 2.21.5, ...,
    #          TORCH_NCCL_TRACE_BUFFER_SIZE: 2000, ..."
    r = wd(p, 2)
    assert (r["kind"], r["nccl_version"]) == ("environments", "2.21.5")
    assert json.loads(r["detail"])["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    # line 3: "[rank0]:[I323 ...:1091] [PG ID 0 PG GUID 0(default_pg) Rank 0] Using non-blocking mode: 0"
    r = wd(p, 3)
    assert (r["kind"], r["pg_desc"], r["message"]) == ("info", "default_pg", "Using non-blocking mode: 0")


def test_watchdog_newer_and_error_wordings():
    log = (
        "[rank3]:[E1206 18:44:12.715 ProcessGroupNCCL.cpp:1500] [PG ID 1 PG GUID 1(dp) Rank 3] "
        "failure detected by "
        "watchdog at work sequence id: 42 PG status: last enqueued work: 44, last completed work: 41\n"
        "[rank3]:[E1206 18:44:13.000 ProcessGroupNCCL.cpp:1600] [PG ID 0 PG GUID 0(default_pg) Rank 3] "
        "Heartbeat "
        "monitor timed out! Process will be terminated after dumping debug info. workMetaList_.size()=2\n"
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
        "unhandled system error, "
        "NCCL version 2.14.3\n"
    )
    p = nccl.parse(log.encode(), "x.log")
    assert p.format == "torch_watchdog"
    r = wd(p, 1)
    assert (r["kind"], r["seq"], r["last_enqueued"], r["last_completed"], r["pg_desc"]) == (
        "failure_detected",
        42,
        44,
        41,
        "dp",
    )
    assert wd(p, 2)["kind"] == "heartbeat_timeout"
    r = wd(p, 3)
    assert (r["kind"], r["nccl_version"], json.loads(r["detail"])["error"]) == (
        "nccl_error",
        "2.14.3",
        "unhandled system error",
    )
    assert p.tool_versions["nccl_version"] == "2.14.3"


# --- Flight Recorder --------------------------------------------------------------------------------------


def test_flight_recorder_tutorial_repr():
    p = parsed("pytorch-tutorial-flight-recorder-unpickled-dump-repr.txt")
    assert p.format == "flight_recorder" and p.tool_versions["flight_recorder_version"] == "2.5"
    (e,) = p.tables["flight_recorder"].to_dicts()
    # lines 36-53 of the file
    assert (
        e["record_id"],
        e["pg_id"],
        e["pg_name"],
        e["pg_desc"],
        e["collective_seq_id"],
        e["p2p_seq_id"],
        e["op_id"],
    ) == (0, 0, "0", "default_pg", 1, 0, 1)  # line 38: "process_group": ("0", "default_pg")
    assert (e["profiling_name"], e["op"], e["state"], e["is_p2p"], e["retired"]) == (
        "nccl:all_reduce",
        "all_reduce",
        "completed",
        False,
        True,
    )
    assert (e["time_created_ns"], e["time_discovered_started_ns"], e["time_discovered_completed_ns"]) == (
        1724779239936775119,
        None,
        1724779239975811724,
    )
    assert (e["timeout_ns"], e["input_dtypes"], e["output_dtypes"], e["input_numel"]) == (
        600_000_000_000,
        ["Float"],
        ["Float"],
        12,
    )
    assert json.loads(e["input_sizes"]) == [[3, 4]] and e["pg_ranks"] == [0, 1]  # line 7: "ranks": "[0, 1]"
    # lines 20-34: three frames
    assert e["frames"] == [
        "test_short_pickle at pytorch/test/distributed/test_c10d_nccl.py:3647",
        "spawn_main at .conda/envs/pytorch-3.10/lib/python3.10/multiprocessing/spawn.py:116",
        "<module> at <string>:1",
    ]
    (g,) = p.tables["flight_recorder_groups"].to_dicts()
    # lines 4-15: pg_config "0" and pg_status "0"
    assert (g["pg_id"], g["pg_name"], g["pg_desc"], g["ranks"], g["group_size"]) == (
        0,
        "0",
        "default_pg",
        [0, 1],
        2,
    )
    assert (g["last_enqueued_collective"], g["last_started_collective"], g["last_completed_collective"]) == (
        2,
        -1,
        2,
    )
    assert any("elisions dropped" in n for n in p.notes)  # line 55: "    ..."


FR_DUMP = {
    "version": "2.5",
    "pg_config": {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
        "1": {"name": "1", "desc": "tp", "ranks": "[2, 3]"},
    },
    "pg_status": {
        "0": {"last_enqueued_collective": 7, "last_started_collective": 7, "last_completed_collective": 6}
    },
    "entries": [
        {
            "record_id": 11,
            "pg_id": 0,
            "process_group": ("0", "default_pg"),
            "collective_seq_id": 7,
            "p2p_seq_id": 0,
            "op_id": 9,
            "profiling_name": "nccl:_reduce_scatter_base",
            "time_created_ns": 1724779239936775119,
            "duration_ms": 1.5,
            "input_sizes": [[8, 1024]],
            "input_dtypes": ["BFloat16"],
            "output_sizes": [[2, 1024]],
            "output_dtypes": ["BFloat16"],
            "state": "started",
            "time_discovered_started_ns": 1724779239936900000,
            "time_discovered_completed_ns": None,
            "retired": False,
            "timeout_ms": 600000,
            "is_p2p": False,
            "frames": [
                {
                    "name": "reduce_scatter_tensor",
                    "filename": "torch/distributed/distributed_c10d.py",
                    "line": 4000,
                }
            ],
        },
        {
            "record_id": 12,
            "pg_id": 1,
            "process_group": ("1", "tp"),
            "collective_seq_id": 0,
            "p2p_seq_id": 3,
            "op_id": 10,
            "profiling_name": "nccl:send 2->3",
            "time_created_ns": 1724779239937000000,
            "input_sizes": [[16]],
            "input_dtypes": ["Float"],
            "output_sizes": [[16]],
            "output_dtypes": ["Float"],
            "state": "scheduled",
            "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None,
            "retired": False,
            "timeout_ms": 600000,
            "is_p2p": True,
            "frames": [],
        },
    ],
}


def test_flight_recorder_pickle_through_allow_list():
    data = pickle.dumps(FR_DUMP, protocol=2)
    assert nccl.sniff(data[:64], "nccl_trace_rank_2") == "flight_recorder"
    p = nccl.parse(data, "nccl_trace_rank_2")
    a, b = sorted(p.tables["flight_recorder"].to_dicts(), key=lambda r: r["record_id"])
    assert (a["rank"], a["pg_name"], a["pg_desc"], a["pg_ranks"], a["collective_seq_id"], a["op"]) == (
        2,
        "0",
        "default_pg",
        [0, 1, 2, 3],
        7,
        "_reduce_scatter_base",
    )
    assert (
        a["duration_ns"],
        a["state"],
        a["time_discovered_started_ns"],
        a["input_numel"],
        a["output_numel"],
    ) == (1_500_000, "started", 1724779239936900000, 8192, 2048)
    assert a["frames"] == ["reduce_scatter_tensor at torch/distributed/distributed_c10d.py:4000"]
    assert (b["op"], b["is_p2p"], b["p2p_seq_id"], b["pg_ranks"], b["frames"]) == (
        "send",
        True,
        3,
        [2, 3],
        [],
    )
    groups = {g["pg_name"]: g for g in p.tables["flight_recorder_groups"].to_dicts()}
    assert (groups["0"]["pg_id"], groups["0"]["last_completed_collective"], groups["0"]["group_size"]) == (
        0,
        6,
        4,
    )
    assert (groups["1"]["pg_id"], groups["1"]["last_enqueued_collective"], groups["1"]["ranks"]) == (
        1,
        None,
        [2, 3],
    )
    assert p.world_size == 4
    # sets, frozensets and OrderedDicts (protocol 2 names them __builtin__.set, collections.OrderedDict)
    # are allowed
    extra = pickle.dumps(
        {**FR_DUMP, "x": {1, 2}, "y": frozenset({3}), "z": collections.OrderedDict(a=1)}, protocol=2
    )
    assert nccl.parse(extra, "nccl_trace_rank_2").tables["flight_recorder"].height == 2
    # typed int lists of torch's C++ pickler go through torch.jit._pickle.build_intlist (mapped to list)
    typed = (
        b"\x80\x02}q\x00X\x07\x00\x00\x00entriesq\x01]q\x02}q\x03X\x0b\x00\x00\x00input_sizesq\x04]q\x05"
        b"ctorch.jit._pickle\nbuild_intlist\nq\x06]q\x07(K\x03K\x04e\x85q\x08Rq\tasas."
    )
    (e,) = nccl.parse(typed, "trace_0").tables["flight_recorder"].to_dicts()
    assert (e["input_sizes"], e["input_numel"], e["rank"]) == ("[[3,4]]", 12, 0)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvalEvil:
    def __reduce__(self):
        return (eval, ("__import__('os').getpid()",))


def test_malicious_pickles_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    for obj, what in (
        ({"version": "2.5", "entries": [_Evil(marker)]}, "system"),
        ({"version": "2.5", "entries": [_EvalEvil()]}, "builtins.eval"),
        ({"version": "2.5", "entries": [{"frames": tmp_path}]}, "pathlib"),
    ):
        with pytest.raises(TraceError, match="unsafe pickle: refused to load") as exc:
            nccl.parse(pickle.dumps(obj, protocol=2), "nccl_trace_rank_0")
        assert what in str(exc.value) and "\n" not in str(exc.value)
    assert not marker.exists()


def test_truncated_and_corrupt_pickles():
    data = pickle.dumps(FR_DUMP, protocol=2)
    with pytest.raises(TraceError, match="^truncated pickle$"):
        nccl.parse(data[: len(data) // 2], "nccl_trace_rank_0")
    with pytest.raises(TraceError, match="corrupt pickle"):
        nccl.parse(b"\x80\x02\xff\xff\xff\xff", "nccl_trace_rank_0")
    with pytest.raises(TraceError, match="not a Flight Recorder dump"):
        nccl.parse(pickle.dumps([1, 2, 3], protocol=2), "nccl_trace_rank_0")


def test_flight_recorder_json_dump():
    # _dump_nccl_trace_json: pg_status values are strings, process_group an array, absent times 0
    dump = {
        "version": "2.10",
        "comm_lib_version": "2.26.2",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": "5",
                "last_started_collective": "5",
                "last_completed_collective": "4",
            }
        },
        "entries": [
            {
                "record_id": 4,
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "thread_id": "140000",
                "thread_name": "pt_main_thread",
                "collective_seq_id": 5,
                "p2p_seq_id": 0,
                "op_id": 5,
                "profiling_name": "nccl:all_reduce",
                "time_created_ns": 1724779239936775119,
                "input_sizes": [[3, 4]],
                "input_dtypes": ["Float"],
                "output_sizes": [[3, 4]],
                "output_dtypes": ["Float"],
                "state": "scheduled",
                "time_discovered_started_ns": 0,
                "time_discovered_completed_ns": 0,
                "retired": False,
                "timeout_ms": 600000,
                "is_p2p": False,
            }
        ],
    }
    data = json.dumps(dump).encode()
    assert nccl.sniff(data, "rank_1.json") == "flight_recorder"
    p = nccl.parse(data, "rank_1.json")
    (e,) = p.tables["flight_recorder"].to_dicts()
    assert (e["rank"], e["version"], e["time_discovered_started_ns"], e["time_discovered_completed_ns"]) == (
        1,
        "2.10",
        None,
        None,
    )
    assert (e["thread_id"], e["thread_name"], e["state"]) == ("140000", "pt_main_thread", "scheduled")
    (g,) = p.tables["flight_recorder_groups"].to_dicts()
    assert (g["last_enqueued_collective"], g["last_completed_collective"]) == (5, 4)
    assert p.tool_versions["nccl_version"] == "2.26.2"
    # truncated inside the first entry: one clear line
    with pytest.raises(TraceError, match="truncated JSON: no complete Flight Recorder entry"):
        nccl.parse(b'{"version": "2.5", "entries": [{"record_id": 0, "pg_id": 0', "rank_0.json")
    # truncated after the first entry: that entry is kept
    cut = json.dumps({**dump, "entries": dump["entries"] * 2})
    p = nccl.parse(cut[: cut.rindex('"record_id"')].encode(), "rank_0.json")
    assert p.tables["flight_recorder"].height == 1 and any("truncated" in n for n in p.notes)


# --- torchfrtrace ------------------------------------------------------------------------------------------


def test_torchfrtrace_report():
    p = parsed("pytorch-tutorial-torchfrtrace-output-missing-rank.txt")
    assert p.format == "torchfrtrace"
    (m,) = p.tables["flight_recorder_mismatches"].to_dicts()
    # line 2: "Not all ranks joining collective 5 at entry 4"
    assert (m["line_no"], m["message"], m["collective_seq_id"], m["record_id"]) == (
        2,
        "Not all ranks joining collective 5 at entry 4",
        5,
        4,
    )
    # lines 3-9: group info 0:default_pg, collective nccl:all_reduce, missing ranks {1}, sizes,
    # expected ranks 2, scheduled
    assert (m["pg_name"], m["pg_desc"], m["profiling_name"], m["missing_ranks"]) == (
        "0",
        "default_pg",
        "nccl:all_reduce",
        [1],
    )
    assert (m["input_sizes"], m["output_sizes"], m["world_size"], m["state"]) == (
        "[[3, 4]]",
        "[[3, 4]]",
        2,
        "scheduled",
    )
    # lines 11-13: the stack
    assert m["frames"] == [
        "all_reduce at /home/user/local/pytorch/torch/distributed/distributed_c10d.py:2696",
        "wrapper at /home/user/local/pytorch/torch/distributed/c10d_logger.py:83",
        "<module> at /home/user/test/crash.py:44",
    ]


def test_torchfrtrace_newer_format():
    report = (
        "Not all ranks joining collective, sequence number: 4\n"
        "internal record id: 9\ngroup info: 1:tp\ncollective: nccl:all_reduce\nmissing ranks: {1, 3}\n"
        "input sizes: [[16]]\noutput sizes: [[16]]\nworld size: 4\nexpected ranks: {0, 1, 2, 3}\n"
        "collective state: scheduled\nerror msg: Culprit rank 1; COLLECTIVE_STATE_MISMATCH\n"
        "collective stack trace: \n all_reduce at a.py:1\n"
    )
    p = nccl.parse(report.encode(), "report.txt")
    (m,) = p.tables["flight_recorder_mismatches"].to_dicts()
    assert (m["collective_seq_id"], m["record_id"], m["pg_name"], m["pg_desc"], m["missing_ranks"]) == (
        4,
        9,
        "1",
        "tp",
        [1, 3],
    )
    assert (m["world_size"], m["expected_ranks"], m["error"], m["frames"]) == (
        4,
        [0, 1, 2, 3],
        "Culprit rank 1; COLLECTIVE_STATE_MISMATCH",
        ["all_reduce at a.py:1"],
    )
