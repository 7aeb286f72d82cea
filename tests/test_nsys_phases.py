"""Phases from an Nsight Systems export captured under torch.autograd.profiler.emit_nvtx
(issue 17 point 1; pipeline/ingest/nsys/mapping.py CPU_SQL's phase markers, queries/views/
70_phases.sql).

No corpus export holds a training step with backward and optimizer ranges (nsys-ai's
mfu_2gpu_before.sqlite is a 300 ms window of forward ops, ../shared/corpus/nsys/PROVENANCE.md),
so the input is a copy of that real 2-GPU export with the NVTX ranges emit_nvtx and torch.optim
write added on each process's main thread (the thread with the most runtime calls), in the
texts PyTorch gives them:
  ProfilerStep#1                                   [W0, W1) = [60111400000, 60411420000)
  autograd::engine::evaluate_function: MmBackward0, seq = 5, op_id = 1   [B0, B1)
  Optimizer.step#SGD.step                          [O0, O1)
with B0 = 60300000000, B1 = 60350000000, O0 = 60380000000, O1 = 60400000000 (ns, the export's
clock). The expected phase of every kernel is worked out from the export's own tables by the
rules of views/70_phases.sql: its runtime call (same correlationId and process) inside the
optimizer range of its thread -> optimizer; inside the backward range of its thread ->
backward; before B0 -> forward; else other (no other thread runs backward ops: no autograd
thread). A kernel launched before the step's start or without a runtime row has no phase.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter

import polars as pl
import pytest
from conftest import corpus

from pipeline import query
from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

W0, W1 = 60_111_400_000, 60_411_420_000
B0, B1 = 60_300_000_000, 60_350_000_000
O0, O1 = 60_380_000_000, 60_400_000_000
MARKS = [
    ("ProfilerStep#1", W0, W1),
    ("autograd::engine::evaluate_function: MmBackward0, seq = 5, op_id = 1", B0, B1),
    ("Optimizer.step#SGD.step", O0, O1),
]


def _expected(con) -> tuple[Counter, dict]:
    """{(pid, phase): kernels} from the export's tables, and {pid: main thread}."""
    mains = {}
    for gtid, n in con.execute(
        "SELECT globalTid, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1 ORDER BY 2"
    ).fetchall():
        mains[gtid >> 24] = gtid  # the busiest thread of each process last
    rows = con.execute(
        "SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24"
    ).fetchall()
    want = Counter()
    for gtid, t in rows:
        if not W0 <= t < W1:
            continue
        main = mains[gtid >> 24] == gtid
        if main and O0 <= t < O1:
            phase = "optimizer"
        elif main and B0 <= t < B1:
            phase = "backward"
        elif t < B0:
            phase = "forward"
        else:
            phase = "other"
        want[((gtid >> 24) & 16777215, phase)] += 1
    return want, mains


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    d = tmp_path_factory.mktemp("nvtx")
    f = d / "in" / "mfu_2gpu_emit_nvtx.sqlite"
    f.parent.mkdir()
    shutil.copyfile(corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite"), f)
    con = sqlite3.connect(f)
    want, mains = _expected(con)
    for gtid in mains.values():
        con.executemany(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
            "VALUES (?, ?, 59, ?, ?, 0)",
            [(s, e, text, gtid) for text, s, e in MARKS],
        )
    con.commit()
    con.close()
    lake = Lake(d / "lake")
    (r,) = ingest_paths([f], lake)
    assert r.status in ("ok", "partial"), r.error
    return lake, want


def test_emit_nvtx_phases_equal_the_export_walked_by_hand(export):
    lake, want = export
    con = query.connect(lake)
    parts = pl.from_arrow(
        con.sql(
            "SELECT p.launch_pid, p.phase FROM phase_parts p JOIN gpu_activities g "
            "ON g.source_id = p.source_id AND g.rank = p.rank AND g.correlation = p.correlation "
            "AND g.start_ns = p.start_ns WHERE p.first_part AND p.phase IS NOT NULL AND g.kind = 'kernel'"
        ).to_arrow_table()
    )
    got = Counter(parts.iter_rows())
    assert got == want and {p for _, p in want} == {"forward", "backward", "optimizer", "other"}
    assert all(n > 0 for n in want.values())
    doc = analyze(lake)
    by_rank = {}
    for r in doc["phases"]:
        by_rank.setdefault(r["rank"], []).append(r)
    assert len(by_rank) == 2
    for rows in by_rank.values():  # the phases partition each rank's step window
        assert sum(r["phase_ns"] for r in rows) == rows[0]["step_ns"]
    assert not [n for n in doc["notes"] if "phases not available" in n]
