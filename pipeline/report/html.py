"""One self-contained HTML report from an analysis (pipeline.analyze).

- Vega, Vega-Lite and vega-embed are inlined once (vl_convert.javascript_bundle), each chart is
  an altair spec embedded as JSON: the file renders with the network off.
- Every string from an input (kernel names, run ids, paths) is HTML-escaped, and JSON placed in
  <script> has '<', '>' and '&' escaped as \\u003c etc., so input text cannot close the script.
- Charts: per-rank x per-step stacked GPU time breakdown (averaged over ranks when there are
  more than MAX_BARS bars), comm-compute overlap per rank, top kernels by time.
"""

from __future__ import annotations

import html
import json
from functools import lru_cache

import altair as alt
import polars as pl

from .. import __version__
from .findings import findings_for_run
from .verdict import LABELS

MAX_BARS = 64
_CATEGORY_COLORS = {"compute": "#4c78a8", "communication": "#e45756", "memory": "#f58518", "unknown": "#b279a2"}
_COLORS = {"compute": "#4c78a8", "exposed communication": "#e45756", "exposed memcpy": "#f58518",
           "exposed unknown": "#b279a2", "idle": "#bab0ac"}


def _json_for_script(obj) -> str:
    return json.dumps(obj).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    import vl_convert as vlc

    js = vlc.javascript_bundle()
    return js.replace("</script", "<\\/script")


def _breakdown_chart(run_id: str, steps: list[dict], ranks: list[dict]) -> tuple[alt.Chart | None, str | None]:
    rows = steps or [{**r, "step": None} for r in ranks]
    if not rows:
        return None, "no GPU activity in this run"
    df = pl.DataFrame(rows, infer_schema_length=None).with_columns(
        idle=pl.col("gpu_idle_ns"), **{"exposed communication": pl.col("exposed_comm_ns"),
                                       "exposed memcpy": pl.col("exposed_memcpy_ns")})
    df = df.with_columns(**{"exposed unknown": pl.col("span_ns") - pl.col("compute_ns") - pl.col("exposed_comm_ns")
                            - pl.col("exposed_memcpy_ns") - pl.col("gpu_idle_ns"), "compute": pl.col("compute_ns")})
    cats = list(_COLORS)
    note = None
    if df.height > MAX_BARS and steps:
        df = df.group_by("step").agg([pl.col(c).mean() for c in cats]).with_columns(label=pl.format("step {}", "step"))
        note = f"{len(ranks)} ranks: each bar is the mean over ranks"
    elif steps:
        df = df.with_columns(label=pl.format("rank {} · step {}", "rank", "step"))
    else:
        df = df.with_columns(label=pl.format("rank {} (whole trace)", "rank"))
    long = df.select(["label"] + cats).unpivot(index="label", variable_name="part", value_name="ns").with_columns(
        ms=pl.col("ns") / 1e6)
    chart = alt.Chart(alt.Data(values=long.to_dicts())).mark_bar().encode(
        y=alt.Y("label:N", title=None, sort=None),
        x=alt.X("ms:Q", title="GPU time (ms)", stack="zero"),
        color=alt.Color("part:N", scale=alt.Scale(domain=cats, range=[_COLORS[c] for c in cats]), title=None),
        order=alt.Order("part_order:Q"),
        tooltip=["label:N", "part:N", alt.Tooltip("ms:Q", format=".3f")],
    ).transform_calculate(part_order=f"indexof({json.dumps(cats)}, datum.part)").properties(
        width=640, height=alt.Step(16), title=f"GPU time breakdown per rank and step — {run_id}")
    return chart, note


