"""Edge cases of the wait/transfer split, the straggler, MFU's window and collective records,
each on a minimal hand-built trace whose answer is worked out in the test (from an adversarial
trial of issue 14's changes)."""

from __future__ import annotations

import pytest
from conftest import X, corpus, write_trace
from test_handmade import COMM_ARGS, H100, gpu, launch, mm_op
from typer.testing import CliRunner

from pipeline.analyze import analyze
from pipeline.catalog import normalize_op
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

US = 1000
runner = CliRunner()
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"


def _lake(tmp_path, per_rank: dict[int, list]) -> Lake:
    for r, ev in per_rank.items():
        write_trace(
            tmp_path / "job" / f"r{r}.json",
            ev,
            deviceProperties=H100,
            distributedInfo={"backend": "nccl", "rank": r, "world_size": len(per_rank)},
        )
    lk = Lake(tmp_path / "lake")
    assert all(x.status == "ok" for x in ingest_paths([tmp_path / "job"], lk)), "ingest"
    return lk


def _steps(shift: int) -> list[dict]:
    """Two steps of 1000 µs: compute [20, 600), all-reduce [600, 900) per step, every time + shift."""
    ev = []
    for k, off in enumerate((0, 1000)):
        o = off + shift
        ev += [
            X("user_annotation", f"ProfilerStep#{k + 1}", o, 1000, pid=10, tid=10),
            launch("cudaLaunchKernel", o + 5, 10 * k + 1),
            launch("cudaLaunchKernel", o + 6, 10 * k + 2),
            gpu("kernel", "gemm", o + 20, 580, 7, 10 * k + 1),
            gpu("kernel", AR, o + 600, 300, 20, 10 * k + 2, **COMM_ARGS),
        ]
    return ev


def test_clock_skew_alone_is_not_waiting(tmp_path):
    """Two identical ranks, every event of rank 1 shifted by +150 µs (its host clock is ahead):
    both all-reduce kernels last 300 µs, so neither waited (wait = duration - the shortest
    duration, each measured on its own clock); comparing starts would call 150 µs per call
    waiting. Exposed communication [600, 900) per step is all transfer."""
    lk = _lake(tmp_path, {0: _steps(0), 1: _steps(150)})
    for r in run(connect(lk), "step_time").to_dicts():
        assert (r["exposed_comm_wait_ns"], r["exposed_comm_transfer_ns"]) == (0, 300 * US), r
    (v,) = analyze(lk)["verdicts"]
    assert v["numbers"]["exposed_comm_wait_pct"] == 0 and v["verdict"] != "straggler-bound"


def test_single_rank_split_is_unknown_not_zero(tmp_path):
    """One rank: no collective is matched on two ranks, so whether its exposed communication
    (300 of 1000 µs per step = 30 %) is transfer or waiting is unknown (null, not 0 %), and the
    network cause reads all of it."""
    lk = _lake(tmp_path, {0: _steps(0)})
    (v,) = analyze(lk)["verdicts"]
    n = v["numbers"]
    assert n["exposed_comm_wait_pct"] is None and n["exposed_comm_transfer_pct"] is None
    assert n["exposed_comm_pct"] == pytest.approx(30.0) and v["verdict"] == "network-bound"
    assert "unknown" in v["reason"] and v["headline"][0] == "exposed_comm_pct"


def test_calls_that_do_not_overlap_are_not_matched(tmp_path):
    """Rank 0 has one extra all-reduce at [100, 150) before the step's: matched by order, call 0
    pairs it with rank 1's [600, 900) kernel, which starts after it ended (a collective cannot end
    before its last rank arrives): not consistent, so no straggler and no waiting from it."""
    ev0 = _steps(0) + [launch("cudaLaunchKernel", 7, 99), gpu("kernel", AR, 100, 50, 20, 99, **COMM_ARGS)]
    lk = _lake(tmp_path, {0: ev0, 1: _steps(0)})
    calls = run(connect(lk), "collective_matching").sort("call_key").to_dicts()
    assert calls[0]["consistent"] is False and calls[0]["straggler_rank"] is None
    res = analyze(lk)
    (v,) = res["verdicts"]
    assert any(c["kind"] == "inconsistent_collectives" for c in v["caveats"])


