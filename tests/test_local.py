"""Per-source metric results, computed at a run's first analysis and kept in the lake
(pipeline/local_fill.py fill; issue 16 point 3, issue 37 item 2: ingest no longer computes them).

Analysis reads breakdown, step_time, idle_gaps, idle_breakdown, step_status and mfu from the
local_<metric> tables, and makes only the split of exposed communication into waiting and
transfer over the other ranks' kernels (queries/local/*.sql). Checked here:
- on PARAM's real 8-rank DLRM job (56 collective kernels that wait for a peer, steps on every
  rank), ingested, then given the results (fill): every such metric equals the full query's rows on the
  same connection, exactly, and the whole analysis (verdict, findings, every number) equals
  the analysis of the same lake without the results;
- on random two-rank jobs of compute kernels and collectives with random step windows
  (hypothesis): the same equality, and exposed waiting / transfer per rank equal the brute-force
  walk of tests/test_interval_property.py (an outside reference, not the full query);
- when the results must not be used (another window or threshold, a source without results, a
  result of another SQL version, a rank whose work comes from two sources), the full queries run,
  and mfu runs in full under an MFU override;
- a source below MIN_GPU_ROWS gets none (and costs no DuckDB connection), and re-ingesting or
  forgetting a source removes its results with its other parts;
- query.run_many, which analyze() uses to run the metrics two at a time on cursors of one
  connection, gives every metric's rows exactly as run() on the connection itself, with the
  per-source results and with the full files under non-default options (the cursors must carry
  the connection's variables: window, threshold, MFU overrides, use_local).
"""

from __future__ import annotations

import json
import shutil
import tempfile

import polars as pl
import pytest
from conftest import corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_interval_property import _brute_split, collective_lake, member

from pipeline import local, local_fill, query
from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

DLRM = ("param", "et_replay", "tests", "inputs", "dlrm_kineto")


def _full(con, name: str) -> pl.DataFrame:
    return pl.from_arrow(con.sql(query.sql_text(name)).to_arrow_table())


# the metrics read through per-source results: those stored, and collective_exposure, whose
# compute pieces come from local_comm_cover then (views/60_exposure_cover.sql)
CHECKED = (*query.LOCAL_METRICS, "collective_exposure", "roofline")  # roofline: from local_roofline


def _same_as_full(lake: Lake) -> None:
    """Every CHECKED metric equals, row for row, the full files on a connection that never reads
    per-source results."""
    con, ref = query.connect(lake), query.connect(lake, local_results=False)
    assert _uses_local(con) and not _uses_local(ref)
    for name in CHECKED:
        got, full = query.run(con, name), query.run(ref, name)
        assert got.equals(full), name


def _uses_local(con) -> bool:
    return bool(con.execute("SELECT getvariable('use_local')").fetchall()[0][0])


@pytest.fixture(scope="module")
def dlrm_lakes(tmp_path_factory):
    """The DLRM job ingested twice: given per-source results (threshold 0) and without (default
    threshold: its ranks have fewer GPU activities). The first with parts of its own per source
    (compact=False; one ingest of the 8 files writes them as one compacted generation,
    pipeline/ingest/hold.py), so that the tests below can damage one source's results file."""
    d = tmp_path_factory.mktemp("dlrm")
    with_local, plain = Lake(d / "with"), Lake(d / "plain")
    assert {r.status for r in ingest_paths([corpus(*DLRM)], with_local, jobs=1, compact=False)} == {"ok"}
    assert with_local.table_files("local_results") == []  # not computed by ingest
    assert local_fill.fill(with_local, min_rows=0) == 8
    assert local_fill.fill(with_local, min_rows=0) == 0  # kept: nothing left to compute
    assert {r.status for r in ingest_paths([corpus(*DLRM)], plain, jobs=1)} == {"ok"}
    assert local_fill.fill(plain) == 0
    return with_local, plain


def test_dlrm_ingest_stores_results_and_analysis_reads_them(dlrm_lakes):
    with_local, plain = dlrm_lakes
    assert len(with_local.table_files("local_results")) == 8
    assert plain.table_files("local_results") == []  # 8 ranks of < MIN_GPU_ROWS activities
    con = query.connect(with_local)
    assert _uses_local(con)
    assert not _uses_local(query.connect(plain))
    waits = con.execute("SELECT count(*), count(DISTINCT rank) FROM comm_wait").fetchall()[0]
    assert waits == (56, 8)  # the split has something to do on every rank
    _same_as_full(with_local)
    for name in CHECKED:
        assert query.run(con, name).height, name
    for name in ("breakdown", "step_time"):
        assert query.run(con, name)["exposed_comm_wait_ns"].sum() > 0
    # the view tracelake sql reads is the same
    assert pl.from_arrow(con.sql("SELECT * FROM step_time").to_arrow_table()).equals(_full(con, "step_time"))


