"""The multi-run report's chart of the fleet (pipeline/fleet.py rows): each run's median step time
against its start time, coloured by its verdict, so a trend or a regression across the runs of an
archive shows at a glance. Runs are separate jobs: points, never a line between them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported by fleet_chart: the html report of one run imports no polars)
    import polars as pl

from .altair_lib import alt
from .charts import WIDTH
from .spec_cache import Spec

# verdict -> colour: the colour of its cause in the step-time breakdown (charts.STEP_PARTS)
VERDICT_COLORS = {
    "network-bound": "#e45756",
    "straggler-bound": "#ff9d98",
    "compute-bound": "#4c78a8",
    "copy-bound": "#f58518",
    "host-bound": "#9d755d",
    "input-bound": "#eeca3b",
    "balanced": "#54a24b",
    "unknown": "#bab0ac",
}
# one shape per verdict (VERDICT_COLORS' order), so the chart reads without colour too
SHAPES = [
    "triangle-up",
    "triangle-down",
    "circle",
    "diamond",
    "square",
    "cross",
    "triangle-right",
    "triangle-left",
]


def fleet_chart(rows: pl.DataFrame):
    """(chart, note) for fleet rows (pipeline.fleet.fleet_rows): one point per run with a known
    start and a median step (y: ms, log scale, since the runs of an archive differ by orders of
    magnitude; x: start, UTC; colour: verdict; tooltip: run, confidence, top finding). (None,
    reason) when fewer than two runs can be placed; the note names the runs left out."""
    import polars as pl

    ok = rows.filter(pl.col("start_ns").is_not_null() & pl.col("median_step_ns").is_not_null())
    left_out = rows.height - ok.height
    if ok.height < 2:
        return None, (
            "the chart of step time per run needs two or more runs with a known start time and steps "
            f"({ok.height} of {rows.height} have both)"
        )
    data = [
        {
            "run": r["run_id"],
            "start": r["start_time"].strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "start_utc": r["start_time"].strftime("%Y-%m-%d %H:%M:%S UTC"),
            "step_ms": r["median_step_ns"] / 1e6,
            "verdict": r["verdict"] or "unknown",
            "confidence": r["verdict_confidence"] or "—",
            "top_finding": r["top_finding_title"] or "—",
        }
        for r in ok.iter_rows(named=True)
    ]
    note = (
        f"{left_out} of {rows.height} runs not drawn (no steps or no known start time)" if left_out else None
    )
    return Spec(_draw, data=data), note


def _draw(data):
    return (
        alt.Chart(alt.Data(values=data))
        .mark_point(filled=True, size=90, opacity=0.9)
        .encode(
            x=alt.X(
                "start:T",
                timeUnit="utcyearmonthdatehoursminutesseconds",
                title="start (UTC)",
                scale=alt.Scale(padding=16),
                axis=alt.Axis(format="%Y-%m-%d", labelAngle=0),
            ),
            y=alt.Y(
                "step_ms:Q", title="median step (ms, log scale)", scale=alt.Scale(type="log", padding=16)
            ),
            color=alt.Color(
                "verdict:N",
                scale=alt.Scale(domain=list(VERDICT_COLORS), range=list(VERDICT_COLORS.values())),
                legend=alt.Legend(title="verdict"),
            ),
            shape=alt.Shape(  # the same legend as colour (one legend: Vega-Lite merges them)
                "verdict:N",
                scale=alt.Scale(domain=list(VERDICT_COLORS), range=SHAPES),
                legend=alt.Legend(title="verdict"),
            ),
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("start_utc:N", title="start"),
                alt.Tooltip("step_ms:Q", title="median step (ms)", format=",.2f"),
                alt.Tooltip("verdict:N"),
                alt.Tooltip("confidence:N"),
                alt.Tooltip("top_finding:N", title="top finding"),
            ],
        )
        .properties(width=WIDTH, height=240, title="Median step time and verdict per run, by start time")
    )
