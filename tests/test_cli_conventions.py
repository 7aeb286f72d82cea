"""The CLI by the conventions of the ecosystem (issue 19 points 2-4): one default lake, help
without Python type names that fits 80 columns, usage errors (exit 2) that create nothing,
listings and results on stdout, progress on stderr only on a terminal."""

from __future__ import annotations

import importlib
import io
import re

import pytest
from conftest import REPO
from rich.console import Console
from typer.testing import CliRunner

from pipeline.analyze import COUNTER_METRICS, METRICS, analyze
from pipeline.cli import app
from pipeline.lake import Lake

runner = CliRunner()
SAMPLE = REPO / "sample_traces"
COMMANDS = ("ingest", "analyze", "report", "run", "forget", "sql", "timeline")


def _options_of(cmd: str) -> set[str]:
    import typer.main

    click_cmd = typer.main.get_command(app).commands[cmd]
    return {o for p in click_cmd.params for o in p.opts if o.startswith("--")} | {"--help"}


@pytest.mark.parametrize("cmd", ("",) + COMMANDS)
def test_help_has_no_type_names_fits_80_columns_and_names_only_its_options(cmd):
    args = [cmd, "--help"] if cmd else ["--help"]
    r = runner.invoke(app, args, env={"COLUMNS": "200"})  # a wide terminal: still 80
    assert r.exit_code == 0, r.output
    text = r.output
    # typer's defaults would print `<list[Path]>`, `<bool>`, `<int>`, `{paths}...`
    assert not re.search(r"<[A-Za-z_\[\]| ]+>", text), text
    assert "list[" not in text and "{" not in text, text
    too_long = [ln for ln in text.splitlines() if len(ln) > 80]
    assert not too_long, too_long
    if cmd:
        # every option the help (epilog included) mentions is one this command takes
        mentioned = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", text))
        assert mentioned <= _options_of(cmd), mentioned - _options_of(cmd)
        assert "Exit codes: 0 all good; 2 usage error" in " ".join(text.split())