def test_run_many_on_cursors_gives_the_rows_of_run(dlrm_lakes):
    with_local, plain = dlrm_lakes
    names = query.metric_names()
    for con in (
        query.connect(with_local),  # per-source results (use_local)
        query.connect(plain, materialize=True),
        # every variable set to a value other than its default
        query.connect(
            plain, window="hta", kernel_wait_threshold_ns=5_000, peak_tflops=123.0, tokens_per_step=4096
        ),
    ):
        many = query.run_many(con, names, workers=2)
        assert list(many) == names
        for name in names:
            assert many[name].equals(query.run(con, name)), name
    # the overrides reached the cursors: mfu's peak is the one given, not the catalog's
    assert set(many["mfu"]["peak_tflops"].drop_nulls()) == {123.0}
    assert many["mfu"]["tokens_per_s"].drop_nulls().len() > 0


def test_dlrm_analysis_is_the_same_with_and_without_results(dlrm_lakes):
    with_local, plain = dlrm_lakes
    a, b = analyze(with_local), analyze(plain)
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_a_truncated_source_keeps_its_steps_incomplete(tmp_path, monkeypatch):
    """step_status makes every step of a truncated source incomplete (sources.status partial):
    the status reaches the per-source results before the sources row is written. DLRM's rank 3
    cut at 70 % of its bytes (a trace killed while written), the 7 others whole."""
    job = tmp_path / "dlrm_kineto"
    job.mkdir()
    files = sorted(corpus(*DLRM).glob("*.json"))
    for f in files:
        data = f.read_bytes()
        (job / f.name).write_bytes(data[: int(len(data) * 0.7)] if f is files[3] else data)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([job], lake, jobs=1)
    assert sorted(r.status for r in res) == ["ok"] * 7 + ["partial"]
    assert local_fill.fill(lake, min_rows=0) == 8
    con = query.connect(lake)
    assert _uses_local(con)
    got = query.run(con, "step_status")
    assert got.equals(_full(con, "step_status"))
    cut = got.filter(pl.col("in_truncated_source"))
    assert cut.height and set(cut["rank"]) == {3} and not cut["complete"].any()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(member, min_size=1, max_size=12),
    st.lists(member, min_size=1, max_size=12),
    st.lists(st.integers(0, 80), min_size=2, max_size=5, unique=True),
)
def test_random_jobs_equal_the_full_queries_and_the_brute_force(acts0, acts1, cuts):
    ranks = {0: acts0, 1: acts1}
    edges = sorted(cuts)
    steps = {r: list(zip(edges, edges[1:])) for r in ranks}  # the same host windows on both ranks
    with tempfile.TemporaryDirectory() as d:
        lake = collective_lake(d, ranks, steps)
        assert local_fill.backfill(lake, min_rows=0) == 2
        _same_as_full(lake)
        rows = [r for r in query.run(query.connect(lake), "breakdown").to_dicts() if r["level"] == "rank"]
    b = _brute_split(ranks)
    for row in rows:
        assert (row["exposed_comm_wait_ns"], row["exposed_comm_transfer_ns"]) == (
            b[row["rank"]]["wait"],
            b[row["rank"]]["transfer"],
        ), row


def test_a_source_below_the_threshold_costs_no_connection(tmp_path, monkeypatch):
    """DLRM's ranks have fewer than MIN_GPU_ROWS GPU activities: neither ingest nor the analysis's
    fill opens the DuckDB connection the results would need (0.4 s per file, which a small job
    would pay for nothing); fill decides from the Parquet footers."""

    def refuse(*a, **k):
        raise AssertionError("connected for a small source")

    monkeypatch.setattr(local.query, "connect", refuse)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths(sorted(corpus(*DLRM).glob("*.json"))[:2], lake, jobs=1)
    assert [r.status for r in res] == ["ok", "ok"]
    assert not any("per-source" in n for r in res for n in r.notes)
    assert local_fill.fill(lake) == 0


@pytest.fixture()
def small_lake(tmp_path, dlrm_lakes):
    """A copy of the DLRM lake with results, to damage."""
    d = tmp_path / "lake"
    shutil.copytree(dlrm_lakes[0].root, d)
    return Lake(d)


def test_options_other_than_the_defaults_run_the_full_queries(small_lake):
    assert not _uses_local(query.connect(small_lake, window="hta"))
    assert not _uses_local(query.connect(small_lake, kernel_wait_threshold_ns=10_000))
    assert _uses_local(query.connect(small_lake, runs=["dlrm_kineto"]))


def test_an_mfu_override_runs_mfu_in_full(small_lake):
    """With --peak-tflops (or the model FLOPs / tokens overrides) mfu's rows change, so mfu runs
    in full while the other metrics still read the stored rows."""
    con = query.connect(small_lake, peak_tflops=100.0)
    assert _uses_local(con)
    assert query.metric_sql(con, "mfu") == query.sql_text("mfu")
    assert query.metric_sql(con, "breakdown") != query.sql_text("breakdown")
    got = query.run(con, "mfu")
    assert got.equals(query.run(query.connect(small_lake, peak_tflops=100.0, local_results=False), "mfu"))
    assert set(got["peak_tflops"].drop_nulls()) == {100.0}


