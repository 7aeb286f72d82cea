"""The report's chart templates (pipeline/report/spec_cache.py): the spec filled from a kept
template is the spec altair gives when the chart is drawn with its values, byte for byte (the
reference: altair itself, drawn fresh), for every chart of real reports and every variant of each
builder; a report whose templates are kept imports no altair and writes the same page."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from conftest import REPO, corpus

from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.report import charts, html, spec_cache, vega
from pipeline.report.collective_charts import busbw_chart, overlap_chart, wait_heatmap
from pipeline.report.nccl_tests_chart import nccl_tests_chart
from pipeline.report.roofline_chart import roofline_chart


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache directory of this test's own, holding the Vega bundle of the usual one (built once
    per vl-convert version: 2 s), and no template."""
    bundle = vega.vega_bundle()
    d = tmp_path / "cache"
    monkeypatch.setenv("TRACELAKE_CACHE_DIR", str(d))
    from importlib.metadata import version

    d.mkdir()
    (d / f"vega-bundle-vl-convert-{version('vl-convert-python')}.js").write_text(bundle, encoding="utf-8")
    spec_cache._memo.clear()
    spec_cache._used.clear()
    yield d
    spec_cache._memo.clear()
    spec_cache._used.clear()


def same_as_drawn(spec: spec_cache.Spec) -> None:
    """The spec built cold (template made and kept), read back from the disk, and drawn by altair
    with the values: the same JSON text; the template was kept (else the check would compare
    altair with itself)."""
    drawn_spec = spec_cache._drawn(spec.chart())
    drawn = json.dumps(drawn_spec)
    spec_cache._memo.clear()
    cold = json.dumps(spec.to_dict())
    assert spec_cache._memo[spec_cache._key(spec)] is not None, spec.draw.__qualname__
    spec_cache._memo.clear()
    warm_spec = spec.to_dict()
    warm = json.dumps(warm_spec)
    assert (spec_cache.directory() / f"{spec_cache._key(spec)}.json").is_file()
    assert cold == drawn and warm == drawn, spec.draw.__qualname__
    assert warm_spec == drawn_spec  # as Python values too (lists where altair gives lists)
    assert spec_cache._MARK not in warm


def _collect(monkeypatch) -> list:
    got = []
    real = html.spec_dict

    def keep(chart):
        got.append(chart)
        return real(chart)

    monkeypatch.setattr(html, "spec_dict", keep)
    return got


def test_every_chart_of_real_reports_is_its_drawn_spec(tmp_path, cache, monkeypatch):
    """PARAM's 8-rank DLRM job (breakdown, overlap, bus bandwidth with its link peak, wait heat
    map of one step, top kernels, roofline, idle gaps, phases, critical path), sample_traces (two
    ranks of a 128-rank job) and the two in one lake (the fleet chart of a multi-run report),
    and DLRM against itself as baseline (the comparison chart)."""
    lake = Lake(tmp_path / "lake")
    dlrm = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
    assert all(r.status == "ok" for r in ingest_paths([dlrm], lake))
    both = Lake(tmp_path / "both")
    for path in (dlrm, REPO / "sample_traces"):
        assert all(r.status == "ok" for r in ingest_paths([path], both))
    one, two = analyze(lake), analyze(both)
    got = _collect(monkeypatch)
    html.render(one)
    html.render(two)
    html.render(one, baseline=one)
    specs = [c for c in got if isinstance(c, spec_cache.Spec)]
    assert len(specs) == len(got)  # every chart is a Spec: a warm report needs no altair
    kinds = {s.draw.__qualname__ for s in specs}
    assert {"_draw_stacked", "_draw_overlap", "_draw_busbw", "_draw_wait_bars", "_draw_top_kernels"} <= kinds
    assert {"_draw_roofline", "_draw_idle_gaps", "_draw_comparison", "_draw"} <= kinds
    for s in specs:
        same_as_drawn(s)


def _ranks(n: int, zero=()) -> list[dict]:
    return [{"rank": r, "overlap_ns": 0 if r in zero else 10 + r, "comm_ns": 100} for r in range(n)]


