"""The fleet view (pipeline/fleet.py, `tracelake runs`, the multi-run report's table and chart).

Expected values come from outside the code under test: the corpus files read by hand or by a
brute-force scan here (PROVENANCE.md: DLRM is 8 ranks of world size 8 on Tesla V100-SXM2-32GB with
one ProfilerStep #10; HTA's trace_diff/test is rank 1 of 2 on a Tesla V100-SXM2-16GB, 6
ProfilerSteps), hand-written analysis documents with hand-computed figures, and for the CLI the
analysis document itself (the fleet is a projection of it)."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from datetime import datetime, timezone

import polars as pl
import pytest
from conftest import corpus
from test_report_browser import open_report
from typer.testing import CliRunner

from pipeline.cli import EXIT_OK, app
from pipeline.diagnosis.verdict import VERDICTS
from pipeline.fleet import DISPLAY, FLEET_COLUMNS, FLEET_SCHEMA, fleet_rows
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.report.fleet_chart import VERDICT_COLORS, fleet_chart
from pipeline.report.html import render

runner = CliRunner()
DLRM = ("param", "et_replay", "tests", "inputs", "dlrm_kineto")
V100X2 = ("hta", "tests", "data", "trace_diff", "test")


def _scan(files) -> tuple[int, list[int]]:
    """Brute force over Kineto JSON files: the earliest start of an X event that is not the
    profiler's own 'Trace' span (ns), and every ProfilerStep's host duration (ns)."""
    import gzip

    start, steps = None, []
    for f in files:
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            events = json.load(fh)["traceEvents"]
        for e in events:
            if e.get("ph") == "X" and e.get("cat") != "Trace":
                start = e["ts"] if start is None else min(start, e["ts"])
            if str(e.get("name", "")).startswith("ProfilerStep#"):
                steps.append(round(e["dur"] * 1000))
    return round(start * 1000), steps


@pytest.fixture(scope="module")
def fleet_lake(tmp_path_factory):
    """A lake of two runs: DLRM's 8 ranks (run dlrm) and trace_diff's one V100 rank (run v100x2)."""
    lake = Lake(tmp_path_factory.mktemp("fleet") / "lake")
    for parts, run in ((DLRM, "dlrm"), (V100X2, "v100x2")):
        res = ingest_paths([corpus(*parts)], lake, run=run, jobs=1)
        assert res and all(r.status == "ok" for r in res), [r.error for r in res]
    from pipeline.analyze import analyze

    return lake, analyze(lake)


def test_fleet_rows_of_a_real_lake(fleet_lake):
    lake, doc = fleet_lake
    rows = {r["run_id"]: r for r in fleet_rows(doc, lake.sources()).iter_rows(named=True)}
    assert sorted(rows) == ["dlrm", "v100x2"]
    d, v = rows["dlrm"], rows["v100x2"]
    dlrm_start, dlrm_steps = _scan(sorted(corpus(*DLRM).glob("*.json")))
    # world size 8, 8 V100s, one step (PROVENANCE.md); the step windows are the host steps here
    # (their GPU work ends inside them), so the median is that of the 8 ProfilerStep#10 durations:
    # (14,455 + 17,797) / 2 µs
    assert (d["world_size"], d["ranks"], d["gpus"], d["gpu_model"], d["steps"]) == (
        8,
        8,
        8,
        "Tesla V100-SXM2-32GB",
        1,
    )
    assert len(dlrm_steps) == 8 and d["median_step_ns"] == statistics.median(dlrm_steps) == 16_126_000
    assert d["start_ns"] == dlrm_start == 1_694_128_201_421_205_000
    assert d["start_time"] == datetime(2023, 9, 7, 23, 10, 1, 421205, tzinfo=timezone.utc)
    # 16.126 ms x 1,000 steps x 8 GPUs in GPU-hours
    assert d["gpu_hours_per_1000_steps"] == pytest.approx(16.126e-3 * 1000 * 8 / 3600)
    assert d["hosts"] is None  # no DLRM file names its host
    v_start, _ = _scan([corpus(*V100X2, "test.json.gz")])
    assert (v["world_size"], v["ranks"], v["gpus"], v["gpu_model"], v["steps"]) == (
        2,
        1,
        1,
        "Tesla V100-SXM2-16GB",
        6,
    )
    assert v["start_ns"] == v_start
    # the verdict, its confidence and the top finding are the document's, finding for finding
    for rid, r in rows.items():
        verdict = next(x for x in doc["verdicts"] if x["run_id"] == rid)
        found = [f for f in doc["findings"] if f["run_id"] == rid]
        assert (r["verdict"], r["verdict_confidence"]) == (verdict["verdict"], verdict["confidence"])
        assert r["findings"] == len(found) > 0
        # per step on a run with steps (DLRM: 1 step; trace_diff: 6), not the window's total
        steps = next(x for x in doc["runs"] if x["run_id"] == rid)["steps"]
        per_step = found[0]["per_step_ns"] if steps else found[0]["recoverable_ns"]
        assert per_step is not None and (per_step < found[0]["recoverable_ns"]) == (len(steps) > 1)
        assert (r["top_finding"], r["top_finding_recoverable_ns"]) == (found[0]["kind"], per_step)
    # DLRM's MFU is not measurable (19.5 % FLOP coverage, under the 50 % bar): null, not a number
    assert d["mfu_pct"] is None and d["tokens_per_s"] is None


def test_start_from_the_document_without_sources(fleet_lake):
    """Without the sources rows the start is the earliest step start of the document."""
    lake, doc = fleet_lake
    rows = {r["run_id"]: r for r in fleet_rows(doc).iter_rows(named=True)}
    first = min(s["step_start_ns"] for s in doc["step_time"] if s["run_id"] == "dlrm")
    assert rows["dlrm"]["start_ns"] == first >= 1_694_128_201_421_205_000


def _doc(**over) -> dict:
    """A hand-written analysis document of two runs: 'a' (4 ranks on 2 hosts, 3 steps, median 20 ms,
    tokens 1,000/s, MFU 40 %, two findings) and 'b' (no steps, MFU not measurable)."""
    doc = {
        "runs": [
            {
                "run_id": "a",
                "ranks": [0, 1, 2, 3],
                "world_size": 4,
                "hosts": ["h1", "h2"],
                "gpus": [{"name": "H100", "ranks": 4}],
                "steps": [1, 2, 3],
                "formats": ["kineto_json", "nccl_log"],
            },
            {
                "run_id": "b",
                "ranks": [0],
                "world_size": None,
                "hosts": [],
                "gpus": [{"name": "(unnamed)", "ranks": 1}],
                "steps": [],
                "formats": ["nsys_sqlite"],
            },
        ],
        "verdicts": [
            {"run_id": "a", "verdict": "network-bound", "confidence": "high", "median_step_ns": 20_000_000},
            {"run_id": "b", "verdict": "unknown", "confidence": None, "median_step_ns": None},
        ],
        "throughput": [
            {"run_id": "a", "mfu_pct": 40.0, "tokens_per_s": 1000.0, "mfu_measurable": True},
            {"run_id": "b", "mfu_pct": 3.0, "tokens_per_s": None, "mfu_measurable": False},
        ],
        "findings": [
            {
                "run_id": "a",
                "kind": "exposed_comm",
                "title": "t1",
                "recoverable_ns": 15_000_000,  # 3 steps of 5 ms
                "per_step_ns": 5_000_000,
                "gpu_hours_per_1000_steps": 0.5,
                "cost_per_1000_steps": 1.5,
            },
            {
                "run_id": "a",
                "kind": "host_idle",
                "title": "t2",
                "recoverable_ns": 1,
                "gpu_hours_per_1000_steps": 0,
            },
        ],
        "step_time": [],
    }
    doc.update(over)
    return doc


def test_fleet_rows_of_a_hand_written_document():
    df = fleet_rows(_doc())
    assert df.schema == FLEET_SCHEMA and df.columns == [c for c, _, _, _ in FLEET_COLUMNS]
    a, b = df.iter_rows(named=True)
    assert (a["world_size"], a["ranks"], a["hosts"], a["gpus"], a["gpu_model"], a["steps"]) == (
        4,
        4,
        2,
        4,
        "H100",
        3,
    )
    assert (a["median_step_ns"], a["mfu_pct"], a["tokens_per_s"]) == (20_000_000, 40.0, 1000.0)
    assert (a["top_finding"], a["top_finding_title"], a["top_finding_recoverable_ns"]) == (
        "exposed_comm",
        "t1",
        5_000_000,
    )
    assert (a["top_finding_gpu_hours_per_1000_steps"], a["top_finding_cost_per_1000_steps"]) == (0.5, 1.5)
    assert a["findings"] == 2 and a["formats"] == "kineto_json, nccl_log"
    # 20 ms x 1,000 steps x 4 GPUs = 80 GPU-s = 0.0222... GPU-hours
    assert a["gpu_hours_per_1000_steps"] == pytest.approx(80 / 3600)
    # b: no world size stated (1 rank traced), no host, an unnamed GPU, no steps, MFU not measurable
    assert (b["world_size"], b["hosts"], b["gpus"], b["gpu_model"], b["steps"]) == (
        1,
        None,
        1,
        "(unnamed)",
        0,
    )
    assert b["median_step_ns"] is None and b["gpu_hours_per_1000_steps"] is None and b["mfu_pct"] is None
    assert b["verdict"] == "unknown" and b["verdict_confidence"] is None
    assert b["top_finding"] is None and b["findings"] == 0
    assert a["start_ns"] is None  # no sources, no step rows


def test_start_before_2000_is_unknown():
    """A start on a relative clock (the epoch's first seconds) is not a date: null."""
    src = pl.DataFrame(
        {"run_id": ["a", "b"], "status": ["ok", "ok"], "trace_start_ns": [5_000, 1_600_000_000 * 10**9]}
    )
    a, b = fleet_rows(_doc(), src).iter_rows(named=True)
    assert a["start_ns"] is None and a["start_time"] is None
    assert (
        b["start_ns"] == 1_600_000_000 * 10**9 and b["start_time"].isoformat() == "2020-09-13T12:26:40+00:00"
    )
    # failed sources give no start
    failed = src.with_columns(status=pl.lit("failed"))
    assert fleet_rows(_doc(), failed)["start_ns"].to_list() == [None, None]


def test_columns_are_documented():
    """Every column has a type and a doc; the units are in the names (_ns: ns, _pct: pct)."""
    for name, _, unit, doc in FLEET_COLUMNS:
        assert len(doc) > 10, name
        assert (unit == "ns") == name.endswith("_ns") and (unit == "pct") == name.endswith("_pct"), name
    assert {c for c, _, _ in DISPLAY} <= set(FLEET_SCHEMA.names())
    assert set(VERDICT_COLORS) == set(VERDICTS)  # one colour per verdict the diagnosis can give


# ------------------------------------------------------------------ tracelake runs


def _runs(lake: Lake, *args: str):
    return runner.invoke(app, ["runs", "--lake", str(lake.root), "--quiet", *args])


def test_runs_csv_sorted_and_filtered(fleet_lake):
    lake, doc = fleet_lake
    medians = {v["run_id"]: v["median_step_ns"] for v in doc["verdicts"]}
    r = _runs(lake, "--format", "csv", "--sort", "-median_step_ns")
    assert r.exit_code == EXIT_OK, r.output
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["run_id"] for x in rows] == sorted(medians, key=lambda k: -medians[k])
    assert {x["run_id"]: int(x["median_step_ns"]) for x in rows} == medians
    dlrm = next(x for x in rows if x["run_id"] == "dlrm")
    assert (dlrm["world_size"], dlrm["start_time"]) == ("8", "2023-09-07T23:10:01.421205Z")
    # --where: a DuckDB expression over the columns; a null compares as unknown (left out)
    r = _runs(lake, "--format", "csv", "--where", "world_size >= 8 AND gpu_model LIKE '%32GB'")
    assert [x["run_id"] for x in csv.DictReader(io.StringIO(r.stdout))] == ["dlrm"]
    r = _runs(lake, "--format", "csv", "--where", "start_time < TIMESTAMPTZ '2023-01-01 00:00:00+00'")
    assert [x["run_id"] for x in csv.DictReader(io.StringIO(r.stdout))] == ["v100x2"]  # 2022-08-31
    r = _runs(lake, "--format", "csv", "--where", "hosts > 0")
    assert r.exit_code == EXIT_OK and r.stdout.strip().count("\n") == 0  # the header alone
    assert "no run matches" in r.stderr