def test_a_source_without_results_makes_analysis_run_in_full(small_lake):
    part = small_lake.table_files("local_results")[3]
    (small_lake.root / "local_results").joinpath(*part.split("/local_results/")[1].split("/")).unlink()
    assert not _uses_local(query.connect(small_lake))


def test_results_of_another_sql_version_are_not_used(small_lake, monkeypatch):
    assert _uses_local(query.connect(small_lake))
    monkeypatch.setattr(query, "_LOCAL_OPTIONS", query._LOCAL_OPTIONS + ";changed")  # as if the SQL changed
    assert not _uses_local(query.connect(small_lake))


def test_a_rank_with_results_from_two_sources_runs_in_full(small_lake):
    """A second local_results row for rank 0 (another source's) in the same run."""
    f = small_lake.table_files("local_results")[0]
    row = pl.read_parquet(f)
    dup = row.with_columns(pl.lit("ffffffffffffffff").alias("source_id"))
    dup.write_parquet(f.rsplit("/", 1)[0] + "/ffffffffffffffff.parquet")
    src = pl.read_parquet(small_lake.table_files("sources")[0]).with_columns(
        pl.lit("ffffffffffffffff").alias("source_id")
    )
    src.write_parquet(small_lake.table_files("sources")[0].rsplit("/", 1)[0] + "/ffffffffffffffff.parquet")
    assert not _uses_local(query.connect(small_lake))


def test_reingest_and_forget_remove_a_sources_results(small_lake, monkeypatch):
    rank0 = sorted(corpus(*DLRM).glob("*0*.json"))[0]
    before = len(small_lake.table_files("local_results"))
    # --force: the source is rewritten without results (ingest computes none)
    (r,) = ingest_paths([rank0], small_lake, force=True, run="dlrm_kineto", jobs=1)
    assert r.status == "ok"
    assert len(small_lake.table_files("local_results")) == before - 1
    assert not _uses_local(query.connect(small_lake))
    assert local_fill.fill(small_lake, min_rows=0) == 1  # the analysis's fill gives it them again
    assert len(small_lake.table_files("local_results")) == before
    assert _uses_local(query.connect(small_lake))
    n = small_lake.forget([(r.run_id, r.source_id)])
    assert n == 1
    assert len(small_lake.table_files("local_results")) == before - 1
    assert len(small_lake.table_files("local_breakdown")) == before - 1


def test_memory_capped_results_and_the_fallback(tmp_path, monkeypatch):
    """The per-source connection is capped (local.MEMORY_LIMIT, issue 40): with a cap DuckDB must
    spill under (32 MB) and the stored files run one at a time (SERIAL_ROWS 0), the results still
    equal the full files; with a cap no query fits in (1 MB), fill stores nothing, the analysis
    equals that of a lake with them, and no spill directory is left in the lake or in the
    system's temporary directory."""
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 0)
    monkeypatch.setattr(local, "SERIAL_ROWS", 0)
    monkeypatch.setattr(local, "MEMORY_LIMIT", "32MB")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    (tmp_path / "systmp").mkdir()
    capped = Lake(tmp_path / "capped")
    assert {r.status for r in ingest_paths([corpus(*DLRM)], capped, jobs=1)} == {"ok"}
    assert local_fill.fill(capped) == 8
    _same_as_full(capped)
    monkeypatch.setattr(local, "MEMORY_LIMIT", "1MB")
    starved = Lake(tmp_path / "starved")
    res = ingest_paths([corpus(*DLRM)], starved, jobs=1)
    assert {r.status for r in res} == {"ok"}
    assert local_fill.fill(starved) == 0
    assert not _uses_local(query.connect(starved))
    a, b = analyze(starved), analyze(capped)
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    assert not list((starved.root / ".tmp").glob("*")) and not list((capped.root / ".tmp").glob("*"))
    assert not list((tmp_path / "systmp").glob("tracelake-local-*"))


def test_backfill_replaces_a_damaged_marker(tmp_path):
    """backfill (benchmarks/scale_trace.py's lakes) reads each source's local_results part to see
    whether it is current: one cut in half by hand is computed again and replaced (it had raised
    polars' error), the whole one left; the per-source results then equal the full queries."""
    ranks = {0: [(0, 10, False, 0), (5, 15, True, 0)], 1: [(2, 9, True, 0)]}  # (start, dur, comm, 0)
    lake = collective_lake(str(tmp_path), ranks, {0: [(0, 30)], 1: [(0, 30)]})
    assert local_fill.backfill(lake, min_rows=0) == 2
    marker = sorted((lake.root / "local_results").rglob("*.parquet"))[0]
    data = marker.read_bytes()
    marker.write_bytes(data[: len(data) // 2])
    assert local_fill.backfill(lake, min_rows=0) == 1
    assert marker.read_bytes()[-4:] == b"PAR1"
    assert local_fill.backfill(lake, min_rows=0) == 0
    _same_as_full(lake)