def test_the_commands_share_one_default_lake(tmp_path, monkeypatch):
    """Without --lake every command uses ./.tracelake, so `tracelake sql` right after
    `make demo` (which writes .tracelake) works; TRACELAKE_LAKE names another."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["ingest", str(SAMPLE)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / ".tracelake" / "TRACELAKE").exists()
    r = runner.invoke(app, ["sql", "--format", "csv", "SELECT count(*) AS n FROM sources"])
    assert r.exit_code == 0 and r.stdout.split() == ["n", "2"], r.output  # the two rank files
    r = runner.invoke(app, ["analyze", "--json", "--quiet"])
    assert r.exit_code == 0 and '"hta_trace_filter"' in r.stdout
    r = runner.invoke(app, ["forget", "--failed", "--dry-run"])
    assert r.exit_code == 0 and r.stdout == ""  # nothing failed
    r = runner.invoke(app, ["report", "-o", "r.md"])
    assert r.exit_code == 0 and "hta_trace_filter" in (tmp_path / "r.md").read_text()
    other = tmp_path / "other"
    r = runner.invoke(app, ["ingest", str(SAMPLE)], env={"TRACELAKE_LAKE": str(other)})
    assert r.exit_code == 0 and (other / "TRACELAKE").exists(), r.output
    r = runner.invoke(
        app, ["sql", "--format", "csv", "SELECT count(*) AS n FROM steps"], env={"TRACELAKE_LAKE": str(other)}
    )
    assert r.exit_code == 0 and r.stdout.split()[0] == "n"


@pytest.mark.parametrize(
    "args, why",
    [
        (["ingest", "nope"], "nope: no such file or directory"),
        (["run", "nope", "-o", "r.html"], "nope: no such file or directory"),
        (["analyze"], ".tracelake: not a tracelake lake"),
        (["report", "-o", "r.html"], ".tracelake: not a tracelake lake"),
        (["forget", "--failed"], ".tracelake: not a tracelake lake"),
        (["analyze", "--lake", "elsewhere"], "elsewhere: not a tracelake lake"),
    ],
)
def test_a_path_that_does_not_exist_is_a_usage_error_that_creates_nothing(tmp_path, monkeypatch, args, why):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and why in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


KWAIT_RANGE = "give a finite number of µs from 0 to 1,000,000,000 (1,000 s)"


@pytest.mark.parametrize(
    "args, line",
    [
        (["ingest"], "error: missing argument 'TRACES...' (see tracelake ingest --help)"),
        (["analyze", "--bogus"], "error: no such option: --bogus (see tracelake analyze --help)"),
        (["analyze", "--lake"], "error: option '--lake' requires an argument (see tracelake analyze --help)"),
        (["analyze", "x"], "error: got unexpected extra argument(s) (x) (see tracelake analyze --help)"),
        (["bogus"], "error: no such command 'bogus' (see tracelake --help)"),
        (["--bogus"], "error: no such option: --bogus (see tracelake --help)"),
        (
            ["analyze", "--window", "x"],
            "error: --window must be 'all' or 'hta' (see tracelake analyze --help)",
        ),
        # --kernel-wait-us 1e300 was taken, nan said 'should be >= 0' (issue 39 item 13)
        *(
            (
                ["analyze", "--kernel-wait-us", v],
                f"error: --kernel-wait-us {shown}: {KWAIT_RANGE} (see tracelake analyze --help)",
            )
            for v, shown in (
                ("1e300", "1e+300"),
                ("nan", "nan"),
                ("inf", "inf"),
                ("-1", "-1"),
                ("2e9", "2e+09"),
            )
        ),
        (
            ["sql", "--kernel-wait-us", "nan", "SELECT 1"],
            f"error: --kernel-wait-us nan: {KWAIT_RANGE} (see tracelake sql --help)",
        ),
    ],
)
def test_a_usage_error_is_one_line_that_says_where_help_is(tmp_path, monkeypatch, args, line):
    """click wrote four lines for its own usage errors (Usage:, Try ... --help, a blank line,
    Error: ...); issue 39 item 13: one line on stderr, exit 2, nothing created."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, args)
    assert (r.exit_code, r.output, r.stdout) == (2, line + "\n", ""), r.output
    assert list(tmp_path.iterdir()) == []


def test_the_largest_kernel_wait_threshold_is_taken(tmp_path):
    lake = tmp_path / "lake"
    assert runner.invoke(app, ["ingest", str(SAMPLE), "--lake", str(lake)]).exit_code == 0
    for v in ("0", "1e9"):
        r = runner.invoke(app, ["sql", "--lake", str(lake), "--kernel-wait-us", v, "SELECT 1 AS x"])
        assert r.exit_code == 0, r.output


def test_analysis_reports_each_stage_once_in_order(tmp_path):
    lake = Lake(tmp_path / "lake")
    assert runner.invoke(app, ["ingest", str(SAMPLE), "--lake", str(lake.root)]).exit_code == 0
    seen: list[tuple[str, int, int]] = []
    analyze(lake, on_progress=lambda stage, done, total: seen.append((stage, done, total)))
    metrics = [m for m in METRICS if m not in COUNTER_METRICS]  # the sample traces have no counters
    total = len(metrics) + 2
    assert [d for _, d, _ in seen] == list(range(1, total + 1)) and {t for _, _, t in seen} == {total}
    assert seen[0][0] == "connect" and seen[-1][0] == "findings"
    assert sorted(s for s, _, _ in seen[1:-1]) == sorted(metrics)


def test_progress_goes_to_stderr_on_a_terminal_and_quiet_turns_it_off(tmp_path, monkeypatch):
    cli_app = importlib.import_module("pipeline.cli.app")  # the module, not the Typer app

    lake = tmp_path / "lake"
    assert runner.invoke(app, ["ingest", str(SAMPLE), "--lake", str(lake)]).exit_code == 0
    for quiet, shown in ((False, True), (True, False)):
        buf = io.StringIO()
        monkeypatch.setattr(cli_app, "err", Console(file=buf, force_terminal=True, width=100))
        r = runner.invoke(app, ["analyze", "--lake", str(lake), "--json"] + (["--quiet"] if quiet else []))
        assert r.exit_code == 0 and r.stdout.startswith("{")  # stdout: the document only
        assert ("analyze" in buf.getvalue()) is shown, buf.getvalue()


