"""Agreement with HTA's temporal breakdown and overlap on every corpus trace HTA 0.5.0 can read,
and where the numbers differ, proof of why.

For each file the test computes, from the raw JSON with the standard json module (independent of
tracelake's parser), the breakdown twice with one brute-force routine:
  hta_like  - with HTA's three quirks switched on: (1) float timestamps rounded to whole µs,
              start up and end down (hta/common/trace_parser.py round_down_time_stamps), so short
              kernels shrink or vanish; (2) cuda_sync events (Stream/Event/Context Sync) counted as
              GPU busy time; (3) any event with an args.stream, such as a Triton launcher cpu_op,
              counted as GPU work; (4) intervals that rounding made negative kept in its merge;
  exact     - with the three switched off (exact ns, waits are not work, host ops are not GPU work).
Both classify with HTA's own get_kernel_type; exact also takes tracelake's one rule beyond the
name regex that these files exercise: a kernel launched by a PyTorch symmetric-memory collective
(its External id is a `symm_mem::` op's, e.g. symm_mem::multimem_all_reduce_ in TraceLens's B200
trace, whose multimem_all_reduce_kernel no NCCL pattern names) is communication
(pipeline/catalog/classification.toml comm_host_ops). The test asserts hta_like equals HTA's
output exactly (so the quirks explain every difference) and exact equals tracelake's numbers
exactly (so tracelake computes the same thing without them).
HTA cannot read some corpus files at all (CPU-only traces, the 2021 bare-array format, MI300 files
that overflow its int16 columns); tracelake ingests them (tests/test_corpus.py).
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import warnings
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from conftest import corpus, union_ns

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

hta_ta = pytest.importorskip("hta.trace_analysis", reason="install the test extra: pip install -e '.[test]'")
from hta.utils.utils import get_kernel_type  # noqa: E402

FILES = [
    ("hta", "tests", "data", "amd_trace", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
    ("hta", "tests", "data", "call_stack", "backward_thread.json"),
    ("hta", "tests", "data", "critical_path", "alexnet", "benchmark_result_2869224_1695835535_trace.json.gz"),
    ("hta", "tests", "data", "critical_path", "cuda_event_sync", "event_sync_trace.json.gz"),
    ("hta", "tests", "data", "critical_path", "cuda_event_sync_multi_stream", "event_sync_trace.json.gz"),
    (
        "hta",
        "tests",
        "data",
        "critical_path",
        "simple_add",
        "benchmark_result_493459_1694039959_trace.json.gz",
    ),
    ("hta", "tests", "data", "df_index_resolver", "df_index_resolver.json.gz"),
    ("hta", "tests", "data", "execution_trace", "benchmark_simple_add_trace.json.gz"),
    ("hta", "tests", "data", "mtia_inference_trace", "mtia_inference_rank_0.json.gz"),
    ("hta", "tests", "data", "nccl_parser_config", "nccl_data.json.gz"),
    ("hta", "tests", "data", "trace_compare", "base", "base.json.gz"),
    ("hta", "tests", "data", "trace_diff", "control", "control.json.gz"),
    ("hta", "tests", "data", "trace_diff", "test", "test.json.gz"),
    ("hta", "tests", "data", "trace_file_list", "inference_rank_1.json.gz"),
    ("hta", "tests", "data", "triton_example", "triton_example.json.gz"),
    ("hta", "tests", "data", "with_gpu_user_annotation", "step_based_trace_2543932.json.gz"),
    ("param", "et_replay", "tests", "inputs", "linear_kineto.json.gz"),
    ("param", "et_replay", "tests", "inputs", "resnet_kineto.json.gz"),
    ("tracelens", "tests", "traces", "b200", "eager_trace.json.gz"),
    ("tracelens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz"),
    ("tracelens", "tests", "traces", "inference", "sglang_decode", "sglang_Qwen3-8B_decode.json.gz"),
    ("tracelens", "tests", "traces", "inference", "vllm_decode_full", "graph_execution.json.gz"),
    ("tracelens", "tests", "traces", "mi210", "gpu_only_trace", "gpu_only_trace.json.gz"),
    ("tracelens", "tests", "traces", "mi300", "ddp_resnet18_no_pool", "train_resnet18.json.gz"),
    ("kineto", "tb_plugin", "samples", "resnet50_num_workers_0", "worker0.1623143089861.pt.trace.json.gz"),
]
GPU_CATS = {
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "mtia_ccp_events",
    "cuda_sync",
}


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    d = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return d["traceEvents"]


def _hta_merged(ivs):
    """HTA's merge_kernel_intervals (hta/utils/utils.py): sort by start; a new group starts when a
    start is later than every earlier end; a group spans min start to max end. Intervals with
    end < start (made by its rounding) are kept, so a lone one counts negative time."""
    groups, cm = [], None
    for s, e in sorted(ivs):
        if cm is None or s > cm:
            groups.append([s, e])
        else:
            groups[-1][1] = max(groups[-1][1], e)
        cm = e if cm is None else max(cm, e)
    return groups


def brute(events: list[dict], quirks: bool) -> dict:
    """(idle, compute, non_compute, span) and overlap % in ns over HTA's window."""
    x = [e for e in events if e.get("ph") == "X" and e.get("cat") is not None and "dur" in e and "ts" in e]
    step_evs = [e for e in x if str(e.get("name", "")).startswith("ProfilerStep#")]
    steps = sorted(float(e["ts"]) for e in step_evs if e["cat"] != "gpu_user_annotation")
    args = lambda e: e.get("args") or {}  # noqa: E731
    has_stream = lambda e: isinstance(args(e).get("stream"), int) and args(e)["stream"] >= 0  # noqa: E731
    gpu = [
        e
        for e in x
        if (e["cat"] in GPU_CATS or (quirks and has_stream(e)))
        and has_stream(e)
        and (quirks or e["cat"] != "cuda_sync")
    ]
    # HTA's load-time window (2+ distinct ProfilerStep names): CPU events before the last step, GPU events
    # they launched
    if len({e["name"] for e in step_evs}) >= 2:
        kept = {args(e).get("correlation") for e in x if not has_stream(e) and float(e["ts"]) < steps[-1]}
        gpu = [e for e in gpu if args(e).get("correlation") in kept]
    symm = {args(e).get("External id") for e in x if str(e.get("name", "")).startswith("symm_mem::")}
    rows = []
    for e in gpu:
        if quirks:  # HTA: float µs, ts = ceil(ts), end = floor(ts + dur), in float arithmetic
            ts, dur = float(e["ts"]), float(e["dur"])
            s, en = math.ceil(ts) * 1000, math.floor(ts + dur) * 1000
        else:
            s = int(Decimal(str(e["ts"])) * 1000)
            en = s + int(Decimal(str(e["dur"])) * 1000)
        kind = get_kernel_type(e["name"])
        if not quirks and e["cat"] == "kernel" and args(e).get("External id") in symm - {None}:
            kind = "COMMUNICATION"
        rows.append((s, en, kind))
    comp = [(s, en) for s, en, k in rows if k == "COMPUTATION" and en > s]
    comm = [(s, en) for s, en, k in rows if k == "COMMUNICATION" and en > s]
    if quirks:  # (4) HTA merges intervals its rounding made negative, and spans first to last group
        g = _hta_merged([(s, en) for s, en, _ in rows])
        span, busy = g[-1][1] - g[0][0], sum(e - s for s, e in g)
        compute = sum(e - s for s, e in _hta_merged([(s, en) for s, en, k in rows if k == "COMPUTATION"]))
    else:
        span = max(en for _, en, _ in rows) - min(s for s, _, _ in rows)
        busy = union_ns([(s, en) for s, en, _ in rows if en > s])
        compute = union_ns(comp)
    both = union_ns(comp) + union_ns(comm) - union_ns(comp + comm)
    return {
        "idle": span - busy,
        "compute": compute,
        "non_compute": span - compute - (span - busy),
        "span": span,
        "overlap_pct": round(100 * both / union_ns(comm), 2) if comm and union_ns(comm) else None,
    }