def _overlap_chart(run_id: str, ranks: list[dict]) -> tuple[alt.Chart | None, str | None]:
    data = [{"rank": r["rank"], "overlap_pct": r["comm_comp_overlap_pct"]} for r in ranks if r["comm_comp_overlap_pct"] is not None]
    if not data:
        return None, "no communication kernels: nothing to overlap"
    note = None
    if len(data) > MAX_BARS:
        chart = alt.Chart(alt.Data(values=data)).mark_bar().encode(
            x=alt.X("overlap_pct:Q", bin=alt.Bin(maxbins=20), title="comm-compute overlap (%)"),
            y=alt.Y("count():Q", title="ranks"))
        note = f"{len(data)} ranks: histogram"
    else:
        chart = alt.Chart(alt.Data(values=data)).mark_bar(color="#54a24b").encode(
            x=alt.X("rank:O", title="rank"), y=alt.Y("overlap_pct:Q", title="comm hidden under compute (%)",
                                                    scale=alt.Scale(domain=[0, 100])),
            tooltip=["rank:O", alt.Tooltip("overlap_pct:Q", format=".2f")])
    return chart.properties(width=640, height=220, title=f"Communication–computation overlap — {run_id}"), note


def _top_kernels_chart(run_id: str, top: list[dict]) -> tuple[alt.Chart | None, str | None]:
    if not top:
        return None, "no GPU activity in this run"
    data = [{"name": t["name"][:90], "category": t["category"], "ms": t["total_ns"] / 1e6, "calls": t["calls"]} for t in top[:15]]
    cats = list(_CATEGORY_COLORS)
    chart = alt.Chart(alt.Data(values=data)).mark_bar().encode(
        y=alt.Y("name:N", sort="-x", title=None), x=alt.X("ms:Q", title="total time, all ranks (ms)"),
        color=alt.Color("category:N", title=None, scale=alt.Scale(domain=cats, range=[_CATEGORY_COLORS[c] for c in cats])),
        tooltip=["name:N", "category:N", "calls:Q", alt.Tooltip("ms:Q", format=".3f")])
    return chart.properties(width=520, height=alt.Step(18), title=f"Top kernels by time — {run_id}"), None


def _fmt_ms(ns) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.3f} ms"


def _fmt_pct(p) -> str:
    return "—" if p is None else f"{p:.1f}%"


def _fmt_pct2(p) -> str:
    return "—" if p is None else f"{p:.3g}%"


