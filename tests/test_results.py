"""Kept results (pipeline/results.py, the stages of pipeline/analyze.py): a run's analysis is read
back while its sources, the options and the code are unchanged, recomputed (alone) when one of
them changes, and the document is the same either way.

Expected values: the document computed with keep=False (nothing read back) on the same lake; which
runs are computed is observed by wrapping analyze_compute.compute."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO, corpus

from pipeline import analyze_compute, results, results_fleet
from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

DLRM = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
FILTER = REPO / "sample_traces" / "hta_trace_filter"


@pytest.fixture(scope="module")
def base_lake(tmp_path_factory):
    """Two runs of real traces (DLRM's 8 ranks; rank 0 of sample_traces' hta_trace_filter) and a
    failed file's run."""
    d = tmp_path_factory.mktemp("kept")
    (d / "broken").mkdir()
    (d / "broken" / "rank0.json").write_bytes(b"not json")
    (d / "hta_trace_filter").mkdir()
    shutil.copy(FILTER / "sampled_rank-0.json.gz", d / "hta_trace_filter")
    lake = Lake(d / "lake")
    res = ingest_paths([DLRM, d / "hta_trace_filter", d / "broken"], lake, jobs=1)
    assert sorted({r.run_id for r in res}) == ["broken", "dlrm_kineto", "hta_trace_filter"]
    return lake


@pytest.fixture()
def lake(base_lake, tmp_path):
    d = tmp_path / "lake"
    shutil.copytree(base_lake.root, d)
    return Lake(d)


@pytest.fixture()
def computed(monkeypatch):
    """The run lists compute() is called with (None: every run of the lake)."""
    calls = []
    real = analyze_compute.compute

    def spy(lake, runs=None, **kw):
        calls.append(None if runs is None else sorted(runs))
        return real(lake, runs=runs, **kw)

    monkeypatch.setattr(analyze_compute, "compute", spy)
    return calls


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """DuckDB on one thread (as tests/test_dask.py, whose one_thread says why): on all cores rows
    that tie in a query's ORDER BY (kernels of equal total time, two ranks entering a collective in
    the same µs) may come out in another order from one computation to the next."""
    import functools

    from pipeline import query

    with pytest.MonkeyPatch.context() as m:
        m.setattr(query, "connect", functools.partial(query.connect, threads=1))
        yield


def _json(doc) -> str:
    """The document as sorted JSON, kernels of equal total_ns in name order (tests/test_dask.py
    _dump: their order follows DuckDB's hash table)."""
    doc = dict(doc)
    for k in ("top_kernels", "step_kernels"):
        doc[k] = sorted(doc[k], key=lambda r: (r["run_id"], -r["total_ns"], r["name"], r["category"]))
    return json.dumps(doc, sort_keys=True)


def test_second_analysis_reads_back_the_same_document(lake, computed):
    fresh = analyze(lake, keep=False)
    assert computed == [None] and not (lake.root / "results").exists()
    first = analyze(lake)
    assert computed == [None, None]
    kept = sorted(p.name for p in (lake.root / "results").iterdir() if p.is_dir())
    assert kept == ["broken", "dlrm_kineto", "hta_trace_filter"]
    second = analyze(lake)
    assert computed == [None, None]  # nothing computed: every run read back
    assert _json(second) == _json(first) == _json(fresh)
    assert second == first  # the same Python values (lists, string keys), not only the same JSON
    assert [r["run_id"] for r in second["runs"]] == ["dlrm_kineto", "hta_trace_filter"]
    assert any(
        n.endswith("rank0.json: not ingested: " + n.split(": not ingested: ")[1]) for n in second["notes"]
    )
    # one run asked for: its part of the whole document, read back
    only = analyze(lake, runs=["hta_trace_filter"])
    assert computed == [None, None]
    assert only["runs"] == [r for r in first["runs"] if r["run_id"] == "hta_trace_filter"]
    assert only["findings"] == [f for f in first["findings"] if f["run_id"] == "hta_trace_filter"]


def test_a_new_source_recomputes_its_run_alone(lake, computed, tmp_path):
    analyze(lake)
    before = analyze(lake, runs=["dlrm_kineto"])
    # the sample job's rank 1 joins its run: only that run changes
    extra = tmp_path / "hta_trace_filter"
    extra.mkdir()
    shutil.copy(FILTER / "sampled_rank-1.json.gz", extra)
    res = ingest_paths([extra], lake, jobs=1)
    assert [(r.status, r.run_id) for r in res] == [("ok", "hta_trace_filter")]
    computed.clear()
    doc = analyze(lake)
    assert computed == [["hta_trace_filter"]]  # the DLRM run and the failed one read back
    assert [r for r in doc["runs"] if r["run_id"] == "dlrm_kineto"] == before["runs"]
    assert _json(doc) == _json(analyze(lake, keep=False))


