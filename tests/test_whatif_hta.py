"""The critical path against HolisticTraceAnalysis 0.5's CriticalPathAnalysis, on HTA's own
critical-path test traces (../shared/corpus/hta/tests/data/critical_path), each with the
annotation and instance HTA's tests use (tests/test_critical_path_analysis.py upstream).

HTA's path is read from its CPGraph: the GPU kernels on it (the kernel edges, from a GPU event's
start node to its end node), and its edge weights by type. The window is HTA's path's own span
(its first node to its last). What must agree, and does (docs/whatif.md "Against HTA"):
- the same GPU kernels on the path, and the same GPU time;
- the same launch delays (KERNEL_LAUNCH_DELAY) and kernel-to-kernel gaps (KERNEL_KERNEL_DELAY;
  our cross_stream edge is an HTA sync edge of weight 0 plus the measured event-wait delay);
- everything else is host time, where the totals differ by design: HTA gives weight 0 to the
  gaps between top-level host ops (DEPENDENCY edges) and to blocking calls, so its total is
  shorter than the window; ours adds up to the window. The difference is all host time.
"""

from __future__ import annotations

import logging
import os

import polars as pl
import pytest
from conftest import corpus

from pipeline import query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.whatif import build, measured
from pipeline.whatif.critical import path_in_window
from pipeline.whatif.replay import replay

CASES = [
    ("simple_add", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("alexnet", "[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1),
    ("cuda_event_sync", "ProfilerStep", 0),
    ("cuda_event_sync_multi_stream", "", None),
]
GPU = ["compute", "communication", "memory", "unknown"]


def _hta(path, annotation, instance):
    os.environ["CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE"] = "1"
    logging.disable(logging.WARNING)
    from hta.analyzers.critical_path_analysis import CPEdgeType
    from hta.trace_analysis import TraceAnalysis

    t = TraceAnalysis(trace_dir=str(path))
    g, ok = t.critical_path_analysis(rank=0, annotation=annotation, instance_id=instance)
    assert ok
    df = t.t.get_trace(0)
    nodes = g.critical_path_nodes
    edges = [g.edges[u, v]["object"] for u, v in zip(nodes, nodes[1:])]
    kernels, gpu_us = set(), 0
    by_type = {k: 0 for k in CPEdgeType}
    for e in edges:
        a, b = g.node_list[e.begin], g.node_list[e.end]
        by_type[e.type] += e.weight
        if a.ev_idx == b.ev_idx and df.loc[a.ev_idx, "stream"] != -1:
            kernels.add(int(df.loc[a.ev_idx, "ts"]))
            gpu_us += e.weight
    first, last = g.node_list[nodes[0]].ts, g.node_list[nodes[-1]].ts
    return {
        "first": int(first),
        "last": int(last),
        "total": int(sum(e.weight for e in edges)),
        "kernels": kernels,
        "gpu": int(gpu_us),
        "launch": int(by_type[CPEdgeType.KERNEL_LAUNCH_DELAY]),
        "kk": int(by_type[CPEdgeType.KERNEL_KERNEL_DELAY]),
    }


@pytest.mark.parametrize("case,annotation,instance", CASES)
def test_critical_path_agrees_with_hta(case, annotation, instance, tmp_path):
    src = corpus("hta", "tests", "data", "critical_path", case)
    h = _hta(src, annotation, instance)
    lk = Lake(tmp_path / "lake")
    ingest_paths([src], lk)
    con = query.connect(lk)
    (run,) = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM sources").fetchall()]
    g = build(con, run)
    d = measured(g)
    t = replay(g, d)
    # HTA's times are µs from the trace's first event
    (abs0,) = con.execute(
        "SELECT least((SELECT min(start_ns) FROM cpu_ops), (SELECT min(start_ns) FROM gpu_activities))"
    ).fetchall()[0]
    shift = abs0 - g.t0
    p = path_in_window(g, d, t, 0, h["first"] * 1000 + shift, h["last"] * 1000 + shift)
    us = {k: int(v) // 1000 for k, v in p.group_by("kind").agg(pl.col("dur_ns").sum()).iter_rows()}
    ours_kernels = {int((s - shift) // 1000) for k, s in zip(p["kind"], p["start_ns"]) if k in GPU}
    assert ours_kernels == h["kernels"]
    assert sum(us.get(k, 0) for k in GPU) == h["gpu"]
    assert us.get("launch", 0) == h["launch"]
    assert abs(us.get("gpu_gap", 0) + us.get("cross_stream", 0) - h["kk"]) <= 1
    # ours adds up to its window; HTA's total is shorter by the host time it weighs 0
    total = int(p["dur_ns"].sum()) // 1000
    host = sum(us.get(k, 0) for k in ("host", "sync", "data_loading", "untraced"))
    assert abs((total - host) - (h["gpu"] + h["launch"] + h["kk"])) <= 1  # the rest is host time
    assert total <= h["last"] - h["first"] and total >= h["total"]
