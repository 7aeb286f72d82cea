"""Steps found where the profiler wrote none (pipeline/ingest/nsys/step_detect.py): on hand-made
exports whose iterations are known by construction, and on the corpus's exports, against the
period and the launches worked out here by brute force with sqlite3 on the files themselves."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import CORPUS
from nsys_handmade import MS
from nsys_handmade import export as _export

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

NSYS = CORPUS / "nsys"


def _steps(lake: Lake) -> pl.DataFrame:
    return pl.from_arrow(
        connect(lake)
        .sql("SELECT rank, step, name, start_ns, end_ns, source FROM steps ORDER BY rank, step")
        .to_arrow_table()
    )


def test_kernel_period_gives_the_iterations_of_a_handmade_export(tmp_path):
    """5 iterations of A B C B D: period 5 kernels; A, C and D occur once per period and A follows
    the 2 ms idle, so steps run from one launch of A to the next: 4 complete steps,
    [k * 10 ms + 2 ms - 10 us, (k + 1) * 10 ms + 2 ms - 10 us) on the export's clock."""
    f = tmp_path / "loop.sqlite"
    _export(f, 5)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([f], lake)
    assert res[0].status == "ok", res[0].error
    st = _steps(lake)
    base = connect(lake).execute("SELECT base_time_ns FROM sources").fetchall()[0][0] or 0
    want = [
        (k, base + k * 10 * MS + 2 * MS - 10_000, base + (k + 1) * 10 * MS + 2 * MS - 10_000)
        for k in range(4)
    ]
    assert list(zip(st["step"], st["start_ns"], st["end_ns"])) == want
    assert set(st["source"]) == {"kernel_period"}
    note = next(n for n in res[0].notes if n.startswith("steps of rank 0"))
    assert "4 repetitions of its kernel sequence (5 kernels each" in note and "'A'" in note
    # each step's window holds its iteration's 5 kernels: 5 ms of compute and the next 2 ms wait
    tm = pl.from_arrow(
        connect(lake)
        .sql("SELECT step, activities, compute_ns, idle_ns FROM step_time ORDER BY step")
        .to_arrow_table()
    )
    assert tm["activities"].to_list() == [5] * 4 and tm["compute_ns"].to_list() == [5 * MS] * 4


def test_repeating_nvtx_range_wins_over_the_period_and_step_range_over_both(tmp_path):
    """The same loop with a user's 'train_step N' range around each iteration (N = 7..11) and an
    op-level 'aten::mm, op_id = M' range around each launch, nested inside: the train_step ranges
    hold every kernel, so they are the steps, numbered by their N; --step-range picks the op ranges."""
    nvtx = []
    for k in range(5):
        t0 = k * 10 * MS + MS
        nvtx.append((t0, t0 + 9 * MS, f"train_step {7 + k}"))
        for j in range(5):
            launch = k * 10 * MS + 2 * MS + j * MS - 10_000
            nvtx.append((launch - 1_000, launch + 6_000, f"aten::mm, op_id = {100 * k + j}"))
    f = tmp_path / "annotated.sqlite"
    _export(f, 5, nvtx)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([f], lake)
    assert res[0].status == "ok", res[0].error
    st = _steps(lake)
    base = connect(lake).execute("SELECT base_time_ns FROM sources").fetchall()[0][0] or 0
    assert st["step"].to_list() == [7, 8, 9, 10, 11]
    assert st["start_ns"].to_list() == [base + k * 10 * MS + MS for k in range(5)]
    assert set(st["source"]) == {"nvtx_repeat"} and st["name"][0] == "train_step 7"
    assert any("5 repeating NVTX ranges 'train_step #' at the top level" in n for n in res[0].notes)

    chosen = Lake(tmp_path / "chosen")
    assert ingest_paths([f], chosen, step_regex=r"^aten::mm")[0].status == "ok"
    st = _steps(chosen)
    assert st.height == 25 and set(st["source"]) == {"nvtx"}


def test_no_steps_from_a_sequence_that_does_not_repeat(tmp_path):
    """Two iterations give one complete period only: fewer than the two steps the rule needs, so
    the run keeps no steps (and the whole-trace basis) rather than a guess."""
    f = tmp_path / "short.sqlite"
    _export(f, 2)
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([f], lake)[0].status == "ok"
    assert _steps(lake).height == 0


