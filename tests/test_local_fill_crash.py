"""A run's first analysis killed while it writes the per-source results (pipeline/local_fill.py fill),
and the readers and writers around it.

Inputs: the 3 ranks of HTA's simple_add trace of tests/test_local_fill.py (139 kernels a rank;
min_rows lowered to 10 so that fill computes them), as parts of their own and compacted into the
run's generation. A real `kill -9` at exact moments: a child process runs fill with
TRACELAKE_CRASH_AT (pipeline/lake_journal.py crash_point) and dies there.
Checked, against references outside the code under test (the rows of a lake filled without
interruption, read straight from every Parquet file under it with pyarrow; the full metric files,
`query.connect(lake, local_results=False)`; a directory listing of the lake):
- a fill killed between writing a result part's temporary file and renaming it leaves a hidden
  `.tmp` file in a run directory; the next fill (the next analysis) removes it and completes the
  results, which equal an uninterrupted fill's;
- a fill killed after writing a compacted generation's new files but before its switch leaves
  files no manifest names; the next fill removes them and switches once;
- a reader (`tracelake sql`, the notebook API, a second analysis) connecting while a fill
  writes reads every metric as the full files give it;
- a fill that cannot write (a file in the way of a directory, a lock that cannot be taken)
  leaves the analysis equal to the full computation, and the next one fills;
- a result part cut short or gone under its source's marker (own parts) is computed again by
  the next analysis, whose document equals the full computation's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import FEW, REPO, parquet_rows

from pipeline import local, local_fill, query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

CHECKED = (*query.LOCAL_METRICS, "collective_exposure", "roofline")


def _lake(few, root, held: bool) -> Lake:
    lake = Lake(root)
    assert {r.status for r in ingest_paths([few], lake, jobs=1, compact=False)} == {"ok"}
    if held:
        with lake.lock():
            assert lake.compact(min_sources=2) == [("job", FEW * 4, 4)]
    return lake


@pytest.fixture(scope="module")
def filled(few, tmp_path_factory):
    """{held: a lake of the FEW sources filled without interruption} (the reference rows)."""
    out = {}
    for held in (False, True):
        lake = _lake(few, tmp_path_factory.mktemp("ref") / "lake", held)
        assert local_fill.fill(lake, min_rows=10) == FEW
        out[held] = lake
    return out


def _hidden(lake: Lake) -> list[str]:
    """Hidden files in the lake's run directories and what <lake>/.tmp and _compacted hold
    besides manifests (a plain directory listing)."""
    out = [str(p.relative_to(lake.root)) for p in lake.root.glob("*/run=*/.*")]
    if (lake.root / ".tmp").is_dir():
        out += [f".tmp/{p.name}" for p in (lake.root / ".tmp").iterdir()]
    if (lake.root / "_compacted").is_dir():
        out += [p.name for p in (lake.root / "_compacted").iterdir() if not p.name.endswith(".json")]
    return sorted(out)


def _compacted(lake: Lake) -> set[str]:
    """The compacted files under the lake (table/run=job/c-<gen>-<k>.parquet)."""
    return {str(p.relative_to(lake.root)) for p in lake.root.glob("*/run=job/c-*.parquet")}


def _killed_fill(lake: Lake, point: str) -> None:
    """A child process running fill(lake, min_rows=10), killed by SIGKILL at crash point `point`
    ("name:n")."""
    code = (
        "from pipeline import local_fill; from pipeline.lake import Lake; "
        f"local_fill.fill(Lake({str(lake.root)!r}), min_rows=10)"
    )
    env = {**os.environ, "TRACELAKE_CRASH_AT": point}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == -9, out.stderr


def _same_as_uninterrupted(lake: Lake, ref: Lake) -> None:
    for t in (*local.TABLES, "local_results"):
        assert parquet_rows(lake, t) == parquet_rows(ref, t), t
    con, full = query.connect(lake), query.connect(lake, local_results=False)
    assert con.execute("SELECT getvariable('use_local')").fetchall() == [(True,)]
    for name in CHECKED:
        assert query.run(con, name).equals(query.run(full, name)), name


def test_a_kill_before_a_result_part_is_renamed_leaves_nothing_after_the_next_fill(few, filled, tmp_path):
    lake = _lake(few, tmp_path / "lake", held=False)
    # the 13th part written: the second source's (11 tables a source, local_results last)
    _killed_fill(lake, "local-written:13")
    left = _hidden(lake)
    assert len(left) == 1 and left[0].endswith(".tmp") and left[0].startswith("local_step_time/run=job/."), (
        left
    )
    assert len(lake.table_files("local_results")) == 1
    other = Lake(tmp_path / "copy")  # the next ingest, forget or compact: Lake.recover
    shutil.copytree(lake.root, other.root)
    with other.lock():
        assert other.recover() == [f"removed {left[0]} (an unfinished write)"]
    assert _hidden(other) == []
    assert local_fill.fill(lake, min_rows=10) == FEW - 1
    assert _hidden(lake) == []
    _same_as_uninterrupted(lake, filled[False])


def test_a_kill_before_a_generations_switch_leaves_nothing_after_the_next_fill(few, filled, tmp_path):
    lake = _lake(few, tmp_path / "lake", held=True)
    gen_files = _compacted(lake)
    _killed_fill(lake, "compact-written:1")
    orphans = _compacted(lake) - gen_files
    # a new file per table with rows in the uninterrupted fill's lake (simple_add has no steps
    # or communication kernels: 4 tables), none live
    with_rows = {t for t in (*local.TABLES, "local_results") if parquet_rows(filled[True], t)}
    assert {o.split("/")[0] for o in orphans} == with_rows and len(orphans) == 4, orphans
    assert lake.holders("local_results") == set()
    switches = []
    assert local_fill.fill(lake, min_rows=10, switches=switches) == FEW
    assert len(switches) == 1
    assert not orphans & _compacted(lake)
    assert _hidden(lake) == []
    _same_as_uninterrupted(lake, filled[True])


@pytest.mark.parametrize("held", [False, True], ids=["parts", "held"])
def test_a_reader_connecting_while_fill_writes_never_reads_results_it_did_not_list(
    few, tmp_path, held, monkeypatch
):
    """`tracelake sql`, the notebook API and a second analysis connect without the lake's lock: a
    fill that writes a run's last results after the connection listed the local_* tables, but
    before it decides whether to read them (query.use_local), must not make it read them (its
    views hold none of them: every metric came out empty). The interleaving is made exact by
    running fill in the middle of query.connect, after the listing (create_views runs between
    the two)."""
    lake = _lake(few, tmp_path / "lake", held)
    create_views, once = query.create_views, []

    def fill_meanwhile(con, *a, **k):
        if not once:  # the connection's (fill's own connections call create_views too)
            once.append(None)
            monkeypatch.setattr(query, "create_views", create_views)
            once[0] = local_fill.fill(lake, min_rows=10)
        return create_views(con, *a, **k)

    monkeypatch.setattr(query, "create_views", fill_meanwhile)
    con = query.connect(lake)
    assert once == [FEW]
    full = query.connect(lake, local_results=False)
    for name in CHECKED:
        assert query.run(con, name).equals(query.run(full, name)), name
    assert query.run(full, "breakdown").height == FEW  # a rank each: not a comparison of nothing


@pytest.mark.parametrize("held", [False, True], ids=["parts", "held"])
def test_an_analysis_whose_results_cannot_be_written_equals_the_full_one(few, tmp_path, held, monkeypatch):
    """fill writing into a lake it cannot write to after all (a full disk, a run directory of
    another owner; here a file where the local_breakdown directory goes, which no permission
    bypasses), or whose lock cannot be taken (a directory in its place): the analysis is not lost
    to a traceback, it computes every metric in full, and the next analysis, once the lake can be
    written, fills. Reference: the analysis of a fresh lake of
    the same traces with the per-source step off (MIN_GPU_ROWS above every source)."""
    from pipeline.analyze import analyze

    monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", 0)
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10**9)
    ref = json.dumps(analyze(_lake(few, tmp_path / "full", held), keep=False), sort_keys=True, default=str)
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    lake = _lake(few, tmp_path / "lake", held)
    (lake.root / "local_breakdown").write_text("in the way\n")
    got = analyze(lake, keep=False)
    assert lake.holders("local_results") == set()
    assert _hidden(lake) == []
    assert json.dumps(got, sort_keys=True, default=str) == ref
    (lake.root / "local_breakdown").unlink()
    (lake.root / ".lock").unlink(missing_ok=True)
    (lake.root / ".lock").mkdir()  # a lock that cannot be taken (LakeError, not LakeBusy)
    got = analyze(lake, keep=False)
    assert lake.holders("local_results") == set()
    assert json.dumps(got, sort_keys=True, default=str) == ref
    (lake.root / ".lock").rmdir()
    got = analyze(lake, keep=False)
    assert len(lake.holders("local_results")) == FEW
    assert json.dumps(got, sort_keys=True, default=str) == ref


@pytest.fixture(scope="module")
def full_doc(few, tmp_path_factory) -> str:
    """The analysis document (JSON text) of a fresh lake of the FEW sources as parts of their own,
    every metric in full (the per-source step off: MIN_GPU_ROWS above every source)."""
    from pipeline.analyze import analyze

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local, "MIN_GPU_ROWS", 10**9)
        doc = analyze(_lake(few, tmp_path_factory.mktemp("full") / "lake", held=False), keep=False)
    return json.dumps(doc, sort_keys=True, default=str)


@pytest.mark.parametrize(
    "table, damage",
    [("local_results", "truncate"), ("local_breakdown", "truncate"), ("local_breakdown", "remove")],
)
def test_a_damaged_result_part_is_computed_again_by_the_next_analysis(
    few, filled, full_doc, tmp_path, table, damage, monkeypatch
):
    """A source's stored result part cut short (a full disk, a copy interrupted) or gone (a user
    who moved an unreadable file out of the lake) while its local_results marker says its results
    are there: the next analysis that computes its run must not crash (the marker unreadable) nor
    read the metric without that source's rows; it computes the source's results again. Reference:
    the full computation's document, and the rows of the lake filled without damage."""
    from pipeline.analyze import analyze

    monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", 0)
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    lake = _lake(few, tmp_path / "lake", held=False)
    assert local_fill.fill(lake, min_rows=10) == FEW
    part = sorted((lake.root / table / "run=job").glob("*.parquet"))[0]
    if damage == "truncate":
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    else:
        part.unlink()
    assert json.dumps(analyze(lake, keep=False), sort_keys=True, default=str) == full_doc
    for t in (*local.TABLES, "local_results"):
        assert parquet_rows(lake, t) == parquet_rows(filled[False], t), t