def test_repeated_seq_does_not_break_the_analysis(tmp_path):
    """An all-reduce and a send/recv of one process group both with Seq 1 on two ranks (PyTorch
    numbers collectives and P2P apart): matched apart, and the analysis runs."""

    def ev():
        return [
            X("user_annotation", "ProfilerStep#1", 0, 1000, pid=10, tid=10),
            launch("cudaLaunchKernel", 5, 1),
            launch("cudaLaunchKernel", 6, 2),
            gpu("kernel", AR, 100, 100, 20, 1, **{**COMM_ARGS, "Seq": 1}),
            gpu(
                "kernel",
                "ncclDevKernel_SendRecv(x)",
                300,
                100,
                21,
                2,
                **{**COMM_ARGS, "Collective name": "send", "Seq": 1},
            ),
        ]

    lk = _lake(tmp_path, {0: ev(), 1: ev()})
    calls = run(connect(lk), "collective_matching").to_dicts()
    assert sorted(c["op"] for c in calls) == ["all_reduce", "send"]
    assert analyze(lk)["verdicts"][0]["verdict"]


def test_duplicate_profiler_step_rows_count_once(tmp_path):
    """ProfilerStep#1 written twice (a user_annotation and a cpu_op of the same window): one
    step row, one step_time row, and its parts add up to its window."""
    ev = _steps(0) + [X("cpu_op", "ProfilerStep#1", 0, 1000, pid=10, tid=10)]
    lk = _lake(tmp_path, {0: ev})
    st = run(connect(lk), "step_time").to_dicts()
    assert [r["step"] for r in st] == [1, 2]
    for r in st:
        assert (
            r["compute_ns"]
            + r["exposed_comm_ns"]
            + r["exposed_memory_ns"]
            + r["exposed_unknown_ns"]
            + r["idle_ns"]
            == r["step_ns"]
        )


def test_mfu_over_a_squeezed_window_stays_below_the_peak(tmp_path):
    """Step 1's all-reduce runs on [950, 3000) on its stream; step 2's matmul (2 * 1024^3 FLOP,
    bf16) runs [1010, 3010) on another: step 2's window starts at step 1's end (3000), 10 µs long.
    MFU divides by the longer of the window and the step's own GPU span (2000 µs):
    100 * 2 * 1024^3 / (2e-3 * 989.4e12) = 0.1085 %, not 100x that."""
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000, pid=10, tid=10),
        X("user_annotation", "ProfilerStep#2", 1000, 10, pid=10, tid=10),
        launch("cudaLaunchKernel", 5, 1),
        X(
            "cpu_op",
            "aten::mm",
            1001,
            5,
            pid=10,
            tid=10,
            **{
                "External id": 7,
                "Input Dims": [[1024, 1024], [1024, 1024]],
                "Input type": ["c10::BFloat16", "c10::BFloat16"],
            },
        ),
        launch("cudaLaunchKernel", 1002, 2, ext=7),
        gpu("kernel", AR, 950, 2050, 20, 1, **COMM_ARGS),
        gpu("kernel", "sm90_gemm_bf16", 1010, 2000, 7, 2, ext=7),
    ]
    lk = _lake(tmp_path, {0: ev})
    m = {r["step"]: r for r in run(connect(lk), "mfu").to_dicts()}
    assert m[2]["step_ns"] == 10 * US
    assert m[2]["mfu_pct"] == pytest.approx(100 * 2 * 1024**3 / (2e-3 * 989.4e12))


def test_implausible_sizes_are_unknown(tmp_path):
    """'In msg nelems' -1,000,000 and 'Group size' 0 on one rank, 2^62 on another: sizes and
    groups unknown (null, with a note), never negative bandwidths, and the files ingest."""

    def ev(n, g):
        return [
            X("user_annotation", "ProfilerStep#1", 0, 1000, pid=10, tid=10),
            launch("cudaLaunchKernel", 5, 1),
            gpu(
                "kernel",
                AR,
                100,
                100,
                20,
                1,
                **{**COMM_ARGS, "In msg nelems": n, "Out msg nelems": n, "Group size": g},
            ),
        ]

    lk = _lake(tmp_path, {0: ev(-1000000, 0), 1: ev(2**62, 2)})
    rows = run(connect(lk), "collective_bandwidth").to_dicts()
    assert all(r["msg_bytes"] is None and r["busbw_gbps"] is None for r in rows)
    notes = [
        r[0] for r in connect(lk).execute("SELECT msg_bytes_note FROM collectives ORDER BY rank").fetchall()
    ]
    assert all("implausible" in n for n in notes), notes


