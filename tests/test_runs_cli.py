"""`tracelake runs` and standard output's edges (the tester's findings 6-9): --where repeated is an
AND, JSON is UTF-8 as it is, a reader that went away ends the command quietly with 141, as a Unix
tool that SIGPIPE ends. The lake: three one-kernel traces in directories named by hand (`über`,
`हिन्दी`, `plain`); the expected runs, lines and exit codes are written out by hand."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, X, write_trace
from typer.testing import CliRunner

from pipeline.cli import EXIT_OK, app
from pipeline.lake import Lake

runner = CliRunner()
T0_US = 1_793_761_200 * 10**6  # 2026-11-04 03:00:00 UTC


@pytest.fixture(scope="module")
def small_lake(tmp_path_factory):
    """Runs über (world size 2), हिन्दी (world size 4) and plain (world size 2), one rank each."""
    root = tmp_path_factory.mktemp("runs_cli")
    for i, (name, world) in enumerate((("über", 2), ("हिन्दी", 4), ("plain", 2))):
        write_trace(
            root / "traces" / name / "rank0.json",
            [X("kernel", "k", T0_US + i * 1000, 50, pid=0, tid=7, device=0, stream=7, correlation=1)],
            distributedInfo={"rank": 0, "world_size": world},
        )
    lake = root / "lake"
    r = runner.invoke(app, ["ingest", str(root / "traces"), "--lake", str(lake), "-j", "1", "-q"])
    assert r.exit_code == EXIT_OK, r.output
    assert sorted(set(Lake(lake).sources()["run_id"].to_list())) == sorted(["über", "हिन्दी", "plain"])
    return lake


def _runs(lake, *args):
    return runner.invoke(app, ["runs", "--lake", str(lake), "-q", *args])


def _ids(r) -> list[str]:
    return [row["run_id"] for row in csv.DictReader(io.StringIO(r.stdout))]


def test_where_repeated_keeps_the_runs_matching_every_one(small_lake):
    assert sorted(_ids(_runs(small_lake, "--format", "csv", "--where", "world_size = 2"))) == [
        "plain",
        "über",
    ]
    # the last alone would keep plain and über (world size 2); both together keep plain
    both = _runs(small_lake, "--format", "csv", "--where", "run_id LIKE 'p%'", "--where", "world_size = 2")
    assert both.exit_code == EXIT_OK, both.output
    assert _ids(both) == ["plain"]
    assert _ids(_runs(small_lake, "--format", "csv", "-w", "world_size = 2", "-w", "run_id LIKE 'p%'")) == [
        "plain"
    ]
    # a bad one of several is the usage error it is alone
    bad = _runs(small_lake, "--where", "world_size = 2", "--where", "world_size = ")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --where: ") and bad.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("where", "line"),
    [
        (
            "1; select 1",
            "error: --where: '1; select 1' holds 2 statements (';' ends one): give one SQL expression",
        ),
        (
            "",
            "error: --where: empty condition: give one SQL expression over the columns "
            "(verdict = 'network-bound')",
        ),
        (
            "  ",
            "error: --where: empty condition: give one SQL expression over the columns "
            "(verdict = 'network-bound')",
        ),
        (
            "1 ORDER BY 2",
            "error: --where: '1 ORDER BY 2': one SQL expression expected (ORDER BY, LIMIT and the like "
            "are no part of one)",
        ),
    ],
)
def test_a_where_that_is_not_one_expression_says_so(small_lake, where, line):
    """The tester's finding 7: DuckDB's 'Cannot have any modifiers in the expression list' and
    'SELECT clause without selection list' named neither --where nor what was wrong."""
    r = _runs(small_lake, "--where", where)
    assert r.exit_code == 2
    assert r.stderr == line + "\n"


def test_a_semicolon_in_a_string_is_no_second_statement(small_lake):
    r = _runs(small_lake, "--format", "csv", "--where", "run_id <> 'a;b' AND world_size = 4")
    assert r.exit_code == EXIT_OK, r.output
    assert _ids(r) == ["हिन्दी"]


def test_json_is_utf8_as_it_is(small_lake):
    r = _runs(small_lake, "--format", "json", "--sort", "run_id")
    assert r.exit_code == EXIT_OK, r.output
    raw = r.stdout_bytes
    assert "über".encode() in raw and "हिन्दी".encode() in raw and b"\\u" not in raw
    assert [x["run_id"] for x in json.loads(raw)] == sorted(["über", "हिन्दी", "plain"])


def _closed_stdout(args: list[str]) -> tuple[int, str]:
    """Run `python -m pipeline.cli ARGS` with standard output a pipe whose reader is already gone:
    (exit code, standard error)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *args],
            stdout=w,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=120,
        )
    finally:
        os.close(w)
    return p.returncode, p.stderr.decode()


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "--format", "csv"],
        ["runs"],  # rich's table: rich's own handling exited 1
        ["sql", "SELECT * FROM range(100000)", "--format", "csv"],
        ["sql", "SELECT * FROM range(10)"],
    ],
)
def test_a_closed_pipe_ends_quietly_with_141(small_lake, args):
    code, err = _closed_stdout([*args, "--lake", str(small_lake), *(["-q"] if args[0] == "runs" else [])])
    assert code == 128 + 13  # SIGPIPE is signal 13 on Linux: what a shell reports for `yes | head -1`
    assert err == ""  # no traceback, no "Exception ignored" line


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["sql", "--help"]])
def test_help_and_version_into_a_closed_pipe_end_quietly_too(args):
    assert _closed_stdout(args) == (128 + 13, "")