def test_sql_metric_views_take_the_analysis_options(tmp_path):
    """A finding's SQL run in `tracelake sql` gives the analysis' numbers under the same options:
    kernel wait is the idle gaps shorter than --kernel-wait-us that are not host wait, so 0 µs
    leaves none, and the default (30 µs) equals analyze's."""
    import json

    lake = tmp_path / "lake"
    assert runner.invoke(app, ["ingest", str(SAMPLE), "--lake", str(lake)]).exit_code == 0
    q = "SELECT sum(idle_kernel_wait_ns) AS kw FROM breakdown WHERE level = 'rank'"
    got = {}
    for k in ("0", "30"):
        r = runner.invoke(app, ["sql", "--lake", str(lake), "--format", "json", "--kernel-wait-us", k, q])
        assert r.exit_code == 0, r.output
        got[k] = json.loads(r.stdout)[0]["kw"]
    doc = json.loads(runner.invoke(app, ["analyze", "--lake", str(lake), "--json", "-q"]).stdout)
    assert got["0"] == 0 and got["30"] == sum(r["idle_kernel_wait_ns"] for r in doc["ranks"]) > 0


def test_sql_reads_and_never_writes(tmp_path, monkeypatch):
    """`tracelake sql` runs one statement that reads: COPY ... TO (into the lake, or anywhere),
    ATTACH, CREATE and SET are refused with one line, exit 2, and leave every file as it was;
    results it cannot print are one line too; NaN is null in JSON; a cut table says so."""
    import json

    lake = tmp_path / "lake"
    assert runner.invoke(app, ["ingest", str(SAMPLE), "--lake", str(lake)]).exit_code == 0
    monkeypatch.chdir(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    target = lake / "sources" / "run=hta_trace_filter" / "evil.parquet"
    for q in (
        f"COPY (SELECT * FROM sources LIMIT 1) TO '{target}'",
        "COPY (SELECT 1) TO 'out.csv'",
        "ATTACH 'x.db' AS x",
        "CREATE TABLE t AS SELECT 1",
        "SET threads = 1",
        "SELECT 1; SELECT 2",
        # EXPLAIN ANALYZE runs what it explains: a COPY under it wrote the file (found by an attack)
        f"EXPLAIN ANALYZE COPY (SELECT 'x' AS y) TO '{target}' (FORMAT parquet)",
        "explain analyze copy (select 1) to 'out.csv'",
        "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
        "/* first */ EXPLAIN ANALYZE COPY (SELECT 1) TO 'out.csv'",
    ):
        r = runner.invoke(app, ["sql", "--lake", str(lake), q])
        assert r.exit_code == 2 and r.stdout == "" and len(r.output.strip().splitlines()) == 1, (q, r.output)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    # EXPLAIN [ANALYZE] of a query still runs
    r = runner.invoke(
        app, ["sql", "--lake", str(lake), "--format", "csv", "EXPLAIN ANALYZE SELECT count(*) FROM sources"]
    )
    assert r.exit_code == 0 and "explain_value" in r.stdout.splitlines()[0]
    for q in ("SELECT INTERVAL 1 DAY AS v", "SELECT union_value(k := 1) AS u"):
        r = runner.invoke(app, ["sql", "--lake", str(lake), "--format", "json", q])
        assert r.exit_code == 2 and "cannot print the result" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["sql", "--lake", str(lake), "--format", "json", "SELECT 'nan'::DOUBLE AS v"])
    assert r.exit_code == 0 and json.loads(r.stdout) == [{"v": None}]
    r = runner.invoke(app, ["sql", "--lake", str(lake), "SELECT range AS i FROM range(300)"])
    assert r.exit_code == 0 and "shows 200 of 300 rows" in r.stderr and "299" in r.stdout
