"""One self-contained HTML report from an analysis (pipeline.analyze) and its document (document.py).

- Vega, Vega-Lite and vega-embed are inlined once (vl_convert.javascript_bundle); each chart is an
  altair spec with its data inline, embedded as JSON: the file makes no request (a Content-Security-
  Policy of default-src 'none' forbids any) and renders with the network off.
- Every string from an input (kernel names, run ids, hosts, paths, NVTX text) is HTML-escaped, and
  JSON placed in <script> has '<', '>' and '&' escaped as \\u003c etc., so input text cannot close
  the script; chart text is SVG text and vega-embed's tooltips escape HTML.
- First screen per run: summary (ranks, hosts, GPUs, steps analysed, inputs, software versions),
  the verdict with its confidence, the numbers behind it and its basis; then the findings ranked by
  recoverable time, each with evidence, recommendation and copyable SQL; then the charts.
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
  7. idle-gap histogram by cause;
  8. with a baseline: the step-time components of both runs.
- Each chart div gets data-rendered="1" when vega-embed has drawn it, or data-error with the
  message, so a browser test can wait for all of them.
"""

from __future__ import annotations

import html
import json
import math
from functools import lru_cache

import altair as alt
import polars as pl

from ..diagnosis.verdict import CAUSES, kept_rows
from .document import basis_text, build, gpus_text, timing_text, versions_text

MAX_BARS = 64
MAX_STEP_COLS = 60
WIDTH = 680

_CATEGORY_COLORS = {
    "compute": "#4c78a8",
    "communication": "#e45756",
    "memory": "#f58518",
    "unknown": "#b279a2",
    "sync": "#9d755d",
}
_CAUSE_COLORS = {
    "host_wait": "#9d755d",
    "kernel_wait": "#bab0ac",
    "other": "#d8d4d0",
    "unreliable": "#e7e1ef",
}
STEP_PARTS = [  # (step_time column, label, colour)
    ("compute_ns", "compute", _CATEGORY_COLORS["compute"]),
    ("exposed_comm_transfer_ns", "exposed comm: transfer", _CATEGORY_COLORS["communication"]),
    ("exposed_comm_wait_ns", "exposed comm: waiting for peers", "#ff9d98"),
    ("exposed_memory_ns", "exposed copies", _CATEGORY_COLORS["memory"]),
    ("exposed_unknown_ns", "exposed unknown", _CATEGORY_COLORS["unknown"]),
    ("idle_input_ns", "idle: data loading", "#eeca3b"),
    ("idle_host_wait_ns", "idle: host launched late", _CAUSE_COLORS["host_wait"]),
    ("idle_kernel_wait_ns", "idle: launch gaps", _CAUSE_COLORS["kernel_wait"]),
    ("idle_other_ns", "idle: other waits", _CAUSE_COLORS["other"]),
    ("idle_unreliable_ns", "idle: before graph replays", _CAUSE_COLORS["unreliable"]),
]
# the same parts on the whole-trace basis (ranks rows): memory is exposed_memcpy_ns there, and
# without steps there is no DataLoader split of idle
TRACE_PARTS = [
    ("exposed_memcpy_ns" if c == "exposed_memory_ns" else c, label, color)
    for c, label, color in STEP_PARTS
    if c != "idle_input_ns"
]
_CAUSE_LABELS = {
    "host_wait": "host launched late",
    "kernel_wait": "launch gap",
    "other": "other wait",
    "unreliable": "before graph replay",
}


