"""The fleet view: one row per run of an analysis document (`tracelake.analyze/5`,
docs/analyze-json.md), for `tracelake runs`, the multi-run report's opening table and the
`runs_overview` SQL view (docs/usage.md, "Runs: the fleet view").

fleet_rows(doc, sources=None) -> polars.DataFrame with the columns of FLEET_COLUMNS, in that
order, one row per entry of doc["runs"] (in the document's order: by run_id). Every value is
read from the document (the figures the report shows for the run), never recomputed, except
the start time when the document has none (see start_ns) and the GPU-hours per 1,000 steps
(the formula of pipeline/diagnosis/cost.py, applied to the run's median step). Null means the
document cannot say (a run without steps has no median step; MFU below the 50 % FLOP-coverage
bar is not measurable), never 0 as a stand-in.

Raises KeyError when doc lacks "runs" (not an analysis document).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .diagnosis.cost import NS_PER_HOUR

if TYPE_CHECKING:  # polars is imported by what builds frames (fleet_rows, FLEET_SCHEMA), not by the
    # html report of one run, which imports this module (a report of kept results reads no frame)
    import polars as pl

# a start before 2000-01-01 UTC is not a wall-clock time (a trace on a relative clock, e.g. a
# profiler without an epoch base): shown as unknown rather than as 1970
MIN_EPOCH_NS = 946_684_800 * 10**9

# (column, polars type name, unit or "", doc): the fleet table's contract; FLEET_SCHEMA is its
# schema (polars types, made on first use: dtype())
FLEET_COLUMNS: list[tuple[str, str, str, str]] = [
    ("run_id", "String", "", "the run's id in the lake (docs/usage.md, Runs)"),
    (
        "start_ns",
        "Int64",
        "ns",
        "when the run's profiling window starts, ns since the Unix epoch (UTC): runs[].start_ns when "
        "the document gives it, else the earliest trace_start_ns of the run's sources that did not "
        "fail, else its earliest step_start_ns; null when unknown or before 2000 (a relative clock)",
    ),
    ("start_time", "Datetime[ns, UTC]", "", "start_ns as a UTC timestamp"),
    (
        "world_size",
        "Int64",
        "",
        "the job's world size as its traces state it (runs[].world_size), else the ranks traced",
    ),
    ("ranks", "Int64", "", "ranks with a file in the lake (runs[].ranks)"),
    ("hosts", "Int64", "", "distinct hosts the run's files name (runs[].hosts); null when none does"),
    (
        "gpus",
        "Int64",
        "",
        "ranks with GPU work on a device (sum of runs[].gpus[].ranks, named or not); null when none",
    ),
    (
        "gpu_model",
        "String",
        "",
        "the GPU names, comma-separated (runs[].gpus[].name; (unnamed) when a trace names none)",
    ),
    ("steps", "Int64", "", "profiler steps found (runs[].steps); 0 for a run without steps"),
    (
        "median_step_ns",
        "Int64",
        "ns",
        "median step time over the steps the verdict kept (verdicts[].median_step_ns); null without steps",
    ),
    (
        "mfu_pct",
        "Float64",
        "pct",
        "model FLOPs utilisation from op shapes, median over ranks (throughput[].mfu_pct); null when "
        "not measurable (FLOP coverage under 50 %) or unknown",
    ),
    (
        "tokens_per_s",
        "Float64",
        "",
        "tokens per second over the job (throughput[].tokens_per_s); null when tokens are unknown",
    ),
    (
        "verdict",
        "String",
        "",
        "network-bound, straggler-bound, compute-bound, copy-bound, host-bound, input-bound, "
        "balanced or unknown (verdicts[].verdict, docs/report.md)",
    ),
    ("verdict_confidence", "String", "", "high, moderate or low; null when there is no verdict"),
    (
        "top_finding",
        "String",
        "",
        "the kind of the run's first-ranked finding (findings[].kind), on a run with steps the "
        "first-ranked that costs time in every step (per_step_ns) when one does; null when it has none",
    ),
    ("top_finding_title", "String", "", "that finding's title"),
    (
        "top_finding_recoverable_ns",
        "Int64",
        "ns",
        "the time that finding could win: per step on a run with steps (findings[].per_step_ns), "
        "over the analysed window per rank otherwise (findings[].recoverable_ns); null when untimed "
        "or without a per-step time on a run with steps",
    ),
    (
        "top_finding_gpu_hours_per_1000_steps",
        "Float64",
        "",
        "that finding's cost in GPU-hours per 1,000 steps (findings[].gpu_hours_per_1000_steps); "
        "null without a per-step time",
    ),
    (
        "top_finding_cost_per_1000_steps",
        "Float64",
        "",
        "the same in money (× --gpu-hour-cost); null without a price",
    ),
    ("findings", "Int64", "", "findings of the run"),
    (
        "gpu_hours_per_1000_steps",
        "Float64",
        "",
        "what 1,000 steps of the run cost: median_step_ns × 1,000 × world_size / 3.6e12 "
        "(pipeline/diagnosis/cost.py's formula); null without steps",
    ),
    ("formats", "String", "", "the input formats of the run's files, comma-separated (runs[].formats)"),
]
_NUMERIC = ("Int64", "Float64")


def dtype(name: str):
    """The polars type of a FLEET_COLUMNS type name (results_fleet.FLEET_EXTRA's too)."""
    import polars as pl

    return pl.Datetime("ns", "UTC") if name == "Datetime[ns, UTC]" else getattr(pl, name)


def fleet_schema() -> pl.Schema:
    """The polars schema of FLEET_COLUMNS (imports polars: made when asked for)."""
    import polars as pl

    return pl.Schema({c: dtype(t) for c, t, _, _ in FLEET_COLUMNS})


def __getattr__(name: str):
    """FLEET_SCHEMA: fleet_schema() (imports polars, so made on first use)."""
    if name == "FLEET_SCHEMA":
        return fleet_schema()
    raise AttributeError(name)


def _ms(ns) -> str:
    return f"{ns / 1e6:,.2f} ms"


# the columns people read (`tracelake runs` as a table or Markdown, the report's table of runs):
# (column, header, the value as text; null is shown as '—'); csv and json give every column
DISPLAY = [
    ("run_id", "run", str),
    ("start_time", "start (UTC)", lambda t: t.strftime("%Y-%m-%d %H:%M")),
    ("world_size", "world", str),
    ("hosts", "hosts", str),
    ("gpus", "GPUs", str),
    ("steps", "steps", str),
    ("median_step_ns", "median step", _ms),
    ("mfu_pct", "MFU", lambda p: f"{p:.1f} %"),
    ("tokens_per_s", "tokens/s", lambda x: f"{x:,.0f}"),
    ("verdict", "verdict", str),
    ("verdict_confidence", "confidence", str),
    ("top_finding", "top finding", str),
    ("top_finding_recoverable_ns", "could win", _ms),
    ("top_finding_gpu_hours_per_1000_steps", "GPU-h/1k steps", lambda h: f"{h:,.3g}"),
]
_TYPES = {c: t for c, t, _, _ in FLEET_COLUMNS}
NUMERIC_DISPLAY = {c for c, _, _ in DISPLAY if _TYPES[c] in _NUMERIC}


def display_cells(df: pl.DataFrame) -> list[list[str]]:
    """The DISPLAY columns of fleet rows as text, row by row ('—' for null)."""
    cols = [c for c, _, _ in DISPLAY]
    return [
        ["—" if v is None else fmt(v) for v, (_, _, fmt) in zip(r, DISPLAY)]
        for r in df.select(cols).iter_rows()
    ]


def _by_run(rows: list[dict] | None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows or []:
        out.setdefault(r.get("run_id"), []).append(r)
    return out


def _starts(doc: dict, sources: pl.DataFrame | None) -> dict[str, int]:
    """run_id -> earliest start (ns): from the sources rows of the run that did not fail when
    `sources` holds any, else from the document's step_time rows (step_start_ns)."""
    starts: dict[str, int] = {}
    for s in doc.get("step_time") or []:
        t = s.get("step_start_ns")
        if t is not None:
            starts[s["run_id"]] = min(int(t), starts.get(s["run_id"], int(t)))
    if sources is not None and sources.height and "trace_start_ns" in sources.columns:
        import polars as pl

        ok = sources.filter(pl.col("status") != "failed") if "status" in sources.columns else sources
        agg = ok.group_by("run_id").agg(pl.col("trace_start_ns").min())
        starts.update({r: int(t) for r, t in agg.iter_rows() if t is not None})
    return starts


# the order runs are listed in without --sort: `tracelake runs` and the report's table of runs
DEFAULT_ORDER = [("start_ns", False), ("run_id", False)]


def sort_rows(df, keys: list[tuple[str, bool]]):
    """df (fleet rows) sorted by keys [(column, descending)], nulls last, run_id breaking ties."""
    if "run_id" not in [k for k, _ in keys]:
        keys = [*keys, ("run_id", False)]
    return df.sort([k for k, _ in keys], descending=[d for _, d in keys], nulls_last=True)


def _top(fs: list[dict], has_steps: bool) -> dict:
    """The finding a run's row names (fs: its findings, ranked): the first-ranked; on a run with
    steps, the first-ranked that costs time in every step (per_step_ns), when one does. A one-off
    slow step (slow_steps: a warm-up in the profiled window, 29x the median step in JAX-Toolbox's
    trace) has no per-step time: ranked first by its window total, it is not what a fix wins in
    each step."""
    if has_steps:
        recurring = next((f for f in fs if f.get("per_step_ns") is not None), None)
        if recurring is not None:
            return recurring
    return fs[0] if fs else {}


def fleet_rows(doc: dict, sources: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per run of the analysis document `doc`, with the columns of FLEET_COLUMNS (types
    FLEET_SCHEMA, units in the names: _ns, _pct). sources: the lake's `sources` rows (at least
    run_id, status, trace_start_ns), read for the start of runs whose document gives none; without
    it the start comes from the document's step_time rows (runs without steps: null)."""
    verdicts = {v["run_id"]: v for v in doc.get("verdicts") or []}
    thr = {t["run_id"]: t for t in doc.get("throughput") or []}
    findings = _by_run(doc.get("findings"))
    starts = _starts(doc, sources)
    rows = []
    for run in doc["runs"]:
        rid = run["run_id"]
        v = verdicts.get(rid) or {}
        t = thr.get(rid) or {}
        fs = findings.get(rid, [])
        median = v.get("median_step_ns")
        top = _top(fs, median is not None)
        start = run.get("start_ns", starts.get(rid))
        start = start if start is not None and start >= MIN_EPOCH_NS else None
        world = run.get("world_size") or len(run.get("ranks") or []) or None
        gpus = sum(g.get("ranks") or 0 for g in run.get("gpus") or [])
        rows.append(
            {
                "run_id": rid,
                "start_ns": start,
                "start_time": start,
                "world_size": world,
                "ranks": len(run.get("ranks") or []),
                "hosts": len(run.get("hosts") or []) or None,
                "gpus": gpus or None,
                "gpu_model": ", ".join(g["name"] for g in run.get("gpus") or []) or None,
                "steps": len(run.get("steps") or []),
                "median_step_ns": median,
                "mfu_pct": t.get("mfu_pct") if t.get("mfu_measurable", True) else None,
                "tokens_per_s": t.get("tokens_per_s"),
                "verdict": v.get("verdict"),
                "verdict_confidence": v.get("confidence"),
                "top_finding": top.get("kind"),
                "top_finding_title": top.get("title"),
                # per step on a run with steps (findings[].per_step_ns), else over the window
                "top_finding_recoverable_ns": (
                    top.get("per_step_ns") if median is not None else top.get("recoverable_ns")
                ),
                "top_finding_gpu_hours_per_1000_steps": top.get("gpu_hours_per_1000_steps"),
                "top_finding_cost_per_1000_steps": top.get("cost_per_1000_steps"),
                "findings": len(fs),
                "gpu_hours_per_1000_steps": (
                    median * 1000 * world / NS_PER_HOUR if median is not None and world else None
                ),
                "formats": ", ".join(run.get("formats") or []) or None,
            }
        )
    import polars as pl

    schema = dict(fleet_schema())
    schema["start_time"] = pl.Int64  # built from ns, cast below
    df = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    return df.with_columns(pl.col("start_time").cast(pl.Datetime("ns")).dt.replace_time_zone("UTC"))
