"""Issue 14 on hand-built traces whose answers are worked out below: exposed communication split
into waiting for peers and transfer, the straggler and its cause, recoverable times never counted
twice, one step window for MFU / tokens/s / the shares, caveats beside the verdict.

Arrival skew (times in µs; two ranks, two steps, the same pattern in each step, step 2 = step 1
shifted by 1500 µs; host ProfilerStep#1 [0, 1500), #2 [1500, 3000) on both ranks):
  rank 0: compute k [20, 1000) (launched at 5), all-reduce [1000, 1500) (launched at 6)
  rank 1: compute k [20, 1400) (launched at 5), all-reduce [1400, 1500) (launched at 6)
  The all-reduce (group "0", 2 ranks, 1e6 floats = 4e6 B) is matched by order: last arrival 1400
  (rank 1, the straggler); transfer = min(500, 100) = 100 µs; wait rank 0 = 400, rank 1 = 0.
  Step window = host window (the GPU work ends at 1500 = the host end).
  rank 0 per step: compute 980; waiting for peers = its first 500 - 100 = 400 µs, [1000, 1400)
    (views/44_comm_wait.sql: duration - the call's transfer time), no compute then: exposed;
    transfer [1400, 1500) = 100 exposed; idle [0, 20) = 20 (host wait: launched at 5 > 0).
    980 + 400 + 100 + 20 = 1500.
  rank 1 per step: compute 1380; transfer 100; idle 20. 1380 + 100 + 20 = 1500.
  Basis: 4 rows x 1500 = 6000 µs: compute 2 x (980 + 1380) = 4720 = 78.67 % (< 80 %);
    waiting 2 x 400 = 800 = 13.33 % (moderate, < 15 %), transfer 4 x 100 = 400 = 6.67 % (moderate),
    host 80 = 1.33 %. No cause at the high bar, compute < 80 % -> the largest moderate cause:
    straggler-bound, moderate (not network-bound: the old exposed-comm total was 20 %, high).
  Straggler: rank 1 last in 2 of 2 calls, caused 2 x 400 = 800 µs of wait (all of it). Its
    lateness per call = the median of the others' waits = 400; it began each step with the others
    (step starts equal), and its compute is 1380 - 980 = 400 µs longer per step = all of its
    lateness -> cause longer_compute (load imbalance).
  Findings: straggler: 800 / 2 ranks = 400 µs over 2 steps (200 per step); exposed_comm (transfer
    6.67 % >= 5 %): 400 / 2 = 200 µs (100 per step); host idle 1.33 % < 5 %: none. Their sum, 600 µs,
    is at most the step time per rank, 3000 µs.
  busbw over the transfer time: 4e6 B / 100,000 ns = 40 GB/s x 2(n-1)/n = 1 (n = 2).
  collective_exposure: all_reduce kernel time (500 + 100) x 2 = 1200 µs, exposed waiting 800,
    exposed transfer 400.
"""

from __future__ import annotations

import json

import pytest
from conftest import X, corpus, write_trace
from test_handmade import COMM_ARGS, H100, gpu, launch
from typer.testing import CliRunner

from pipeline.analyze import analyze
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

US = 1000
runner = CliRunner()


def skew_events(compute_end: int) -> list[dict]:
    ev = []
    for k, off in enumerate((0, 1500)):
        ev += [
            X("user_annotation", f"ProfilerStep#{k + 1}", off, 1500, pid=10, tid=10),
            launch("cudaLaunchKernel", off + 5, 10 * k + 1),
            launch("cudaLaunchKernel", off + 6, 10 * k + 2),
            gpu("kernel", "gemm", off + 20, compute_end - 20, 7, 10 * k + 1),
            gpu(
                "kernel",
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
                off + compute_end,
                1500 - compute_end,
                20,
                10 * k + 2,
                **COMM_ARGS,
            ),
        ]
    return ev


@pytest.fixture(scope="module")
def skew(tmp_path_factory):
    d = tmp_path_factory.mktemp("skew")
    for r, end in ((0, 1000), (1, 1400)):
        write_trace(
            d / "job" / f"r{r}.json",
            skew_events(end),
            deviceProperties=H100,
            distributedInfo={"backend": "nccl", "rank": r, "world_size": 2},
        )
    lk = Lake(d / "lake")
    assert [x.status for x in ingest_paths([d / "job"], lk)] == ["ok", "ok"]
    return lk, analyze(lk)


