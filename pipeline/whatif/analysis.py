"""The replay in the analysis (pipeline/analyze.py): each run's critical path per step, and each
timed finding's gain replayed instead of added up.

A finding kind maps to the change that fixes it (`FIX`): straggler -> the straggler rank on time,
exposed_comm -> collectives overlapped, host_idle -> no launch gaps, input_idle -> no data
loading, exposed_memcpy -> copies and memsets free. Its replayed gain per step is the identity
replay's mean step minus the changed replay's; the finding keeps its additive estimate as
`estimated_ns` / `estimated_per_step_ns`, and its recoverable time becomes the replayed gain,
never more than the estimate: the estimates take disjoint instants of the step (findings.py), so
capped gains still never count an instant twice (a replay can find less than the estimate, when
the time would only move to another chain, never more than the time the finding names).
"""

from __future__ import annotations

import duckdb
import polars as pl

from . import changes
from .graph import Graph, build, step_notes
from .replay import measured
from .steps import beside_measured


def _straggler(g: Graph):
    r = changes.straggler_rank(g, g.g_s)
    return changes.on_time(r) if r is not None else None


FIX = {
    "straggler": _straggler,
    "exposed_comm": lambda g: changes.collectives_overlapped(),
    "host_idle": lambda g: changes.no_launch_gaps(),
    "input_idle": lambda g: changes.no_data_loading(),
    "exposed_memcpy": lambda g: changes.scale("category:memory=0"),
}


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


# the most GPU activities a run may have for analyze to replay its findings: the graph and the
# replays take about 1.3 KB and 5 us of CPU per activity (benchmarks/whatif_bench.py), so a run
# past it would cost the analysis more than its own metrics; `tracelake whatif` replays any run
MAX_NODES = 1_000_000


def for_run(
    con: duckdb.DuckDBPyConnection,
    run: str,
    findings: list[dict],
    excluded: set[tuple[int, int]] = frozenset(),
) -> tuple[dict | None, list[dict]]:
    """(the run's what-if summary or None, its critical path rows) and the timed findings of
    `findings` annotated in place (replay, estimated_ns, recoverable_ns, per_step_ns, a first
    evidence line). excluded: the (rank, step) rows the verdict's basis leaves out (incomplete and
    outlier steps), left out of the gains too, so a gain and its estimate are over the same steps.
    None, [] when the run cannot be replayed (no GPU work, no steps): the findings keep their
    estimates; ({run_id, skipped: why}, []) for a run of more than MAX_NODES GPU activities, which
    analyze does not replay (it says so in a note)."""
    from . import run_replay

    (n,) = con.execute(
        "SELECT count(*) FROM gpu_activities WHERE run_id = ? AND kind <> 'sync'", [run]
    ).fetchall()[0]
    if n > MAX_NODES:
        return {
            "run_id": run,
            "skipped": f"{n:,} GPU activities, over the limit of {MAX_NODES:,} for analyze; "
            "`tracelake whatif` replays it",
        }, []
    try:
        g = build(con, run)
    except ValueError:
        return None, []
    saved = [dict(f) for f in findings]
    try:
        return _replayed(con, run, g, findings, excluded, run_replay)
    except ValueError as e:  # a replay that cannot finish (replay.py: a graph with a cycle)
        for f, before in zip(findings, saved):  # the findings as they came: their estimates
            f.clear()
            f.update(before)
        return {"run_id": run, "skipped": str(e).removeprefix(f"run {run}: ")}, []


def _replayed(con, run: str, g, findings: list[dict], excluded, run_replay) -> tuple[dict | None, list[dict]]:
    """for_run's work on the run's graph g. Raises ValueError from a replay that cannot finish."""
    ident = run_replay(g, measured(g))
    if ident.steps.height == 0:
        return None, []
    both = beside_measured(con, ident.steps)
    keep = pl.DataFrame(
        {"rank": [r for r, _ in excluded], "step": [s for _, s in excluded]},
        schema={"rank": pl.Int64, "step": pl.Int64},
    )
    basis = both.join(keep, on=["rank", "step"], how="anti")
    if basis.height == 0:
        basis = both
    baseline = float(basis["step_ns_measured"].mean()) if basis.height else ident.step_ns()
    ident_ns = float(basis["step_ns"].mean()) if basis.height else ident.step_ns()
    err_pct = abs(ident_ns - baseline) / baseline * 100 if baseline else 0.0

    def basis_mean(steps: pl.DataFrame) -> float:
        m = steps.join(basis.select("rank", "step"), on=["rank", "step"], how="semi")
        return float(m["step_ns"].mean()) if m.height else 0.0

    out = {
        "run_id": run,
        "steps": int(ident.steps["step"].n_unique()),
        "baseline_step_ns": int(round(baseline)),
        "identity_step_ns": int(round(ident_ns)),
        "identity_error_pct": round(err_pct, 3),
        "notes": step_notes(g),
        "changes": [],
    }
    base = measured(g)
    for f in findings:
        make = FIX.get(f.get("kind"))
        if make is None or f.get("recoverable_ns") is None or not f.get("per_step_ns"):
            continue
        ch = make(g)
        if ch is None:
            continue
        r = run_replay(g, ch.apply(g, base), with_path=False)
        gain = ident_ns - basis_mean(r.steps)
        est_step, est = f["per_step_ns"], f["recoverable_ns"]
        kept = max(0.0, min(gain, est_step))
        f["estimated_ns"], f["estimated_per_step_ns"] = est, est_step
        f["per_step_ns"] = int(round(kept))
        f["recoverable_ns"] = int(round(est * kept / est_step))
        f["replay"] = {
            "change": ch.key,
            "baseline_step_ns": out["baseline_step_ns"],
            "predicted_step_ns": int(round(baseline - gain)),
            "gain_ns": int(round(gain)),
            "identity_error_pct": out["identity_error_pct"],
        }
        f["evidence"] = [
            f"Replayed across ranks: with {ch.label}, the step goes from {_ms(baseline)} to "
            f"{_ms(baseline - gain)} (identity replay error {err_pct:.2f} %; the additive estimate was "
            f"{_ms(est_step)} per step)"
        ] + list(f.get("evidence", []))
        out["changes"].append({"change": ch.key, "label": ch.label, "finding": f["kind"], **f["replay"]})
    rows = []
    if ident.path is not None and ident.path.height:
        s = (
            ident.path.group_by("step", "end_rank", "kind", "rank")
            .agg(pl.col("dur_ns").sum().alias("ns"))
            .sort(["step", "ns", "kind", "rank"], descending=[False, True, False, False])
        )
        rows = [{"run_id": run, **r} for r in s.to_dicts()]
    return out, rows
