"""`tracelake diff BASELINE CANDIDATE`: run against run, the CI regression gate
(pipeline/diagnosis/diff.py; docs/usage.md "Diff: the CI gate"; docs/diff-json.md)."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .app import EXIT_FAILED, _write, command, err, usage_error
from .options import KWAIT, LAKE, QUIET, STEPS, WINDOW, check_output

EPILOG = (
    "Exit codes: 0 compared, the gate (if any) passed; 1 the gate failed (--fail-on-regression, --fail-on); "
    "2 usage error; 4 failed (an input could not be ingested or read, or -o could not be written); 5 not "
    "comparable (the reason is printed)."
)


def _side(arg: str, run: str | None, lake_dir: Path, step_range, stack, what: str) -> tuple[Path, str | None]:
    """(lake directory, run id or None) of one side: a lake; traces (a file or directory, ingested
    into a temporary lake removed on exit); or a run of --lake."""
    from ..ingest import ingest_paths
    from ..lake import Lake

    p = Path(arg)
    if p.exists():
        if Lake(p).exists():
            if step_range:
                err.print(
                    f"note: {what} {arg} is a lake: --step-range applies only to traces ingested now",
                    markup=False,
                    soft_wrap=True,
                )
            return p, run
        from .. import scratch

        tmp = stack.enter_context(scratch.temporary("diff")) / "lake"
        results = ingest_paths([p], Lake(tmp), step_regex=step_range)
        for r in results:
            if r.status == "failed":
                err.print(f"warning: {r.path}: {r.error}", markup=False, style="yellow", soft_wrap=True)
        if not results:
            raise usage_error(f"{what} {arg}: no trace, export or NCCL log found there")
        if not any(r.status == "ok" for r in results):
            err.print(f"error: {what} {arg}: nothing could be ingested", markup=False)
            raise typer.Exit(EXIT_FAILED)
        return tmp, run
    lake = Lake(lake_dir)
    if lake.exists() and arg in set(lake.sources()["run_id"].drop_nulls().to_list()):
        if run is not None and run != arg:
            raise usage_error(f"{what} {arg} is a run of {lake_dir}; --{what}-run {run} contradicts it")
        return lake_dir, arg
    raise usage_error(f"{what} {arg}: no such file or directory, and not a run of the lake {lake_dir}")


def _exit_on(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _ops(lake_dir: Path, run: str) -> list[dict]:
    """queries/step_ops.sql's rows of one run of a lake (GPU time per launching op)."""
    from .. import query
    from ..lake import Lake

    con = query.connect(Lake(lake_dir), runs=[run], metric_views=())  # (query.run runs the file)
    try:
        return query.run(con, "step_ops").to_dicts()
    finally:
        con.close()


def _pick(doc: dict, run: str | None, other: str | None, arg: str, what: str, same_lake: bool) -> str:
    """The run of a side's analysis to compare: the one asked for, else the only run with GPU
    work, else the run of the other side's name (not when both sides are one lake: that would
    compare a run with itself). A side without a run with GPU work is not comparable (exit 5)."""
    ids = [v["run_id"] for v in doc["verdicts"] if v["basis"] is not None]
    if run is not None:
        if run not in {r["run_id"] for r in doc["runs"]}:
            raise usage_error(f"{what} {arg}: no run {run} (runs: {', '.join(sorted(ids)) or 'none'})")
        return run
    if len(ids) == 1:
        return ids[0]
    if other in ids and not same_lake:
        return other
    if not ids:
        from ..diagnosis.diff import EXIT_NOT_COMPARABLE

        err.print(
            f"not comparable: {what} {arg}: no run with GPU work (CPU-only traces or NCCL logs only)",
            markup=False,
        )
        raise typer.Exit(EXIT_NOT_COMPARABLE)
    raise usage_error(f"{what} {arg}: holds runs {', '.join(sorted(ids))}: choose one with --{what}-run")


def _thresholds(items: list[str]) -> dict[str, float]:
    from ..diagnosis.diff import COMPONENT_KEYS

    out = {}
    for item in items:
        key, sep, pct = item.partition("=")
        try:
            val = float(pct)
        except ValueError:
            val = float("nan")
        if not sep or key not in COMPONENT_KEYS or not (val >= 0) or not math.isfinite(val):
            raise usage_error(
                f"--fail-on {item!r}: COMPONENT=PCT with PCT >= 0 and COMPONENT one of "
                + ", ".join(COMPONENT_KEYS)
            )
        if key in out:
            raise usage_error(f"--fail-on {key} given twice ({out[key]:g} and {val:g}): give one threshold")
        out[key] = val
    return out