def _json_for_script(obj) -> str:
    return json.dumps(obj).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one ES module (vl-convert's bundle), safe inside <script>."""
    import vl_convert as vlc

    js = vlc.javascript_bundle()
    return js.replace("</script", "<\\/script")


def _groups(values: list[int], limit: int) -> list[list[int]]:
    """Split sorted distinct values into at most `limit` runs of consecutive items."""
    if len(values) <= limit:
        return [[v] for v in values]
    size = math.ceil(len(values) / limit)
    return [values[i : i + size] for i in range(0, len(values), size)]


def _group_label(name: str, g: list[int]) -> str:
    return f"{name} {g[0]}" if len(g) == 1 else f"{name}s {g[0]}–{g[-1]}"


def _stacked(rows: list[dict], labels: list[str], parts, title: str, x_title: str) -> alt.Chart:
    data = []
    for row, label in zip(rows, labels):
        for i, (col, name, _) in enumerate(parts):
            data.append({"bar": label, "part": name, "order": i, "ms": (row.get(col) or 0) / 1e6})
    names = [p[1] for p in parts]
    return (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            y=alt.Y("bar:N", title=None, sort=labels),
            x=alt.X("ms:Q", title=x_title, stack="zero"),
            color=alt.Color(
                "part:N",
                title=None,
                scale=alt.Scale(domain=names, range=[p[2] for p in parts]),
                legend=alt.Legend(orient="bottom", columns=3),
            ),
            order=alt.Order("order:Q"),
            tooltip=["bar:N", "part:N", alt.Tooltip("ms:Q", format=",.3f")],
        )
        .properties(width=WIDTH, height=alt.Step(16), title=title)
    )


def _mean_rows(rows: list[dict], cols: list[str]) -> dict:
    return {c: sum(r.get(c) or 0 for r in rows) / len(rows) for c in cols}


def breakdown_chart(step_rows: list[dict], ranks: list[dict]):
    """Stacked time per rank x step (step_time rows), or per rank over the whole trace (ranks rows)
    when the run has no steps. Returns (chart | None, note | None)."""
    if step_rows:
        cols = [p[0] for p in STEP_PARTS]
        n_ranks = len({r["rank"] for r in step_rows})
        steps = sorted({r["step"] for r in step_rows})
        if len(step_rows) <= MAX_BARS:
            rows = sorted(step_rows, key=lambda r: (r["rank"], r["step"]))
            labels = [f"rank {r['rank']} · step {r['step']}" for r in rows]
            note = None
        else:
            groups = _groups(sorted({r["rank"] for r in step_rows}), MAX_BARS)
            rows = [_mean_rows([r for r in step_rows if r["rank"] in set(g)], cols) for g in groups]
            labels = [_group_label("rank", g) for g in groups]
            note = (
                f"{n_ranks} ranks × {len(steps)} steps: each bar is the mean over the steps"
                + (" and the ranks named" if len(groups) < n_ranks else "")
                + "; every row is in the step_time view of tracelake sql"
            )
        return _stacked(
            rows, labels, STEP_PARTS, "Step time by rank and step: where it went", "time (ms)"
        ), note
    if not ranks:
        return None, "no GPU activity in this run"
    cols = [p[0] for p in TRACE_PARTS]
    rows = [
        {
            **r,
            "exposed_unknown_ns": r["span_ns"]
            - r["compute_ns"]
            - r["exposed_comm_ns"]
            - r["exposed_memcpy_ns"]
            - r["gpu_idle_ns"],
        }
        for r in sorted(ranks, key=lambda r: r["rank"])
    ]
    groups = _groups([r["rank"] for r in rows], MAX_BARS)
    if len(groups) == len(rows):
        labels, note = [f"rank {r['rank']} (whole trace)" for r in rows], None
    else:
        by = {r["rank"]: r for r in rows}
        rows = [_mean_rows([by[x] for x in g], cols) for g in groups]
        labels = [_group_label("rank", g) for g in groups]
        note = f"{len(by)} ranks: each bar is the mean over the ranks named"
    return _stacked(
        rows, labels, TRACE_PARTS, "GPU time by rank over the whole trace (the run has no steps)", "time (ms)"
    ), note