def test_every_variant_of_each_builder_is_its_drawn_spec(cache):
    """Each builder's other forms, on small hand-made rows: overlap as a histogram (over 64
    ranks), with labels on its 0 % bars only (over 16 ranks), with none, and labelled (3 ranks);
    MFU over steps; the wait heat map over several steps; bus bandwidth without a link peak; the
    roofline without roofs; nccl-tests with and without a link peak; the fleet chart."""
    import polars as pl

    built = [
        overlap_chart(_ranks(70), [])[0],
        overlap_chart(_ranks(20, zero=(3, 7)), [])[0],
        overlap_chart(_ranks(20), [])[0],
        overlap_chart(_ranks(3, zero=(1,)), [])[0],
        charts.mfu_chart(
            [{"rank": r, "step": s, "mfu_pct": 10.0 + r + s} for r in (0, 1) for s in (4, 5)], None
        )[0],
        wait_heatmap([{"step": s, "wait_ns": {"0": 5 * s, "1": 7, "2": 0}} for s in (1, 2, 3)], 3)[0],
        busbw_chart([{"op": "all_reduce", "msg_bytes": 1024, "busbw_gbps": 3.5, "link_peak_gbps": None}])[0],
        roofline_chart(
            [
                {
                    "intensity": 2.0,
                    "achieved_tflops": 1.5,
                    "kernel_name": "k",
                    "op_name": "aten::mm",
                    "bound": "memory",
                    "dur_ns": 2_000_000,
                    "roof_pct": 40.0,
                    "kernels": 3,
                    "peak_tflops": None,
                    "memory_gbps": None,
                    "precision": "fp32",
                }
            ],
            {},
        )[0],
    ]
    nccl = {
        "file": "t.txt",
        "test": "all_reduce_perf",
        "table_index": 0,
        "placement": "out_of_place",
        "busbw_gbps": 10.0,
        "algbw_gbps": 5.0,
        "time_ns": 1000,
        "type": "float",
        "line_no": 30,
    }
    rows = [{**nccl, "size_bytes": b} for b in (8, 1024)]
    peak = {
        "test": "all_reduce_perf",
        "link_peak_gbps": 450.0,
        "link_note": "NVLink",
        "placement": "out_of_place",
    }
    built.append(nccl_tests_chart(rows, [])[0])
    built.append(
        nccl_tests_chart(
            rows, [peak | {"file": "t.txt", "peak_busbw_gbps": 10.0, "size_at_peak_bytes": 1024}]
        )[0]
    )
    from pipeline.report.fleet_chart import fleet_chart

    fleet = pl.DataFrame(
        {
            "run_id": ["a", "b"],
            "start_ns": [1, 2],
            "median_step_ns": [5_000_000, 6_000_000],
            "start_time": [
                datetime(2026, 12, 1, tzinfo=timezone.utc),
                datetime(2026, 12, 2, tzinfo=timezone.utc),
            ],
            "verdict": ["network-bound", None],
            "verdict_confidence": ["high", None],
            "top_finding_title": [None, "x"],
        }
    )
    built.append(fleet_chart(fleet)[0])
    assert all(isinstance(s, spec_cache.Spec) for s in built)
    variants = {(s.draw.__qualname__, repr(s.variant), tuple(sorted(s.values))) for s in built}
    assert len(variants) == len(built)  # each a template of its own
    for s in built:
        same_as_drawn(s)


def test_a_value_altair_does_not_keep_whole_is_drawn_each_time(cache):
    """A draw function that puts a value inside a longer string (against spec_cache's rule) gets
    no template: its spec is drawn by altair each time, with the value."""

    def draw(title):
        from pipeline.report.altair_lib import alt

        return alt.Chart(alt.Data(values=[{"a": 1}])).mark_bar().properties(title=f"runs: {title}")

    s = spec_cache.Spec(draw, title="x")
    assert s.to_dict()["title"] == "runs: x"
    assert spec_cache._memo[spec_cache._key(s)] is None
    assert not (spec_cache.directory() / f"{spec_cache._key(s)}.json").exists()


