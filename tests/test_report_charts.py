"""The report's charts as data (their Vega-Lite specs' values and formats) and the run summary's
software line: kernel labels, one step, 0 % bars, step-number formats, versions (the rendered
page is tests/test_report_browser.py's)."""

from __future__ import annotations

import json

from conftest import corpus

from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.report import document
from pipeline.report.charts import Table, mfu_chart, top_kernels_chart
from pipeline.report.collective_charts import overlap_chart

ADD_F = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
)
ADD_L = ADD_F.replace("<float>", "<long>")


def _layers(spec: dict) -> list[dict]:
    return spec.get("layer", [spec])


def _values(layer: dict, spec: dict) -> list[dict]:
    data = layer.get("data") or spec["data"]
    return data["values"]


def test_top_kernels_short_labels_full_name_on_hover():
    top = [
        {"name": ADD_F, "category": "compute", "total_ns": 2_000_000, "calls": 3},
        {"name": ADD_L, "category": "compute", "total_ns": 1_000_000, "calls": 1},
        {"name": "ampere_sgemm_128x64_nn", "category": "compute", "total_ns": 500_000, "calls": 2},
    ]
    chart, _ = top_kernels_chart(top)
    spec = chart.to_dict(validate=False)
    vals = spec["data"]["values"]
    assert [v["kernel"] for v in vals] == [
        "vectorized_elementwise_kernel [CUDAFunctor_add<float>]",
        "vectorized_elementwise_kernel [CUDAFunctor_add<long>]",
        "ampere_sgemm_128x64_nn",
    ]
    assert [v["name"] for v in vals] == [ADD_F, ADD_L, "ampere_sgemm_128x64_nn"]
    enc = spec["encoding"]
    assert enc["y"]["field"] == "kernel"
    assert {"field": "name", "type": "nominal", "title": "kernel"} in enc["tooltip"]


def _steps(mfu_by_rank_step: dict) -> list[dict]:
    return [{"rank": r, "step": s, "mfu_pct": v} for (r, s), v in mfu_by_rank_step.items()]


def test_mfu_one_step_is_a_sentence_and_steps_print_without_separators():
    t, note = mfu_chart(_steps({(0, 12): 30.0, (1, 12): 40.0}), None)
    assert isinstance(t, Table) and note is None
    assert t.text == "MFU in step 12: 35.00 % (mean over 2 rank(s); min 30.00 %, max 40.00 %)"
    assert t.header == ["rank", "MFU"] and t.rows == [["0", "30.00 %"], ["1", "40.00 %"]]
    one, _ = mfu_chart(_steps({(0, 5): 12.5}), None)
    assert one.text == "MFU in step 5: 12.50 % (mean over 1 rank(s))" and one.rows == []
    # two steps numbered past 1,000: a line, its axis and tooltip as integers without separators
    chart, _ = mfu_chart(_steps({(0, 1233): 30.0, (0, 1234): 31.0}), None)
    spec = chart.to_dict(validate=False)
    assert all(layer["encoding"]["x"]["axis"]["format"] == "d" for layer in spec["layer"])
    line = spec["layer"][1]
    assert {"field": "step", "type": "quantitative", "format": "d"} in line["encoding"]["tooltip"]
    assert [v["step"] for v in spec["data"]["values"]] == [1233, 1234]


def test_zero_overlap_is_labelled():
    rows = [
        {"rank": 0, "overlap_ns": 0, "comm_ns": 100},
        {"rank": 1, "overlap_ns": 50, "comm_ns": 100},
    ]
    chart, _ = overlap_chart(rows, [])
    spec = chart.to_dict(validate=False)
    bars, text = _layers(spec)
    assert text["mark"]["type"] == "text" and text["encoding"]["text"]["field"] == "label"
    assert [(v["rank"], v["label"]) for v in _values(text, spec)] == [(0, "0\u00a0%"), (1, "50\u00a0%")]
    # every rank at 0 %: a sentence, not an empty axis
    t, _ = overlap_chart([{"rank": r, "overlap_ns": 0, "comm_ns": 10} for r in range(3)], [])
    assert isinstance(t, Table)
    assert t.text == "0 % of the communication is hidden under compute on any of the 3 ranks: none overlaps"


