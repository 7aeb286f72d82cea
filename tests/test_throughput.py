"""Throughput, PaLM MFU, energy and cost (queries/mfu.sql tokens and palm_mfu_pct,
queries/energy.sql, pipeline/diagnosis/throughput.py and cost.py; issue 17 points 4-5).

1. A hand-made two-rank job on H100s (bf16 peak 989.4 TFLOP/s), µs in the trace:
   ProfilerStep#1 [0, 1500), ProfilerStep#2 [1500, 3000) on each rank; one GEMM kernel per step
   inside the host window, so each step window is its host window (1500 µs).
   Embedding calls (inputs [weight, indices]):
     step 1: token table [50000, 512] and position table [2048, 512], each called twice with
             indices [4, 128] (two micro-batches): largest B x S = 512, 4 calls over 2 tables
             -> 512 * 4 / 2 = 1024 tokens;
     step 2: the token table once with [1, 100] and a 1-D lookup [7] (not [B, S]) -> 100 tokens.
   Power counter "GPU Power" {"power_w": ...} on rank 0: 300 W at 0, 500 W at 750, 100 W at 3000
   (the last sample: nothing after it to hold until):
     step 1: 300 W x 750 µs + 500 W x 750 µs = 0.225 + 0.375 = 0.6 J, 400 W mean, 100 % covered;
     step 2: 500 W x 1500 µs = 0.75 J.
   With --global-batch 8 --seq-len 512: 4096 tokens per step over world size 2 = 2048 per rank:
   2048 / 1.5e-3 s = 1,365,333.3 tokens/s per GPU, 2,730,666.7 for the job.
   PaLM, N 1e8, L 2, H 8, Q 64, T 512: 6e8 + 12*2*8*64*512 = 606,291,456 FLOP/token;
   palm_mfu_pct = 100 * 606,291,456 * 2048 / (1.5e-3 * 989.4e12) = 83.66 %.
2. TraceLens's H100 BERT-small inference trace: its three aten::embedding calls (word, token
   type, position tables) all take indices [1, 141] (read from the file: Input Dims of the
   aten::embedding events), so its one step has 141 tokens.
"""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import X, corpus, write_trace
from typer.testing import CliRunner

from pipeline.analyze import analyze
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

US = 1000
H100 = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000, "numSms": 132}]


def _emb(ts, weight, idx, ext):
    args = {"External id": ext, "Input Dims": [weight, idx, [], [], []], "Input type": ["float", "long int"]}
    return X("cpu_op", "aten::embedding", ts, 5, pid=10, tid=10, **args)


def _events(rank: int):
    ev = []
    for k, off in enumerate((0, 1500)):
        corr = 10 * k + 1
        ev += [
            X("user_annotation", f"ProfilerStep#{k + 1}", off, 1500, pid=10, tid=10),
            X("cuda_runtime", "cudaLaunchKernel", off + 50, 5, pid=10, tid=10, correlation=corr),
            X("kernel", "gemm", off + 100, 1200, pid=0, tid=7, device=0, stream=7, correlation=corr),
        ]
    tok, pos = [50000, 512], [2048, 512]
    ev += [_emb(10, tok, [4, 128], 1), _emb(20, pos, [4, 128], 2), _emb(30, tok, [4, 128], 3)]
    ev += [_emb(40, pos, [4, 128], 4), _emb(1510, tok, [1, 100], 5), _emb(1520, [10, 4], [7], 6)]
    if rank == 0:
        ev += [
            {"ph": "C", "name": "GPU Power", "pid": 10, "tid": 10, "ts": t, "args": {"power_w": w}}
            for t, w in ((0, 300), (750, 500), (3000, 100))
        ]
    return ev


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("tput")
    for r in (0, 1):
        write_trace(
            d / "job" / f"r{r}.json",
            _events(r),
            deviceProperties=H100,
            distributedInfo={"backend": "nccl", "rank": r, "world_size": 2},
        )
    lk = Lake(d / "lake")
    assert [x.status for x in ingest_paths([d / "job"], lk)] == ["ok", "ok"]
    return lk


