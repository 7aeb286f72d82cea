"""One self-contained HTML report from an analysis (pipeline.analyze) and its document (document.py).

This module owns the page: render() assembles the summary, verdict, findings, tables and notes
around the charts; the chart builders are in charts.py, the inlined Vega bundle in vega.py (both
re-exported here).

- Vega, Vega-Lite and vega-embed are inlined once (vl_convert.javascript_bundle); each chart is an
  altair spec with its data inline, embedded as JSON: the file makes no request (a Content-Security-
  Policy of default-src 'none' forbids any) and renders with the network off.
- Every string from an input (kernel names, run ids, hosts, paths, NVTX text) is HTML-escaped, and
  JSON placed in <script> has '<', '>' and '&' escaped as \\u003c etc., so input text cannot close
  the script; chart text is SVG text and vega-embed's tooltips escape HTML.
- First screen per run: summary (ranks, hosts, GPUs, steps analysed, inputs, software versions),
  the verdict with its confidence, the numbers behind it and its basis; then the findings ranked by
  recoverable time, each with evidence, recommendation and copyable SQL; then the charts.
- A report of several runs opens with the fleet view: a table of the runs (fleet_html.py; rows
  from pipeline/fleet.py), sortable and filterable in the page, each run linking to its section,
  and their median step time and verdict against start time (fleet_chart.py).
- Charts (altair), each hidden with its reason when the data cannot support it; never more than
  MAX_BARS bars or heat-map rows: beyond that, ranks and steps are aggregated (means over ranks per
  step, consecutive ranks or steps in groups, histograms).
  1. step-time breakdown per rank x step (compute, exposed communication, exposed memory, idle by
     cause) — whole trace per rank when the run has no steps;
  2. comm-compute overlap per rank;
  3. collective bus bandwidth against message size, with the link peak;
  4. rank x step heat map of collective wait (stragglers are the ranks the others wait for);
  5. MFU per step;
  6. top kernels by time;
  7. idle time by gap length and cause;
  8. with a baseline: the step-time components of both runs;
  9. nccl-tests output: bus bandwidth against message size per test, with the link peak
     (nccl_tests_chart.py), for runs that hold it.
- Each chart div gets data-rendered="1" when vega-embed has drawn it, or data-error with the
  message, so a browser test can wait for all of them; its Vega view is window.tracelakeViews[id]
  (a test reads the drawn marks and scales from it).
"""

from __future__ import annotations

import html
import re

from ..diagnosis.steady import kept_rows
from ..diagnosis.verdict import CAUSES
from ..fleet import DEFAULT_ORDER, fleet_rows, sort_rows
from ..kernelname import hover_name, short_names
from .charts import (
    MAX_BARS,
    MAX_STEP_COLS,
    STEP_PARTS,
    TRACE_PARTS,
    WIDTH,
    Table,
    breakdown_chart,
    comparison_chart,
    critical_path_chart,
    idle_gap_chart,
    mfu_chart,
    phase_chart,
    top_kernels_chart,
)
from .collective_charts import busbw_chart, overlap_chart, wait_heatmap
from .document import (
    basis_text,
    build,
    gpus_text,
    nccl_matching_lines,
    roofline_text,
    throughput_text,
    timing_text,
    versions_text,
)
from .fleet_chart import fleet_chart
from .fleet_html import fleet_table
from .nccl_tests_chart import nccl_tests_chart
from .roofline_chart import roofline_chart
from .spec_cache import spec_dict
from .vega import _json_for_script, vega_bundle

__all__ = [
    "MAX_BARS",
    "MAX_STEP_COLS",
    "STEP_PARTS",
    "TRACE_PARTS",
    "WIDTH",
    "breakdown_chart",
    "busbw_chart",
    "comparison_chart",
    "idle_gap_chart",
    "mfu_chart",
    "overlap_chart",
    "render",
    "top_kernels_chart",
    "vega_bundle",
    "wait_heatmap",
]


def _fmt_ms(ns) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.3f} ms"


def _fmt_pct(p) -> str:
    return "—" if p is None else f"{p:.1f}%"


def _fmt_pct2(p) -> str:
    return "—" if p is None else f"{p:.3g}%"


_BARS = {key: (mod, high) for _, key, mod, high in CAUSES.values()}

# a number and its unit never wrap apart: the space between them becomes a no-break space
_UNIT_SPACE = re.compile(
    r"(?<=\d) (?=(?:ns|µs|us|ms|s|min|h|[KMGT]i?B(?:/s)?|B|[KMGTP]?FLOP(?:/s)?|W|J|k?Wh|GPU-hours|%)"
    r"(?![\w/]))"
)
_PRE = re.compile(r"(<pre\b.*?</pre>)", re.S)