@pytest.mark.parametrize("held", [False, True], ids=["parts", "held"])
def test_a_source_whose_results_fail_leaves_the_full_analysis_and_is_tried_again(
    few, full_doc, tmp_path, held, monkeypatch
):
    """One STORED file failing on one source (a DuckDB error, as the memory cap exceeded raises
    one): that source gets no results, the others do, the analysis equals the full computation's
    document (it cannot read per-source results for every source, so it reads none), and the next
    analysis computes the missing source's results. Reference: full_doc (compacted or not, a run's
    document is the same)."""
    import duckdb

    from pipeline.analyze import analyze

    monkeypatch.setattr(local_fill, "FILL_MIN_ROWS", 0)
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    lake = _lake(few, tmp_path / "lake", held)
    frame, failed = query.frame, []
    mfu = (query.QUERIES_DIR / "mfu.sql").read_text()

    def failing(con, sql):
        if sql == mfu and not failed:
            failed.append(1)
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block (test)")
        return frame(con, sql)

    monkeypatch.setattr(query, "frame", failing)
    assert json.dumps(analyze(lake, keep=False), sort_keys=True, default=str) == full_doc
    assert failed == [1] and len(lake.holders("local_results")) == FEW - 1
    assert json.dumps(analyze(lake, keep=False), sort_keys=True, default=str) == full_doc
    assert len(lake.holders("local_results")) == FEW
    con = query.connect(lake)
    assert con.execute("SELECT getvariable('use_local')").fetchall() == [(True,)]
