"""Property test: the interval SQL (queries/breakdown.sql) against a brute-force reference that
walks every nanosecond of small random interval sets."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st

from pipeline.lake import Lake
from pipeline.query import connect, run

CATS = ["compute", "communication", "memory", "unknown"]
KIND = {"compute": "kernel", "communication": "kernel", "memory": "memcpy", "unknown": "unknown"}

interval = st.tuples(st.integers(0, 60), st.integers(0, 15), st.sampled_from(CATS), st.integers(0, 2))


def brute(ivs):
    t0 = min(s for s, _, _, _ in ivs)
    t1 = max(s + d for s, d, _, _ in ivs)
    out = dict(span=t1 - t0, busy=0, compute=0, comm=0, memory=0, overlap=0, exposed_comm=0, exposed_memory=0)
    for t in range(t0, t1):
        active = {c for s, d, c, _ in ivs if s <= t < s + d}
        out["busy"] += bool(active)
        out["compute"] += "compute" in active
        out["comm"] += "communication" in active
        out["memory"] += "memory" in active
        out["overlap"] += "compute" in active and "communication" in active
        out["exposed_comm"] += "communication" in active and "compute" not in active
        out["exposed_memory"] += "memory" in active and not active & {"compute", "communication"}
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(interval, min_size=1, max_size=25), st.integers(-80, 80), st.booleans())
def test_breakdown_matches_brute_force(ivs, shift, materialize):
    """Two ranks with the same intervals, the second shifted in time (the sweep runs over all ranks
    in one sort), on plain and materialized views."""
    with tempfile.TemporaryDirectory() as d:
        lake = Lake(d)
        lake.ensure()
        n = len(ivs)
        for rank, dt in ((0, 0), (1, shift)):
            sid = f"s{rank}"
            lake.write_source("r", sid, {"gpu_activities": {
                "run_id": ["r"] * n, "source_id": [sid] * n, "rank": [rank] * n, "device": [0] * n,
                "stream": [st_ for _, _, _, st_ in ivs], "kind": [KIND[c] for _, _, c, _ in ivs], "category": [c for _, _, c, _ in ivs],
                "classified_by": ["default"] * n, "name": ["k"] * n, "start_ns": [s + dt for s, _, _, _ in ivs],
                "end_ns": [s + du + dt for s, du, _, _ in ivs], "dur_ns": [du for _, du, _, _ in ivs], "event_index": list(range(n)),
            }}, {"source_id": sid, "run_id": "r", "path": f"/x{rank}", "format": "kineto_json", "content_sha256": "0", "size_bytes": 0,
                 "status": "ok", "schema_version": 1, "tracelake_version": "t", "ingested_at_ns": 0})
        rows = run(connect(lake, materialize=materialize), "breakdown").to_dicts()
    assert [r["rank"] for r in rows] == [0, 1]
    b = brute(ivs)
    for row in rows:
        _check(row, b)


def _check(row, b):
    assert row["span_ns"] == b["span"]
    assert row["gpu_busy_ns"] == b["busy"] and row["gpu_idle_ns"] == b["span"] - b["busy"]
    assert (row["compute_ns"], row["comm_ns"], row["memory_ns"]) == (b["compute"], b["comm"], b["memory"])
    assert (row["overlap_ns"], row["exposed_comm_ns"], row["exposed_memory_ns"]) == (b["overlap"], b["exposed_comm"], b["exposed_memory"])
    assert row["compute_ns"] + row["exposed_comm_ns"] + row["exposed_memory_ns"] + row["exposed_unknown_ns"] + row["gpu_idle_ns"] == row["span_ns"]
    assert row["idle_host_wait_ns"] + row["idle_kernel_wait_ns"] + row["idle_other_ns"] + row["idle_unreliable_ns"] == row["gpu_idle_ns"]
