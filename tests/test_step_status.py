"""Step completeness (queries/step_status.sql): only work cut off at the trace's end makes a step
incomplete. A launch without GPU work counts only when no later launch of the same source file
and rank (by launch start) has GPU work; launches that never produce a GPU record (cuDNN's
cudaMemsetAsync calls) earlier in the trace leave their step complete.

Hand-made trace (times in µs), rank 0, one file:
  ProfilerStep#1 [1000, 2000):
    cudaLaunchKernel  1010 corr 1 -> kernel [1100, 1200)
    cudaMemsetAsync   1020 corr 2 -> no GPU record (cuDNN-style)
    cudaLaunchKernel  1030 corr 3 -> kernel [1200, 1300)
    cudaMemcpyAsync   1040 corr 4 -> memcpy [1300, 1350)
    cudaDeviceSynchronize 1050 corr 9 (not a launch call: not counted)
    launches 4, without GPU work 1 (corr 2, followed by corr 3 and 4 that have GPU work): cut off 0
    -> complete
  ProfilerStep#2 [2000, 3000):
    cudaMemsetAsync   2005 corr 6 -> no GPU record, but corr 5 after it has one: not cut off
    cudaLaunchKernel  2010 corr 5 -> kernel [2100, 2200): the last launch with GPU work
    cudaLaunchKernel  2030 corr 7 -> none   (after 2010: cut off)
    cudaLaunchKernel  2040 corr 8 -> none   (after 2010: cut off)
    launches 4, without GPU work 3, cut off 2 -> incomplete, and it is the last step
Rank 1, one file, ProfilerStep#1 [1000, 2000) with one cudaLaunchKernel (1010, corr 1) and no GPU
work at all in the file: nothing was recorded after it, so it is cut off -> incomplete.
Rank 0's step 1 window in step_time: [1000, max(2000, 1350)) = 1000 µs; step 2: [2000, max(3000,
2200)) = 1000 µs; the verdict leaves out step 2 of rank 0 only (rank 1 has no GPU work, so no
step_time row).

Real traces (counted in the test from the raw JSON with the json module, not from tracelake):
HTA's tests/data/nccl_parser_config/nccl_data.json.gz (3 ProfilerSteps, 1259 launch calls each,
one cudaMemsetAsync per step without a GPU record, all before the last launch with GPU work) and
TraceLens's tests/traces/h100 BERT trace (1 step, 83 launch calls, 22 cudaMemsetAsync without
GPU records, none after the last launch with GPU work). Every step is complete, and the verdict
lists none of them as an excluded "incomplete" step. (HTA's ns_resolution_trace, 47 such memsets
in each of its 5 steps, is not in ../shared/corpus.)
"""

from __future__ import annotations

import pytest
from conftest import X, corpus, raw_step_counts, write_trace

from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

US = 1000  # ns per µs


def gpu(cat, name, ts, dur, corr, stream=7):
    return X(cat, name, ts, dur, pid=0, tid=stream, device=0, stream=stream, correlation=corr)


def rt(name, ts, corr):
    return X("cuda_runtime", name, ts, 5, pid=10, tid=10, correlation=corr)


def rank0_events():
    return [
        X("user_annotation", "ProfilerStep#1", 1000, 1000, pid=10, tid=10),
        X("user_annotation", "ProfilerStep#2", 2000, 1000, pid=10, tid=10),
        rt("cudaLaunchKernel", 1010, 1),
        rt("cudaMemsetAsync", 1020, 2),
        rt("cudaLaunchKernel", 1030, 3),
        rt("cudaMemcpyAsync", 1040, 4),
        rt("cudaDeviceSynchronize", 1050, 9),
        gpu("kernel", "k1", 1100, 100, 1),
        gpu("kernel", "k3", 1200, 100, 3),
        gpu("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 1300, 50, 4),
        rt("cudaMemsetAsync", 2005, 6),
        rt("cudaLaunchKernel", 2010, 5),
        rt("cudaLaunchKernel", 2030, 7),
        rt("cudaLaunchKernel", 2040, 8),
        gpu("kernel", "k5", 2100, 100, 5),
    ]


def rank1_events():
    return [
        X("user_annotation", "ProfilerStep#1", 1000, 1000, pid=10, tid=10),
        rt("cudaLaunchKernel", 1010, 1),
    ]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    d = tmp_path_factory.mktemp("steps")
    write_trace(d / "job" / "r0.json", rank0_events(), distributedInfo={"rank": 0, "world_size": 2})
    write_trace(d / "job" / "r1.json", rank1_events(), distributedInfo={"rank": 1, "world_size": 2})
    lk = Lake(d / "lake")
    assert [r.status for r in ingest_paths([d / "job"], lk)] == ["ok", "ok"]
    return lk


def test_only_work_cut_off_at_the_end_makes_a_step_incomplete(lake):
    st = {(r["rank"], r["step"]): r for r in run(connect(lake), "step_status").to_dicts()}
    cols = ("launches", "launches_without_gpu_work", "launches_cut_off", "complete", "is_last")
    assert tuple(st[(0, 1)][c] for c in cols) == (4, 1, 0, True, False)
    assert tuple(st[(0, 2)][c] for c in cols) == (4, 3, 2, False, True)
    assert tuple(st[(1, 1)][c] for c in cols) == (1, 1, 1, False, True)
    assert set(st) == {(0, 1), (0, 2), (1, 1)}


def test_verdict_leaves_out_only_the_cut_off_step(lake):
    (v,) = analyze(lake)["verdicts"]
    assert v["excluded_steps"] == [{"step": 2, "rank": 0, "step_ns": 1000 * US, "why": "incomplete"}]


# ------------------------------------------------------------------ real traces

REAL = {
    "nccl_data": ("hta", "tests", "data", "nccl_parser_config", "nccl_data.json.gz"),
    "bert_h100": ("tracelens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz"),
}


@pytest.fixture(scope="module", params=sorted(REAL))
def real(request, tmp_path_factory):
    path = corpus(*REAL[request.param])
    lk = Lake(tmp_path_factory.mktemp(request.param))
    assert [r.status for r in ingest_paths([path], lk, run=request.param)] == ["ok"]
    return request.param, raw_step_counts(path), lk


def test_memsets_without_gpu_records_leave_steps_complete(real):
    name, raw, lk = real
    # the raw files: cuDNN's memsets have no GPU record in every step, none of them at the end
    expected = {"nccl_data": {4: (1259, 1), 5: (1259, 1), 6: (1259, 1)}, "bert_h100": {6: (83, 22)}}[name]
    assert {n: (v[0], v[1]) for n, v in raw.items()} == expected
    assert all(v[2] == {"cudaMemsetAsync"} and v[3] == 0 for v in raw.values())
    st = run(connect(lk), "step_status").to_dicts()
    assert {r["step"]: (r["launches"], r["launches_without_gpu_work"]) for r in st} == expected
    assert all(r["launches_cut_off"] == 0 and r["complete"] is True for r in st)


def test_the_verdict_keeps_those_steps(real):
    name, raw, lk = real
    res = analyze(lk)
    assert res["runs"][0]["incomplete_steps"] == []
    (v,) = res["verdicts"]
    assert v["basis"] == "steps" and [e for e in v["excluded_steps"] if e["why"] == "incomplete"] == []
    assert v["steps_used"] == len(raw)