def test_op_names_with_suffixes():
    # PyTorch's barrier title (pytorch#140785), a tagged title, reduce_scatter_v
    assert [
        normalize_op(x)
        for x in (
            "all_reduce_barrier",
            "all_reduce:tag",
            "reduce_scatter_v",
            "allgather_into_tensor_coalesced",
        )
    ] == ["all_reduce", "all_reduce", "reduce_scatter", "all_gather"]


def test_infinite_options_are_usage_errors(tmp_path):
    lk = _lake(tmp_path, {0: _steps(0)})
    for opt in ("--peak-tflops", "--model-flops-per-step", "--tokens-per-step", "--kernel-wait-us"):
        r = runner.invoke(app, ["analyze", "--lake", str(lk.root), "--json", opt, "inf"])
        assert r.exit_code == 2, (opt, r.output)


def test_sampled_ranks_match_only_what_lines_up():
    """HTA's trace_filter (2 sampled ranks of a 128-rank job; also sample_traces/): its events
    were sampled upstream, so matching the k-th NCCL kernel of each rank pairs different calls.
    Read by hand from the raw kernels (the ones whose pairs overlap in time): of the 10 calls, 4
    line up (the 2nd and 7th of the comm stream with 8 calls, and both calls of the other)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        lk = Lake(Path(d))
        ingest_paths([corpus("hta", "tests", "data", "trace_filter")], lk)
        calls = run(connect(lk), "collective_matching").to_dicts()
    assert len(calls) == 10 and sum(c["consistent"] for c in calls) == 4


def test_headline_never_shows_a_number_beside_its_part():
    """Every verdict's headline, with any other causes at their high bar, holds disjoint numbers:
    no key twice, none a part of another (host wait inside host-bound, transfer inside exposed
    communication, any idle cause inside GPU idle)."""
    from itertools import combinations

    from pipeline.diagnosis.verdict import CAUSES, HEADLINE, PARTS, headline_keys

    cause_keys = [c[1] for c in CAUSES.values()] + ["exposed_comm_pct"]
    for v, keys in HEADLINE.items():
        for n in range(3):
            for also in combinations([k for k in cause_keys if k != keys[0]], n):
                h = headline_keys(keys, list(also))
                assert h[0] == keys[0] and 2 <= len(h) <= 3, (v, also, h)
                for a, b in combinations(h, 2):
                    assert a != b and b not in PARTS.get(a, ()) and a not in PARTS.get(b, ()), (v, also, h)
    assert headline_keys(HEADLINE["host-bound"], ["exposed_comm_wait_pct"]) == [
        "host_bound_pct",
        "exposed_comm_wait_pct",
        "compute_pct",
    ]


def test_queued_idle_no_cause_explains_is_an_abstention_not_balanced(tmp_path):
    """HTA's MTIA trace (corpus hta/tests/data/mtia_trace_single_rank, one rank, one step): HTA
    0.5.0 on this file, run by hand (get_temporal_breakdown): idle 42.39 % of kernel time,
    compute 54.81 %; get_idle_time_breakdown: on stream 1, 93 % of the idle is 'other' (neither
    host wait nor kernel wait: the next kernel was already queued). No cause reaches its moderate
    bar, so the run used to read 'balanced' beside a top finding of 39 % queued idle; the largest
    share is time no cause explains, so the verdict abstains and says what it is."""
    lk = Lake(tmp_path / "lake")
    d = corpus("hta", "tests", "data", "mtia_trace_single_rank")
    assert [r.status for r in ingest_paths([d], lk)] == ["ok"]
    doc = analyze(lk)
    (v,) = doc["verdicts"]
    n = v["numbers"]
    assert abs(n["gpu_idle_pct"] - 42.39) < 0.5 and abs(n["compute_pct"] - 54.81) < 0.5
    assert n["idle_other_pct"] >= 0.9 * n["gpu_idle_pct"]  # HTA: 93 % of stream 1's idle is other
    causes = ("host_bound_pct", "idle_input_pct", "exposed_memcpy_pct", "exposed_comm_pct")
    assert all((n[k] or 0) < 5 for k in causes)
    assert (v["verdict"], v["confidence"]) == ("unknown", None)
    assert v["reason"].startswith(f"the GPU idles {n['idle_other_pct']:.1f}% of step time with its next work")
    assert "confidence lowered" not in v["reason"]  # an abstention has no confidence to lower
    assert v["headline"][0] == "idle_other_pct"
    assert doc["findings"][0]["kind"] == "queued_idle"


def test_events_on_two_clocks_give_no_verdict_and_no_trace_findings(tmp_path):
    """PARAM's DLRM worker0 with every kernel's ts moved to the first millisecond after 0 while
    its host events stay on the epoch (1694128201... µs): the trace spans 53 years, and its
    shares ('host-bound 92.3%' with no note, in an attack) mean nothing. The verdict abstains,
    naming the file, and no finding is drawn from those times."""
    import json

    (src,) = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto").glob("worker0_*.json")
    doc = json.loads(src.read_text())
    host = [e["ts"] for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    assert min(host) > 1.6e15  # µs since 1970: 2023
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["ts"] = e["ts"] % 1000
    d = tmp_path / "job"
    d.mkdir()
    (d / "worker0.json").write_text(json.dumps(doc))
    lk = Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([d], lk)] == ["ok"]
    res = analyze(lk)
    (v,) = res["verdicts"]
    assert (v["verdict"], v["confidence"]) == ("unknown", None)
    assert "clock_mismatch" in [c["kind"] for c in v["caveats"]]
    assert v["reason"].startswith("no verdict: 1 input(s) span more than a day of clock (")
    assert str(d / "worker0.json") in v["reason"]
    assert res["findings"] == []


def _copy_bound(kind: str, steps: bool) -> list[dict]:
    """One rank: gemm [20, 220) µs, then a 600 µs host-to-device copy [220, 820) of 1 GB from
    `kind` host memory (Pinned or Pageable) that nothing hides, then gemm [820, 1000); with
    `steps`, inside ProfilerStep#1 [0, 1000)."""
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000, pid=10, tid=10)] if steps else []
    return ev + [
        launch("cudaLaunchKernel", 5, 1),
        launch("cudaMemcpyAsync", 6, 2),
        launch("cudaLaunchKernel", 7, 3),
        gpu("kernel", "gemm", 20, 200, 7, 1),
        gpu("gpu_memcpy", f"Memcpy HtoD ({kind} -> Device)", 220, 600, 7, 2, bytes=10**9),
        gpu("kernel", "gemm", 820, 180, 7, 3),
    ]


