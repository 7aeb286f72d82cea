"""The HTML report in a real browser: headless Chromium (Debian's `chromium` package, installed by
scripts/install-browser.sh from `make test`), driven by Playwright, opens reports made from corpus
traces with the network blocked, and checks that every chart rendered, that nothing was logged as
an error, that no request left the page, and that markup in input strings stayed text.

These tests fail, not skip, when the browser is missing: run `bash scripts/install-browser.sh`
(or set TRACELAKE_CHROMIUM to a Chromium binary)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO, corpus
from test_report import DLRM, EVIL, injection_lake, synthetic_lake
from test_report_charts import GCP, gcp_rows
from typer.testing import CliRunner

from pipeline.cli import EXIT_OK, app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.report.charts import _CAUSE_LABELS

runner = CliRunner()

# report name -> the charts it must draw (a chart the data cannot support is hidden, with its reason)
EXPECTED = {
    # busbw: the sampled ranks' all_to_all / all_gather sizes come from their nccl:<op> records
    # phases: HTA's sampled ranks (and trace_diff's) have autograd backward and Optimizer.step ops
    # roofline: their ops carry Input Dims (aten::mm, addmm, elementwise); DLRM's too
    # critical_path (docs/whatif.md): every report here has a run with GPU work and steps (the nsys
    # export's steps are found from its kernel sequence, the injection trace has ProfilerSteps)
    "kineto_2_ranks": {
        "breakdown",
        "overlap",
        "phases",
        "busbw",
        "wait",
        "kernels",
        "idle_gaps",
        "roofline",
        "critical_path",
    },
    # nccl_tests: its second run, GCP's all_reduce_perf output
    "one_rank_with_bandwidth": {
        "breakdown",
        "overlap",
        "phases",
        "busbw",
        "kernels",
        "idle_gaps",
        "nccl_tests",
        "critical_path",
    },
    # overlap: 0 % on both ranks, a sentence (EXPECTED_TABLES)
    "nsys_no_steps": {"breakdown", "wait", "kernels", "idle_gaps", "critical_path"},
    # busbw: DLRM's all_to_all / all_reduce sizes come from the nccl:<op> records around each launch;
    # no phases: synthetic_lake keeps only the host ops the other metrics read (no backward ops);
    # mfu: hidden, not measurable (20 % FLOP coverage, issue 39 item 9); wait: one step, a bar per rank
    "dlrm_64_ranks": {
        "breakdown",
        "overlap",
        "wait",
        "busbw",
        "kernels",
        "idle_gaps",
        "roofline",
        "critical_path",
    },
    # busbw: trace_diff's all_to_alls are sized from their nccl:all_to_all records, and the group
    # of an unnamed process group is the world (distributedInfo world_size); mfu: hidden, its FLOP
    # coverage is under the 50 % bar (not measurable)
    "comparison": {
        "comparison",
        "breakdown",
        "overlap",
        "phases",
        "busbw",
        "kernels",
        "idle_gaps",
        "roofline",
        "critical_path",
    },  # fmt: skip
    "injection": {"breakdown", "kernels", "idle_gaps", "critical_path"},
}
# report name -> the charts it shows as a sentence (and a table) instead: a single dot or a 0 % bar
EXPECTED_TABLES = {
    "nsys_no_steps": {"overlap"},
    "injection": {"overlap"},
}


def _ingest(path: Path, lake: Lake, run: str) -> Lake:
    res = ingest_paths([path], lake, run=run)
    assert res and all(r.status == "ok" for r in res), [r.error for r in res]
    return lake


def _report(lake: Lake, out: Path, *extra: str) -> Path:
    r = runner.invoke(app, ["report", "--lake", str(lake.root), "-o", str(out), *extra])
    assert r.exit_code == EXIT_OK, r.output
    return out


def build_report(name: str, d: Path) -> Path:
    """Make the report `name` (a key of EXPECTED) under d."""
    out = d / f"{name}.html"
    if (
        name == "kineto_2_ranks"
    ):  # `tracelake run` end to end on the sample traces (2 ranks of a 128-rank job)
        r = runner.invoke(
            app, ["run", str(REPO / "sample_traces"), "--lake", str(d / "sample"), "-o", str(out)]
        )
        assert r.exit_code == EXIT_OK, r.output
        return out
    if name == "one_rank_with_bandwidth":  # and, as a second run, an nccl-tests output
        lake = _ingest(corpus("hta", "tests", "data", "nccl_parser_config"), Lake(d / "nccl"), "nccl_parser")
        return _report(_ingest(corpus(*GCP), lake, "nccl_tests"), out)
    if name == "nsys_no_steps":
        return _report(
            _ingest(corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite"), Lake(d / "nsys"), "mfu_2gpu"), out
        )
    if name == "dlrm_64_ranks":
        return _report(synthetic_lake(corpus(*DLRM), d / "dlrm64", 64), out)
    if name == "comparison":
        base = _ingest(
            corpus("hta", "tests", "data", "trace_diff", "control"), Lake(d / "control"), "control"
        )
        cur = _ingest(corpus("hta", "tests", "data", "trace_diff", "test"), Lake(d / "test"), "test")
        return _report(cur, out, "--baseline", str(base.root))
    assert name == "injection"
    return _report(injection_lake(d / "evil"), out)


_BUILT: dict[str, Path] = {}


@pytest.fixture(scope="session")
def report_of(tmp_path_factory):
    """name -> report path, each built once per test process (so xdist workers split the work)."""

    def get(name: str) -> Path:
        if name not in _BUILT:
            _BUILT[name] = build_report(name, tmp_path_factory.mktemp(name))
        return _BUILT[name]

    return get


def open_report(browser, path: Path):
    """Open the report with every non-file, non-data request blocked and recorded. Returns (page,
    context, log) where log holds the blocked requests, console errors and warnings, page errors and
    dialogs; the page has waited until every chart is drawn or has failed."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    log = {"blocked": [], "console": [], "pageerror": [], "dialog": [], "requests": []}

    def route(r):
        url = r.request.url
        if url.startswith(("file:", "data:")):
            return r.continue_()
        log["blocked"].append(url)
        return r.abort()

    ctx.route("**/*", route)
    page = ctx.new_page()
    page.on("request", lambda req: log["requests"].append(req.url))
    page.on(
        "console",
        lambda m: log["console"].append((m.type, m.text)) if m.type in ("error", "warning") else None,
    )
    page.on("pageerror", lambda e: log["pageerror"].append(str(e)))
    page.on("dialog", lambda dlg: (log["dialog"].append(dlg.message), dlg.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_function(
        "() => [...document.querySelectorAll('.chart')].every(e => e.dataset.rendered || e.dataset.error)",
        timeout=30_000,
    )
    return page, ctx, log


CHARTS_JS = """() => [...document.querySelectorAll('.chart')].map(e => ({
  kind: e.dataset.chart, rendered: e.dataset.rendered || '', error: e.dataset.error || '',
  svgs: e.querySelectorAll('svg').length,
  marks: e.querySelectorAll('svg .mark-rect path, svg .mark-symbol path, svg .mark-line path, \
svg .mark-area path, svg .mark-rule line').length}))"""


@pytest.mark.parametrize("name", list(EXPECTED))
def test_report_renders_offline(browser, report_of, name):
    page, ctx, log = open_report(browser, report_of(name))
    try:
        charts = page.evaluate(CHARTS_JS)
        assert {c["kind"] for c in charts} == EXPECTED[name]
        for c in charts:
            assert c["rendered"] == "1" and not c["error"], c
            assert c["svgs"] == 1 and c["marks"] > 0, c
        hidden = page.locator(".hidden-chart").all_inner_texts()
        assert all(t.startswith("Chart hidden: ") and len(t) > 20 for t in hidden)
        tables = page.evaluate(
            "() => [...document.querySelectorAll('.chart-table')].map(e => e.dataset.chart)"
        )
        assert set(tables) == EXPECTED_TABLES.get(name, set())
        assert len(charts) + len(hidden) + len(tables) >= 7
        # a number and its unit never wrap apart: no plain space between them in any text shown
        text = page.inner_text("body")
        assert not re.search(r"\d (?:ns|µs|ms|s|GB/s|MiB|%)(?![\w/])", text), re.findall(
            r"(?s).{30}\d (?:ns|µs|ms|s|GB/s|MiB|%)(?![\w/]).{10}", text
        )[:3]
        assert "\u00a0ms" in text
        assert (
            log["blocked"] == [] and log["console"] == [] and log["pageerror"] == [] and log["dialog"] == []
        )
        assert log["requests"] == [report_of(name).as_uri()]
        # the first screen holds the run summary and the verdict with its numbers
        box = page.locator(".verdict").first.bounding_box()
        assert box["y"] + 120 < 800, box
        assert page.locator("table.summary").first.is_visible()
        assert page.locator(".verdict ul.headline li").count() >= 2
    finally:
        ctx.close()


def test_findings_sql_is_copyable(browser, report_of):
    page, ctx, log = open_report(browser, report_of("injection"))
    try:
        first = page.locator("li.finding").first
        first.locator("summary").click()
        first.locator("button.copy").click()
        selected = page.evaluate("() => window.getSelection().toString()")
        sql = first.locator("pre.sql").inner_text()
        assert selected == sql and sql.startswith("SELECT ") and "FROM step_time" in sql
        assert log["pageerror"] == []
    finally:
        ctx.close()


def test_injection_stays_inert(browser, report_of):
    page, ctx, log = open_report(browser, report_of("injection"))
    try:
        text = page.inner_text("body")
        assert "<script>alert(3)</script>" in text  # the host name, as text
        assert "<img src=x onerror=alert(2)>.json" in text  # the failed file's name, as text
        assert page.evaluate("() => document.querySelectorAll('img').length") == 0
        assert page.evaluate("() => document.querySelectorAll('script').length") == 3  # the report's own
        # kernel names are chart text: SVG text nodes, not markup
        labels = page.evaluate(
            "() => [...document.querySelectorAll('[data-chart=kernels] svg text')].map(t => t.textContent)"
        )
        assert EVIL[0] in labels and EVIL[1] in labels
        # their tooltip shows them as text too
        bar = page.locator("[data-chart=kernels] svg .mark-rect path").first
        bar.hover()
        page.wait_for_selector("#vg-tooltip-element.visible", timeout=5_000)
        tip = page.locator("#vg-tooltip-element")
        assert any(e in tip.inner_text() for e in EVIL + ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"])
        assert page.evaluate("() => document.querySelectorAll('img').length") == 0
        assert (
            log["dialog"] == [] and log["pageerror"] == [] and log["blocked"] == [] and log["console"] == []
        )
    finally:
        ctx.close()


# the drawn bars of a chart: each rect mark item's datum with its height (or width) read back
# through the chart's own scale, so the value is what the browser drew
BARS_JS = """([kind, axis]) => {
  const id = document.querySelector(`.chart[data-chart=${kind}]`).id;
  const v = window.tracelakeViews[id], out = [];
  const walk = n => {
    if (!n) return;
    if (n.marktype === 'rect' && n.role === 'mark')
      for (const it of n.items) out.push({datum: it.datum, p0: axis === 'y' ? it.y : it.x,
                                          p1: axis === 'y' ? it.y + it.height : it.x + it.width});
    (n.items || []).forEach(walk);
  };
  walk(v.scenegraph().root);
  const s = v.scale(axis);
  return out.map(b => ({...b.datum, value: Math.abs(s.invert(b.p0) - s.invert(b.p1))}));
}"""


def test_idle_gap_bars_sum_to_idle_time(browser, report_of):
    """The idle-gap chart's bars are idle time: summed, as drawn, they equal the lake's idle_gaps
    total_ns (queries/idle_gaps.sql), and that equals the whole-trace breakdown's gpu_idle_ns
    (queries/breakdown.sql level 'rank'): both are the gaps between the union of a rank's GPU
    work, first to last activity, with the same device-level causes."""
    from pipeline import query

    path = report_of("kineto_2_ranks")
    con = query.connect(Lake(path.parent / "sample"))
    gaps = query.run(con, "idle_gaps")
    ranks = query.run(con, "breakdown").filter(level="rank")
    assert gaps["total_ns"].sum() == ranks["gpu_idle_ns"].sum() > 0
    for cause, col in (("host_wait", "idle_host_wait_ns"), ("kernel_wait", "idle_kernel_wait_ns")):
        assert gaps.filter(cause=cause)["total_ns"].sum() == ranks[col].sum()
    page, ctx, log = open_report(browser, path)
    try:
        bars = page.evaluate(BARS_JS, ["idle_gaps", "y"])
        assert len(bars) == gaps.height
        drawn_ms = sum(b["value"] for b in bars)
        assert drawn_ms == pytest.approx(gaps["total_ns"].sum() / 1e6, rel=1e-6)
        # each bar is its bucket's time, with the gap count beside it
        by = {(r["bucket_lo_ns"], r["cause"]): r for r in gaps.iter_rows(named=True)}
        for b in bars:
            r = by[(b["lo"], {v: k for k, v in _CAUSE_LABELS.items()}[b["cause"]])]
            assert b["value"] == pytest.approx(r["total_ns"] / 1e6, rel=1e-6, abs=1e-9)
            assert b["gaps"] == r["gaps"]
    finally:
        ctx.close()


def test_zero_overlap_and_one_step_are_sentences(browser, report_of):
    """nsys_no_steps: no communication kernel overlaps compute on either rank, so the overlap
    chart is the sentence '0 %', not an empty axis; DLRM (64 replicated ranks, one step): MFU is
    not measurable at its FLOP coverage (a sentence instead of the chart; the one-step MFU sentence
    and table: tests/test_report_charts.py), and its wait is a bar per rank."""
    page, ctx, _ = open_report(browser, report_of("nsys_no_steps"))
    try:
        t = page.locator(".chart-table[data-chart=overlap]").inner_text()
        assert "0 % of the communication is hidden under compute on any of the 2 ranks" in t.replace(
            "\u00a0", " "
        )
    finally:
        ctx.close()
    page, ctx, _ = open_report(browser, report_of("dlrm_64_ranks"))
    try:
        # DLRM's op shapes model 20 % of its compute-kernel time (throughput.flop_coverage_pct
        # 19.5): below the 50 % bar its MFU is not measurable, said instead of a chart
        note = page.locator("p.hidden-chart[data-chart=mfu]").inner_text()
        assert "MFU not measurable from op shapes: only 20% of compute-kernel time has modelled FLOPs" in note
        # the wait of the one step: a bar per rank, not a one-column heat map
        bars = page.evaluate(BARS_JS, ["wait", "x"])
        assert len(bars) == 64 and {b["steps"] for b in bars} == {"step 10"}
    finally:
        ctx.close()


def test_software_row_of_an_nsys_export(report_of):
    """mfu_2gpu_before.sqlite's TARGET_INFO_SYSTEM_ENV (NvDriverVersion 580.95.05, CudaDriverVersion
    13000) and META_DATA_EXPORT (nsys 2026.2.1.210, export schema 3.25.0), as the sources row
    keeps them, in the summary's software row."""
    html = report_of("nsys_no_steps").read_text()
    assert (
        "<tr><th>software</th><td>NVIDIA driver 580.95.05; CUDA driver API 13.0; Nsight Systems "
        "2026.2.1.210; Nsight Systems export schema 3.25.0</td></tr>"
    ) in html


def test_nccl_tests_points_drawn(browser, report_of):
    """The nccl-tests chart draws one point per row and placement of the file's table (lines 24-54
    of ncclTests-gcp-a3mega-h100-16rank-allreduce.txt), at the printed busbw."""
    page, ctx, log = open_report(browser, report_of("one_rank_with_bandwidth"))
    try:
        pts = page.evaluate(
            """() => {
          const id = document.querySelector('.chart[data-chart=nccl_tests]').id;
          const v = window.tracelakeViews[id], out = [], sy = v.scale('y');
          const walk = n => {
            if (!n) return;
            if (n.marktype === 'symbol' && n.role === 'mark')
              for (const it of n.items) out.push({...it.datum, drawn: sy.invert(it.y)});
            (n.items || []).forEach(walk);
          };
          walk(v.scenegraph().root);
          return out;
        }"""
        )
        assert sorted((p["line"], p["size_bytes"], p["placement"], p["busbw_gbps"]) for p in pts) == sorted(
            gcp_rows()
        )
        assert all(p["drawn"] == pytest.approx(p["busbw_gbps"], abs=0.5) for p in pts)
        assert log["pageerror"] == [] and log["console"] == []
    finally:
        ctx.close()