def test_tokens_from_embedding_shapes(job):
    rows = {(r["rank"], r["step"]): r for r in run(connect(job), "mfu").to_dicts()}
    for rank in (0, 1):
        s1, s2 = rows[(rank, 1)], rows[(rank, 2)]
        assert (s1["tokens_per_step"], s1["tokens_source"]) == (1024, "embedding")
        assert (s2["tokens_per_step"], s2["tokens_source"]) == (100, "embedding")
        assert s1["tokens_per_s"] == pytest.approx(1024 / 1.5e-3) and s1["palm_mfu_pct"] is None
    doc = analyze(job)
    (t,) = doc["throughput"]
    assert t["tokens_source"] == "embedding" and t["world_size"] == 2
    # per rank: (1024 + 100) tokens over 3000 µs; the job: x 2 ranks
    assert t["tokens_per_s_per_gpu"] == pytest.approx(1124 / 3e-3)
    assert t["tokens_per_s"] == pytest.approx(2 * 1124 / 3e-3)
    assert any("aten::embedding indices" in n for n in doc["notes"])


def test_global_batch_and_palm_mfu(job):
    r = CliRunner().invoke(
        app,
        ["analyze", "--lake", str(job.root), "--json", "--global-batch", "8", "--seq-len", "512", "--params",
         "1e8", "--layers", "2", "--heads", "8", "--head-dim", "64", "--gpu-hour-cost", "3"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (t,) = doc["throughput"]
    assert t["tokens_source"] == "global_batch" and t["tokens_per_step"] == 2048
    assert t["tokens_per_s_per_gpu"] == pytest.approx(2048 / 1.5e-3)
    assert t["tokens_per_s"] == pytest.approx(2 * 2048 / 1.5e-3)
    assert t["palm_flops_per_token"] == 606_291_456
    assert t["palm_mfu_pct"] == pytest.approx(100 * 606_291_456 * 2048 / (1.5e-3 * 989.4e12))
    assert doc["model_inputs"]["global_tokens_per_step"] == 4096 and doc["model_inputs"]["gpu_hour_cost"] == 3
    timed = [f for f in doc["findings"] if f["per_step_ns"] is not None]
    assert timed  # the idle before each GEMM: 100 µs + 200 µs of a 1500 µs step
    for f in timed:
        hours = f["per_step_ns"] * 1e-9 * 1000 * 2 / 3600
        assert f["gpu_hours_per_1000_steps"] == pytest.approx(hours)
        assert f["cost_per_1000_steps"] == pytest.approx(3 * hours)


def test_model_option_errors_are_usage_errors(job):
    for extra in (["--global-batch", "8"], ["--params", "1e8"], ["--gpu-hour-cost", "-1"]):
        r = CliRunner().invoke(app, ["analyze", "--lake", str(job.root), "--json", *extra])
        assert r.exit_code == 2, (extra, r.output)


def test_energy_per_step_and_token(job):
    rows = {(r["rank"], r["step"]): r for r in run(connect(job), "energy").to_dicts()}
    assert set(rows) == {(0, 1), (0, 2)}  # rank 1 has no power counter
    assert rows[(0, 1)]["energy_j"] == pytest.approx(0.6) and rows[(0, 1)]["mean_power_w"] == pytest.approx(
        400
    )
    assert rows[(0, 2)]["energy_j"] == pytest.approx(0.75) and rows[(0, 2)]["covered_pct"] == pytest.approx(
        100
    )
    (e,) = analyze(job)["energy"]
    # median over the two rank-steps; per token: by the median tokens per rank and step (1024, 100 -> 562)
    assert e["energy_j_per_step"] == pytest.approx(0.675)
    assert e["energy_j_per_token"] == pytest.approx(0.675 / 562)


def test_bert_tokens_from_its_embeddings(tmp_path):
    p = corpus("tracelens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")
    ev = json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
    emb = [e["args"]["Input Dims"] for e in ev if e.get("name") == "aten::embedding"]
    assert len(emb) == 3 and {json.dumps(d[1]) for d in emb} == {"[1, 141]"}
    assert len({json.dumps(d[0]) for d in emb}) == 3  # three tables
    lk = Lake(tmp_path / "lake")
    ingest_paths([p], lk)
    (row,) = run(connect(lk), "mfu").to_dicts()
    assert (row["tokens_per_step"], row["tokens_source"]) == (141, "embedding")
    assert row["tokens_per_s"] == pytest.approx(141 / (row["step_ns"] * 1e-9))


# ---------------------------------------------------------------- hostile inputs (attack run)


@pytest.mark.parametrize(
    "extra",
    [
        ["--global-batch", "8", "--seq-len", "-5"],
        ["--global-batch", "8", "--seq-len", "0"],
        ["--params", "nan", "--layers", "2", "--heads", "8", "--head-dim", "64", "--seq-len", "512"],
        ["--params", "inf", "--layers", "2", "--heads", "8", "--head-dim", "64", "--seq-len", "512"],
        ["--seq-len", "512"],  # would be silently ignored
        ["--tokens-per-step", "100", "--seq-len", "512"],
    ],
)
def test_bad_model_options_are_usage_errors(job, extra):
    r = CliRunner().invoke(app, ["analyze", "--lake", str(job.root), "--json", *extra])
    assert r.exit_code == 2 and "Traceback" not in r.output, (extra, r.output)


def test_huge_tokens_give_valid_json(job):
    r = CliRunner().invoke(app, ["analyze", "--lake", str(job.root), "--json", "--tokens-per-step", "1e308"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    (t,) = doc["throughput"]
    assert t["tokens_per_s_per_gpu"] is None and t["tokens_per_s"] is None  # past the float range: null


@pytest.mark.parametrize(
    "idx, want",
    [
        ([4, 128], 512),
        ([2**40, 2**40], 2.0**80),  # absurd, but no INT64 overflow
        ([-4, 128], None),
        ([0, 128], None),
        ([True, 128], None),
        (["4", "128"], None),
        ([4.5, 128], None),
        ([4, 128, 2], None),
    ],
)
def test_embedding_indices_must_be_positive_integers(tmp_path, idx, want):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1500, pid=10, tid=10),
        X("cuda_runtime", "cudaLaunchKernel", 50, 5, pid=10, tid=10, correlation=1),
        X("kernel", "gemm", 100, 1200, pid=0, tid=7, device=0, stream=7, correlation=1),
        _emb(10, [50000, 512], idx, 1),
    ]
    write_trace(tmp_path / "job" / "r0.json", ev, deviceProperties=H100)
    lk = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "job"], lk)
    (row,) = run(connect(lk), "mfu").to_dicts()
    assert row["tokens_per_step"] == want


def test_negative_power_is_not_a_reading(tmp_path):
    """-300 W at 0 then 100 W at 750 and 500 W at 1500 (µs) over the step [0, 1500): the negative
    sample is dropped, so the step holds 100 W from 750 to 1500: 0.075 J over half the window."""
    ev = _events(1)[:3] + [
        {"ph": "C", "name": "GPU Power", "pid": 10, "tid": 10, "ts": t, "args": {"power_w": w}}
        for t, w in ((0, -300), (750, 100), (1500, 500))
    ]
    ev[0]["dur"] = 1500
    write_trace(tmp_path / "job" / "r0.json", ev, deviceProperties=H100)
    lk = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "job"], lk)
    (row,) = run(connect(lk), "energy").to_dicts()
    assert row["energy_j"] == pytest.approx(0.075) and row["covered_pct"] == pytest.approx(50)
