"""What-if's face: `whatif()` (the `tracelake.whatif/1` document), the identity replay with its
step windows and critical paths (run_replay), the SQL views of the critical path (register) and
the API's critical_path(). pipeline/whatif/__init__.py re-exports these names.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import polars as pl

from .changes import Change
from .critical import paths
from .graph import Graph, build, step_notes
from .replay import Durations, Timing, large, measured, prepare, replay
from .steps import beside_measured, windows

CONTRACT = "tracelake.whatif/1"
TOP_SEGMENTS = 5


@dataclass
class Replayed:
    """One replay of a graph: its durations, times, step windows and critical paths."""

    durations: Durations
    timing: Timing
    steps: pl.DataFrame
    path: pl.DataFrame | None

    def step_ns(self) -> float:
        return float(self.steps["step_ns"].mean()) if self.steps.height else 0.0


def run_replay(g: Graph, d: Durations, with_path: bool = True) -> Replayed:
    t = replay(g, d)
    w = windows(g, t)
    return Replayed(d, t, w, paths(g, d, t, w) if with_path else None)


def summary(path: pl.DataFrame, n_steps: int) -> list[dict]:
    """The critical path's time per step by kind and rank, longest first: kind, rank, ns (a mean
    per step over the steps replayed)."""
    if path is None or path.height == 0 or n_steps == 0:
        return []
    s = (
        path.group_by("kind", "rank")
        .agg(pl.col("dur_ns").sum())
        .sort(["dur_ns", "kind", "rank"], descending=[True, False, False])
    )
    return [{"kind": k, "rank": int(r), "ns": int(round(v / n_steps))} for k, r, v in s.iter_rows()]


def _identity(con, run: str, g: Graph, top: int, base: Durations) -> tuple[dict, float, int, Durations]:
    """whatif()'s document without its changes, the identity replay's mean step, the number of
    steps and the measured durations (base: measured(g))."""
    ident = run_replay(g, base)
    if ident.steps.height == 0:
        raise ValueError(f"run {run}: no steps to replay (the trace has no ProfilerStep or step range)")
    both = beside_measured(con, ident.steps)
    baseline = float(both["step_ns_measured"].mean()) if both.height else ident.step_ns()
    ident_ns = float(both["step_ns"].mean()) if both.height else ident.step_ns()
    err = abs(ident_ns - baseline) / baseline * 100 if baseline else 0.0
    n_steps = ident.steps["step"].n_unique()
    out = {
        "contract": CONTRACT,
        "run_id": run,
        "ranks": len(g.ranks),
        "steps": n_steps,
        "baseline_step_ns": int(round(baseline)),
        "identity_step_ns": int(round(ident_ns)),
        "identity_error_pct": round(err, 3),
        "critical_path": summary(ident.path, n_steps)[:top],
        "notes": step_notes(g),
        "changes": [],
    }
    return out, ident.step_ns(), n_steps, base


def whatif(
    con: duckdb.DuckDBPyConnection,
    run: str,
    wanted: list[Change],
    top: int = TOP_SEGMENTS,
    graph: Graph | None = None,
) -> dict:
    """The `tracelake.whatif/1` document of `run` (docs/whatif.md) for a pipeline.query
    connection: baseline_step_ns (the measured mean step time over the ranks and steps replayed,
    step_window), identity_step_ns and identity_error_pct (the replay with nothing changed), notes
    (per step, what the graph leaves out) and one entry per change (predicted_step_ns, gain_ns,
    gain_pct, critical path top segments, leaves_out: what the projection does not model). graph:
    run's graph when the caller built it already (build(con, run)). Raises ValueError for a run
    without GPU work, steps or a graph that does not settle."""
    g = graph if graph is not None else build(con, run)
    con.execute("SET VARIABLE replay_run = ?", [run])
    base = measured(g)
    entries: dict[int, dict] = {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        # a large run's levels and its first change (replay, step windows, critical paths) are
        # made in a thread beside the identity replay and the later changes (numpy lets go of the
        # GIL in its array passes, so two cores share them); the thread keeps only the change's
        # step time and path, so that at most two changes' replays are alive at a time (memory)
        first = pool.submit(_first_change, g, base, wanted[0]) if wanted and large(g) else None
        out, ident_step, n_steps, base = _identity(con, run, g, top, base)

        def entry(ch: Change, pred: float, path: pl.DataFrame | None) -> dict:
            return {
                "change": ch.key,
                "label": ch.label,
                "predicted_step_ns": int(round(pred)),
                "gain_ns": int(round(ident_step - pred)),
                "gain_pct": round((ident_step - pred) / ident_step * 100, 2) if ident_step else 0.0,
                "critical_path": summary(path, n_steps)[:top],
                "leaves_out": ch.leaves_out,
            }

        for i, ch in enumerate(wanted):
            if i == 0 and first is not None:
                continue  # the thread's
            r = run_replay(g, ch.apply(g, base))
            entries[i] = entry(ch, r.step_ns(), r.path)
            del r
        if first is not None:
            entries[0] = entry(wanted[0], *first.result())  # raises what the thread raised
    for i, ch in enumerate(wanted):  # in the order asked (a change's note is known once applied)
        if ch.note():
            out["notes"].append(f"{ch.label}: {ch.note()}")
        out["changes"].append(entries[i])
    return out


def _first_change(g: Graph, base: Durations, ch: Change) -> tuple[float, pl.DataFrame | None]:
    """whatif()'s thread: g's levels, then the first change's replay: its mean step time and
    critical paths."""
    prepare(g)
    r = run_replay(g, ch.apply(g, base))
    return r.step_ns(), r.path


def critical_path(con: duckdb.DuckDBPyConnection, run: str) -> pl.DataFrame:
    """Each step's critical path of `run` across ranks (docs/whatif.md) as segments on the lake's
    absolute clock: step, end_rank, seq, kind, rank, start_ns, end_ns, dur_ns, name; empty when the
    run has no steps. Raises ValueError for a run without GPU work."""
    g = build(con, run)
    p = run_replay(g, measured(g)).path
    return p.with_columns(pl.col("start_ns") + g.t0, pl.col("end_ns") + g.t0)


def register(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Bind `critical_path` (one row per segment of each step's critical path: run_id, step,
    end_rank, seq, kind, rank, start_ns, end_ns on the absolute clock, dur_ns, name) and
    `critical_path_summary` (run_id, step, end_rank, kind, rank, ns: the segments' time by kind
    and rank) on a pipeline.query connection, for every run with GPU work and steps. Returns the
    runs that could not be replayed, with why."""
    runs = [r for (r,) in con.sql("SELECT DISTINCT run_id FROM gpu_activities ORDER BY 1").fetchall()]
    frames, skipped = [], []
    for run in runs:
        try:
            p = critical_path(con, run)
        except ValueError as e:
            skipped.append(str(e))
            continue
        if p.height == 0:
            skipped.append(f"run {run}: no steps to replay")
            continue
        frames.append(p.with_columns(pl.lit(run).alias("run_id")))
    cols = ["run_id", "step", "end_rank", "seq", "kind", "rank", "start_ns", "end_ns", "dur_ns", "name"]
    cp = (
        pl.concat(frames).select(cols)
        if frames
        else pl.DataFrame(
            schema={c: pl.Int64 for c in cols} | {"run_id": pl.String, "kind": pl.String, "name": pl.String}
        ).select(cols)
    )
    con.register("critical_path_rows", cp.to_arrow())
    con.execute("CREATE OR REPLACE TEMP VIEW critical_path AS SELECT * FROM critical_path_rows")
    con.execute(
        "CREATE OR REPLACE TEMP VIEW critical_path_summary AS SELECT run_id, step, end_rank, kind, rank, "
        "sum(dur_ns)::BIGINT AS ns FROM critical_path GROUP BY ALL ORDER BY run_id, step, ns DESC"
    )
    return skipped