@pytest.fixture(scope="module")
def hta_quiet():
    warnings.filterwarnings("ignore")
    from hta.configs.config import logger

    logger.setLevel(logging.CRITICAL)


@pytest.mark.parametrize("parts", FILES, ids=lambda p: p[-1][:40])
def test_matches_hta_with_quirks_explained(parts, tmp_path, hta_quiet):
    path = corpus(*parts)
    d = tmp_path / "t"
    d.mkdir()
    os.symlink(path, d / path.name)
    ta = hta_ta.TraceAnalysis(trace_dir=str(d))
    t = ta.get_temporal_breakdown(visualize=False).iloc[0]
    theirs = {
        "idle": int(t["idle_time(us)"]) * 1000,
        "compute": int(t["compute_time(us)"]) * 1000,
        "non_compute": int(t["non_compute_time(us)"]) * 1000,
        "span": int(t["kernel_time(us)"]) * 1000,
    }
    events = _events(path)
    hta_like, exact = brute(events, quirks=True), brute(events, quirks=False)
    # 1. HTA's quirks reproduce HTA's numbers exactly
    assert {k: hta_like[k] for k in theirs} == theirs
    if exact["overlap_pct"] is not None:
        ov = ta.get_comm_comp_overlap(visualize=False)
        assert float(ov["comp_comm_overlap_pctg"].iloc[0]) == hta_like["overlap_pct"]
    # 2. without the quirks, the same routine gives tracelake's numbers exactly
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([path], lake, run="x")
    assert r.status == "ok"
    (o,) = run(connect(lake, window="hta"), "breakdown").filter(pl.col("level") == "rank").to_dicts()
    ours = {
        "idle": o["gpu_idle_ns"],
        "compute": o["compute_ns"],
        "non_compute": o["span_ns"] - o["compute_ns"] - o["gpu_idle_ns"],
        "span": o["span_ns"],
    }
    assert ours == {k: exact[k] for k in ours}
    assert (
        round(o["comm_comp_overlap_pct"], 2) if o["comm_comp_overlap_pct"] is not None else None
    ) == exact["overlap_pct"]