def test_runs_json_and_md(fleet_lake):
    lake, doc = fleet_lake
    r = _runs(lake, "--format", "json", "--sort", "world_size")
    assert r.exit_code == EXIT_OK, r.output
    rows = json.loads(r.stdout)
    assert [x["run_id"] for x in rows] == ["v100x2", "dlrm"]  # world size 2, then 8
    assert list(rows[0]) == [c for c, _, _, _ in FLEET_COLUMNS]
    # an integer past 2^53 - 1 is text (as `tracelake sql --format json` writes it)
    assert rows[1]["start_ns"] == "1694128201421205000" and rows[1]["median_step_ns"] == 16_126_000
    r = _runs(lake, "--format", "md", "--where", "run_id = 'dlrm'")
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("| run | start (UTC) | world |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:7] == ["dlrm", "2023-09-07 23:10", "8", "—", "8", "1", "16.13 ms"]
    # numbers are right-aligned: world, hosts, GPUs, steps, median step, MFU, tokens/s, could win, GPU-h
    assert lines[1].count("---:") == 9 and lines[1].count("| --- ") == len(DISPLAY) - 9


@pytest.mark.parametrize(
    "where",
    [
        "verdict = ",  # a syntax error
        "no_such_column > 1",
        "true; DROP TABLE runs",  # a statement, not an expression
        "run_id IN (SELECT path FROM read_csv('/etc/passwd'))",  # no file access
    ],
)
def test_bad_where_is_a_one_line_usage_error(fleet_lake, where):
    lake, _ = fleet_lake
    r = _runs(lake, "--where", where)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith("error: --where: ") and r.stderr.count("\n") == 1, r.stderr


def test_bad_sort_and_format(fleet_lake):
    lake, _ = fleet_lake
    r = _runs(lake, "--sort", "median_step")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "unknown column 'median_step'" in r.stderr
    r = _runs(lake, "--format", "xml")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1


# ------------------------------------------------------------------ the multi-run report


def test_report_opens_with_the_table_of_runs(fleet_lake):
    lake, doc = fleet_lake
    page = render(doc)
    table = re.search(r'<table class="fleet" id="fleet">(.*?)</table>', page, re.S).group(1)
    links = re.findall(r'<a href="#(run-\d+)">([^<]+)</a>', table)
    # one row per run, in `tracelake runs`' order: by start time (v100x2 2022-08-31, dlrm 2023-09-07)
    assert [name for _, name in links] == ["v100x2", "dlrm"]
    for anchor, name in links:  # each link leads to its run's section
        assert re.search(rf'<section class="run" id="{anchor}"><h2>Run <code>{name}</code>', page)
    assert page.index('id="fleet"') < page.index('<section class="run"')
    # both runs have a start and steps: the chart of step time over time is drawn
    assert 'data-chart="fleet"' in page and "Chart hidden" not in page.split('<section class="run"')[0]


def test_fleet_chart_needs_two_placed_runs():
    df = fleet_rows(_doc())  # no start times
    chart, note = fleet_chart(df)
    assert chart is None and "(0 of 2 have both)" in note
    src = pl.DataFrame(
        {"run_id": ["a", "b"], "status": ["ok", "ok"], "trace_start_ns": [2 * 10**18, 2 * 10**18]}
    )
    chart, note = fleet_chart(fleet_rows(_doc(), src))
    assert chart is None and "(1 of 2 have both)" in note  # b has no steps


def test_report_table_sorts_filters_and_links_in_a_browser(fleet_lake, tmp_path, browser):
    """Headless Chromium (as tests/test_report_browser.py): the header click sorts by value, the
    box filters, a run's link scrolls to its section, and the chart draws one point per run."""
    lake, doc = fleet_lake
    medians = {v["run_id"]: v["median_step_ns"] for v in doc["verdicts"]}
    path = tmp_path / "fleet.html"
    path.write_text(render(doc), encoding="utf-8")
    page, ctx, log = open_report(browser, path)
    try:
        names = "() => [...document.querySelectorAll('#fleet tbody tr')].map(r => r.cells[0].innerText)"
        head = page.locator("#fleet th[data-col=median_step_ns]")
        head.click()
        assert page.evaluate(names) == sorted(medians, key=medians.get)
        assert head.get_attribute("aria-sort") == "ascending"
        head.click()
        assert page.evaluate(names) == sorted(medians, key=lambda k: -medians[k])
        page.fill("#fleet-filter", "v100")
        visible = "() => [...document.querySelectorAll('#fleet tbody tr')].filter(r => !r.hidden).length"
        assert page.evaluate(visible) == 1
        page.fill("#fleet-filter", "")
        page.click("#fleet a:text-is('dlrm')")
        anchor = page.evaluate("() => location.hash").lstrip("#")
        assert page.locator(f"section#{anchor} h2").inner_text() == "Run dlrm"
        assert page.locator(f"section#{anchor}").bounding_box()["y"] < 50  # scrolled to it
        points = "() => document.querySelectorAll('.chart[data-chart=fleet] svg .mark-symbol.role-mark path')"
        assert page.evaluate(points + ".length") == 2  # one point per run
        assert log["pageerror"] == [] and log["console"] == [] and log["blocked"] == []
    finally:
        ctx.close()


def test_a_one_off_slow_step_is_not_priced_as_a_per_step_win(tmp_path):
    """JAX-Toolbox's pax FSDP job (four nsys-jax archives: tests/test_report.py
    test_nsys_jax_verdict_uses_steps_not_startup): step 0 is a warm-up of ~6 s against a median
    step of ~127 ms, left out of the verdict, and its slow_steps finding is the run's only one. It
    has no per-step time, so the row's "could win" (per step on a run with steps) is null: it
    showed the window's 3,716 ms against a 127 ms step (a new user's trial). With a finding that
    costs time in every step, the row names that one before the one-off (hand-written document)."""
    from pipeline.analyze import analyze

    lake = Lake(tmp_path / "lake")
    assert all(r.status == "ok" for r in ingest_paths([corpus("nsys", "jax-toolbox")], lake, run="pax"))
    doc = analyze(lake)
    found = [f for f in doc["findings"] if f["run_id"] == "pax"]
    v = next(x for x in doc["verdicts"] if x["run_id"] == "pax")
    assert [(e["step"], e["why"]) for e in v["excluded_steps"]] == [(0, "outlier")]
    assert [(f["kind"], f["per_step_ns"]) for f in found] == [("slow_steps", None)]
    assert found[0]["recoverable_ns"] > 10 * v["median_step_ns"]
    (row,) = fleet_rows(doc).iter_rows(named=True)
    assert (row["top_finding"], row["top_finding_recoverable_ns"]) == ("slow_steps", None)
    # a per-step cause ranked below the one-off (3 ms per step against 60 ms once) is named instead
    one_off = {
        "run_id": "a",
        "kind": "slow_steps",
        "title": "t0",
        "recoverable_ns": 60_000_000,
        "per_step_ns": None,
    }
    hand = _doc()
    hand["findings"].insert(0, one_off)
    a = next(r for r in fleet_rows(hand).iter_rows(named=True) if r["run_id"] == "a")
    assert (a["top_finding"], a["top_finding_title"], a["top_finding_recoverable_ns"]) == (
        "exposed_comm",
        "t1",
        5_000_000,
    )