def test_forget_recomputes_and_removes_a_whole_runs_results(lake, computed):
    analyze(lake)
    src = lake.sources(["dlrm_kineto"])
    one = src.sort("path").row(0, named=True)
    with lake.lock():
        lake.forget([("dlrm_kineto", one["source_id"])])
    computed.clear()
    doc = analyze(lake)
    assert computed == [["dlrm_kineto"]]
    assert _json(doc) == _json(analyze(lake, keep=False))
    assert len([r for r in doc["runs"] if r["run_id"] == "dlrm_kineto"][0]["ranks"]) == 7
    with lake.lock():
        lake.forget([("hta_trace_filter", s) for s in lake.sources(["hta_trace_filter"])["source_id"]])
    analyze(lake)
    assert not (lake.root / "results" / "hta_trace_filter").exists()  # pruned with the run


def test_other_options_recompute_and_both_are_kept(lake, computed):
    a = analyze(lake)
    b = analyze(lake, window="hta")
    assert computed == [None, None] and b["window"] == "hta"
    assert _json(analyze(lake)) == _json(a) and _json(analyze(lake, window="hta")) == _json(b)
    assert computed == [None, None]  # both option sets kept (results.KEEP)
    assert len(list((lake.root / "results" / "dlrm_kineto").glob("*.json"))) == 2


def test_new_code_recomputes(lake, computed, monkeypatch):
    analyze(lake)
    monkeypatch.setattr(results, "code_fingerprint", lambda: "another version")
    analyze(lake)
    assert computed == [None, None]


def test_a_damaged_kept_result_is_recomputed_and_rewritten(lake, computed):
    a = analyze(lake)
    (f,) = (lake.root / "results" / "dlrm_kineto").glob("*.json")
    f.write_bytes(b'{"key": "x", "doc": [')  # cut short
    b = analyze(lake)
    assert computed == [None, ["dlrm_kineto"]]
    assert _json(a) == _json(b)
    assert json.loads(f.read_bytes())["key"] == f.stem  # rewritten whole


def test_a_lake_where_results_cannot_be_written_is_analysed_every_time(lake, computed):
    (lake.root / "results").write_bytes(b"")  # a file where the directory would be: mkdir fails
    a, b = analyze(lake), analyze(lake)
    assert computed == [None, None]
    assert _json(a) == _json(b)


def test_code_fingerprint_covers_the_sql_and_the_schema(tmp_path, monkeypatch):
    """The key changes when a query or the schema changes in a checkout (not only the version):
    measured on copies of queries/ and schemas/."""
    from pipeline.paths import QUERIES_DIR, SCHEMAS_DIR

    for name, real in (("QUERIES_DIR", QUERIES_DIR), ("SCHEMAS_DIR", SCHEMAS_DIR)):
        copy = tmp_path / name
        shutil.copytree(real, copy)
        monkeypatch.setattr(results, name, copy)
        results.code_fingerprint.cache_clear()
        before = results.code_fingerprint()
        f = sorted(copy.rglob("*.sql" if name == "QUERIES_DIR" else "*.toml"))[0]
        f.write_bytes(f.read_bytes() + b"\n")
        results.code_fingerprint.cache_clear()
        assert results.code_fingerprint() != before, name
    results.code_fingerprint.cache_clear()


