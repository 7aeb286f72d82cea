"""The roofline chart of the HTML report (html.py embeds its spec), in the (chart | None,
note | None) shape of charts.py: achieved TFLOP/s against arithmetic intensity (FLOP/byte),
log-log, one point per kernel and launching op (queries/roofline.sql's groups over all ranks and
steps, sized by their time, coloured by bound), with the device's roofs: for each peak the
kernels were measured against, the memory roof (intensity x HBM bandwidth) up to the ridge point,
then the compute peak (Williams, Waterman, Patterson, CACM 2009). The document keeps the groups
that lost the most time against their roofs (analyze keeps 5 x top_n per run), so a run with many
kernels is shown by those; the note counts the groups left out for want of a byte count."""

from __future__ import annotations

from ..kernelname import hover_name, short_names
from .altair_lib import alt
from .charts import WIDTH
from .spec_cache import Spec


def roofline_chart(rows: list[dict], summary: dict | None):
    pts = [r for r in rows if r["intensity"] and r["achieved_tflops"]]
    if not pts:
        why = "no compute kernel with modelled FLOPs and bytes (see the notes)"
        return None, why if summary is None else "the modelled kernels have no byte count"
    label = short_names(r["kernel_name"] for r in pts)
    data = [
        {
            "kernel": label[r["kernel_name"]],
            "name": hover_name(r["kernel_name"]),
            "op": r["op_name"],
            "bound": r["bound"],
            "intensity": r["intensity"],
            "tflops": r["achieved_tflops"],
            "ms": r["dur_ns"] / 1e6,
            "roof_pct": r["roof_pct"],
            "kernels": r["kernels"],
        }
        for r in pts
    ]
    lo = min(d["intensity"] for d in data) / 4
    hi = max(d["intensity"] for d in data) * 4
    roofs = sorted(
        {
            (r["peak_tflops"], r["memory_gbps"], r["precision"])
            for r in pts
            if r["peak_tflops"] and r["memory_gbps"]
        }
    )
    line = []
    for peak, bw, prec in roofs:
        ridge = peak * 1e3 / bw
        label = f"{prec} roof: {peak:g} TFLOP/s, {bw:g} GB/s"
        xs = [min(lo, ridge / 4), ridge, max(hi, ridge * 4)]
        line += [{"roof": label, "x": x, "y": min(peak, x * bw / 1e3)} for x in xs]
    note = None if line else "the device's peaks are not in pipeline/catalog/devices.toml: no roof lines"
    if summary is not None and len(pts) < len(rows):
        note = (
            (note + "; ") if note else ""
        ) + f"{len(rows) - len(pts)} kernel group(s) without a byte count left out"
    if line:
        return Spec(_draw_roofline, data=data, roofs=line), note
    return Spec(_draw_roofline, data=data), note


def _draw_roofline(data, roofs=None):
    """The kernels' points, with the roofs' dashed lines (rows: roof, x, y) when given."""
    layers = [
        alt.Chart(alt.Data(values=data))
        .mark_point(filled=True, opacity=0.75)
        .encode(
            x=alt.X("intensity:Q", scale=alt.Scale(type="log"), title="arithmetic intensity (FLOP/byte)"),
            y=alt.Y("tflops:Q", scale=alt.Scale(type="log"), title="achieved TFLOP/s"),
            color=alt.Color("bound:N", title="bound"),
            size=alt.Size("ms:Q", title="time (ms)"),
            tooltip=[
                alt.Tooltip("name:N", title="kernel"),
                alt.Tooltip("op:N"),
                alt.Tooltip("bound:N"),
                alt.Tooltip("kernels:Q"),
                alt.Tooltip("ms:Q", format=",.3f"),
                alt.Tooltip("intensity:Q", format=",.3g"),
                alt.Tooltip("tflops:Q", format=",.3g"),
                alt.Tooltip("roof_pct:Q", format=".1f"),
            ],
        )
    ]
    if roofs is not None:
        layers.append(
            alt.Chart(alt.Data(values=roofs))
            .mark_line(strokeDash=[6, 4], color="#333")
            .encode(
                x=alt.X("x:Q"), y=alt.Y("y:Q"), detail=alt.Detail("roof:N"), tooltip=[alt.Tooltip("roof:N")]
            )
        )
    return alt.layer(*layers).properties(
        width=WIDTH, height=300, title="Kernels against the roofline (one point per kernel and op, all ranks)"
    )