def overlap_chart(step_rows: list[dict], ranks: list[dict]):
    """Share of each rank's communication hidden under compute (over the analysed steps, else the
    whole trace); a histogram over ranks beyond MAX_BARS."""
    per: dict[int, list[float]] = {}
    for r in step_rows or ranks:
        t = per.setdefault(r["rank"], [0.0, 0.0])
        t[0] += r.get("overlap_ns") or 0
        t[1] += r.get("comm_ns") or 0
    data = [{"rank": k, "overlap_pct": 100 * o / c} for k, (o, c) in sorted(per.items()) if c > 0]
    if not data:
        return None, "no communication kernels: nothing to overlap"
    where = "over the analysed steps" if step_rows else "over the whole trace"
    if len(data) > MAX_BARS:
        chart = (
            alt.Chart(alt.Data(values=data))
            .mark_bar(color="#54a24b")
            .encode(
                x=alt.X(
                    "overlap_pct:Q",
                    bin=alt.Bin(maxbins=20, extent=[0, 100]),
                    title="communication hidden under compute (%)",
                ),
                y=alt.Y("count():Q", title="ranks"),
            )
        )
        note = f"{len(data)} ranks: histogram over ranks"
    else:
        chart = (
            alt.Chart(alt.Data(values=data))
            .mark_bar(color="#54a24b")
            .encode(
                x=alt.X("rank:O", title="rank"),
                y=alt.Y(
                    "overlap_pct:Q",
                    title="communication hidden under compute (%)",
                    scale=alt.Scale(domain=[0, 100]),
                ),
                tooltip=["rank:O", alt.Tooltip("overlap_pct:Q", format=".2f")],
            )
        )
        note = None
    return chart.properties(
        width=WIDTH, height=220, title=f"Communication–computation overlap per rank, {where}"
    ), note


def busbw_chart(
    per_rank_calls: list[dict], matched_calls: list[dict] | None = None, size_note: str | None = None
):
    """Median bus bandwidth per (collective, message size), log-log, with a dashed rule at each
    link peak (NVLink per direction, when the group fits on one host). Over the matched calls'
    transfer time (after the last rank arrived: queries/collective_matching.sql) when there are
    any with a bandwidth, else over every rank's own kernel time (which includes waiting for
    peers). size_note: why sizes are missing (the analysis note), shown when no call has one."""
    if not per_rank_calls and not matched_calls:
        return None, "no collectives in this run"
    rows = [
        c
        for c in (matched_calls or [])
        if c["busbw_gbps"] is not None and c["msg_bytes"] and c.get("consistent")
    ]
    over = "transfer time of matched calls" if rows else "each rank's kernel time, waiting included"
    rows = rows or [c for c in per_rank_calls if c["busbw_gbps"] is not None and c["msg_bytes"]]
    if not rows:
        return None, (
            "no collective has both a message size and a group size, so bandwidth is unknown"
            + (f" ({size_note})" if size_note else "")
        )
    df = pl.DataFrame(
        [{"op": c["op"], "msg_bytes": c["msg_bytes"], "busbw_gbps": c["busbw_gbps"]} for c in rows]
    )
    agg = (
        df.group_by("op", "msg_bytes")
        .agg(busbw_gbps=pl.col("busbw_gbps").median(), calls=pl.len())
        .sort("op", "msg_bytes")
    )
    data = [{**r, "msg_mib": r["msg_bytes"] / 2**20} for r in agg.to_dicts()]
    peaks = sorted({c["link_peak_gbps"] for c in rows if c["link_peak_gbps"]})
    pts = (
        alt.Chart(alt.Data(values=data))
        .mark_point(filled=True, size=60)
        .encode(
            x=alt.X("msg_mib:Q", scale=alt.Scale(type="log"), title="message size (MiB)"),
            y=alt.Y("busbw_gbps:Q", scale=alt.Scale(type="log"), title="bus bandwidth (GB/s)"),
            color=alt.Color("op:N", title="collective"),
            tooltip=[
                "op:N",
                alt.Tooltip("msg_mib:Q", format=",.4f"),
                alt.Tooltip("busbw_gbps:Q", format=",.2f"),
                "calls:Q",
            ],
        )
    )
    layers = [pts]
    note = None
    if peaks:
        layers.append(
            alt.Chart(alt.Data(values=[{"peak": p, "label": f"link peak {p:g} GB/s"} for p in peaks]))
            .mark_rule(strokeDash=[6, 4], color="#333")
            .encode(y="peak:Q", tooltip=["label:N"])
        )
    else:
        note = "link peak unknown (the group spans hosts, or the device is not in pipeline/catalog/devices.toml): no peak line"
    return alt.layer(*layers).properties(
        width=WIDTH, height=280, title=f"Collective bus bandwidth against message size (median over {over})"
    ), note