def test_software_line_from_kineto_versions(tmp_path):
    """HTA's triton_example.json.gz holds schemaVersion 1 (line 3) and cupti_version 18,
    cuda_runtime_version 12000, cuda_driver_version 12000 (lines 70-72); sample_traces only
    schemaVersion; nccl_parser_config distributedInfo's nccl_version 2.17.1."""
    lake = Lake(tmp_path / "lake")
    for path, run in (
        (corpus("hta", "tests", "data", "triton_example", "triton_example.json.gz"), "triton"),
        (corpus("hta", "tests", "data", "nccl_parser_config"), "nccl"),
    ):
        assert all(r.status == "ok" for r in ingest_paths([path], lake, run=run))
    doc = document.build(analyze(lake))
    text = {r["run_id"]: document.versions_text(r["summary"]["tool_versions"]) for r in doc["runs"]}
    assert text == {
        "triton": "CUDA runtime 12.0; CUDA driver API 12.0; CUPTI API 18; Kineto trace schema 1",
        "nccl": "NCCL 2.17.1; Kineto trace schema 1",
    }
    raw = {r["run_id"]: r["summary"]["tool_versions"] for r in json.loads(json.dumps(doc))["runs"]}
    assert raw["triton"]["cuda_runtime_version"] == ["12000"]  # the JSON keeps the raw values
    assert document.versions_text({"schemaVersion": ["1"]}) == (
        "PyTorch, CUDA, NCCL and driver versions not recorded in the inputs "
        "(they record: Kineto trace schema 1)"
    )
    # HIP's integer version (tracelens mi210 traces: hip_runtime_version 60443483)
    assert document.versions_text({"hip_runtime_version": ["60443483"], "roctracer_version": ["4.1"]}) == (
        "HIP runtime 6.4.43483; roctracer 4.1"
    )
    # the NVIDIA driver as pipit's Perlmutter exports store it (TARGET_INFO_SYSTEM_ENV NvDriverVersion
    # 52510517, beside CudaDriverVersion 12000: the 525.105.17 driver of CUDA 12.0), and as text
    # (nsys-ai's 580.95.05)
    assert document.versions_text({"nvidia_driver_version": ["52510517"]}) == "NVIDIA driver 525.105.17"
    assert document.versions_text({"nvidia_driver_version": ["580.95.05"]}) == "NVIDIA driver 580.95.05"


GCP = ("nccl", "ncclTests-gcp-a3mega-h100-16rank-allreduce.txt")


def gcp_rows() -> list[tuple[int, int, str, float]]:
    """(line, size, placement, busbw) of the file's results table, read here by hand: lines 24-54
    (8 B to 8 GiB), out-of-place busbw in column 8, in-place in column 12."""
    lines = corpus(*GCP).read_text().splitlines()
    out = []
    for no in range(24, 55):
        c = lines[no - 1].split()
        out += [(no, int(c[0]), "out-of-place", float(c[7])), (no, int(c[0]), "in-place", float(c[11]))]
    return out


