"""Step windows of a replay, by the definition of queries/views/25_step_window.sql (torch-tb-profiler's
step time): a step starts at its host window's start or at the previous step's end if that is
later, and ends at its host window's end or at the end of the last GPU work launched in it,
whichever is later. Applied to the recorded times it gives step_window's rows; applied to a
replay's times, the predicted steps.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .graph import STEP_END, STEP_START, Graph
from .replay import Timing


def windows(g: Graph, t: Timing) -> pl.DataFrame:
    """One row per rank and step: rank, step, start_ns, end_ns, step_ns (relative to g.t0; ns).
    Only ranks with GPU work and steps with both marks."""
    idx = np.nonzero((g.h_what == STEP_START) | (g.h_what == STEP_END))[0]
    is_end = g.h_what[idx] == STEP_END
    marks = pl.DataFrame(
        {
            "rank": g.h_rank[idx],
            "step": g.h_step[idx],
            "what": np.where(is_end, "step_end", "step_start"),
            "t": np.where(is_end, t.h_end[idx], t.h_start[idx]),
        }
    )
    if marks.height == 0:
        return pl.DataFrame(
            schema={
                "rank": pl.Int64,
                "step": pl.Int64,
                "start_ns": pl.Int64,
                "end_ns": pl.Int64,
                "step_ns": pl.Int64,
            }
        )
    host = marks.pivot(on="what", index=["rank", "step"], values="t", aggregate_function="first").drop_nulls()
    gpu = (
        pl.DataFrame({"rank": g.g_rank, "step": g.g_step, "e": t.g_end})
        .filter(pl.col("step") >= 0)
        .group_by("rank", "step")
        .agg(pl.col("e").max().alias("gpu_end"))
    )
    ranks = pl.DataFrame({"rank": np.unique(g.g_rank)})
    w = (
        host.join(ranks, on="rank")
        .join(gpu, on=["rank", "step"], how="left")
        .with_columns(
            pl.max_horizontal("step_end", pl.col("gpu_end").fill_null(pl.col("step_end"))).alias("end0")
        )
        .sort("rank", "step_start", "step")
        .with_columns(pl.col("end0").shift(1).cum_max().over("rank").alias("prev_end"))
        .with_columns(
            pl.max_horizontal("step_start", pl.col("prev_end").fill_null(pl.col("step_start"))).alias(
                "start_ns"
            )
        )
        .with_columns(pl.max_horizontal("end0", "start_ns").alias("end_ns"))
        .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"))
    )
    return w.select("rank", "step", "start_ns", "end_ns", "step_ns").sort("rank", "step")


def beside_measured(con, replayed: pl.DataFrame) -> pl.DataFrame:
    """A replay's step rows (windows()) joined to the measured ones of the same run (step_window,
    the run set by graph.build in getvariable('replay_run')): rank, step, start_ns, end_ns,
    step_ns (replayed), step_ns_measured. Only rows both have."""
    meas = pl.from_arrow(
        con.sql(
            "SELECT rank::BIGINT AS rank, step, step_ns FROM step_window "
            "WHERE run_id = getvariable('replay_run')"
        ).to_arrow_table()
    )
    return replayed.join(meas, on=["rank", "step"], how="inner", suffix="_measured")