def test_runs_overview_is_the_fleet_rows_of_the_kept_analyses(lake, tmp_path):
    """The SQL view holds, per run, the fleet row (pipeline/fleet.py) of its kept analysis, and says
    when the run's sources changed since (current)."""
    import polars as pl

    from pipeline import query
    from pipeline.fleet import FLEET_SCHEMA, fleet_rows

    def overview():
        con = query.connect(lake)
        return pl.from_arrow(con.sql("SELECT * FROM runs_overview").to_arrow_table())

    assert overview().height == 0  # nothing analysed yet: an empty view with the columns
    assert overview().columns[: len(FLEET_SCHEMA)] == list(FLEET_SCHEMA)
    doc = analyze(lake)
    want = fleet_rows(doc, lake.sources())
    got = overview()
    # DuckDB names the session's zone Etc/UTC: the same instants
    same = got.select(list(FLEET_SCHEMA)).with_columns(pl.col("start_time").dt.convert_time_zone("UTC"))
    assert same.equals(want)
    assert got["run_id"].to_list() == ["dlrm_kineto", "hta_trace_filter"]  # the failed run has no row
    assert got["current"].to_list() == [True, True]
    assert got.filter(pl.col("run_id") == "dlrm_kineto")["world_size"].item() == 8
    # a new file in one run: its row is no longer current until the next analysis
    extra = tmp_path / "hta_trace_filter"
    extra.mkdir()
    shutil.copy(FILTER / "sampled_rank-1.json.gz", extra)
    ingest_paths([extra], lake, jobs=1)
    assert overview()["current"].to_list() == [True, False]
    analyze(lake)
    now = overview()
    assert now["current"].to_list() == [True, True]
    assert now.filter(pl.col("run_id") == "hta_trace_filter")["ranks"].item() == 2