def test_nccl_tests_chart_points_are_the_files_rows(tmp_path):
    """GCP A3-Mega all_reduce_perf (16 ranks on node01 and node02): one point per table row and
    placement, equal to the printed busbw; the run spans two nodes, so no link-peak rule and the
    note says why. With the device list cut to node01's 8 ranks (one node) the rule is the H100's
    NVLink rate per direction, 450 GB/s (pipeline/catalog/devices.toml H100-SXM)."""
    from pipeline.report.nccl_tests_chart import nccl_tests_chart

    lake = Lake(tmp_path / "lake")
    assert all(r.status == "ok" for r in ingest_paths([corpus(*GCP)], lake, run="gcp"))
    res = analyze(lake)
    chart, note = nccl_tests_chart(res["nccl_tests"], res["nccl_tests_bandwidth"])
    spec = chart.to_dict(validate=False)
    (layer,) = spec["layer"]
    got = sorted((v["line"], v["size_bytes"], v["placement"], v["busbw_gbps"]) for v in _values(layer, spec))
    assert got == sorted(gcp_rows()) and len(got) == 62
    assert {v["test"] for v in _values(layer, spec)} == {"all_reduce_perf"}
    assert layer["encoding"]["x"]["scale"]["type"] == "log"
    # the section's sentences (values: tests/test_nccl_tests.py, read from the file's lines 24-54),
    # then why there is no link-peak line
    assert note.endswith(
        "half of it from 256\u00a0MiB on. "
        "no link-peak line: spans 2 nodes: line rate unknown: run with NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET"
    ) and note.startswith(
        "all_reduce_perf out-of-place (ncclTests-gcp-a3mega-h100-16rank-allreduce.txt, 2 node(s))"
    )
    # one node: the device lines of node02 (ranks 8-15, lines 12-19) removed
    text = corpus(*GCP).read_text().splitlines(keepends=True)
    one = tmp_path / "one_node.txt"
    one.write_text("".join(x for x in text if " on node02 " not in x))
    lake1 = Lake(tmp_path / "lake1")
    assert all(r.status == "ok" for r in ingest_paths([one], lake1, run="one"))
    res1 = analyze(lake1)
    chart1, note1 = nccl_tests_chart(res1["nccl_tests"], res1["nccl_tests_bandwidth"])
    spec1 = chart1.to_dict(validate=False)
    pts, rule = spec1["layer"]
    assert rule["mark"]["type"] == "rule" and "% of the 450\u00a0GB/s link" in note1
    assert [v["peak"] for v in _values(rule, spec1)] == [450.0]
    assert len(_values(pts, spec1)) == 62


def test_report_import_skips_jsonschemas_slow_optional_format_packages():
    """Issue 38 item 2: with jsonschema's format extras installed (as in the test extra and
    notebook environments), `import altair` imported rfc3987_syntax, which compiles 39 lark
    grammars (1.7 s of 2.7 s), and isoduration (with arrow), rfc3986_validator and the other
    format packages (0.1-0.2 s). The report's charts import altair without any of them
    (pipeline/report/altair_lib.py), leave no import blocked afterwards, and altair still
    validates a chart. An import of one of them by another module while altair is imported (here:
    a thread importing idna in a loop meanwhile) is not blocked."""
    import importlib.util
    import subprocess
    import sys

    from pipeline.report.altair_lib import FORMAT_PACKAGES

    code = (
        "import sys, threading, importlib\n"
        "pk = ('rfc3987_syntax', 'rfc3987', 'rfc3986_validator', 'rfc3339_validator', 'isoduration',\n"
        "      'webcolors', 'idna', 'uri_template', 'jsonpointer', 'fqdn')\n"
        "import pipeline.report.html as h\n"
        "from pipeline.report.altair_lib import alt\n"
        "print('altair' in sys.modules)\n"  # imported on first use (spec_cache.py), not before
        "alt.Chart\n"
        "print([m for m in pk if m in sys.modules], 'jsonschema' in sys.modules, 'altair' in sys.modules)\n"
        "alt.Chart(alt.Data(values=[{'a': 1}])).mark_bar().encode(x='a:Q').to_dict(validate=True)\n"
        "import importlib.util as u\n"
        "print(all(u.find_spec(m) is None or importlib.import_module(m) is not None for m in pk))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["False", "[] True True", "True"], out
    # the list covers every package outside the standard library that jsonschema's format module
    # imports (read from its source, not copied here)
    import ast
    from pathlib import Path

    import jsonschema

    tree = ast.parse((Path(jsonschema.__file__).parent / "_format.py").read_text())
    nodes = list(ast.walk(tree))
    imported = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and n.level == 0}
    optional = imported - set(sys.stdlib_module_names) - {"jsonschema", "__future__"}
    assert optional and optional <= set(FORMAT_PACKAGES), optional - set(FORMAT_PACKAGES)
    # another module's import of one of them while altair is imported goes through: a thread
    # imports idna (when installed) as soon as jsonschema's format checkers have started
    other = (
        "import sys, threading, time, importlib.util as u\n"
        "got = []\n"
        "def watch():\n"
        "    while 'jsonschema._format' not in sys.modules: time.sleep(0.0005)\n"
        "    import idna; got.append(idna.__name__)\n"
        "t = threading.Thread(target=watch, daemon=True); t.start()\n"
        "from pipeline.report.altair_lib import load\n"
        "load()\n"
        "t.join(30)\n"
        "print(got == ['idna'] if u.find_spec('idna') else 'no idna')\n"
    )
    out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, check=True).stdout
    assert out.strip() in ("True", "no idna"), out
    # whether the checks are more than vacuous depends on the packages being installed (the test
    # extra's HolisticTraceAnalysis pulls them in here)
    print("installed:", [m for m in FORMAT_PACKAGES if importlib.util.find_spec(m) is not None])


