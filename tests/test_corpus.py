"""Every Kineto file in ../shared/corpus/{hta,param,tracelens,kineto} ingests, or is refused with
a clear reason (the Chakra execution trace). Row counts are checked against an independent count
with the standard json module; specific values are read by hand from the files (cited)."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter

import polars as pl
import pytest
from conftest import KINETO_DIRS, corpus

from pipeline.ingest import discover, ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

GPU_CATS = {
    "kernel",
    "Kernel",
    "mtia_ccp_events",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "cuda_sync",
    "cuda_profiler_range",
}
SKIP = {
    "Trace",
    "ac2g",
    "async_cpu_to_gpu",
    "async",
    "fwdbwd",
    "critical_path",
    "cpu_instant_event",
    "gpu_user_annotation",
}
CHAKRA = "execution_trace/benchmark_simple_add_et.json.gz"


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    lk = Lake(tmp_path_factory.mktemp("corpus"))
    # one run per file: several corpus directories hold unrelated traces of the same rank
    results = []
    for f in discover(KINETO_DIRS):
        results += ingest_paths([f], lk, run=re.sub(r"[^A-Za-z0-9]+", "_", str(f.relative_to(corpus()))))
    return lk, results


def _load(path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    d = json.loads(raw)
    return d if isinstance(d, list) else d["traceEvents"]


def test_every_kineto_file_ingests_or_is_refused_clearly(lake):
    _, results = lake
    assert len(results) >= 50
    for r in results:
        if r.path.endswith(CHAKRA):
            assert r.status == "failed"
            assert "Chakra execution trace" in r.error and "not a Kineto trace" in r.error
        else:
            assert r.status == "ok", (r.path, r.error)


def test_row_counts_match_an_independent_json_count(lake):
    lk, results = lake
    con = connect(lk)

    def counts(table):
        return {
            (r, s): n
            for r, s, n in con.execute(
                f"SELECT run_id, source_id, count(*) FROM {table} GROUP BY ALL"
            ).fetchall()
        }

    gpu, cpu, steps = counts("gpu_activities"), counts("cpu_ops"), counts("steps")
    from pathlib import Path

    for r in results:
        if r.status != "ok":
            continue
        ev = _load(Path(r.path))
        x = [e for e in ev if e.get("ph") == "X"]
        n_gpu = sum(1 for e in x if e.get("cat") in GPU_CATS)
        n_cpu = sum(1 for e in x if e.get("cat") not in GPU_CATS and e.get("cat") not in SKIP)
        n_steps = sum(
            1
            for e in x
            if re.match(r"^ProfilerStep\s*#\s*\d+$", str(e.get("name")))
            and e.get("cat") in ("user_annotation", "Operator", "cpu_op")
        )
        key = (r.run_id, r.source_id)
        assert gpu.get(key, 0) == n_gpu, r.path
        assert cpu.get(key, 0) == n_cpu, r.path
        assert steps.get(key, 0) == n_steps, r.path


def q(con, sql):
    return pl.from_arrow(con.sql(sql).to_arrow_table()).to_dicts()


def test_relative_timestamps_with_base_are_exact(lake):
    # nccl_data.json.gz: "baseTimeNanoseconds": 1711964646000000000 and the first NCCL kernel
    # {"name": "ncclKernel_AllReduce_RING_LL_Sum_float(...)", "ts": 4458677009853.422, "dur": 2636.669,
    #  "args": {"In msg nelems": 6637568, "dtype": "Float", "Group size": 2, "Process Group Name": "0", ...}}
    con = connect(lake[0])
    (row,) = q(
        con,
        "SELECT * FROM collectives WHERE run_id LIKE 'hta_tests_data_nccl_parser_config%' "
        f"AND start_ns = {1711964646000000000 + 4458677009853422}",
    )
    assert row["dur_ns"] == 2636669 and row["end_ns"] == 1711964646000000000 + 4458677009853422 + 2636669
    assert (
        row["op"],
        row["in_nelems"],
        row["dtype"],
        row["msg_bytes"],
        row["group_size"],
        row["process_group"],
        row["pg_ranks"],
    ) == ("all_reduce", 6637568, "Float", 6637568 * 4, 2, "0", [0, 1])
    assert (row["algorithm"], row["protocol"], row["reduction"]) == ("RING", "LL", "sum")
    (src,) = q(con, "SELECT * FROM sources WHERE run_id LIKE 'hta_tests_data_nccl_parser_config%'")
    assert (
        src["base_time_ns"] == 1711964646000000000
        and json.loads(src["tool_versions"])["nccl_version"] == "2.17.1"
    )
    assert (src["rank"], src["world_size"], src["rank_source"]) == (0, 2, "distributed_info")
    pgs = q(con, "SELECT * FROM process_groups WHERE run_id LIKE 'hta_tests_data_nccl_parser_config%'")
    assert [(p["process_group"], p["pg_desc"], p["group_size"], p["ranks"]) for p in pgs] == [
        ("0", "default_pg", 2, [0, 1])
    ]


def test_integer_epoch_us_and_kernel_args(lake):
    # dlrm worker0: {"cat": "kernel", "name": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(...)",
    #  "ts": 1694128201429795, "dur": 2146, "args": {"stream": 84, "correlation": 41246,
    #  "registers per thread": 96, "shared memory": 41760, "grid": [8, 1, 1], "block": [640, 1, 1]}}
    #  and {"name": "Memcpy HtoD (Pinned -> Device)", "ts": 1694128201428006,
    #  "dur": 1, "args": {"stream": 22, "bytes": 832}}
    con = connect(lake[0])
    (k,) = q(
        con, "SELECT * FROM gpu_activities WHERE run_id LIKE '%dlrm_kineto_worker0%' AND correlation = 41246"
    )
    assert (k["start_ns"], k["dur_ns"], k["stream"], k["category"], k["classified_by"]) == (
        1694128201429795000,
        2146000,
        84,
        "communication",
        "name",
    )
    assert (
        k["grid_x"],
        k["grid_y"],
        k["grid_z"],
        k["block_x"],
        k["registers_per_thread"],
        k["shared_memory_bytes"],
    ) == (8, 1, 1, 640, 96, 41760)
    (m,) = q(
        con,
        "SELECT * FROM gpu_activities WHERE run_id LIKE '%dlrm_kineto_worker0%' "
        "AND start_ns = 1694128201428006000 AND kind = 'memcpy'",
    )
    assert (m["bytes"], m["copy_kind"], m["src_kind"], m["dst_kind"], m["stream"]) == (
        832,
        "HtoD",
        "Pinned",
        "Device",
        22,
    )
    # The kernel has no Collective name args; its cudaLaunchKernel (correlation 41246, ts 1694128201429782,
    # tid 59811) lies inside {"cat": "user_annotation", "name": "nccl:all_to_all", "ts": 1694128201429757,
    # "dur": 62, "args": {"Input Dims": [[6144]], "Input type": ["float"]}}: all_to_all, S = 6144 x 4 B
    # (tests/test_collective_naming.py)
    (c,) = q(
        con, "SELECT * FROM collectives WHERE run_id LIKE '%dlrm_kineto_worker0%' AND correlation = 41246"
    )
    assert (c["op"], c["op_raw"], c["msg_bytes"], c["dtype"], c["msg_bytes_note"]) == (
        "all_to_all",
        "nccl:all_to_all",
        6144 * 4,
        "float",
        None,
    )


def test_2021_bare_array_trace(lake):
    # kineto worker0.pt.trace.json.gz is a bare JSON array; first Kernel event:
    # {"cat": "Kernel", "name": "void cudnn::cnn::wgrad_alg0_engine<...>", "tid": "stream 7",
    #  "ts": 1606910596288085, "dur": 379, "args": {"stream": 7, "correlation": 60032, "grid": [4, 8, 32],
    #  "block": [8, 32, 1]}}
    con = connect(lake[0])
    (k,) = q(
        con,
        "SELECT * FROM gpu_activities WHERE run_id LIKE 'kineto%worker0_pt_trace%' AND correlation = 60032",
    )
    assert (k["start_ns"], k["dur_ns"], k["stream"], k["kind"], k["grid_z"], k["block_y"]) == (
        1606910596288085000,
        379000,
        7,
        "kernel",
        32,
        32,
    )
    # {"cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 1606910596350714, "dur": 2353,
    #  "args": {"bytes": 19267584, "external id": 862}}
    (m,) = q(
        con,
        "SELECT * FROM gpu_activities WHERE run_id LIKE 'kineto%worker0_pt_trace%' "
        "AND start_ns = 1606910596350714000",
    )
    assert (m["bytes"], m["src_kind"], m["external_id"]) == (19267584, "Pageable", 862)
    (s,) = q(con, "SELECT * FROM sources WHERE run_id LIKE 'kineto%worker0_pt_trace%'")
    assert (s["rank"], s["rank_source"]) == (0, "file_name")  # "worker0" in the file name


def test_comms_id_beyond_int64_and_no_args(lake):
    # large_integer_trace: {"cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 0, "ts": 100,
    # "dur": 50} and record_param_comms with "Comms Id": 10159970886766084423 (> 2**63 - 1)
    con = connect(lake[0])
    (k,) = q(con, "SELECT * FROM gpu_activities WHERE run_id LIKE '%large_integer%'")
    assert (k["start_ns"], k["dur_ns"], k["device"], k["stream"], k["category"]) == (
        100000,
        50000,
        0,
        0,
        "communication",
    )
    (s,) = q(con, "SELECT * FROM sources WHERE run_id LIKE '%large_integer%'")
    assert (s["rank"], s["rank_source"]) == (70, "file_name")  # rank-70.Mar_25_...


def test_cpu_only_rocm_mtia_and_misc(lake):
    con = connect(lake[0])
    (s,) = q(con, "SELECT * FROM sources WHERE run_id LIKE '%cpu_only%'")
    assert (s["rank"], s["world_size"], s["backend"]) == (34, 300, "gloo")
    assert q(con, "SELECT count(*) n FROM gpu_activities WHERE run_id LIKE '%cpu_only%'")[0]["n"] == 0
    (d,) = q(con, "SELECT * FROM devices WHERE run_id LIKE '%amd_trace%' AND used")
    assert d["vendor"] == "amd"
    # triton_example: the kernel was launched by the driver call cuLaunchKernel
    (t,) = q(con, "SELECT launch_name FROM gpu_work WHERE run_id LIKE '%triton_example%'")
    assert t["launch_name"] == "cuLaunchKernel"
    # cupti range-profiler mode: 77 cuda_profiler_range events are GPU work of unknown category
    assert (
        q(
            con,
            "SELECT count(*) n FROM gpu_activities WHERE run_id LIKE '%cupti_profiler%' "
            "AND category = 'unknown'",
        )[0]["n"]
        == 77
    )
    # cuda_sync events are stored as sync, never busy time
    n_sync = q(
        con,
        "SELECT count(*) n FROM gpu_activities WHERE run_id LIKE '%critical_path_alexnet%' AND kind = 'sync'",
    )[0]["n"]
    assert n_sync == 41 and q(con, "SELECT count(*) n FROM scope WHERE kind = 'sync'")[0]["n"] == 0


def test_graph_replay_detected(lake):
    # vllm graph_execution: count kernels whose correlation is shared with another kernel, independently
    lk, results = lake
    (r,) = [r for r in results if r.path.endswith("vllm_decode_full/graph_execution.json.gz")]
    from pathlib import Path

    ev = _load(Path(r.path))
    corr = Counter(e["args"]["correlation"] for e in ev if e.get("ph") == "X" and e.get("cat") == "kernel")
    expected = sum(n for n in corr.values() if n > 1)
    con = connect(lk)
    got = q(con, f"SELECT count(*) n FROM gpu_work WHERE source_id = '{r.source_id}' AND graph_replay")[0][
        "n"
    ]
    assert got == expected and expected > 300


def test_recoverable_times_never_exceed_step_time_on_every_corpus_run(lake):
    """docs/report.md "Never counted twice", on every Kineto file of the corpus (one run each):
    the timed findings of a run add up to at most its time per rank."""
    from conftest import assert_recoverable_within_step_time

    from pipeline.analyze import analyze

    lk, _ = lake
    res = analyze(lk)
    assert len(res["verdicts"]) >= 50
    assert assert_recoverable_within_step_time(res) >= 10  # runs with timed findings: the check bites