def wait_heatmap(collectives: list[dict], n_ranks: int):
    """Wait in matched collectives (duration − transfer time) summed per rank and step: the ranks
    that wait least are the late ones the others wait for."""
    calls = [c for c in collectives if c.get("wait_ns")]
    if n_ranks < 2 or not calls:
        return None, "needs collectives matched across at least two ranks"
    cells: dict[tuple[int, object], float] = {}
    for c in calls:
        for rk, w in c["wait_ns"].items():
            k = (int(rk), c["step"] if c["step"] is not None else -1)
            cells[k] = cells.get(k, 0.0) + (w or 0)
    ranks = sorted({k[0] for k in cells})
    steps = sorted({k[1] for k in cells})
    if len(ranks) < 2:
        return None, "needs collectives matched across at least two ranks"
    rg, sg = _groups(ranks, MAX_BARS), _groups(steps, MAX_STEP_COLS)
    data = []
    for g in rg:
        for h in sg:
            vals = [cells.get((r, s), 0.0) for r in g for s in h]
            per_rank = sum(vals) / len(g)
            data.append(
                {
                    "ranks": _group_label("rank", g),
                    "steps": ("outside steps" if h == [-1] else _group_label("step", h)),
                    "wait_ms": per_rank / 1e6,
                }
            )
    note = None
    if len(rg) < len(ranks) or len(sg) < len(steps):
        note = f"{len(ranks)} ranks × {len(steps)} steps: cells are means over the ranks named" + (
            " and sums over the steps named" if len(sg) < len(steps) else ""
        )
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_rect()
        .encode(
            x=alt.X("steps:N", title="step", sort=None),
            y=alt.Y("ranks:N", title=None, sort=None),
            color=alt.Color("wait_ms:Q", title="wait (ms)", scale=alt.Scale(scheme="orangered")),
            tooltip=["ranks:N", "steps:N", alt.Tooltip("wait_ms:Q", format=",.3f")],
        )
    )
    return chart.properties(
        width=min(WIDTH, 40 * len(sg) + 80),
        height=alt.Step(14),
        title="Collective wait per rank and step (a straggler waits least: the others wait for it)",
    ), note


def mfu_chart(steps: list[dict], reason: str | None):
    """MFU per step: mean over ranks, with the min–max band."""
    rows = [s for s in steps if s["mfu_pct"] is not None]
    if not steps:
        return None, "the run has no steps (MFU is per step)"
    if not rows:
        return None, reason or "MFU not available for this run"
    df = pl.DataFrame([{"step": s["step"], "mfu": s["mfu_pct"]} for s in rows])
    agg = (
        df.group_by("step")
        .agg(mean=pl.col("mfu").mean(), lo=pl.col("mfu").min(), hi=pl.col("mfu").max(), ranks=pl.len())
        .sort("step")
    )
    data = agg.to_dicts()
    base = alt.Chart(alt.Data(values=data)).encode(
        x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1))
    )
    band = base.mark_area(opacity=0.25, color="#4c78a8").encode(y=alt.Y("lo:Q", title="MFU (%)"), y2="hi:Q")
    line = base.mark_line(point=True, color="#4c78a8").encode(
        y="mean:Q",
        tooltip=[
            "step:Q",
            alt.Tooltip("mean:Q", format=".2f"),
            alt.Tooltip("lo:Q", format=".2f"),
            alt.Tooltip("hi:Q", format=".2f"),
            "ranks:Q",
        ],
    )
    return alt.layer(band, line).properties(
        width=WIDTH, height=220, title="Model FLOPs utilisation per step (mean over ranks, band: min–max)"
    ), None


def top_kernels_chart(top: list[dict]):
    if not top:
        return None, "no GPU activity in this run"
    data = [
        {"name": t["name"][:90], "category": t["category"], "ms": t["total_ns"] / 1e6, "calls": t["calls"]}
        for t in top[:15]
    ]
    cats = list(_CATEGORY_COLORS)
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            y=alt.Y("name:N", sort="-x", title=None),
            x=alt.X("ms:Q", title="total time, all ranks (ms)"),
            color=alt.Color(
                "category:N",
                title=None,
                scale=alt.Scale(domain=cats, range=[_CATEGORY_COLORS[c] for c in cats]),
            ),
            tooltip=["name:N", "category:N", "calls:Q", alt.Tooltip("ms:Q", format=",.3f")],
        )
    )
    return chart.properties(width=520, height=alt.Step(18), title="Top kernels by time"), None