@command(epilog=EPILOG)
def diff(
    baseline: str = typer.Argument(
        ...,
        metavar="BASELINE",
        help="The baseline: traces (a file or directory), a lake, or a run of --lake.",
    ),
    candidate: str = typer.Argument(..., metavar="CANDIDATE", help="The candidate, in the same forms."),
    lake: Path = LAKE,
    baseline_run: Optional[str] = typer.Option(
        None, "--baseline-run", metavar="RUN", help="The baseline's run."
    ),
    candidate_run: Optional[str] = typer.Option(
        None, "--candidate-run", metavar="RUN", help="The candidate's run."
    ),
    fmt: str = typer.Option("text", "--format", "-f", metavar="text|md|json", help="Output format."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", metavar="FILE", help="File to write (default: standard output)."
    ),
    fail_on_regression: Optional[float] = typer.Option(
        None,
        "--fail-on-regression",
        min=0.0,
        metavar="PCT",
        help="Exit 1 when the verdict is a regression of at least PCT % of the baseline step time.",
    ),
    fail_on: List[str] = typer.Option(
        [],
        "--fail-on",
        metavar="COMPONENT=PCT",
        help="Exit 1 when a component (compute, exposed_transfer, peer_wait, memory_copies, host_idle, "
        "input_idle, other) grew by PCT % of the baseline step time or more; repeatable.",
    ),
    min_change: float = typer.Option(
        1.0,
        "--min-change",
        min=0.0,
        metavar="PCT",
        help="Smallest change called a regression or improvement.",
    ),
    align: str = typer.Option(
        "steady",
        "--align",
        metavar="steady|step",
        help="Compare the steady steps of each side, or equal step numbers.",
    ),
    step_range: Optional[str] = STEPS,
    window: str = WINDOW,
    kernel_wait_us: float = KWAIT,
    quiet: bool = QUIET,
):
    """Compare two runs' step time (a confidence interval from their steps), say what moved, gate CI."""
    from ..diagnosis.diff import diff as diff_runs
    from ..report.diff_render import render
    from .analysis_cmd import _analysis

    if fmt not in ("text", "md", "json"):
        raise usage_error(f"--format {fmt!r}: text, md or json")
    for what, arg in (("BASELINE", baseline), ("CANDIDATE", candidate)):
        if not arg.strip():
            raise usage_error(
                f"{what} is empty: give a directory or file of traces, a lake, or a run of --lake"
            )
    for name, v in (("--fail-on-regression", fail_on_regression), ("--min-change", min_change)):
        if v is not None and not math.isfinite(v):
            raise usage_error(f"{name} {v}: give a finite percentage")
    from ..lake import Lake

    sides = [Path(a) for a in (baseline, candidate) if Path(a).exists()]
    check_output(
        output, [p for p in sides + [lake] if Lake(p).exists()], [p for p in sides if not Lake(p).exists()]
    )
    if align not in ("steady", "step"):
        raise usage_error(f"--align {align!r}: steady or step")
    if step_range:
        import re

        from ..classify import check_regex

        try:
            check_regex(step_range)
        except re.error as e:
            raise usage_error(f"--step-range {step_range!r}: {e}")
    gates = _thresholds(fail_on)
    # a CI job cancelled with SIGTERM (or a hang-up) still removes the temporary lakes: the signal
    # becomes an exit that unwinds the ExitStack below
    with contextlib.ExitStack() as stack:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            stack.callback(signal.signal, sig, signal.signal(sig, _exit_on))  # restored on the way out
        bdir, brun = _side(baseline, baseline_run, lake, step_range, stack, "baseline")
        cdir, crun = _side(candidate, candidate_run, lake, step_range, stack, "candidate")
        same = cdir == bdir

        def analysed(lake_dir: Path, runs: list[str | None]) -> dict:
            # only the runs named (every run when a side names none: _pick chooses among them), with
            # analyze's default options, so that the results `analyze`, `report` and `runs` kept are
            # read, not computed again (the comparison reads step_kernels, which top_n never cuts)
            only = None if None in runs else sorted(set(runs))
            return _analysis(
                lake_dir, window, kernel_wait_us, None, None, *([None] * 8), runs=only, quiet=quiet
            )[0]

        bdoc = analysed(bdir, [brun, crun] if same else [brun])
        cdoc = bdoc if same else analysed(cdir, [crun])
        brun = _pick(bdoc, brun, crun, baseline, "baseline", same)
        crun = _pick(cdoc, crun, brun, candidate, "candidate", same)
        ops = (_ops(bdir, brun), _ops(cdir, crun))
        doc = diff_runs(
            bdoc,
            brun,
            cdoc,
            crun,
            align=align,
            min_change_pct=min_change,
            fail_on_regression_pct=fail_on_regression,
            fail_on=gates,
            ops=ops,
        )
    doc["baseline"]["input"], doc["candidate"]["input"] = baseline, candidate
    text = render(doc, fmt)
    if output is None or str(output) == "-":
        sys.stdout.write(text)
    else:
        _write(output, text)
    raise typer.Exit(doc["exit_code"])