def test_step_time_splits_exposed_comm(skew):
    lk, _ = skew
    st = {(r["rank"], r["step"]): r for r in run(connect(lk), "step_time").to_dicts()}
    for step in (1, 2):
        r0, r1 = st[(0, step)], st[(1, step)]
        assert (r0["step_ns"], r0["compute_ns"], r0["exposed_comm_ns"]) == (1500 * US, 980 * US, 500 * US)
        assert (r0["exposed_comm_wait_ns"], r0["exposed_comm_transfer_ns"], r0["idle_ns"]) == (
            400 * US,
            100 * US,
            20 * US,
        )
        assert (r1["compute_ns"], r1["exposed_comm_wait_ns"], r1["exposed_comm_transfer_ns"]) == (
            1380 * US,
            0,
            100 * US,
        )
    bd = {(r["rank"], r["level"]): r for r in run(connect(lk), "breakdown").to_dicts()}
    assert (bd[(0, "rank")]["exposed_comm_wait_ns"], bd[(0, "rank")]["exposed_comm_transfer_ns"]) == (
        800 * US,
        200 * US,
    )
    assert bd[(0, "rank")]["kernels"] == 4  # a split kernel counts once
    (ex,) = run(connect(lk), "collective_exposure").filter(step=1).to_dicts()
    assert (ex["op"], ex["kernels"], ex["kernel_ns"], ex["exposed_wait_ns"], ex["exposed_transfer_ns"]) == (
        "all_reduce",
        2,
        600 * US,
        400 * US,
        200 * US,
    )  # per step: rank 0 waits 400, both ranks transfer 100


def test_waiting_for_a_late_rank_is_not_network_bound(skew):
    _, res = skew
    (v,) = res["verdicts"]
    n = v["numbers"]
    assert n["exposed_comm_pct"] == pytest.approx(100 * 1200 / 6000)
    assert n["exposed_comm_wait_pct"] == pytest.approx(100 * 800 / 6000) and n[
        "exposed_comm_transfer_pct"
    ] == pytest.approx(100 * 400 / 6000)
    assert (v["verdict"], v["confidence"], v["steps_used"]) == ("straggler-bound", "moderate", 2)
    st = v["straggler"]
    assert (st["rank"], st["times_last"], st["calls"], st["caused_wait_ns"], st["lateness_ns"]) == (
        1,
        2,
        2,
        800 * US,
        800 * US,
    )
    assert (st["cause"], st["cause_ns"]) == ("longer_compute", 800 * US)
    assert "rank 1 arrived last in 2 of 2" in v["reason"] and "compute took longer" in v["reason"]


def test_findings_split_and_never_count_twice(skew):
    _, res = skew
    fs = {f["kind"]: f for f in res["findings"]}
    assert set(fs) == {"straggler", "exposed_comm"}
    assert (fs["straggler"]["recoverable_ns"], fs["straggler"]["per_step_ns"]) == (400 * US, 200 * US)
    assert (fs["exposed_comm"]["recoverable_ns"], fs["exposed_comm"]["per_step_ns"]) == (200 * US, 100 * US)
    assert [f["kind"] for f in res["findings"]] == ["straggler", "exposed_comm"]
    assert fs["straggler"]["title"] == "Waiting for a straggler: rank 1 arrives last"
    assert "balance the work per rank" in fs["straggler"]["recommendation"]
    assert any(
        "40.0 GB/s weighted by transfer time over 2 call(s)" in e for e in fs["exposed_comm"]["evidence"]
    )
    (c1, _) = res["collectives"]
    assert c1["busbw_gbps"] == pytest.approx(4e6 / 100_000)


# ---------------------------------------------------------------- one step window (MFU, tokens/s)


def _host_ahead_events():
    """ProfilerStep#1 [0, 100) µs on the host (the host runs ahead); the mm it launches runs on
    the GPU [50, 1000): the step's window is [0, 1000) = 1000 µs (views/25_step_window.sql)."""
    return [
        X("user_annotation", "ProfilerStep#1", 0, 100, pid=10, tid=10),
        X(
            "cpu_op",
            "aten::mm",
            5,
            20,
            pid=10,
            tid=10,
            **{
                "External id": 5,
                "Input Dims": [[1024, 1024], [1024, 1024]],
                "Input type": ["c10::BFloat16", "c10::BFloat16"],
            },
        ),
        launch("cudaLaunchKernel", 10, 1, ext=5),
        gpu("kernel", "sm90_xmma_gemm_bf16", 50, 950, 7, 1, ext=5),
    ]