def _dur(ns: float) -> str:
    for unit, d in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= d:
            return f"{ns / d:.3g} {unit}"
    return f"{ns:.3g} ns"


def idle_gap_chart(gaps: list[dict]):
    """Histogram of the GPU's idle gaps (power-of-two length buckets), stacked by cause."""
    if not gaps:
        return None, "no idle gaps between GPU work"
    data = [
        {
            "bucket": f"{_dur(g['bucket_lo_ns'])}–{_dur(g['bucket_hi_ns'])}",
            "lo": g["bucket_lo_ns"],
            "cause": _CAUSE_LABELS.get(g["cause"], g["cause"]),
            "gaps": g["gaps"],
            "total_ms": g["total_ns"] / 1e6,
        }
        for g in gaps
    ]
    order = [d["bucket"] for d in sorted({d["lo"]: d for d in data}.values(), key=lambda d: d["lo"])]
    causes = list(_CAUSE_LABELS)
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            x=alt.X("bucket:N", sort=order, title="idle gap length"),
            y=alt.Y("gaps:Q", title="gaps (all ranks)"),
            color=alt.Color(
                "cause:N",
                title=None,
                scale=alt.Scale(
                    domain=[_CAUSE_LABELS[c] for c in causes], range=[_CAUSE_COLORS[c] for c in causes]
                ),
            ),
            tooltip=[
                "bucket:N",
                "cause:N",
                "gaps:Q",
                alt.Tooltip("total_ms:Q", format=",.3f", title="total (ms)"),
            ],
        )
    )
    return chart.properties(width=WIDTH, height=220, title="GPU idle gaps by length and cause"), None


def comparison_chart(comp: dict):
    rows = [c for c in comp["components"] if c["baseline_ns"] or c["current_ns"]]
    if not rows:
        return None, comp.get("reason") or "nothing to compare"
    data = []
    for c in rows:
        data.append({"component": c["label"], "run": "baseline", "ms": c["baseline_ns"] / 1e6})
        data.append({"component": c["label"], "run": "this run", "ms": c["current_ns"] / 1e6})
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            y=alt.Y("component:N", sort=[c["label"] for c in rows], title=None),
            yOffset=alt.YOffset("run:N", sort=["baseline", "this run"]),
            x=alt.X("ms:Q", title=f"ms {comp['per']}"),
            color=alt.Color(
                "run:N",
                scale=alt.Scale(domain=["baseline", "this run"], range=["#bab0ac", "#4c78a8"]),
                title=None,
            ),
            tooltip=["component:N", "run:N", alt.Tooltip("ms:Q", format=",.3f")],
        )
    )
    return chart.properties(
        width=WIDTH, height=alt.Step(12), title="Step-time components: baseline against this run"
    ), None


def _fmt_ms(ns) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.3f} ms"


def _fmt_pct(p) -> str:
    return "—" if p is None else f"{p:.1f}%"


def _fmt_pct2(p) -> str:
    return "—" if p is None else f"{p:.3g}%"


_BARS = {key: (mod, high) for _, key, mod, high in CAUSES.values()}


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


