"""The communication's charts of the HTML report, in the (chart | None, note | None) shape of
charts.py (html.py embeds their specs):
  2. share of each rank's communication hidden under compute (overlap_chart);
  3. collective bus bandwidth against message size, with the link peak (busbw_chart);
  4. rank x step heat map of collective wait: stragglers are the ranks the others wait for
     (wait_heatmap).
At most MAX_BARS heat-map rows and MAX_STEP_COLS columns: beyond that, consecutive ranks and steps
are grouped (charts.group_values).
"""

from __future__ import annotations

from .altair_lib import alt
from .charts import MAX_BARS, MAX_STEP_COLS, WIDTH, Table, group_label, group_values, median
from .spec_cache import Spec


def overlap_chart(step_rows: list[dict], ranks: list[dict]):
    """Share of each rank's communication hidden under compute (over the analysed steps, else the
    whole trace); a histogram over ranks beyond MAX_BARS."""
    per: dict[int, list[float]] = {}
    for r in step_rows or ranks:
        t = per.setdefault(r["rank"], [0.0, 0.0])
        t[0] += r.get("overlap_ns") or 0
        t[1] += r.get("comm_ns") or 0
    data = [
        {"rank": k, "overlap_pct": 100 * o / c, "label": f"{100 * o / c:.0f}\u00a0%"}
        for k, (o, c) in sorted(per.items())
        if c > 0
    ]
    if not data:
        return None, "no communication kernels: nothing to overlap"
    where = "over the analysed steps" if step_rows else "over the whole trace"
    title = f"Communication–computation overlap per rank, {where}"
    if all(d["overlap_pct"] == 0 for d in data):
        ranks = [d["rank"] for d in data]
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"any of the {len(ranks)} ranks"
        return Table(title, f"0 % of the communication is hidden under compute on {who}: none overlaps"), None
    if len(data) > MAX_BARS:
        return Spec(_draw_overlap, {"kind": "histogram"}, data=data, title=title), (
            f"{len(data)} ranks: histogram over ranks"
        )
    # every bar's value as text when they fit (up to 16), else the 0 % ones, which draw nothing
    if len(data) <= 16:
        return Spec(_draw_overlap, {"kind": "labelled"}, data=data, title=title), None
    shown = [d for d in data if d["overlap_pct"] == 0]
    if shown:
        return Spec(_draw_overlap, {"kind": "zeros labelled"}, data=data, shown=shown, title=title), None
    return Spec(_draw_overlap, {"kind": "bars"}, data=data, title=title), None


def _draw_overlap(kind: str, data, title, shown=None):
    """The overlap chart: a histogram over ranks (kind 'histogram'), else a bar per rank with its
    value as text on every bar ('labelled'), on the given ones ('zeros labelled': shown), or on
    none ('bars')."""
    if kind == "histogram":
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
        return chart.properties(width=WIDTH, height=220, title=title)
    base = alt.Chart(alt.Data(values=data)).encode(
        x=alt.X("rank:O", title="rank", axis=alt.Axis(format="d")),
        y=alt.Y(
            "overlap_pct:Q",
            title="communication hidden under compute (%)",
            scale=alt.Scale(domain=[0, 100]),
        ),
    )
    bars = base.mark_bar(color="#54a24b").encode(
        tooltip=[alt.Tooltip("rank:O", format="d"), alt.Tooltip("overlap_pct:Q", format=".2f")]
    )
    chart = bars
    if kind != "bars":
        labels = (
            alt.Chart(alt.Data(values=data if kind == "labelled" else shown))
            .mark_text(dy=-6, fontSize=10, color="#333")
            .encode(x=alt.X("rank:O"), y=alt.Y("overlap_pct:Q"), text=alt.Text("label:N"))
        )
        chart = alt.layer(bars, labels)
    return chart.properties(width=WIDTH, height=220, title=title)


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
    by: dict[tuple, list[float]] = {}
    for c in rows:
        by.setdefault((c["op"], c["msg_bytes"]), []).append(c["busbw_gbps"])
    data = [
        {"op": op, "msg_bytes": b, "busbw_gbps": median(v), "calls": len(v), "msg_mib": b / 2**20}
        for (op, b), v in sorted(by.items(), key=lambda kv: (kv[0][0] is not None, kv[0][0] or "", kv[0][1]))
    ]
    peaks = sorted({c["link_peak_gbps"] for c in rows if c["link_peak_gbps"]})
    title = f"Collective bus bandwidth against message size (median over {over})"
    if not peaks:
        note = (
            "link peak unknown (the group spans hosts, or the device is not in "
            "pipeline/catalog/devices.toml): no peak line"
        )
        return Spec(_draw_busbw, data=data, title=title), note
    lines = [{"peak": p, "label": f"link peak {p:g} GB/s"} for p in peaks]
    return Spec(_draw_busbw, data=data, peaks=lines, title=title), None


