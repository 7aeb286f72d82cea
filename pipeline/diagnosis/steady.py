"""Which step rows a run's verdict rests on: steady_steps() leaves out a rank's incomplete steps
and outlier steps (more than OUTLIER_FACTOR x the median step on some rank), kept_rows() gives
back the rows a verdict kept (pipeline/diagnosis/verdict.py module doc: Basis)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported by steady_steps: kept_rows serves a report of kept results)
    import polars as pl

OUTLIER_FACTOR = 3.0


def steady_steps(step_time: pl.DataFrame) -> tuple[pl.DataFrame, list[dict], int | None]:
    """Split one run's step_time rows (queries/step_time.sql, with the `complete` flag of
    queries/step_status.sql when present) into the rows the verdict uses and those it leaves out.

    Left out, in this order:
    - incomplete steps of a rank (a launch of the step has no GPU work in the trace: the profiler
      stopped first): their GPU time is cut off. torch-tb-profiler drops such tail steps
      (event_parser.py _update_steps_duration), HTA drops the last step for the same reason;
    - outlier steps: a step number is left out on every rank when some rank's step_ns exceeds
      OUTLIER_FACTOR x the median step_ns of the remaining rows.
    Returns (kept rows, excluded [{step, rank, step_ns, why: "incomplete" | "outlier"}] — for an
    outlier step its slowest rank —, median step ns of the complete rows). When every row would be
    left out, all rows are kept and nothing is reported excluded.
    """
    import polars as pl

    if step_time.height == 0:
        return step_time, [], None
    excluded: list[dict] = []
    rows = step_time
    if "complete" in rows.columns:
        inc = rows.filter(pl.col("complete") == False)  # noqa: E712 (null = unknown, kept)
        if 0 < inc.height < rows.height:
            excluded += [
                {
                    "step": int(r["step"]),
                    "rank": int(r["rank"]),
                    "step_ns": int(r["step_ns"]),
                    "why": "incomplete",
                }
                for r in inc.sort("rank", "step").iter_rows(named=True)
            ]
            rows = rows.filter(pl.col("complete").is_null() | pl.col("complete"))
    median = int(statistics.median(rows["step_ns"].to_list()))
    bad = rows.filter(pl.col("step_ns") > OUTLIER_FACTOR * median)
    if bad.height:
        kept = rows.filter(~pl.col("step").is_in(bad["step"].unique().to_list()))
        if kept.height:
            worst = bad.sort("step_ns", descending=True).unique("step", keep="first").sort("step")
            excluded += [
                {
                    "step": int(r["step"]),
                    "rank": int(r["rank"]),
                    "step_ns": int(r["step_ns"]),
                    "why": "outlier",
                }
                for r in worst.iter_rows(named=True)
            ]
            rows = kept
    return rows, excluded, median


def kept_rows(step_rows: list[dict], verdict: dict) -> list[dict]:
    """The step_time rows (dicts) of a run that its verdict used: without the outlier steps (on
    every rank) and the incomplete (rank, step) rows listed in verdict["excluded_steps"]."""
    out_steps = {e["step"] for e in verdict.get("excluded_steps", []) if e["why"] == "outlier"}
    out_rows = {(e["rank"], e["step"]) for e in verdict.get("excluded_steps", []) if e["why"] == "incomplete"}
    return [r for r in step_rows if r["step"] not in out_steps and (r["rank"], r["step"]) not in out_rows]