@pytest.mark.parametrize("kind", ["Pinned", "Pageable"])
@pytest.mark.parametrize("steps", [True, False])
def test_copy_advice_follows_the_copies(tmp_path, kind, steps):
    """Exposed copies (60 % of the step) from pinned memory must not be told to use pinned
    buffers (issue 39 item 8: that advice sat under evidence that 98 % of the copy time was already
    pinned): the evidence says 100 % pinned and the advice is to overlap and copy less; with no
    training step in the trace, that it looks like a weight load: profile the steps. Pageable
    copies keep the pinned-buffer advice."""
    lk = _lake(tmp_path, {0: _copy_bound(kind, steps)})
    (f,) = [f for f in analyze(lk)["findings"] if f["kind"] == "exposed_memcpy"]
    rec = f["recommendation"]
    if kind == "Pinned":
        assert "100% of the host-device copy time is from/to pinned host memory" in f["evidence"]
        assert "pinned buffers" not in rec and "pin_memory" not in rec
        assert rec.startswith("The host-device copies already use pinned host memory")
        assert ("weight or checkpoint load" in rec) is (not steps)
    else:
        assert not any("pinned host memory" in e for e in f["evidence"])
        assert "1 copies from/to pageable host memory, 953.7 MiB" in f["evidence"]
        assert rec.startswith("Use pinned host buffers")


def _low_coverage() -> list[dict]:
    """One step [0, 1000) µs: an aten::mm [[1024,1024],[1024,1024]] bf16 launches gemm [20, 70)
    (50 µs with modelled FLOPs), then an unmodelled kernel [70, 970) (900 µs): FLOP coverage
    50 / 950 = 5.3 % of compute-kernel time, under the 50 % bar."""
    return [
        X("user_annotation", "ProfilerStep#1", 0, 1000, pid=10, tid=10),
        mm_op(2, 8, 5),
        launch("cudaLaunchKernel", 5, 1, ext=5),
        launch("cudaLaunchKernel", 12, 2),
        gpu("kernel", "sm90_xmma_gemm_bf16", 20, 50, 7, 1, ext=5),
        gpu("kernel", "my_custom_kernel", 70, 900, 7, 2),
    ]