def _draw_busbw(data, title, peaks=None):
    """The bus bandwidth's points, with a dashed rule at each of peaks (rows: peak, label) when
    given."""
    pts = (
        alt.Chart(alt.Data(values=data))
        .mark_point(filled=True, size=60)
        .encode(
            x=alt.X("msg_mib:Q", scale=alt.Scale(type="log"), title="message size (MiB)"),
            y=alt.Y("busbw_gbps:Q", scale=alt.Scale(type="log"), title="bus bandwidth (GB/s)"),
            color=alt.Color("op:N", title="collective"),
            tooltip=[
                alt.Tooltip("op:N"),
                alt.Tooltip("msg_mib:Q", format=",.4f"),
                alt.Tooltip("busbw_gbps:Q", format=",.2f"),
                alt.Tooltip("calls:Q"),
            ],
        )
    )
    layers = [pts]
    if peaks is not None:
        layers.append(
            alt.Chart(alt.Data(values=peaks))
            .mark_rule(strokeDash=[6, 4], color="#333")
            .encode(y=alt.Y("peak:Q"), tooltip=[alt.Tooltip("label:N")])
        )
    return alt.layer(*layers).properties(width=WIDTH, height=280, title=title)


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
    rg, sg = group_values(ranks, MAX_BARS), group_values(steps, MAX_STEP_COLS)
    data = []
    for g in rg:
        for h in sg:
            vals = [cells.get((r, s), 0.0) for r in g for s in h]
            per_rank = sum(vals) / len(g)
            data.append(
                {
                    "ranks": group_label("rank", g),
                    "steps": ("outside steps" if h == [-1] else group_label("step", h)),
                    "wait_ms": per_rank / 1e6,
                }
            )
    note = None
    if len(rg) < len(ranks) or len(sg) < len(steps):
        note = f"{len(ranks)} ranks × {len(steps)} steps: cells are means over the ranks named" + (
            " and sums over the steps named" if len(sg) < len(steps) else ""
        )
    if len(sg) == 1:  # one step: a heat map of one column is a bar per rank
        (h,) = sg
        where = "outside steps" if h == [-1] else f"in {group_label('step', h)}"
        title = f"Collective wait per rank {where} (a straggler waits least: the others wait for it)"
        return Spec(_draw_wait_bars, data=data, title=title), note
    # the width decides the template (a number altair checks): one per column count
    return Spec(_draw_wait_heatmap, {"width": min(WIDTH, 40 * len(sg) + 80)}, data=data), note


def _draw_wait_bars(data, title):
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_bar(color="#e45756")
        .encode(
            y=alt.Y("ranks:N", title=None, sort=None),
            x=alt.X("wait_ms:Q", title="wait in collectives (ms)"),
            tooltip=[
                alt.Tooltip("ranks:N"),
                alt.Tooltip("steps:N"),
                alt.Tooltip("wait_ms:Q", format=",.3f"),
            ],
        )
    )
    return chart.properties(width=WIDTH, height=alt.Step(14), title=title)


def _draw_wait_heatmap(width: int, data):
    chart = (
        alt.Chart(alt.Data(values=data))
        .mark_rect()
        .encode(
            x=alt.X("steps:N", title="step", sort=None),
            y=alt.Y("ranks:N", title=None, sort=None),
            color=alt.Color("wait_ms:Q", title="wait (ms)", scale=alt.Scale(scheme="orangered")),
            tooltip=[alt.Tooltip("ranks:N"), alt.Tooltip("steps:N"), alt.Tooltip("wait_ms:Q", format=",.3f")],
        )
    )
    return chart.properties(
        width=width,
        height=alt.Step(14),
        title="Collective wait per rank and step (a straggler waits least: the others wait for it)",
    )