def _brute_force(path: Path) -> dict[int, dict]:
    """Per device: the smallest period P at which the kernel names (demangled, in start order)
    equal themselves shifted on >= 90 % of positions, tried for every P; the names found at every
    P-th kernel; and the launches (CUDA API start of the same correlation id and process)."""
    c = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    out = {}
    for (dev,) in c.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1").fetchall():
        rows = c.execute(
            """SELECT coalesce(k.demangledName, k.shortName), r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k
               LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                 AND r.globalTid / 16777216 = k.globalPid / 16777216
               WHERE k.deviceId = ? ORDER BY k.start""",
            (dev,),
        ).fetchall()
        seq = np.array([r[0] for r in rows])
        p = next(p for p in range(2, len(seq) // 3 + 1) if np.mean(seq[:-p] == seq[p:]) >= 0.9)
        anchors = {}
        for name in set(seq.tolist()):
            pos = np.flatnonzero(seq == name)
            if len(pos) >= 3 and np.all(np.diff(pos) == p):
                anchors[name] = [rows[i][1] for i in pos]
        out[dev] = {"period": p, "anchors": anchors, "n": len(seq)}
    return out


@pytest.mark.parametrize("name", ["mfu_2gpu_before.sqlite", "mfu_2gpu_after.sqlite"])
def test_nsys_ai_exports_get_the_period_of_their_kernel_sequence(tmp_path, name):
    """nsys-ai's 300 ms windows of Wan2.1 training: no ProfilerStep, and the only repeating NVTX
    ranges are op-level (aten::*, FlashAttnFunc: few kernels each). Brute force on the file: the
    kernel names repeat every 119 kernels on both GPUs (one transformer block); the steps run
    between launches of one name found at every 119th kernel, and there are as many as its
    occurrences less one."""
    f = NSYS / "nsys-ai" / name
    want = _brute_force(f)
    assert {d: w["period"] for d, w in want.items()} == {0: 119, 1: 119}
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([f], lake)
    assert res[0].status == "ok"
    st = _steps(lake)
    assert set(st["source"]) == {"kernel_period"}
    base = connect(lake).execute("SELECT min(base_time_ns) FROM sources").fetchall()[0][0] or 0
    for rank, dev in ((0, 0), (1, 1)):  # one process per GPU, ranks by lowest device (test_nsys)
        mine = st.filter(pl.col("rank") == rank)
        starts = [s - base for s in mine["start_ns"].to_list()] + [mine["end_ns"][-1] - base]
        matching = [a for a in want[dev]["anchors"].values() if a == starts]
        assert matching, (rank, starts[:3])
        assert mine.height == len(matching[0]) - 1 >= 13
    # the two ranks' step k is the same block: their starts differ by far less than a step
    both = st.pivot(on="rank", index="step", values="start_ns").drop_nulls()
    gap = (both["0"] - both["1"]).abs().max()
    assert gap < (st["end_ns"] - st["start_ns"]).median() / 2
    con = connect(lake)
    assert con.execute("SELECT count(DISTINCT step) FROM step_time").fetchall()[0][0] >= 13


def test_the_run_summary_says_how_steps_were_found(tmp_path):
    from pipeline.analyze import analyze

    lake = Lake(tmp_path / "lake")
    assert ingest_paths([NSYS / "nsys-ai" / "mfu_2gpu_before.sqlite"], lake)[0].status == "ok"
    doc = analyze(lake)
    assert doc["runs"][0]["steps_found_by"] == ["kernel_period"]
    assert doc["verdicts"][0]["basis"] == "steps"


def test_nested_step_ranges_and_copies_count(tmp_path):
    """nsightful's power iteration: 44 ranges 'Step 0 to 10' ... 'Step 430 to 440' inside one 'Loop'
    range (brute force below, from NVTX_EVENTS): the steps are those 44, found one level inside.
    pipit's saxpy: its 'saxpy' ranges hold its 5 kernels but not its 15 copies, which take three
    times as long: no steps rather than windows that leave most of the GPU work out."""
    f = NSYS / "nsightful" / "power_iteration__baseline.sqlite"
    c = sqlite3.connect(f"file:{f}?mode=ro&immutable=1", uri=True)
    want = sorted(
        (s, e)
        for s, e, t in c.execute(
            'SELECT n.start, n."end", coalesce(n.text, s.value) FROM NVTX_EVENTS n '
            "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59"
        )
        if t and t.startswith("Step ") and " to " in t
    )
    assert len(want) == 44
    lake = Lake(tmp_path / "power")
    res = ingest_paths([f], lake)
    st = _steps(lake)
    base = connect(lake).execute("SELECT base_time_ns FROM sources").fetchall()[0][0] or 0
    assert [(s - base, e - base) for s, e in zip(st["start_ns"], st["end_ns"])] == want
    assert set(st["source"]) == {"nvtx_repeat"} and st["step"].to_list() == list(range(10, 441, 10))
    assert any("1 level(s) inside the top one" in n for n in res[0].notes)

    saxpy = Lake(tmp_path / "saxpy")
    assert ingest_paths([NSYS / "pipit" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"], saxpy)[0].status == "ok"
    assert _steps(saxpy).height == 0