def render(
    result: dict, title: str = "tracelake report", baseline: dict | None = None, doc: dict | None = None
) -> str:
    """HTML text of the report for an analysis dict (pipeline.analyze.analyze); with `baseline`
    (the analysis of another lake) each run is also compared with its baseline run. `doc` is the
    report document (document.build) when the caller already has it."""
    e = html.escape
    doc = doc or build(result, baseline)
    specs: list[tuple[str, str, dict]] = []
    body: list[str] = []

    def chart_block(kind: str, res) -> None:
        chart, note = res
        if chart is None:
            body.append(f'<p class="hidden-chart" data-chart="{kind}">Chart hidden: {e(note)}.</p>')
            return
        cid = f"chart{len(specs)}"
        specs.append((cid, kind, chart.to_dict()))
        body.append(f'<div class="chart" id="{cid}" data-chart="{kind}"></div>')
        if note:
            body.append(f'<p class="note">{e(note)}.</p>')

    if len(doc["runs"]) > 1:
        rows = "".join(
            f'<tr><td><a href="#run-{i}">{e(r["run_id"])}</a></td><td class="l">{e(r["verdict"]["verdict"])}</td>'
            f'<td>{e(r["verdict"]["confidence"] or "—")}</td><td class="l">{e(r["verdict"]["reason"])}</td></tr>'
            for i, r in enumerate(doc["runs"])
        )
        body.append(
            f"<h2>Runs</h2><table><tr><th>run</th><th>verdict</th><th>confidence</th><th>why</th></tr>{rows}</table>"
        )
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
            f"<tr><th>ranks</th><td>{s['ranks']} rank(s) ingested{world}; {s['ranks_with_gpu_work']} with GPU work</td></tr>"
            f"<tr><th>hosts</th><td>{e(', '.join(s['hosts'])) or 'not recorded in the inputs'}</td></tr>"
            f"<tr><th>GPUs</th><td>{e(gpus_text(s['gpus']))}</td></tr>"
            f"<tr><th>steps analysed</th><td>{s['steps_analysed']} of {s['steps']} step(s)</td></tr>"
            f"<tr><th>inputs</th><td>{s['sources']} source file(s): {e(', '.join(s['formats']))}</td></tr>"
            f"<tr><th>software</th><td>{e(versions_text(s['tool_versions']))}</td></tr></table>"
        )
        conf = f' <span class="conf">({e(v["confidence"])} confidence)</span>' if v["confidence"] else ""
        nums = "".join(
            f'<li class="num{_level(h["key"], h["pct"])}"><b>{_fmt_pct(h["pct"])}</b> {e(h["label"])}</li>'
            for h in v["headline"]
        )
        body.append(
            f'<div class="verdict v-{e(v["verdict"])}"><h3>Verdict: {e(v["verdict"])}{conf}</h3>'
            f'<p>{e(v["reason"])}.</p><ul class="headline">{nums}</ul>{_caveats_html(v)}'
            f'<p class="basis">{e(basis_text(s, v))} Rules and thresholds: docs/report.md.</p></div>'
        )
        comp = run["comparison"]
        if comp is not None:
            body.append(
                f"<h3>Against baseline run <code>{e(comp['baseline_run_id'])}</code></h3><p>{e(comp['summary'])}.</p>"
            )
            if comp["components"]:
                rows = "".join(
                    f'<tr{" class=moved" if c["moved"] else ""}><td class="l">{e(c["label"])}</td><td>{_fmt_ms(c["baseline_ns"])}</td>'
                    f"<td>{_fmt_ms(c['current_ns'])}</td><td>{c['delta_ns'] / 1e6:+,.3f} ms</td>"
                    f"<td>{'—' if c['delta_pct'] is None else format(c['delta_pct'], '+.1f') + '%'}</td></tr>"
                    for c in comp["components"]
                )
                body.append(
                    f'<table class="compare"><tr><th>component ({e(comp["per"])})</th><th>baseline</th><th>this run</th>'
                    f"<th>change</th><th>change %</th></tr>{rows}</table>"
                )
                chart_block("comparison", comparison_chart(comp))
            if comp["kernels"]:
                rows = "".join(
                    f'<tr><td class="l"><code>{e(k["name"][:160])}</code></td><td>{e(k["category"])}</td>'
                    f"<td>{_fmt_ms(k['baseline_ns'])}</td><td>{_fmt_ms(k['current_ns'])}</td>"
                    f"<td>{k['delta_ns'] / 1e6:+,.3f} ms</td></tr>"
                    for k in comp["kernels"]
                )
                body.append(
                    f'<table class="compare"><tr><th>kernel (largest changes, {e(comp["per"])})</th><th>category</th>'
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
                    f'<li class="finding"><h4>{e(f["title"])} <span class="rec">— {e(timing_text(f))}</span></h4><ul>{ev}</ul>'
                    f"<p><b>Recommendation:</b> {e(f['recommendation'])}</p>"
                    f"<details><summary>SQL (continue in <code>tracelake sql</code>)</summary>"
                    f'<pre class="sql"><code>{e(f["sql"])}</code></pre>'
                    f'<button type="button" class="copy">copy SQL</button></details></li>'
                )
            body.append("</ol>")
        body.append("<h3>Charts</h3>")
        mfu_note = next((n for n in run["notes"] if "MFU not available" in n), None)
        chart_block("breakdown", breakdown_chart(step_rows, ranks))
        chart_block("overlap", overlap_chart(step_rows, ranks))
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
        chart_block("mfu", mfu_chart(steps, mfu_note.split(": ", 1)[1] if mfu_note else None))
        chart_block("kernels", top_kernels_chart([t for t in result["top_kernels"] if t["run_id"] == rid]))
        chart_block(
            "idle_gaps", idle_gap_chart([g for g in result.get("idle_gaps", []) if g["run_id"] == rid])
        )
        rows = "".join(
            f"<tr><td>{r['rank']}</td><td>{_fmt_ms(r['span_ns'])}</td><td>{_fmt_ms(r['compute_ns'])}</td>"
            f"<td>{_fmt_ms(r['comm_ns'])}</td><td>{_fmt_ms(r['exposed_comm_ns'])}</td><td>{_fmt_ms(r['exposed_comm_wait_ns'])}</td>"
            f"<td>{_fmt_ms(r['exposed_comm_transfer_ns'])}</td><td>{_fmt_pct(r['comm_comp_overlap_pct'])}</td>"
            f"<td>{_fmt_ms(r['gpu_idle_ns'])}</td><td>{_fmt_ms(r['idle_host_wait_ns'])}</td><td>{_fmt_pct2(r['mfu_pct'])}</td>"
            f"<td>{_fmt_pct(r['flop_coverage_pct'])}</td></tr>"
            for r in ranks[:MAX_BARS]
        )
        if rows:
            body.append(
                "<h3>Per rank, whole trace</h3><table><tr><th>rank</th><th>GPU span</th><th>compute</th><th>comm</th>"
                "<th>exposed comm</th><th>of it: waiting for peers</th><th>of it: transfer</th><th>overlap</th><th>idle</th><th>idle: host wait</th><th>MFU</th><th>FLOP coverage</th></tr>"
                f"{rows}</table>"
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
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:">
<title>{e(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; padding: 0 1em; }}
code, pre {{ background: #f4f4f4; padding: 0 .2em; }} pre {{ padding: .6em; overflow-x: auto; white-space: pre-wrap; }}
.verdict {{ border-left: 6px solid #888; padding: .3em 1em; background: #fafafa; margin: .8em 0; }}
.verdict h3 {{ margin: .3em 0; font-size: 1.4em; }}
.v-network-bound {{ border-color: #e45756; }} .v-host-bound {{ border-color: #9d755d; }} .v-input-bound {{ border-color: #eeca3b; }}
.v-copy-bound {{ border-color: #f58518; }} .v-straggler-bound {{ border-color: #ff9d98; }} .v-compute-bound {{ border-color: #4c78a8; }} .v-balanced {{ border-color: #54a24b; }}
ul.headline {{ list-style: none; padding: 0; display: flex; gap: 2em; flex-wrap: wrap; }}
ul.headline b {{ font-size: 1.5em; }} li.high b {{ color: #c0392b; }} li.moderate b {{ color: #b7791f; }}
.basis {{ color: #555; font-size: .9em; }} .caveats {{ background: #fff7e6; padding: .2em .6em; margin: .4em 0; }}
.caveats ul {{ margin: .2em 0; }}
table {{ border-collapse: collapse; margin: .5em 0; }} td, th {{ border: 1px solid #ddd; padding: .2em .5em; text-align: right; }}
table.summary th {{ text-align: left; background: #f6f6f6; }} table.summary td, td.l {{ text-align: left; }}
tr.moved td {{ font-weight: bold; }}
.finding h4 {{ margin: .8em 0 .2em; }} .rec {{ color: #555; font-weight: normal; }}
.note, .hidden-chart {{ color: #666; font-style: italic; }} .chart {{ margin: 1em 0; }}
</style></head><body>
<h1>{e(title)}</h1>
<p>tracelake {e(doc["tracelake_version"])} · analysis window: {e(doc["window"])} · kernel-wait threshold {doc["kernel_wait_threshold_ns"] / 1000:g} µs</p>
{"".join(body)}
{"<h2>Notes</h2><ul>" + notes + "</ul>" if notes else ""}
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
  p.then(() => {{ el.dataset.rendered = '1'; }})
   .catch(err => {{ el.dataset.error = String(err); el.textContent = 'chart failed: ' + err; }});
}}
{charts_js}
</script>
</body></html>
"""
