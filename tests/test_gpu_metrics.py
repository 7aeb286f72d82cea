"""nsys GPU metrics as direct evidence (queries/gpu_metrics.sql, pipeline/diagnosis/roofline.py
metrics_text).

No corpus export carries GPU_METRICS (../shared/corpus/nsys/PROVENANCE.md lists it absent in
each), so the input is a copy of nsys-ai's real 2-GPU export mfu_2gpu_before.sqlite with the two
tables nsys writes for `--gpu-metrics-devices` added (TARGET_INFO_GPU_METRICS, GPU_METRICS; the
columns of ../shared/reference/nsys.md "GPU metrics sampling"), holding hand-written samples
inside the export's window (META_DATA_EXPORT DERIVED_WINDOW_NS 60111418026-60411418026):
  GPU 0: SM Active [Throughput %] 40 and 60 (mean 50), Tensor Active [Throughput %] 10 and 30
         (mean 20), DRAM Read Bandwidth [Throughput %] 70;
  GPU 1: SM Active [Throughput %] 80, and a metric the query does not know (GPC Clock Frequency).
The export has no steps, so only the whole-trace rows (step NULL) exist.
"""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from conftest import corpus

from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run
from pipeline.report.document import build

T0 = 60_111_418_026 + 1_000_000  # 1 ms into the window
NAMES = [  # (typeId, metricId, name)
    (0, 1, "SM Active [Throughput %]"),
    (0, 2, "Tensor Active [Throughput %]"),
    (0, 3, "DRAM Read Bandwidth [Throughput %]"),
    (1, 1, "SM Active [Throughput %]"),
    (1, 9, "GPC Clock Frequency [MHz]"),
]
SAMPLES = [  # (timestamp, typeId, metricId, value)
    (T0, 0, 1, 40),
    (T0 + 100_000, 0, 1, 60),
    (T0, 0, 2, 10),
    (T0 + 100_000, 0, 2, 30),
    (T0, 0, 3, 70),
    (T0, 1, 1, 80),
    (T0, 1, 9, 1755),
]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    d = tmp_path_factory.mktemp("gm")
    f = d / "in" / "mfu_2gpu_metrics.sqlite"
    f.parent.mkdir()
    shutil.copyfile(corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite"), f)
    con = sqlite3.connect(f)
    con.execute(
        "CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, "
        "typeName TEXT NOT NULL, metricId INTEGER NOT NULL, metricName TEXT NOT NULL)"
    )
    con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GPU', ?, ?)", NAMES)
    con.execute(
        "CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER NOT NULL, "
        "metricId INTEGER NOT NULL, value INTEGER NOT NULL)"
    )
    con.executemany("INSERT INTO GPU_METRICS VALUES (?1, ?1, ?2, ?3, ?4)", SAMPLES)
    con.commit()
    con.close()
    lk = Lake(d / "lake")
    (r,) = ingest_paths([f], lk)
    assert r.status in ("ok", "partial"), r.error
    return lk


def test_metrics_per_rank(lake):
    rows = run(connect(lake), "gpu_metrics").to_dicts()
    got = {r["rank"]: r for r in rows}
    assert all(r["step"] is None for r in rows) and set(got) == {0, 1}
    assert got[0]["sm_active_pct"] == pytest.approx(50) and got[0]["tensor_active_pct"] == pytest.approx(20)
    assert got[0]["dram_read_pct"] == pytest.approx(70) and got[0]["dram_write_pct"] is None
    assert got[0]["samples"] == 5  # the clock frequency is not one of the five metrics
    assert got[1]["sm_active_pct"] == pytest.approx(80) and got[1]["tensor_active_pct"] is None


def test_metrics_in_the_report(lake):
    doc = build(analyze(lake))
    (run_doc,) = doc["runs"]
    # median over the ranks that have the metric: SM active of 50 and 80 -> 65
    assert run_doc["gpu_metrics"] == (
        "nsys GPU metrics over the trace (median over 2 rank(s), % of peak): SM active 65%, "
        "tensor active 20%, DRAM read 70%"
    )