def nbsp_units(markup: str) -> str:
    """The page's markup with '12.3 ms', '40 GB/s', '0 %' joined by &nbsp; (code in <pre>, the
    SQL, left as it is)."""
    return "".join(
        part if part.startswith("<pre") else _UNIT_SPACE.sub("&nbsp;", part) for part in _PRE.split(markup)
    )


def _level(key: str, pct) -> str:
    """CSS class of a headline number: its cause's level (verdict.CAUSES bars), none for context numbers."""
    if pct is None or key not in _BARS:
        return ""
    mod, high = _BARS[key]
    return " high" if pct >= high else " moderate" if pct >= mod else ""


def _caveats_html(v: dict) -> str:
    """The verdict's caveats as a list under it (nothing when there are none)."""
    cs = v.get("caveats") or []
    if not cs:
        return ""
    items = "".join(
        f'<li data-caveat="{html.escape(c["kind"])}">{html.escape(c["text"])}'
        + (" <i>(lowers the confidence)</i>" if c.get("lowers_confidence") else "")
        + "</li>"
        for c in cs
    )
    return f'<div class="caveats"><b>Caveats</b><ul>{items}</ul></div>'


# the page's Content-Security-Policy (no request of any kind) and style sheet, inlined in render()
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:"
)
_STYLE = (
    "body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; "
    "padding: 0 1em; }\n"
    "code, pre { background: #f4f4f4; padding: 0 .2em; } "
    "pre { padding: .6em; overflow-x: auto; white-space: pre-wrap; }\n"
    ".verdict { border-left: 6px solid #888; padding: .3em 1em; background: #fafafa; margin: .8em 0; }\n"
    ".verdict h3 { margin: .3em 0; font-size: 1.4em; }\n"
    ".v-network-bound { border-color: #e45756; } .v-host-bound { border-color: #9d755d; } "
    ".v-input-bound { border-color: #eeca3b; }\n"
    ".v-copy-bound { border-color: #f58518; } .v-straggler-bound { border-color: #ff9d98; } "
    ".v-compute-bound { border-color: #4c78a8; } .v-balanced { border-color: #54a24b; }\n"
    "ul.headline { list-style: none; padding: 0; display: flex; gap: 2em; flex-wrap: wrap; }\n"
    "ul.headline b { font-size: 1.5em; } li.high b { color: #c0392b; } li.moderate b { color: #b7791f; }\n"
    ".basis { color: #555; font-size: .9em; } "
    ".caveats { background: #fff7e6; padding: .2em .6em; margin: .4em 0; }\n"
    ".caveats ul { margin: .2em 0; }\n"
    "table { border-collapse: collapse; margin: .5em 0; } "
    "td, th { border: 1px solid #ddd; padding: .2em .5em; text-align: right; }\n"
    "table.summary th { text-align: left; background: #f6f6f6; } "
    "table.summary td, td.l { text-align: left; }\n"
    "tr.moved td { font-weight: bold; }\n"
    ".finding h4 { margin: .8em 0 .2em; } .rec { color: #555; font-weight: normal; }\n"
    ".note, .hidden-chart { color: #666; font-style: italic; } .chart, .chart-table { margin: 1em 0; }\n"
)


def render(
    result: dict, title: str = "tracelake report", baseline: dict | None = None, doc: dict | None = None
) -> str:
    """HTML text of the report for an analysis dict (pipeline.analyze.analyze); with `baseline`
    (the analysis of another lake) each run is also compared with its baseline run. `doc` is the
    report document (document.build) when the caller already has it.

    Each chart's spec comes from its cached template when there is one (spec_cache.py: altair is
    then not imported); a chart drawn with altair is drawn with altair's debug mode off (altair
    otherwise validates every schema object against the Vega-Lite schema as it is created:
    jsonschema over 66 objects, and a JSON dump of the schema of each, 0.1-0.15 of the 0.25-0.35
    CPU-s of the DLRM job's first report), while the page embeds each chart unvalidated anyway
    (to_dict(validate=False)); the HTML is the same either way."""
    return _page(result, title, baseline, doc)


