"""Per-source metric results computed at a run's first analysis (pipeline/local_fill.py fill, issue 37
item 2 / issue 38 item 4), not by ingest.

Inputs: 3 ranks of one real trace (HTA's simple_add, 139 kernels a rank: the same bytes with
distributedInfo.rank 0-2, so one run of 3 sources), ingested as parts of their own, and the same
compacted into the run's generation (Lake.compact; an ingest's held sources are written into one
the same way, pipeline/ingest/hold.py). min_rows is lowered to 10 so that these small sources get
results, as a large rank would.
Checked, against references outside the code under test (the full metric files, which read the
lake's rows and never the stored results; the rows read straight from each source's Parquet
part with pyarrow):
- an ingest of Kineto traces imports no DuckDB (issue 38 item 1) and stores no results;
- fill gives the sources held by a generation the same rows as the same sources in parts of
  their own, and every metric read through them equals the full files; the first analysis fills
  only runs of FILL_MIN_ROWS GPU activities or more (the sources that have results counted; the
  threshold set around the row counts pyarrow reads from the parts' footers), and its document
  equals the full computation's either way;
- a source replaced while its results were computed, and a lake whose lock another command
  holds, get nothing written; a fill that fails before its local_results part leaves results no
  reader uses, and the next fill completes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import msgspec
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import FEW, REPO, SIMPLE_ADD, parquet_rows

from pipeline import local, local_fill, query
from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

TRACE = SIMPLE_ADD
CHECKED = (*query.LOCAL_METRICS, "collective_exposure", "roofline")


def _few_lakes(few, root) -> tuple[Lake, Lake]:
    """(parts: the FEW sources as parts of their own; held: the same compacted into the run's
    generation by Lake.compact)."""
    parts, held = Lake(root / "parts"), Lake(root / "held")
    for lake in (parts, held):
        assert {r.status for r in ingest_paths([few], lake, jobs=1, compact=False)} == {"ok"}
    with held.lock():
        assert held.compact(min_sources=2) == [("job", FEW * 4, 4)]
    return parts, held


@pytest.fixture(scope="module")
def lakes(few, tmp_path_factory):
    """(held: the sources in the run's compacted generation; parts: as parts of their own), each
    filled with min_rows 10."""
    parts, held = _few_lakes(few, tmp_path_factory.mktemp("lakes"))
    assert (held.root / "_compacted" / "run=job.json").exists()
    assert not (parts.root / "_compacted").exists()
    for lake in (held, parts):
        assert lake.table_files("local_results") == []
        assert local_fill.fill(lake, min_rows=10) == FEW
        assert local_fill.fill(lake, min_rows=10) == 0
    return held, parts


def test_an_ingest_of_kineto_traces_imports_no_duckdb(tmp_path):
    code = (
        "import sys; from pathlib import Path; from pipeline.ingest import ingest_paths; "
        "from pipeline.lake import Lake; "
        f"r = ingest_paths([Path({str(TRACE)!r})], Lake(Path({str(tmp_path / 'lake')!r})), jobs=1); "
        "print(r[0].status, 'duckdb' in sys.modules, 'pipeline.local' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ok", "False", "False"]


def test_held_sources_get_the_results_of_parts_of_their_own(lakes):
    held, parts = lakes
    for t in (*local.TABLES, "local_results"):
        assert parquet_rows(held, t) == parquet_rows(parts, t), t
    assert parquet_rows(held, "local_breakdown") and parquet_rows(held, "local_idle_gaps")
    assert len(parquet_rows(held, "local_results")) == FEW
    for lake in (held, parts):
        con, ref = query.connect(lake), query.connect(lake, local_results=False)
        assert con.execute("SELECT getvariable('use_local')").fetchall() == [(True,)]
        for name in CHECKED:
            assert query.run(con, name).equals(query.run(ref, name)), name


def test_a_generation_of_small_and_large_sources_is_filled_in_one_call(lakes, few, tmp_path, monkeypatch):
    """A generation holding sources on both sides of SERIAL_ROWS (the small computed side by side,
    the large after them, alone) gets every source's results in one fill and one switch: the
    small ones' switch used to leave the large one pointing at a generation that was gone, its
    results computed and dropped. Reference: the rows of the parts-of-their-own lake."""
    _, parts = lakes
    _, held = _few_lakes(few, tmp_path)
    missing = local_fill._missing

    def one_large(*a, **k):  # the second source counts as large (its rows are the same 139 kernels)
        got, total = missing(*a, **k)
        return [(r, s, g, 10**6 if i == 1 else n) for i, (r, s, g, n) in enumerate(got)], total

    monkeypatch.setattr(local_fill, "_missing", one_large)
    monkeypatch.setattr(local, "SERIAL_ROWS", 1000)
    switches = []
    assert local_fill.fill(held, min_rows=10, switches=switches) == FEW
    assert len(switches) == 1
    assert local_fill.fill(held, min_rows=10) == 0
    for t in (*local.TABLES, "local_results"):
        assert parquet_rows(held, t) == parquet_rows(parts, t), t


def test_the_first_analysis_fills_only_above_fill_min_rows_and_equals_the_full_computation(
    few, tmp_path, monkeypatch
):
    """Below FILL_MIN_ROWS GPU activities in all, the first analysis computes every metric in
    full and stores no per-source results; at it, it fills; both documents equal the full
    computation's (a lake analysed with MIN_GPU_ROWS above every source: no results at all). The
    threshold is set around the sources' own row count, read from their Parquet footers with
    pyarrow."""
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10**9)
    full = Lake(tmp_path / "full")
    ingest_paths([few], full, jobs=1)
    ref = json.dumps(analyze(full, keep=False), sort_keys=True, default=str)
    assert full.table_files("local_results") == []
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    lake = Lake(tmp_path / "lake")
    assert {r.status for r in ingest_paths([few], lake, jobs=1)} == {"ok"}
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in lake.table_files("gpu_activities"))
    assert rows > FEW * 100
    seen: list = []

    def progress(stage, done, total):
        if stage == "per-source results":
            seen.append((done, total))

    monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", rows + 1)
    assert json.dumps(analyze(lake, keep=False, on_progress=progress), sort_keys=True, default=str) == ref
    assert lake.table_files("local_results") == [] and seen == []
    monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", rows)
    assert json.dumps(analyze(lake, keep=False, on_progress=progress), sort_keys=True, default=str) == ref
    assert len(lake.holders("local_results")) == FEW
    assert seen == [(k, FEW) for k in range(1, FEW + 1)]  # the progress bar's steps, one a source


def test_sources_with_results_count_toward_fill_min_rows(few, tmp_path, monkeypatch):
    """A run of its own too small to be filled is filled when it is analysed beside a run whose
    sources have results already (the metrics read per-source results only when every source in
    scope has them: query.use_local), and not when both together stay under FILL_MIN_ROWS."""
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    other = tmp_path / "in" / "job2"
    other.mkdir(parents=True)
    for f in few.iterdir():  # the same events in other bytes (an ingest skips content it holds)
        doc = msgspec.json.decode(f.read_bytes())
        doc["copy"] = 2
        (other / f.name).write_bytes(msgspec.json.encode(doc))
    for name, top in (("together", 0), ("apart", 1)):
        lake = Lake(tmp_path / name)
        assert {r.status for r in ingest_paths([few], lake, jobs=1)} == {"ok"}
        assert local_fill.fill(lake, min_rows=10) == FEW  # run "job" has results
        assert {r.status for r in ingest_paths([other], lake, jobs=1)} == {"ok"}
        runs = {r for r, _ in lake.holders("gpu_activities")}
        assert len(runs) == 2, runs
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in lake.table_files("gpu_activities"))
        # more than the new run alone holds (half the rows), at most (together) or just over
        # (apart) what both hold
        monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", rows + top)
        analyze(lake, keep=False)
        assert len(lake.holders("local_results")) == (2 * FEW if name == "together" else FEW), name


def test_a_source_replaced_meanwhile_and_a_busy_lake_get_nothing(few, tmp_path, monkeypatch):
    parts, held = _few_lakes(few, tmp_path)
    compute, one = local.compute, threading.Lock()

    def replaced(files, sid, *a, **k):  # a commit replaces the source (or switches the run) meanwhile
        out = compute(files, sid, *a, **k)
        with one:  # fill computes two sources at a time
            src = parts.root / "sources" / "run=job" / f"{sid}.parquet"
            if src.exists():
                data = src.read_bytes()
                src.unlink()
                src.write_bytes(data)  # a new inode: as a --force commit leaves it
            man = held.root / "_compacted" / "run=job.json"
            m = json.loads(man.read_bytes())
            m["gen"] = os.urandom(8).hex()
            tmp = man.with_name(".switch.tmp")
            tmp.write_text(json.dumps(m))
            os.replace(tmp, man)  # as a switch replaces it: readers see the old or the new
        return out

    monkeypatch.setattr(local, "compute", replaced)
    assert local_fill.fill(parts, min_rows=10) == 0
    assert parts.table_files("local_results") == [] and parts.table_files("local_breakdown") == []
    assert local_fill.fill(held, min_rows=10) == 0
    assert held.holders("local_results") == set()
    monkeypatch.setattr(local, "compute", compute)
    with parts.lock():  # another command writes to the lake
        assert local_fill.fill(parts, min_rows=10) == 0
    assert parts.table_files("local_results") == []


def test_a_fill_cut_before_its_marker_is_not_used_and_is_completed(few, tmp_path, monkeypatch):
    lake = Lake(tmp_path / "lake")
    ingest_paths([few], lake, jobs=1, compact=False)
    write = local_fill.write_parquet

    def cut(tbl, path):
        if path.parent.parent.name == "local_results":
            path.write_bytes(b"PAR1")  # the disk fills half-way through the marker
            raise OSError(28, "No space left on device")
        write(tbl, path)

    monkeypatch.setattr(local_fill, "write_parquet", cut)
    assert local_fill.fill(lake, min_rows=10) == 0  # not raised: the analysis goes on in full
    assert lake.table_files("local_results") == [] and len(lake.table_files("local_breakdown")) == FEW
    assert os.listdir(lake.root / "local_results" / "run=job") == []  # its temporary file removed
    con = query.connect(lake)
    assert con.execute("SELECT getvariable('use_local')").fetchall() == [(False,)]
    monkeypatch.setattr(local_fill, "write_parquet", write)
    assert local_fill.fill(lake, min_rows=10) == FEW
    assert len(lake.table_files("local_results")) == FEW
    assert pl.read_parquet(lake.table_files("local_results"))["sql_version"].unique().to_list() == [
        query.local_sql_version()
    ]


def test_a_compacted_runs_first_analysis_is_kept(few, tmp_path, monkeypatch):
    """fill's switch of the run's generation changes the lake's listing, which analysis compares
    before keeping what it computed: its own switches (signatures taken under the lock) are told
    apart from another command's commit, so the first analysis is kept and the second reads it;
    a commit between the listing and fill's switch keeps nothing."""
    import pipeline.analyze_compute as ac
    from pipeline import results

    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", 0)
    _, held = _few_lakes(few, tmp_path / "a")
    first = analyze(held)
    assert len(held.holders("local_results")) == FEW
    assert list((held.root / "results" / "job").glob("*.json"))

    def refuse(*a, **k):
        raise AssertionError("computed again")

    monkeypatch.setattr(ac, "compute", refuse)
    same = json.dumps(analyze(held), sort_keys=True, default=str)
    assert same == json.dumps(first, sort_keys=True, default=str)
    monkeypatch.undo()
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", 0)
    _, other = _few_lakes(few, tmp_path / "b")
    fill = local_fill.fill

    def racing(lake, *a, **k):  # another command commits between the listing and the switch
        os.utime(next((lake.root / "sources").rglob("*.parquet")), ns=(1, 1))
        return fill(lake, *a, **k)

    monkeypatch.setattr(local_fill, "fill", racing)
    before = results.listing_signature(other.root)
    analyze(other)
    assert results.listing_signature(other.root) != before
    assert not list((other.root / "results" / "job").glob("*.json"))


def test_a_writer_waits_out_an_analysis_short_hold(tmp_path, monkeypatch):
    """Lake.lock: a holder whose purpose is "analysis" (a first analysis writing its per-source
    results, a few ms a rank) is waited for, up to BRIEF_HOLD_WAIT_S; any other holder makes a
    writer fail at once with LakeBusy naming it. Hand-made holds in a thread, on a second open of
    the lock file (flock(2) locks conflict between two open file descriptions, even in one
    process)."""
    import time

    import pipeline.lake as lake_mod
    from pipeline.lake import LakeBusy

    lake = Lake(tmp_path / "lake")
    lake.ensure()
    held = threading.Event()

    def hold(purpose, secs):
        with lake.lock(purpose=purpose):
            held.set()
            time.sleep(secs)

    def holding(purpose, secs) -> threading.Thread:
        held.clear()
        t = threading.Thread(target=hold, args=(purpose, secs))
        t.start()
        held.wait()
        return t

    t = holding("analysis", 0.4)
    start = time.monotonic()
    with lake.lock():  # waits the analysis out
        waited = time.monotonic() - start
    t.join()
    assert waited >= 0.2
    t = holding(None, 0.6)  # an ingest or forget: no waiting
    start = time.monotonic()
    with pytest.raises(LakeBusy, match=r"another tracelake command \(ingest or forget\) is writing"):
        with lake.lock():
            pass
    assert time.monotonic() - start < 0.3
    t.join()
    monkeypatch.setattr(lake_mod, "BRIEF_HOLD_WAIT_S", 0.1)  # an analysis holding longer than that
    t = holding("analysis", 0.6)
    with pytest.raises(LakeBusy, match=r"another tracelake command \(analysis\) is writing"):
        with lake.lock():
            pass
    t.join()


def test_a_damaged_per_source_part_gives_the_full_computation_with_a_note(few, tmp_path, monkeypatch):
    """A local_* part cut by hand (the tester's finding: every analysis then failed with DuckDB's
    "No magic bytes"): the analysis equals the full computation's (a lake analysed with
    MIN_GPU_ROWS above every source: no results at all), with a note in the run naming the
    damaged file; --recompute the same."""
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10**9)
    full = Lake(tmp_path / "full")
    ingest_paths([few], full, jobs=1)
    ref = analyze(full, keep=False)
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    lake = Lake(tmp_path / "lake")
    ingest_paths([few], lake, jobs=1, compact=False)
    assert local_fill.fill(lake, min_rows=10) == FEW
    part = sorted((lake.root / "local_step_time").rglob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:100])
    for recompute in (False, True):
        got = analyze(lake, keep=False, recompute=recompute)
        notes = [n for n in got["notes"] if n.startswith("per-source results could not be read")]
        assert len(notes) == 1 and part.name in notes[0], got["notes"]
        got["notes"] = [n for n in got["notes"] if n not in notes]
        assert json.dumps(got, sort_keys=True, default=str) == json.dumps(ref, sort_keys=True, default=str)