def test_report_built_without_altairs_debug_mode_is_the_same_page(tmp_path):
    """html.render builds the charts with altair's debug mode off (no validation of each schema
    object as it is created: 0.1 s of the DLRM job's report); the page is the same as with it on,
    altair's default (the reference), on PARAM's 8-rank DLRM job (every chart kind the small job
    has: breakdown, overlap, bus bandwidth, wait heat map, top kernels, idle gaps, phases, roofline)."""
    from altair.utils import schemapi
    from altair.utils.schemapi import debug_mode

    from pipeline.report import html as page

    lake = Lake(tmp_path / "lake")
    dlrm = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
    assert all(r.status == "ok" for r in ingest_paths([dlrm], lake))
    res = analyze(lake)
    # no chart hands altair an encoding as shorthand text: each one is converted by a from_dict
    # that hashes every one of the ~570 schema classes (_FromDict), 60 % of the report's CPU
    made, real_init = [], schemapi._FromDict.__init__
    schemapi._FromDict.__init__ = lambda self, *a: (made.append(1), real_init(self, *a))[1]
    try:
        fast = page.render(res)
    finally:
        schemapi._FromDict.__init__ = real_init
    assert made == []
    with debug_mode(True):
        checked = page._page(res, "tracelake report", None, None)
    assert fast == checked
    assert fast.count('class="chart"') >= 8, fast.count('class="chart"')


def test_chart_encodings_are_channel_objects_not_shorthand_text():
    """Every encoding channel the report's charts set (encode(x=..., tooltip=[...])) is an altair
    channel object (alt.X("a:Q"), alt.Tooltip("a:N")), never shorthand text ("a:Q"): altair turns
    text into its channel with from_dict, which hashes the schema of every one of its ~570 schema
    classes per call (json.dumps of each; issue 38: 0.1 -> 0.04 CPU-s for the DLRM job's report,
    the same page). Read from the modules' source, so a chart the tests do not draw counts too."""
    import ast
    from pathlib import Path

    import pipeline.report as report

    text = []
    for path in sorted(Path(report.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "encode":
                for kw in node.keywords:
                    values = kw.value.elts if isinstance(kw.value, (ast.List, ast.Tuple)) else [kw.value]
                    text += [
                        f"{path.name}:{v.lineno} {kw.arg}={v.value!r}"
                        for v in values
                        if isinstance(v, ast.Constant) and isinstance(v.value, str)
                    ]
    assert text == []
    # the check sees text where it is: a line written the slow way is found
    bad = ast.parse('c.encode(y="peak:Q", tooltip=[alt.Tooltip("a:N"), "label:N"])').body[0].value
    found = [
        v.value
        for kw in bad.keywords
        for v in getattr(kw.value, "elts", [kw.value])
        if isinstance(v, ast.Constant)
    ]
    assert found == ["peak:Q", "label:N"]