def render(result: dict, title: str = "tracelake report") -> str:
    """HTML text of the report for an analysis dict (pipeline.analyze.analyze)."""
    e = html.escape
    specs: list[tuple[str, dict]] = []
    body: list[str] = []
    verdicts = {v["run_id"]: v for v in result["verdicts"]}
    for run in result["runs"]:
        rid = run["run_id"]
        steps = [s for s in result["steps"] if s["run_id"] == rid]
        ranks = [r for r in result["ranks"] if r["run_id"] == rid]
        top = [t for t in result["top_kernels"] if t["run_id"] == rid]
        v = verdicts[rid]
        body.append(f'<section class="run" id="run-{e(rid)}"><h2>Run <code>{e(rid)}</code></h2>')
        body.append(
            f'<p class="summary">{len(run["ranks"])} rank(s) ingested'
            f'{" of world size " + str(run["world_size"]) if run["world_size"] else ""}; '
            f'{len(run["steps"])} step(s) analysed; {run["sources"]} source file(s).</p>')
        conf = f' <span class="conf">({e(v["confidence"])} confidence)</span>' if v["confidence"] else ""
        nums = "".join(f"<li>{e(LABELS.get(k, k))}: {_fmt_pct(x)} of GPU time</li>" for k, x in v["numbers"].items())
        body.append(f'<div class="verdict v-{e(v["verdict"])}"><h3>Verdict: {e(v["verdict"])}{conf}</h3>'
                    f'<p>{e(v["reason"])}</p><ul>{nums}</ul></div>')
        fs = findings_for_run(rid, result)
        body.append("<h3>Findings (ranked by estimated recoverable time per rank)</h3>")
        if not fs:
            body.append("<p>No finding above its threshold.</p>")
        body.append("<ol class='findings'>")
        for f in fs:
            ev = "".join(f"<li>{e(x)}</li>" for x in f["evidence"])
            body.append(
                f'<li><h4>{e(f["title"])} — {_fmt_ms(f["recoverable_ns"])} per rank</h4><ul>{ev}</ul>'
                f'<p><b>Recommendation:</b> {e(f["recommendation"])}</p>'
                f'<details><summary>SQL (tracelake sql)</summary><pre>{e(f["sql"])}</pre></details></li>')
        body.append("</ol>")
        for fn, args in ((_breakdown_chart, (rid, steps, ranks)), (_overlap_chart, (rid, ranks)), (_top_kernels_chart, (rid, top))):
            chart, note = fn(*args)
            if chart is None:
                body.append(f'<p class="hidden-chart">Chart hidden: {e(note)}.</p>')
                continue
            cid = f"chart{len(specs)}"
            specs.append((cid, chart.to_dict()))
            body.append(f'<div class="chart" id="{cid}"></div>')
            if note:
                body.append(f'<p class="note">{e(note)}</p>')
        rows = "".join(
            f"<tr><td>{r['rank']}</td><td>{_fmt_ms(r['span_ns'])}</td><td>{_fmt_ms(r['compute_ns'])}</td>"
            f"<td>{_fmt_ms(r['comm_ns'])}</td><td>{_fmt_ms(r['exposed_comm_ns'])}</td><td>{_fmt_pct(r['comm_comp_overlap_pct'])}</td>"
            f"<td>{_fmt_ms(r['gpu_idle_ns'])}</td><td>{_fmt_ms(r['idle_host_wait_ns'])}</td><td>{_fmt_pct2(r['mfu_pct'])}</td>"
            f"<td>{_fmt_pct(r['flop_coverage_pct'])}</td></tr>"
            for r in ranks[:MAX_BARS])
        if rows:
            body.append("<h3>Per rank</h3><table><tr><th>rank</th><th>GPU span</th><th>compute</th><th>comm</th>"
                        "<th>exposed comm</th><th>overlap</th><th>idle</th><th>idle: host wait</th><th>MFU</th><th>FLOP coverage</th></tr>"
                        f"{rows}</table>")
            if len(ranks) > MAX_BARS:
                body.append(f"<p class='note'>First {MAX_BARS} of {len(ranks)} ranks shown; all are in `tracelake analyze --json`.</p>")
        body.append("</section>")
    notes = "".join(f"<li>{e(n)}</li>" for n in result["notes"])
    summary = "".join(
        f'<tr><td><a href="#run-{e(v["run_id"])}">{e(v["run_id"])}</a></td><td>{e(v["verdict"])}</td>'
        f'<td>{e(v["confidence"] or "—")}</td><td style="text-align:left">{e(v["reason"])}</td></tr>'
        for v in result["verdicts"])
    summary_html = (f"<h2>Runs</h2><table><tr><th>run</th><th>verdict</th><th>confidence</th><th>why</th></tr>{summary}</table>"
                    if len(result["verdicts"]) > 1 else "")
    charts_js = "\n".join(
        f"vegaEmbed('#{cid}', {_json_for_script(spec)}, {{actions: false, renderer: 'svg'}})"
        f".catch(err => {{ document.getElementById('{cid}').textContent = 'chart failed: ' + err; }});"
        for cid, spec in specs)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:">
<title>{e(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
code, pre {{ background: #f4f4f4; padding: 0 .2em; }} pre {{ padding: .6em; overflow-x: auto; }}
.verdict {{ border-left: 6px solid #888; padding: .4em 1em; background: #fafafa; }}
.v-network-bound {{ border-color: #e45756; }} .v-host-bound {{ border-color: #f58518; }}
.v-compute-bound {{ border-color: #4c78a8; }} .v-balanced {{ border-color: #54a24b; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ddd; padding: .2em .5em; text-align: right; }}
.note, .hidden-chart {{ color: #666; font-style: italic; }}
</style></head><body>
<h1>{e(title)}</h1>
<p>tracelake {e(__version__)} · analysis window: {e(result["window"])} · kernel-wait threshold {result["kernel_wait_threshold_ns"] / 1000:g} µs</p>
{summary_html}
{"".join(body)}
<h2>Notes</h2><ul>{notes or "<li>none</li>"}</ul>
<script type="module">{vega_bundle()}</script>
<script type="module">
{charts_js}
</script>
</body></html>
"""