def _page(result: dict, title: str, baseline: dict | None, doc: dict | None) -> str:
    e = html.escape
    doc = doc or build(result, baseline)
    specs: list[tuple[str, str, dict]] = []
    body: list[str] = []

    def chart_block(kind: str, res) -> None:
        chart, note = res
        if chart is None:
            body.append(f'<p class="hidden-chart" data-chart="{kind}">Chart hidden: {e(note)}.</p>')
            return
        if isinstance(chart, Table):  # a sentence (and a small table) where a chart would be one dot
            head = "".join(f"<th>{e(h)}</th>" for h in chart.header)
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in chart.rows)
            body.append(
                f'<div class="chart-table" data-chart="{kind}">'
                f"<p><b>{e(chart.title)}</b>: {e(chart.text)}.</p>"
                + (f"<table><tr>{head}</tr>{rows}</table>" if chart.rows else "")
                + (f'<p class="note">{e(note)}.</p>' if note else "")
                + "</div>"
            )
            return
        cid = f"chart{len(specs)}"
        specs.append((cid, kind, spec_dict(chart)))
        body.append(f'<div class="chart" id="{cid}" data-chart="{kind}"></div>')
        if note:
            body.append(f'<p class="note">{e(note)}.</p>')

    if len(doc["runs"]) > 1:  # the fleet view: a sortable table of the runs, then step time over time
        fleet = sort_rows(fleet_rows(result), DEFAULT_ORDER)  # in `tracelake runs`' order
        body.append(fleet_table(fleet, {r["run_id"]: f"run-{i}" for i, r in enumerate(doc["runs"])}))
        chart_block("fleet", fleet_chart(fleet))
    for i, run in enumerate(doc["runs"]):
        rid, s, v = run["run_id"], run["summary"], run["verdict"]
        step_all = [x for x in result.get("step_time", []) if x["run_id"] == rid]
        step_rows = kept_rows(step_all, v)
        analysed = {x["step"] for x in step_rows}
        ranks = [x for x in result["ranks"] if x["run_id"] == rid]
        steps = kept_rows([x for x in result["steps"] if x["run_id"] == rid], v)
        body.append(f'<section class="run" id="run-{i}"><h2>Run <code>{e(rid)}</code></h2>')
        world = f" of world size {s['world_size']}" if s["world_size"] else ""
        body.append(
            '<table class="summary">'
            "<tr><th>ranks</th>"
            f"<td>{s['ranks']} rank(s) ingested{world}; {s['ranks_with_gpu_work']} with GPU work</td></tr>"
            f"<tr><th>hosts</th><td>{e(', '.join(s['hosts'])) or 'not recorded in the inputs'}</td></tr>"
            f"<tr><th>GPUs</th><td>{e(gpus_text(s['gpus']))}</td></tr>"
            f"<tr><th>steps analysed</th><td>{s['steps_analysed']} of {s['steps']} step(s)</td></tr>"
            f"<tr><th>inputs</th><td>{s['sources']} source file(s): {e(', '.join(s['formats']))}</td></tr>"
            f"<tr><th>software</th><td>{e(versions_text(s['tool_versions']))}</td></tr></table>"
        )
        matching = nccl_matching_lines(s.get("nccl_matching"))
        if matching:
            body.append(
                '<ul class="nccl-matching">' + "".join(f"<li>{e(x)}</li>" for x in matching) + "</ul>"
            )
        conf = f' <span class="conf">({e(v["confidence"])} confidence)</span>' if v["confidence"] else ""
        nums = "".join(
            f'<li class="num{_level(h["key"], h["pct"])}"><b>{_fmt_pct(h["pct"])}</b> {e(h["label"])}</li>'
            for h in v["headline"]
        )
        tp = throughput_text(run["throughput"], run["energy"], run["findings"])
        body.append(
            f'<div class="verdict v-{e(v["verdict"])}"><h3>Verdict: {e(v["verdict"])}{conf}</h3>'
            f'<p>{e(v["reason"])}.</p><ul class="headline">{nums}</ul>'
            + (f'<p class="throughput">{e(tp)}</p>' if tp else "")
            + (f'<p class="throughput">{e(run["gpu_metrics"])}.</p>' if run.get("gpu_metrics") else "")
            + (f'<p class="throughput">{e(rl)}</p>' if (rl := roofline_text(run.get("roofline"))) else "")
            + f"{_caveats_html(v)}"
            f'<p class="basis">{e(basis_text(s, v))} Rules and thresholds: docs/report.md.</p></div>'
        )
        comp = run["comparison"]
        if comp is not None:
            body.append(
                f"<h3>Against baseline run <code>{e(comp['baseline_run_id'])}</code></h3>"
                f"<p>{e(comp['summary'])}.</p>"
            )
            if comp["components"]:
                rows = "".join(
                    f'<tr{" class=moved" if c["moved"] else ""}><td class="l">{e(c["label"])}</td>'
                    f"<td>{_fmt_ms(c['baseline_ns'])}</td>"
                    f"<td>{_fmt_ms(c['current_ns'])}</td><td>{c['delta_ns'] / 1e6:+,.3f} ms</td>"
                    f"<td>{'—' if c['delta_pct'] is None else format(c['delta_pct'], '+.1f') + '%'}</td></tr>"
                    for c in comp["components"]
                )
                body.append(
                    f'<table class="compare"><tr><th>component ({e(comp["per"])})</th><th>baseline</th>'
                    "<th>this run</th>"
                    f"<th>change</th><th>change %</th></tr>{rows}</table>"
                )
                chart_block("comparison", comparison_chart(comp))
            if comp["kernels"]:
                label = short_names(k["name"] for k in comp["kernels"])
                rows = "".join(
                    f'<tr><td class="l"><code title="{e(hover_name(k["name"]))}">{e(label[k["name"]])}</code>'
                    f"</td><td>{e(k['category'])}</td>"
                    f"<td>{_fmt_ms(k['baseline_ns'])}</td><td>{_fmt_ms(k['current_ns'])}</td>"
                    f"<td>{k['delta_ns'] / 1e6:+,.3f} ms</td></tr>"
                    for k in comp["kernels"]
                )
                body.append(
                    f'<table class="compare"><tr><th>kernel (largest changes, {e(comp["per"])})</th>'
                    "<th>category</th>"
                    f"<th>baseline</th><th>this run</th><th>change</th></tr>{rows}</table>"
                )
        body.append("<h3>Findings, ranked by estimated recoverable time</h3>")
        if not run["findings"]:
            body.append("<p>No finding reaches its threshold.</p>")
        else:
            body.append("<ol class='findings'>")
            for f in run["findings"]:
                ev = "".join(f"<li>{e(x)}</li>" for x in f["evidence"])
                body.append(
                    '<li class="finding">'
                    f'<h4>{e(f["title"])} <span class="rec">— {e(timing_text(f))}</span></h4><ul>{ev}</ul>'
                    f"<p><b>Recommendation:</b> {e(f['recommendation'])}</p>"
                    f"{'<p><b>Timeline:</b> <code>' + e(f['timeline']['command']) + '</code></p>' if f.get('timeline') else ''}"  # noqa: E501
                    f"<details><summary>SQL (continue in <code>tracelake sql</code>)</summary>"
                    f'<pre class="sql"><code>{e(f["sql"])}</code></pre>'
                    f'<button type="button" class="copy">copy SQL</button></details></li>'
                )
            body.append("</ol>")
        body.append("<h3>Charts</h3>")
        mfu_note = next((n for n in run["notes"] if "MFU not available" in n), None)
        chart_block("breakdown", breakdown_chart(step_rows, ranks))
        chart_block("overlap", overlap_chart(step_rows, ranks))
        if step_rows:  # phases exist per step only
            kept = {(r["rank"], r["step"]) for r in step_rows}
            chart_block(
                "phases",
                phase_chart(
                    [
                        p
                        for p in result.get("phases", [])
                        if p["run_id"] == rid and (p["rank"], p["step"]) in kept
                    ]
                ),
            )
        chart_block(
            "critical_path",
            critical_path_chart([c for c in result.get("critical_path", []) if c["run_id"] == rid]),
        )
        size_note = next(
            (
                n.split("no message size: ", 1)[1]
                for n in result.get("notes", [])
                if n.startswith(f"run {rid}: collective bandwidth") and "no message size: " in n
            ),
            None,
        )
        chart_block(
            "busbw",
            busbw_chart(
                [c for c in result.get("collectives_per_rank", []) if c["run_id"] == rid],
                [c for c in result.get("collectives", []) if c["run_id"] == rid],
                size_note,
            ),
        )
        chart_block(
            "wait",
            wait_heatmap(
                [
                    c
                    for c in result.get("collectives", [])
                    if c["run_id"] == rid and (not step_rows or c["step"] in analysed)
                ],
                s["ranks_with_gpu_work"],
            ),
        )
        tput = run["throughput"] or {}
        if tput.get("mfu_pct") is not None and not tput.get("mfu_measurable", True):
            # too little of the compute has op shapes (throughput.mfu_measurable): no figure
            chart_block(
                "mfu",
                mfu_chart(
                    [dict(s, mfu_pct=None) for s in steps],
                    f"MFU not measurable from op shapes: only {tput['flop_coverage_pct'] or 0:.0f}% of "
                    "compute-kernel time has modelled FLOPs",
                ),
            )
        else:
            chart_block("mfu", mfu_chart(steps, mfu_note.split(": ", 1)[1] if mfu_note else None))
        chart_block("kernels", top_kernels_chart([t for t in result["top_kernels"] if t["run_id"] == rid]))
        chart_block(
            "roofline",
            roofline_chart([x for x in result.get("roofline", []) if x["run_id"] == rid], run["roofline"]),
        )
        chart_block(
            "idle_gaps", idle_gap_chart([g for g in result.get("idle_gaps", []) if g["run_id"] == rid])
        )
        nccl_rows = [x for x in result.get("nccl_tests", []) if x["run_id"] == rid]
        if nccl_rows:  # only runs with nccl-tests output
            peaks = [x for x in result.get("nccl_tests_bandwidth", []) if x["run_id"] == rid]
            chart_block("nccl_tests", nccl_tests_chart(nccl_rows, peaks))
        rows = "".join(
            f"<tr><td>{r['rank']}</td><td>{_fmt_ms(r['span_ns'])}</td><td>{_fmt_ms(r['compute_ns'])}</td>"
            f"<td>{_fmt_ms(r['comm_ns'])}</td><td>{_fmt_ms(r['exposed_comm_ns'])}</td>"
            f"<td>{_fmt_ms(r['exposed_comm_wait_ns'])}</td>"
            f"<td>{_fmt_ms(r['exposed_comm_transfer_ns'])}</td>"
            f"<td>{_fmt_pct(r['comm_comp_overlap_pct'])}</td><td>{_fmt_ms(r['gpu_idle_ns'])}</td>"
            f"<td>{_fmt_ms(r['idle_host_wait_ns'])}</td><td>{_fmt_pct2(r['mfu_pct'])}</td>"
            f"<td>{_fmt_pct(r['flop_coverage_pct'])}</td></tr>"
            for r in ranks[:MAX_BARS]
        )
        if rows:
            body.append(
                "<h3>Per rank, whole trace</h3><table><tr><th>rank</th><th>GPU span</th><th>compute</th>"
                "<th>comm</th><th>exposed comm</th><th>of it: waiting for peers</th>"
                "<th>of it: transfer</th><th>overlap</th><th>idle</th><th>idle: host wait</th><th>MFU</th>"
                f"<th>FLOP coverage</th></tr>{rows}</table>"
            )
            if len(ranks) > MAX_BARS:
                body.append(
                    f"<p class='note'>First {MAX_BARS} of {len(ranks)} ranks shown; all are in "
                    "<code>tracelake analyze --json</code>.</p>"
                )
        if run["notes"]:
            body.append("<h3>Notes</h3><ul>" + "".join(f"<li>{e(n)}</li>" for n in run["notes"]) + "</ul>")
        body.append("</section>")
    notes = "".join(f"<li>{e(n)}</li>" for n in doc["notes"])
    charts_js = "\n".join(
        f"track('{cid}', vegaEmbed('#{cid}', {_json_for_script(spec)}, {{actions: false, renderer: 'svg'}}));"
        for cid, _, spec in specs
    )
    stamp = (
        f"<p>tracelake {e(doc['tracelake_version'])} · analysis window: {e(doc['window'])} · "
        f"kernel-wait threshold {doc['kernel_wait_threshold_ns'] / 1000:g} µs</p>"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_CSP}">
<title>{e(title)}</title>
<style>
{_STYLE}</style></head><body>
<h1>{e(title)}</h1>
{nbsp_units(stamp)}
{nbsp_units("".join(body))}
{nbsp_units("<h2>Notes</h2><ul>" + notes + "</ul>") if notes else ""}
<script>
document.addEventListener('click', ev => {{
  if (!ev.target.classList.contains('copy')) return;
  const pre = ev.target.parentElement.querySelector('pre');
  const sel = window.getSelection(); const r = document.createRange(); r.selectNodeContents(pre);
  sel.removeAllRanges(); sel.addRange(r);
  if (navigator.clipboard) navigator.clipboard.writeText(pre.textContent).catch(() => {{}});
}});
</script>
<script type="module">{vega_bundle()}</script>
<script type="module">
function track(id, p) {{
  const el = document.getElementById(id);
  window.tracelakeViews = window.tracelakeViews || {{}};
  p.then(r => {{ window.tracelakeViews[id] = r.view; el.dataset.rendered = '1'; }})
   .catch(err => {{ el.dataset.error = String(err); el.textContent = 'chart failed: ' + err; }});
}}
{charts_js}
</script>
</body></html>
"""