def test_a_report_with_kept_templates_imports_no_altair_and_is_the_same_page(tmp_path, cache):
    """DLRM's report rendered in this process with no template kept (altair draws every chart),
    then in a fresh interpreter from the kept templates: the same page, and altair not imported
    there."""
    lake = Lake(tmp_path / "lake")
    dlrm = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
    assert all(r.status == "ok" for r in ingest_paths([dlrm], lake))
    cold = html.render(analyze(lake))
    out = tmp_path / "warm.html"
    code = (
        "import sys\n"
        "from pipeline.analyze import analyze\n"
        "from pipeline.lake import Lake\n"
        "from pipeline.report import html\n"
        f"page = html.render(analyze(Lake({str(lake.root)!r})))\n"
        f"open({str(out)!r}, 'w', encoding='utf-8').write(page)\n"
        "print('altair' in sys.modules, 'jsonschema' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert p.stdout.strip() == "False False", p.stderr[-800:]
    assert out.read_text(encoding="utf-8") == cold
    assert cold.count('class="chart"') >= 8


def test_a_cache_that_cannot_be_written_costs_only_the_drawing(tmp_path, monkeypatch):
    """The cache directory under a file (mkdir fails): the spec is still altair's own, nothing
    is kept, and the next chart of the process reuses the template built in memory."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("TRACELAKE_CACHE_DIR", str(blocker / "cache"))
    spec_cache._memo.clear()
    try:
        s = overlap_chart(_ranks(3, zero=(1,)), [])[0]
        assert json.dumps(s.to_dict()) == json.dumps(spec_cache._drawn(s.chart()))
        assert spec_cache._memo[spec_cache._key(s)] is not None
        assert not (blocker / "cache").exists()
        again = overlap_chart(_ranks(5), [])[0]
        assert json.dumps(again.to_dict()) == json.dumps(spec_cache._drawn(again.chart()))
    finally:
        spec_cache._memo.clear()


# the modules holding draw functions, their helpers and the cache itself (read by hand from
# pipeline/report/: the builders returning a Spec, altair_lib, spec_cache)
CHART_MODULES = [
    "charts.py",
    "collective_charts.py",
    "roofline_chart.py",
    "nccl_tests_chart.py",
    "fleet_chart.py",
    "altair_lib.py",
    "spec_cache.py",
]


def test_a_change_to_any_chart_module_keys_new_templates(tmp_path):
    """The key is derived from the package's sources (no hand-kept list): a copy of the package
    gives the installed key; a line added to any chart module, or a new module, gives another;
    a package without spec_cache.py's source (bytecode only) keeps no template."""
    import shutil

    from pipeline.report import spec_cache as sc

    pkg = tmp_path / "report"
    pkg.mkdir()
    for f in (REPO / "pipeline" / "report").glob("*.py"):
        shutil.copy(f, pkg)
    assert sc.source_hash(pkg) == sc._code_hash()
    keys = {sc._code_hash()}
    for name in CHART_MODULES:
        before = (pkg / name).read_bytes()
        (pkg / name).write_bytes(before + b"# a change\n")
        keys.add(sc.source_hash(pkg))
        (pkg / name).write_bytes(before)
        assert sc.source_hash(pkg) == sc._code_hash()
    (pkg / "heatmap_chart.py").write_text("def draw(data): ...\n")
    keys.add(sc.source_hash(pkg))
    assert len(keys) == len(CHART_MODULES) + 2
    (pkg / "spec_cache.py").unlink()
    with pytest.raises(FileNotFoundError):
        sc.source_hash(pkg)


def test_template_directories_of_other_keys_are_pruned_when_unused(cache):
    """When a new key's directory is written, the template directories of other keys (another
    altair, older chart modules) unused for PRUNE_AFTER_S go (modification times set by hand: 31
    and 29 days ago); one used more recently (another installation sharing the cache), the current
    one and what is not a template directory stay. A directory added later stays until the next
    new key. Reading a template marks its directory used, once per process."""
    import os
    import time

    root = spec_cache.directory().parent
    day = 86400
    old = root / "altair-5.0.0-0123456789abcdef"
    other = root / "altair-5.4.1-fedcba9876543210"
    for d, age in ((old, 31 * day), (other, 29 * day)):
        d.mkdir(parents=True)
        (d / f"{'0' * 32}.json").write_text('{"template": {}}')
        os.utime(d, (time.time() - age, time.time() - age))
    (root / "notes.txt").write_text("not ours")
    s = overlap_chart(_ranks(3, zero=(1,)), [])[0]
    assert json.dumps(s.to_dict()) == json.dumps(spec_cache._drawn(s.chart()))
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [spec_cache.directory().name, other.name, "notes.txt"]
    )
    assert (spec_cache.directory() / f"{spec_cache._key(s)}.json").is_file()
    old.mkdir()
    again = overlap_chart(_ranks(20), [])[0]  # another template (bars), in the existing directory
    again.to_dict()
    assert old.is_dir() and len(list(spec_cache.directory().iterdir())) == 2
    # a fresh process reading a kept template marks the directory used
    cur = spec_cache.directory()
    os.utime(cur, (time.time() - 40 * day, time.time() - 40 * day))
    spec_cache._memo.clear()
    spec_cache._used.clear()
    assert json.dumps(s.to_dict()) == json.dumps(spec_cache._drawn(s.chart()))
    assert time.time() - cur.stat().st_mtime < day


def test_pruning_that_fails_never_fails_the_report(cache, monkeypatch):
    def fail(*a, **k):
        raise PermissionError("read-only")

    monkeypatch.setattr(spec_cache.shutil, "rmtree", fail)
    old = spec_cache.directory().parent / "altair-5.0.0-0123456789abcdef"
    old.mkdir(parents=True)
    s = overlap_chart(_ranks(3, zero=(1,)), [])[0]
    assert json.dumps(s.to_dict()) == json.dumps(spec_cache._drawn(s.chart()))
    assert old.is_dir() and (spec_cache.directory() / f"{spec_cache._key(s)}.json").is_file()


def test_without_the_charts_source_nothing_is_kept(cache, monkeypatch):
    """Bytecode installed without its source (source_hash raises): the spec is altair's own, drawn
    in this process, and no template directory is written."""

    def no_source():
        raise FileNotFoundError("no spec_cache.py")

    monkeypatch.setattr(spec_cache, "_code_hash", no_source)
    s = overlap_chart(_ranks(3, zero=(1,)), [])[0]
    assert json.dumps(s.to_dict()) == json.dumps(spec_cache._drawn(s.chart()))
    assert spec_cache._memo[spec_cache._key(s)] is not None
    assert not (cache / "chart-specs").exists()