def test_a_second_cli_analysis_opens_no_parquet(lake):
    """`tracelake analyze --json` of a lake whose runs are all kept prints the same document and
    imports none of polars, pyarrow and DuckDB (what makes it fast: docs/performance.md)."""
    import subprocess
    import sys

    script = (
        "import runpy, sys\n"
        "sys.argv = ['tracelake', 'analyze', '--json', '--lake', sys.argv[1]]\n"
        "try:\n"
        "    runpy.run_module('pipeline.cli', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('polars', 'pyarrow', 'duckdb') if m in sys.modules]\n"
        "sys.stderr.write('IMPORTED ' + ','.join(heavy))\n"
    )

    def run():
        p = subprocess.run([sys.executable, "-c", script, str(lake.root)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout), p.stderr.rsplit("IMPORTED ", 1)[1]

    first, imported = run()
    assert "polars" in imported  # computed: the lake was read
    second, imported = run()
    assert imported == ""
    from pipeline.cli.analysis_cmd import _timeline_lake  # the CLI names --lake in its commands

    # the same as the API reads back (a fresh computation may order tied rows otherwise: _json)
    assert second == first == json.loads(json.dumps(_timeline_lake(analyze(lake), lake.root)))
    # a file joins a run: the listing changed, the lake is read again (and that run recomputed)
    with lake.lock():
        lake.forget([("hta_trace_filter", lake.sources(["hta_trace_filter"])["source_id"][0])])
    third, imported = run()
    assert "polars" in imported and [r["run_id"] for r in third["runs"]] == ["dlrm_kineto"]


def test_keys_remembered_for_some_runs_serve_those_runs_only(lake, computed):
    """After analysing one run, that run is read back without the lake (kept_analysis), but the
    whole lake is not (its other runs' keys are unknown)."""
    from pipeline.analyze import kept_analysis

    one = analyze(lake, runs=["hta_trace_filter"])
    assert computed == [["hta_trace_filter"]]
    assert kept_analysis(lake.root, {}, ["hta_trace_filter"]) == one
    assert kept_analysis(lake.root, {}) is None
    assert kept_analysis(lake.root, {"window": "hta"}, ["hta_trace_filter"]) is None  # other options
    whole = analyze(lake)
    assert computed == [["hta_trace_filter"], ["broken", "dlrm_kineto"]]  # the kept run read back
    assert kept_analysis(lake.root, {}) == whole


# ------------------------------------------------------------- damaged, hostile or racing state
# (found by trying the archive features as a user would, then attacking them)


def _kept_json(lake, run_id):
    (f,) = [p for p in (lake.root / "results" / run_id).glob("*.json")]
    return f


def test_nothing_is_kept_when_the_lake_changed_while_computing(lake, computed, monkeypatch):
    """An ingest or forget that commits while the runs are computed: the answer is returned but not
    kept (its key was made from the sources rows before), and the next analysis computes again."""
    real = analyze_compute.compute

    def racing(lk, runs=None, **kw):
        doc = real(lk, runs=runs, **kw)
        with lk.lock():  # a forget commits meanwhile
            lk.forget([("hta_trace_filter", lk.sources(["hta_trace_filter"])["source_id"][0])])
        return doc

    monkeypatch.setattr(analyze_compute, "compute", racing)
    analyze(lake)
    assert not list((lake.root / "results").glob("*/*.json"))
    monkeypatch.setattr(analyze_compute, "compute", real)
    doc = analyze(lake)
    assert [r["run_id"] for r in doc["runs"]] == ["dlrm_kineto"]
    assert _json(doc) == _json(analyze(lake, keep=False))


def test_damaged_or_missing_fleet_rows_break_nothing_and_are_written_again(lake):
    from pipeline import query
    from pipeline.analyze import kept_analysis

    analyze(lake)
    rows = sorted((lake.root / "results").glob("*/*.fleet.parquet"))
    assert [p.parent.name for p in rows] == ["dlrm_kineto", "hta_trace_filter"]
    rows[0].write_bytes(rows[0].read_bytes()[:100])  # cut
    rows[1].unlink()
    con = query.connect(lake)
    assert con.execute("SELECT count(*) FROM gpu_activities").fetchall()[0][0] > 0
    assert con.execute("SELECT count(*) FROM runs_overview").fetchall()[0][0] == 0  # none readable
    assert kept_analysis(lake.root, {}) is None  # the CLI's fast path leaves the repair to analyze
    analyze(lake)
    assert all(results_fleet.fleet_ok(lake.root, p.parent.name, p.name.split(".")[0]) for p in rows)
    got = query.connect(lake).execute("SELECT run_id, current FROM runs_overview").fetchall()
    assert got == [("dlrm_kineto", True), ("hta_trace_filter", True)]


def test_recompute_replaces_a_kept_result_altered_by_hand(lake):
    good = analyze(lake)
    f = _kept_json(lake, "dlrm_kineto")
    f.write_bytes(f.read_bytes().replace(b'"verdict":"', b'"verdict":"not-'))
    assert analyze(lake)["verdicts"] != good["verdicts"]  # valid JSON under the right key: served
    assert _json(analyze(lake, recompute=True)) == _json(good)
    assert _json(analyze(lake)) == _json(good)  # kept again, replaced


@pytest.mark.parametrize(
    "damage",
    [
        b"[" * 200_000,  # deep nesting
        b'{"key": "KEY", "doc": {}}',
        b'{"key": "KEY", "doc": {"runs": 5}}',
        b'{"key": "KEY", "doc": DOC_NO_RUN_ID}',
    ],
)
def test_a_malformed_kept_document_is_computed_again(lake, computed, damage):
    good = analyze(lake)
    f = _kept_json(lake, "dlrm_kineto")
    key = f.stem
    part = json.loads(f.read_bytes())["doc"]
    part["findings"] = [{"junk": 1}]
    damage = damage.replace(b"KEY", key.encode()).replace(b"DOC_NO_RUN_ID", json.dumps(part).encode())
    f.write_bytes(damage)
    computed.clear()
    assert _json(analyze(lake)) == _json(good)
    assert computed == [["dlrm_kineto"]]


@pytest.mark.parametrize("edit", ["runs_as_list", "a_run_left_out", "deep"])
def test_a_state_file_edited_by_hand_is_not_trusted(lake, computed, edit):
    good = analyze(lake)
    state = lake.root / "results" / "_state.json"
    s = json.loads(state.read_bytes())
    (opt,) = s["keys"]
    if edit == "runs_as_list":
        s["keys"][opt]["runs"] = ["a"]
    elif edit == "a_run_left_out":
        del s["keys"][opt]["runs"]["hta_trace_filter"]
    state.write_text(json.dumps(s) if edit != "deep" else "[" * 200_000)
    computed.clear()
    assert _json(analyze(lake)) == _json(good)
    assert computed == []  # the keys were computed from the sources rows again; the runs were kept


def test_prune_removes_only_its_own_run_directories(lake, tmp_path):
    analyze(lake)
    mine = lake.root / "results" / "my-notes"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with lake.lock():
        lake.forget([("hta_trace_filter", s) for s in lake.sources(["hta_trace_filter"])["source_id"]])
    analyze(lake)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert not (lake.root / "results" / "hta_trace_filter").exists()
    # results/ as a link to elsewhere: nothing there is removed
    elsewhere = tmp_path / "elsewhere"
    shutil.move(lake.root / "results", elsewhere)
    (lake.root / "results").symlink_to(elsewhere)
    (elsewhere / "important").mkdir()
    (elsewhere / "important" / f"{'0' * 64}.json").write_text("{}")
    (elsewhere / "_state.json").unlink()
    analyze(lake)
    assert (elsewhere / "important").exists()