def test_head_reads_the_first_line(small_lake):
    """The tester's pipeline as a shell runs it: head prints the header, the command ends 141."""
    cmd = (
        f"{sys.executable} -m pipeline.cli sql 'SELECT * FROM range(300000)' --format csv "
        f"--lake {small_lake} | head -1; echo rc=${{PIPESTATUS[0]}}"
    )
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.stdout.splitlines()[0] == "range"
    assert p.stdout.splitlines()[1] in ("rc=141", "rc=0")  # 0 when it wrote it all before head left
    assert p.stderr == ""


def test_run_of_only_bad_inputs_ends_with_one_line_saying_so(tmp_path):
    """The tester's finding 11: `tracelake run` on inputs that all fail exited 4 after the ingest's
    summary, without a word about the report."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text("garbage")
    (tmp_path / "in" / "b.json").write_text("{")
    out = tmp_path / "r.html"
    r = runner.invoke(
        app, ["run", str(tmp_path / "in"), "--lake", str(tmp_path / "lake"), "-o", str(out), "-q"]
    )
    assert r.exit_code == 4
    lines = r.stderr.splitlines()
    assert lines[-2] == f"ingested 0, failed 2, skipped 0 (already in the lake) -> {tmp_path / 'lake'}"
    assert lines[-1] == f"error: no report written to {out}: no input could be ingested"
    assert not out.exists()


def test_the_table_keeps_its_columns_whatever_the_script_of_a_run_id(small_lake):
    """The tester's finding 9: हिन्दी's vowel signs are 3 cells by rich's count, 4 by wcwidth's and
    5 by glibc's, so a terminal drew its row wider than rich padded it and shifted the columns
    after it. The run id is the last column: every other column starts at the same offset on
    every line (all their cells are ASCII, '—' or box lines: one character, one cell)."""
    r = _runs(small_lake)
    assert r.exit_code == EXIT_OK, r.output
    header, rule, *rows = r.stdout.splitlines()
    assert header.split("┃")[0].strip() == "start (UTC)" and header.split("┃")[-1].strip() == "run"
    assert sorted(row.split("│")[-1].strip() for row in rows) == sorted(["über", "हिन्दी", "plain"])
    seps = [[i for i, c in enumerate(line) if c in "┃│╇"] for line in (header, rule, *rows)]
    assert len(seps[0]) == 13 and all(s == seps[0] for s in seps)  # 14 columns, 13 separators