def test_mfu_divides_by_the_step_window_not_the_host_step(tmp_path):
    write_trace(tmp_path / "job" / "rank0.json", _host_ahead_events(), deviceProperties=H100[:1])
    lk = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "job"], lk)
    # 2 * 1024^3 FLOP over the 1000 µs window on the H100's 989.4 bf16 TFLOP/s (not over the 100 µs
    # host step, which would give 10x that)
    res = analyze(lk)
    (s,) = res["steps"]
    assert (s["step_ns"], s["host_step_ns"], s["gpu_span_ns"]) == (1000 * US, 100 * US, 950 * US)
    assert s["mfu_pct"] == pytest.approx(100 * 2 * 1024**3 / (1e-3 * 989.4e12))
    (st,) = res["step_time"]
    assert st["step_ns"] == s["step_ns"]
    # with the user's FLOPs: 0.5e9 FLOP per step on 1 TFLOP/s over 1000 µs = 50 % (the host step
    # would say 500 %, beyond the peak); tokens/s = 4096 tokens / 1e-3 s
    res = analyze(lk, peak_tflops=1.0, model_flops_per_step=0.5e9, tokens_per_step=4096)
    (s,) = res["steps"]
    assert s["mfu_pct"] == pytest.approx(50.0) and s["tokens_per_s"] == pytest.approx(4096 / 1e-3)
    (r,) = res["ranks"]
    assert r["mfu_pct"] == pytest.approx(50.0) and r["tokens_per_s"] == pytest.approx(4096 / 1e-3)


def test_tokens_per_step_alone_gives_tokens_per_second(tmp_path):
    write_trace(tmp_path / "job" / "rank0.json", _host_ahead_events(), deviceProperties=H100[:1])
    lk = tmp_path / "lake"
    assert runner.invoke(app, ["ingest", str(tmp_path / "job"), "--lake", str(lk)]).exit_code == 0
    r = runner.invoke(app, ["analyze", "--lake", str(lk), "--json", "--tokens-per-step", "2048"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tracelake.analyze/5"
    (s,) = doc["steps"]
    assert s["tokens_per_s"] == pytest.approx(2048 / 1e-3)


# ---------------------------------------------------------------- caveats beside the verdict


def test_caveats_missing_ranks_and_single_step(tmp_path):
    """PARAM's DLRM worker0 alone: 1 of 8 ranks (distributedInfo world_size 8), one ProfilerStep
    (#10): two caveats, each lowering the confidence one level."""
    src = corpus(
        "param", "et_replay", "tests", "inputs", "dlrm_kineto", "worker0_step_12.1694128201545.pt.trace.json"
    )
    lk = Lake(tmp_path / "lake")
    ingest_paths([src], lk)
    (v,) = analyze(lk)["verdicts"]
    kinds = [c["kind"] for c in v["caveats"]]
    assert "missing_ranks" in kinds and "single_step" in kinds
    assert "1 of 8 ranks ingested" in next(c["text"] for c in v["caveats"] if c["kind"] == "missing_ranks")
    assert v["confidence"] == "low"  # high -> moderate -> low


def test_busbw_evidence_shows_the_sizes_apart():
    """Two sizes (issue 39 item 7: 1.4 MB calls at 2.5-9.9 GB/s and 1.79 GB calls at 130-153 GB/s
    read "median 69.7 GB/s at a median message of 855 MiB", a figure no call had): the evidence
    gives the busbw weighted by transfer time and each size apart. By hand: (2.0 x 1 ms + 4.0 x
    0.5 ms + 100 x 10 ms) / 11.5 ms = 1.004e9 / 1.15e7 = 87.3 GB/s, 19 % of 450 GB/s."""
    from pipeline.diagnosis.comm_findings import busbw_text

    def call(size, gbps, t_ns):
        return {"msg_bytes": size, "busbw_gbps": gbps, "transfer_ns": t_ns, "link_peak_gbps": 450.0}

    calls = [call(2**20, 2.0, 1_000_000), call(2**20, 4.0, 500_000), call(2**30, 100.0, 10_000_000)]
    assert busbw_text(calls) == (
        "87.3 GB/s weighted by transfer time over 3 call(s) = 19% of the 450 GB/s link peak; "
        "by message size: 1.00 MiB x2: 2.0-4.0 GB/s, 1.00 GiB x1: 100.0 GB/s"
    )
    # more sizes than listed one by one: their range and the size that took the most time
    many = [call(2**k, float(k), 1000 * k) for k in range(10, 16)]
    text = busbw_text(many)
    assert text.endswith(
        "; 6 message sizes from 1.00 KiB to 32.00 KiB, the most time at 32.00 KiB x1: 15.0 GB/s"
    )
