"""The docs of what `tracelake sql` can read (pipeline/sqldoc.py): the column tags of every metric
and documented view against what DuckDB returns on a real lake (names, order and types), the
`--list` / `--describe` output against schemas/v3.toml and the SQL files' own tags, the generated
docs/sql-reference.md, and the per-rank top kernels against a brute-force count of the lake's
gpu_activities."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import CORPUS, REPO
from typer.testing import CliRunner

from pipeline import analyze, query, sqldoc
from pipeline.cli import EXIT_OK, app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.whatif import register

runner = CliRunner()
NCCL_LOG = "nccl-tests-issue-284-socket-transport-info-interleaved-in-table.log"
NCCL_TESTS = "ncclTests-oci-a100-16rank-roce-allreduce.txt"


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    """sample_traces/ (HTA's two-rank trace) and two NCCL files (each in a run of its own), so the
    NCCL metrics have rows too."""
    lk = Lake(tmp_path_factory.mktemp("sqldoc") / "lake")
    assert {r.status for r in ingest_paths([REPO / "sample_traces"], lk, jobs=1)} == {"ok"}
    for name in (NCCL_LOG, NCCL_TESTS):
        (r,) = ingest_paths([CORPUS / "nccl" / name], lk, run=Path(name).stem[:40], jobs=1)
        assert r.status == "ok", r.error
    return lk


def _described(con, name: str) -> list[tuple[str, str]]:
    return [
        (r[0], sqldoc.normalize_type(r[1])) for r in con.execute(f"DESCRIBE SELECT * FROM {name}").fetchall()
    ]


def test_documented_columns_are_the_output_columns(lake):
    docs = [d for d in sqldoc.catalog().values() if not d.internal]
    assert {d.name for d in docs if d.kind == "metric"} == set(query.metric_names())
    for con in (
        query.connect(lake),
        query.connect(lake, local_results=False, materialize=False),
        # every override set: mfu's getvariable() columns typed by the value, not NULL
        query.connect(lake, peak_tflops=100.0, palm_flops_per_token=1e9, tokens_per_step=512.0),
    ):
        # the replay's views (kind "replay") are bound when a query names them (tracelake sql)
        # (sample_traces' run replays; the NCCL runs have no GPU work and are not listed)
        assert register(con) == []
        for d in docs:
            documented = [(c.name, c.type) for c in d.columns]
            assert documented == _described(con, d.name), (
                f"{d.source}: {d.name}'s @column tags are not its output"
            )


def test_every_view_is_documented_or_internal():
    views = {d.name for d in sqldoc.catalog().values() if d.kind == "view"}
    assert views == query.derived_view_names()
    assert {d.name for d in sqldoc.catalog().values() if d.internal} == {
        "collective_step",
        "exposure_cover",
        "phase_ranges",
        "roofline_parts",
    }


def test_show_tables_is_the_list_plus_internal_views_and_stored_results(lake):
    r = runner.invoke(app, ["sql", "--lake", str(lake.root), "--format", "json", "SHOW TABLES"])
    assert r.exit_code == EXIT_OK, r.output
    shown = {x["name"] for x in json.loads(r.stdout)}
    # connect's helpers (the _empty_* typed tables, materialized views) live in the schema internal
    assert not [n for n in shown if n.startswith("_") or "_empty_" in n], shown
    # the replay's views are bound only when a query names them (test_documented_columns...)
    listed = {d.name for d in sqldoc.listed() if d.kind != "replay"}
    internal = {d.name for d in sqldoc.catalog().values() if d.internal}
    local = {
        t
        for t in tomllib.loads((REPO / "schemas" / "v3.toml").read_text())["tables"]
        if t.startswith("local_")
    }
    assert shown == listed | internal | local
    assert not listed & (internal | local)


def test_list_names_every_table_and_view_with_its_doc():
    r = runner.invoke(app, ["sql", "--lake", "/nonexistent/lake", "--list", "--format", "json"])
    assert r.exit_code == EXIT_OK, r.output
    rows = json.loads(r.stdout)
    by = {x["name"]: x for x in rows}
    assert len(by) == len(rows)
    toml = tomllib.loads((REPO / "schemas" / "v3.toml").read_text())["tables"]
    for name, t in toml.items():
        if name.startswith("local_"):  # stored per-source results: an implementation detail
            assert name not in by
            continue
        first = re.match(r"(.+?\.)(\s+[A-Z(`]|$)", t["doc"]).group(1)
        assert (
            by[name]["kind"] == "table" and by[name]["doc"] == first and t["doc"].startswith(by[name]["doc"])
        )
    for f in sorted((REPO / "queries").glob("*.sql")):
        line = f.read_text().splitlines()[0].removeprefix("-- ").removeprefix(f"{f.stem}: ")
        assert by[f.stem]["kind"] == "metric" and by[f.stem]["source"] == f"queries/{f.name}"
        assert by[f.stem]["doc"].lower().startswith(line.lower().rstrip(",")), f.name
    assert by["top_kernels"]["doc"] == "Top GPU kernels (and copies) by total time, per run."
    for f in sorted((REPO / "queries" / "views").glob("*.sql")):
        for name, summary in re.findall(r"^-- @view (\w+): (.*)$", f.read_text(), re.M):
            assert by[name]["kind"] == "view" and by[name]["doc"].startswith(summary), name
    # hidden: internal views, macros, the catalog's helpers
    for name in (
        "collective_step",
        "roofline_parts",
        "busbw_factor",
        "keyed_ns",
        "_empty_sources",
        "local_mfu",
    ):
        assert name not in by
    assert by["device_catalog"]["kind"] == "catalog"
    # the table form: one line each, the summary whole
    r = runner.invoke(app, ["sql", "--lake", "/nonexistent/lake", "--list"])
    lines = r.stdout.splitlines()
    assert r.exit_code == EXIT_OK and len(lines) == len(rows)
    (line,) = [x for x in lines if x.split()[1] == "top_kernels_rank"]
    assert line.split()[0] == "metric" and line.endswith(by["top_kernels_rank"]["doc"])
    assert not Path("/nonexistent/lake").exists()


def test_describe_a_table_gives_the_schema_docs():
    r = runner.invoke(app, ["sql", "--lake", "x", "--describe", "gpu_activities", "--format", "json"])
    assert r.exit_code == EXIT_OK, r.output
    got = json.loads(r.stdout)
    toml = tomllib.loads((REPO / "schemas" / "v3.toml").read_text())["tables"]["gpu_activities"]
    duck = {
        "int32": "INTEGER",
        "int64": "BIGINT",
        "string": "VARCHAR",
        "bool": "BOOLEAN",
        "float64": "DOUBLE",
    }
    assert got["kind"] == "table" and got["source"] == "schemas/v3.toml"
    assert [(c["column"], c["type"], c["unit"], c["doc"]) for c in got["columns"]] == [
        (c["name"], duck[c["type"]], c["unit"], c["doc"]) for c in toml["columns"]
    ]


def _tags(path: Path, view: str | None = None) -> list[tuple[str, str, str, str]]:
    """(name, type, unit, doc) of the @column tags of a metric file (or of one view's block),
    read with a regex of their own, continuation lines joined."""
    text = path.read_text()
    if view:
        text = text[text.index(f"-- @view {view}:") :]
        text = text[: text.index("CREATE OR REPLACE VIEW")]
    text = re.sub(r"\n--\s{2,}(?!@)", " ", text)
    out = []
    for m in re.finditer(
        r"^-- @column (\w+) (.+?)"
        r"(?: (ns|bytes|GB/s|%|FLOP|TFLOP/s|FLOP/byte|FLOP/token|tokens|tokens/s|J|W|count))?: (.*)$",
        text,
        re.M,
    ):
        out.append((m.group(1), m.group(2), m.group(3) or "", " ".join(m.group(4).split())))
    return out


def test_describe_a_metric_and_a_view_gives_their_tags():
    for name, path, view in (
        ("top_kernels_rank", REPO / "queries" / "top_kernels_rank.sql", None),
        ("nccl_checks", REPO / "queries" / "nccl_checks.sql", None),
        ("step_window", REPO / "queries" / "views" / "25_step_window.sql", "step_window"),
    ):
        r = runner.invoke(app, ["sql", "--lake", "x", "--describe", name, "--format", "json"])
        assert r.exit_code == EXIT_OK, r.output
        got = json.loads(r.stdout)
        assert [(c["column"], c["type"], c["unit"], c["doc"]) for c in got["columns"]] == _tags(path, view), (
            name
        )
    got = json.loads(
        runner.invoke(app, ["sql", "-l", "x", "--describe", "top_kernels_rank", "-f", "json"]).stdout
    )
    assert got["columns"][5] == {
        "column": "total_ns",
        "type": "BIGINT",
        "unit": "ns",
        "doc": "Their summed duration.",
    }
    # @columns_of: scope has gpu_work's columns, which are gpu_activities'
    scope = json.loads(runner.invoke(app, ["sql", "-l", "x", "--describe", "scope", "-f", "json"]).stdout)
    acts = json.loads(
        runner.invoke(app, ["sql", "-l", "x", "--describe", "gpu_activities", "-f", "json"]).stdout
    )
    assert scope["columns"] == acts["columns"] and scope["kind"] == "view"
    # the table form: a header, then one line per column with its unit and doc
    r = runner.invoke(app, ["sql", "-l", "x", "--describe", "TOP_KERNELS_RANK"])
    assert r.exit_code == EXIT_OK
    assert r.stdout.startswith("top_kernels_rank: metric (queries/top_kernels_rank.sql)\n")
    assert re.search(
        r"^share_pct +DOUBLE +% +100 \* total_ns / the rank's summed total_ns\.$", r.stdout, re.M
    )
    r = runner.invoke(app, ["sql", "-l", "x", "--describe", "busbw_factor"])
    assert r.exit_code == 2 and "no such table or view" in r.output
    r = runner.invoke(app, ["sql", "-l", "x", "--list", "SELECT 1"])
    assert r.exit_code == 2


def test_sql_errors_and_missing_lakes_are_usage_errors(lake, tmp_path):
    r = runner.invoke(app, ["sql", "--lake", str(lake.root), "SELEC nonsense"])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        'error: Parser Error: syntax error at or near "SELEC"'
    ]
    r = runner.invoke(app, ["sql", "--lake", str(lake.root), "SELECT nope FROM steps"])
    assert (
        r.exit_code == 2
        and r.output.startswith("error: Binder Error: ")
        and len(r.output.strip().splitlines()) == 1
    )
    gone = tmp_path / "no" / "lake"
    r = runner.invoke(app, ["sql", "--lake", str(gone), "SELECT 1"])
    assert r.exit_code == 2 and r.output.strip().startswith(
        f"error: {gone}: not a tracelake lake (run `tracelake ingest"
    )
    assert not (tmp_path / "no").exists()
    r = runner.invoke(app, ["sql", "--lake", str(tmp_path), "SELECT 1"])
    assert r.exit_code == 2 and "not a tracelake lake" in r.output and list(tmp_path.iterdir()) == []
    r = runner.invoke(app, ["sql", "--lake", str(lake.root)])
    assert r.exit_code == 2


def test_outputs_with_a_source_id_name_its_file(lake):
    con = query.connect(lake)
    files = dict(con.execute("SELECT source_id, regexp_extract(path, '[^/]+$') FROM sources").fetchall())
    for name in query.metric_names():
        cols = [c for c, _ in _described(con, name)]
        if "source_id" in cols:
            assert cols[cols.index("source_id") + 1] == "file", name
    checks = con.execute("SELECT DISTINCT source_id, file FROM nccl_checks").fetchall()
    tests = con.execute("SELECT DISTINCT source_id, file FROM nccl_tests_bandwidth").fetchall()
    assert {f for _, f in checks} == {NCCL_LOG} and {f for _, f in tests} == {NCCL_TESTS}
    assert all(files[s] == f for s, f in checks + tests)


def test_top_kernels_rank_is_a_brute_force_count(lake):
    acc: dict = defaultdict(lambda: [0, 0, 0])  # calls, total, max
    for f in lake.table_files("gpu_activities"):
        for row in pq.read_table(f, columns=["run_id", "rank", "name", "category", "dur_ns"]).to_pylist():
            if row["category"] == "sync":  # scope leaves synchronization out (views/20_scope.sql)
                continue
            a = acc[(row["run_id"], row["rank"], row["name"], row["category"])]
            a[0] += 1
            a[1] += row["dur_ns"]
            a[2] = max(a[2], row["dur_ns"])
    per_rank: dict = defaultdict(int)
    for (run, rank, _, _), (_, total, _) in acc.items():
        per_rank[(run, rank)] += total
    got = query.run(query.connect(lake), "top_kernels_rank")
    assert got.height == len(acc) and {(r, k) for r, k in got.select("run_id", "rank").rows()} == {
        (k[0], k[1]) for k in acc
    }
    for run, rank, name, cat, calls, total, mean, mx, share in got.rows():
        c, t, m = acc[(run, rank, name, cat)]
        assert (calls, total, mx) == (c, t, m)
        assert math.isclose(mean, t / c, rel_tol=1e-12) and math.isclose(
            share, 100 * t / per_rank[(run, rank)], rel_tol=1e-9
        )
    # ordered by rank, then total time
    keys = [(r, k, -t) for r, k, t in got.select("run_id", "rank", "total_ns").rows()]
    assert keys == sorted(keys)
    # summed over the ranks it is top_kernels
    tk = {
        (r, n, c): t
        for r, n, c, t in query.run(query.connect(lake), "top_kernels")
        .select("run_id", "name", "category", "total_ns")
        .rows()
    }
    summed: dict = defaultdict(int)
    for (run, _, name, cat), (_, total, _) in acc.items():
        summed[(run, name, cat)] += total
    assert tk == dict(summed)
    assert "top_kernels_rank" not in analyze.METRICS  # a sql view, not part of the analysis


def test_reference_page_is_current():
    page = (REPO / "docs" / "sql-reference.md").read_text()
    assert page == sqldoc.render_reference(), "docs/sql-reference.md is stale: run python -m pipeline.sqldoc"
    assert "## Finding your way in SQL" in page and "### `top_kernels_rank`" in page


def test_the_line_format():
    c = sqldoc.parse_column("wait_ns MAP(INT32,INT64) ns: each rank's wait: its longest kernel")
    assert c == sqldoc.ColumnDoc(
        "wait_ns", "MAP(INTEGER, BIGINT)", "ns", "each rank's wait: its longest kernel"
    )
    assert sqldoc.parse_column("x string: text") == sqldoc.ColumnDoc("x", "VARCHAR", "", "text")
    assert sqldoc.parse_column("p DOUBLE %: share").unit == "%"
    for bad in (
        "x BIGINT ms: unknown unit",
        "x BIGINT",
        "x: no type",
        "X BIGINT: upper-case name",
        "x BIGINT: ",
    ):
        with pytest.raises(sqldoc.DocError):
            sqldoc.parse_column(bad)
    assert sqldoc.normalize_type("int64[]") == "BIGINT[]" and sqldoc.normalize_type("bool") == "BOOLEAN"
    units = {
        c["unit"]
        for t in tomllib.loads((REPO / "schemas" / "v3.toml").read_text())["tables"].values()
        for c in t["columns"]
    }
    assert units - {""} <= set(sqldoc.UNITS)  # one vocabulary for the tables and the SQL files
    with pytest.raises(sqldoc.DocError, match="no @view or @internal"):
        sqldoc.parse_views("CREATE OR REPLACE VIEW v AS SELECT 1 AS a;", "v.sql")
    with pytest.raises(sqldoc.DocError, match="documents no columns"):
        sqldoc.parse_views("-- @view v: a view\nCREATE OR REPLACE VIEW v AS SELECT 1 AS a;", "v.sql")
    (v,) = sqldoc.parse_views(
        "-- @view v: a view\n--   on two lines.\n-- @column a INTEGER count: the a,\n--   continued.\n"
        "CREATE OR REPLACE VIEW v AS SELECT 1 AS a;",
        "v.sql",
    )
    assert v == (
        "v",
        "a view on two lines.",
        False,
        (sqldoc.ColumnDoc("a", "INTEGER", "count", "the a, continued."),),
    )
    summary, prose, cols = sqldoc.parse_metric(
        "-- m: what it is,\n-- on two lines.\n--\n-- More.\n-- @column a BIGINT: A.\nSELECT 1 AS a",
        "queries/m.sql",
    )
    assert (
        summary == "What it is, on two lines."
        and prose == "m: what it is,\non two lines.\n\nMore."
        and len(cols) == 1
    )


def test_sql_json_writes_utf8_as_is(lake):
    """`tracelake sql --format json` writes non-ASCII text as UTF-8, not as \\u escapes (as
    `tracelake runs --format json` does); the expected text is written by hand."""
    q = "SELECT 'über-job' AS run, 'हिन्दी' AS name, 3 AS n"
    r = runner.invoke(app, ["sql", "--lake", str(lake.root), "--format", "json", q])
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout == '[{"run": "über-job", "name": "हिन्दी", "n": 3}]\n'
