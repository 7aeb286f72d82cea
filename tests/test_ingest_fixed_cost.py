"""The per-file fixed costs of ingest cut for archives of small traces (issue 37 item 1) change no
row: real corpus Kineto traces give the same rows in every table whether ingested through the
fast paths (times in one Arrow decimal cast, the input shapes' texts as an Arrow array built from
buffers, the tables' id columns and absolute times in Arrow) or through the general ones those
fast paths stand in front of (timeparse's polars conversion, the texts split in Rust, the
polars-frame tables of StreamParsed.tables(arrow=False)), which the code keeps for the inputs the
fast paths refuse; and a trace spills its tables to a scratch directory only when it is large
enough to spill, which is then removed.

Expected values: the rows of the general paths, read back from every Parquet file of the lake
with pyarrow (no listing or manifest of the code under test)."""

from __future__ import annotations

import io
import json
import shutil

import polars as pl
import pytest
from conftest import X, corpus
from test_hold import raw_rows

from pipeline import timeparse
from pipeline.ingest import hold, ingest_paths
from pipeline.ingest.kineto import api as kineto_api
from pipeline.ingest.kineto import result, summary, values
from pipeline.lake import Lake

# small traces with GPU annotations, collectives, process groups, AMD devices, steps, large integers,
# no GPU
TRACES = [
    corpus("hta", "tests", "data", "trace_filter", "sampled_rank-0.json.gz"),
    corpus("hta", "tests", "data", "amd_trace", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
    corpus("hta", "tests", "data", "large_integer_trace", "rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"),
    corpus("hta", "tests", "data", "cpu_only", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
    corpus("hta", "tests", "data", "with_gpu_user_annotation", "step_based_trace_2543932.json.gz"),
    corpus(
        "hta",
        "tests",
        "data",
        "critical_path",
        "alexnet",
        "benchmark_result_2869224_1695835535_trace.json.gz",
    ),
]


def _general_paths(monkeypatch) -> None:
    """Every fast path off: what the code did before them."""
    monkeypatch.setattr(timeparse, "_arrow_decimal", lambda raws: None)
    general_texts = values._texts

    def texts(raws):  # the split in Rust, as for bytes that are not UTF-8
        if not raws:
            return general_texts(raws)
        s = pl.Series([b"\x00".join(raws).decode("utf-8", "replace")], dtype=pl.String).str.split("\x00")
        s = s.explode()
        return s.replace("", None) if s.str.len_bytes().min() == 0 else s

    monkeypatch.setattr(values, "_texts", texts)
    import pipeline.ingest.kineto.columns as columns

    monkeypatch.setattr(columns, "_texts", texts)
    tables = result.StreamParsed.tables

    def polars_tables(self, ids=None, arrow=False):
        if not arrow:
            return tables(self, ids, arrow)
        frames = tables(self, ids, False)

        def arrowed(v):
            if callable(v):
                return lambda: [f.to_arrow() for f in v()]
            return (f.to_arrow() for f in v)

        return {t: arrowed(v) for t, v in frames.items()}

    monkeypatch.setattr(result.StreamParsed, "tables", polars_tables)


@pytest.mark.parametrize("held", [False, True])
def test_the_fast_paths_write_the_rows_of_the_general_ones(tmp_path, monkeypatch, held):
    src = tmp_path / "job"
    src.mkdir()
    for i, t in enumerate(TRACES):
        shutil.copy(t, src / f"t{i}_{t.name}")
    kw = {"jobs": 1, "compact": held}
    if held:  # every source held in memory and written into the run's generation (hold.py)
        monkeypatch.setattr(hold.compaction, "AUTO_MIN_SOURCES", 1)
        monkeypatch.setattr("pipeline.ingest.Pending", lambda lake: hold.Pending(lake, 1))
        kw["run"] = "all"
    fast = ingest_paths([src], Lake(tmp_path / "fast"), **kw)
    with monkeypatch.context() as m:
        _general_paths(m)
        general = ingest_paths([src], Lake(tmp_path / "general"), **kw)
    assert [(r.path, r.status, r.run_id) for r in fast] == [(r.path, r.status, r.run_id) for r in general]
    assert {r.status for r in fast} == {"ok"}
    got, want = raw_rows(tmp_path / "fast"), raw_rows(tmp_path / "general")
    assert got == want
    for t in (
        "gpu_activities",
        "cpu_ops",
        "steps",
        "devices",
        "annotations",
        "collectives",
        "process_groups",
    ):
        assert want[t], t  # each table the traces fill is compared, not two empty lists


def test_a_scratch_directory_only_for_a_trace_that_spills(tmp_path, monkeypatch):
    made = []
    scratch = Lake.scratch

    def counted(self):
        made.append(scratch(self))
        return made[-1]

    monkeypatch.setattr(Lake, "scratch", counted)
    assert ingest_paths([TRACES[0]], Lake(tmp_path / "a"), jobs=1)[0].status == "ok"
    assert made == []  # 4,855 events: held in memory
    monkeypatch.setattr(kineto_api, "SPOOL_BYTES", 0)  # every batch spilled
    assert ingest_paths([TRACES[0]], Lake(tmp_path / "b"), jobs=1)[0].status == "ok"
    assert len(made) == 1 and not made[0].exists()  # made at the first spill, removed after
    assert raw_rows(tmp_path / "a") == raw_rows(tmp_path / "b")


AR = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def _collective_rows(events: list[dict]) -> tuple[list, list]:
    """(the collectives rows of the ingest's Arrow path, StreamParsed.tables(arrow=True), which
    skips _collectives for a trace without communication kernels and collective ops; those of
    parse(), which always runs it), each as (op, timing_source, start_ns) sorted."""
    data = json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    s = kineto_api.parse_stream(io.BytesIO(data).read)
    try:
        chunks = s.tables({"run_id": "r", "source_id": "s", "rank": 0}, arrow=True)["collectives"]()
        fast = [(r["op"], r["timing_source"], r["start_ns"]) for c in chunks for r in c.to_pylist()]
    finally:
        s.close()
    full = kineto_api.parse(data).collectives
    return sorted(fast), sorted(
        zip(*(full.get_column(c).to_list() for c in ("op", "timing_source", "start_ns")))
    )


def test_collectives_skipped_only_for_a_trace_without_communication():
    """Hand-built traces (µs): a compute kernel alone has no collectives row on either path; an NCCL
    all-reduce kernel at 200 launched with no host record around it is one row named by its
    kernel (GPU timing, 200,000 ns), and a CPU-only record_param_comms 'allreduce' at 50 (gloo,
    no GPU) one row timed by the op (50,000 ns): the Arrow path's skip leaves both rows."""
    kernel = X("kernel", "volta_sgemm_128x64_nn", 100, 10, pid=0, tid=7, device=0, stream=7, correlation=1)
    launch = X("cuda_runtime", "cudaLaunchKernel", 90, 5, pid=10, tid=10, correlation=1)
    assert _collective_rows([kernel, launch]) == ([], [])
    nccl = X("kernel", AR, 200, 50, pid=0, tid=7, device=0, stream=7, correlation=2)
    want = [("all_reduce", "gpu_kernel", 200_000)]
    assert _collective_rows([kernel, launch, nccl]) == (want, want)
    rpc = X("cpu_op", "record_param_comms", 50, 20, pid=10, tid=10, **{"Collective name": "allreduce"})
    want = [("all_reduce", "cpu_op", 50_000)]
    assert _collective_rows([rpc]) == (want, want)


def test_summaries_without_rows_have_the_columns_of_those_with_rows():
    """steps, record_param_comms ops and comm host ops of a trace that has none (their frames made
    without running their plans) have the names and types these frames have on a real trace that
    has them all (HTA's sampled_rank-0: ProfilerStep windows and NCCL collectives)."""
    from isal import igzip

    s = kineto_api.parse_stream(io.BytesIO(igzip.decompress(TRACES[0].read_bytes())).read)
    try:
        full = {"steps": s.steps, "rpc": s.rpc, "hosts": s.comm_hosts}
    finally:
        s.close()
    empty = {
        "steps": summary.steps_frame([], 7),
        "rpc": summary.rpc_frame([], 7),
        "hosts": summary.hosts_frame([], 7),
    }
    for k, f in full.items():
        assert f.height > 0, k  # read by hand from the trace: 2 steps, NCCL ops with collective metadata
        assert empty[k].height == 0 and empty[k].schema == f.schema, k