def test_mfu_not_measurable_at_low_flop_coverage(tmp_path):
    """At 5 % FLOP coverage the MFU (0.2 %) describes too little of the compute: the report says
    MFU is not measurable instead of printing a figure (issue 39 item 9: "MFU 0.094 %" at 1 %
    coverage), and never refers to a low-MFU finding that is not there."""
    from pipeline.report.document import throughput_text

    lk = _lake(tmp_path, {0: _low_coverage()})
    res = analyze(lk)
    (t,) = res["throughput"]
    assert t["flop_coverage_pct"] == pytest.approx(100 * 50 / 950)
    assert t["mfu_measurable"] is False and t["mfu_pct"] is not None
    assert not [f for f in res["findings"] if f["kind"] == "low_mfu"]
    text = throughput_text(t, None, res["findings"])
    assert text == (
        "Throughput: MFU not measurable from op shapes: only 5% of compute-kernel time has modelled "
        "FLOPs (give --model-flops-per-step for a figure)."
    )
    html = runner.invoke(app, ["report", "--lake", str(lk.root), "-o", str(tmp_path / "r.html")])
    assert html.exit_code == 0, html.output
    page = (tmp_path / "r.html").read_text()
    assert "MFU not measurable from op shapes" in page and "low-MFU finding" not in page
    # measurable, without a low-MFU finding: the line names no finding
    ok = dict(t, mfu_measurable=True, flop_coverage_pct=80.0, mfu_pct=35.0, peak_tflops=989.4)
    assert throughput_text(ok, None, []) == (
        "Throughput: MFU 35.0% from op shapes over the whole trace (median of the ranks) "
        "(FLOP coverage 80%) of 989.4 TFLOP/s."
    )
    low = [{"kind": "low_mfu"}]
    assert "(median of the ranks; the low-MFU finding is per analysed step)" in throughput_text(ok, None, low)


def test_no_steps_caveat_names_what_the_inputs_allow(tmp_path):
    """The no-steps caveat's hint follows the run's inputs (issue 39 item 10: a run of NCCL logs
    alone read "Nsight Systems exports: give --step-range"): an NCCL log alone gets no such caveat
    (it has no trace), a Kineto trace the ProfilerStep hint, an Nsight export --step-range."""
    from pipeline.diagnosis.caveats import caveats_for_run

    def no_steps(formats):
        return [
            c["text"]
            for c in caveats_for_run({"formats": formats}, [], None, has_steps=False)
            if c["kind"] == "no_steps"
        ]

    assert no_steps(["nccl_log"]) == [] and no_steps(["nccl_tests", "flight_recorder"]) == []
    (k,) = no_steps(["kineto_json"])
    assert "prof.step()" in k and "Nsight" not in k
    (n,) = no_steps(["nsys_sqlite"])
    assert "--step-range" in n and "ProfilerStep" not in n
    # end to end: an NCCL log alone
    lk = Lake(tmp_path / "lake")
    ingest_paths([corpus("nccl", "nccl-issue-1193-coll-allreduce-ray-prefix-128rank.log")], lk)
    res = analyze(lk)
    texts = [c["text"] for v in res["verdicts"] for c in v.get("caveats", [])]
    assert not any("Nsight Systems" in t or "no steps in the trace" in t for t in texts), texts


def test_advice_speaks_of_pytorch_only_for_pytorch_programs(tmp_path):
    """CloverLeaf (pipit's Perlmutter export) is a CUDA application with no PyTorch op on its host:
    its host-idle advice names CUDA graphs by the CUDA API, not torch.compile (issue 39 item 10:
    host-bound advice spoke only of PyTorch for a CUDA C application). nsys-ai's export records
    PyTorch's aten:: NVTX ranges: a PyTorch program."""
    for name, src, pytorch in (
        ("clover", corpus("nsys", "pipit", "perlmutter-cloverleaf-cuda.sqlite"), False),
        ("nsysai", corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite"), True),
    ):
        lk = Lake(tmp_path / name)
        ingest_paths([src], lk)
        res = analyze(lk)
        (run,) = res["runs"]
        assert run["pytorch"] is pytorch, name
        if not pytorch:
            (f,) = [f for f in res["findings"] if f["kind"] == "host_idle"]
            rec = f["recommendation"]
            assert "cudaStreamBeginCapture" in rec and "torch" not in rec and ".item()" not in rec
