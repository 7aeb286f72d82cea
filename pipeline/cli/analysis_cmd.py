"""`tracelake analyze`, `report` and `run`: the analysis of the lake with the command's options,
and its rendering (pipeline/report/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .app import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    _write,
    command,
    err,
    existing_lake,
    exit_help,
    out,
    preload_charts,
    progress,
)
from .ingest_cmd import _ingest, no_empty_path
from .lake_errors import lake_read_error, lake_read_failure
from .options import (
    COMM,
    EXCLUDE,
    FORCE,
    GLOBAL_BATCH,
    GPU_HOUR_COST,
    HEAD_DIM,
    HEADS,
    JOBS,
    KWAIT,
    LAKE,
    LAYERS,
    MFLOPS,
    ONLY_RUNS,
    PARAMS,
    PATHS,
    PEAK,
    QUIET,
    RANK,
    RECOMPUTE,
    RUN,
    SCHEDULER,
    SCHEDULER_ANALYSIS,
    SEQ,
    STEPS,
    TOKENS,
    WINDOW,
    _format,
    _model_options,
    _resolve_runs,
    _window_options,
    all_failed,
    lake_option,
)
from .summary import print_summary


def _analysis(
    lake_dir: Path,
    window: str,
    kernel_wait_us: float,
    peak_tflops: float | None,
    model_flops_per_step: float | None,
    *palm_shape,
    top_n: int | None = 20,
    scheduler: str | None = None,
    runs: list[str] | None = None,
    quiet: bool = False,
    recompute: bool = False,
    exact_runs: bool = False,
) -> tuple[dict, int]:
    """Analysis of the lake with the command's options, and its exit code; palm_shape = (params,
    layers, heads, head_dim, seq_len, tokens_per_step, global_batch, gpu_hour_cost), all None when
    not given; top_n: kernels kept per run; scheduler: a Dask scheduler's address to analyse on,
    one task per run (each run whose task fails gets a warning here and a note in the document;
    the code is then EXIT_PARTIAL, or EXIT_FAILED when no run could be analysed); runs: only
    these runs (a usage error names any the lake does not hold; exact_runs: they are the lake's
    own run ids, as an ingest of this process returned them, so they are not resolved against its
    `sources` rows: one read of them less for `run`); quiet: no progress bar;
    recompute: compute every run again (and keep the new results) instead of reading them. Raises
    Exit(2) when lake_dir holds no lake."""
    try:
        return _analysis_of(
            lake_dir,
            window,
            kernel_wait_us,
            peak_tflops,
            model_flops_per_step,
            *palm_shape,
            top_n=top_n,
            scheduler=scheduler,
            runs=runs,
            quiet=quiet,
            recompute=recompute,
            exact_runs=exact_runs,
        )
    except Exception as e:
        # a lake that cannot be read: the lake's own errors and DuckDB's (neither module is
        # imported when every run's result was kept, so they are looked up, not imported)
        lake_mod, duckdb = sys.modules.get("pipeline.lake"), sys.modules.get("duckdb")
        readable = (lake_mod.LakeError,) if lake_mod else ()
        readable += (duckdb.InvalidInputException,) if duckdb else ()
        if not isinstance(e, readable) and not lake_read_failure(e):
            raise
        err.print(lake_read_error(lake_dir, e), markup=False)
        raise typer.Exit(EXIT_FAILED)


def _timeline_lake(doc: dict, lake_dir: Path) -> dict:
    """doc, each finding's `tracelake timeline` command (timeline.command) naming the lake when it
    is not the default (lake_option)."""
    prefix, lake = "tracelake timeline ", lake_option(lake_dir)
    for f in doc.get("findings", []) if lake else []:
        t = f.get("timeline")
        if t and t.get("command", "").startswith(prefix):
            t["command"] = f"{prefix}{lake}{t['command'][len(prefix) :]}"
    return doc


def _nothing_analysed(doc: dict, lake_dir) -> None:
    """Exit 4 with one line when every source in scope failed to ingest (no run to analyse, and
    a note per failed file): nothing to analyse is a failure a CI job must see, not a success
    with a note."""
    failed = [n for n in doc["notes"] if ": not ingested: " in n]
    if not doc["runs"] and failed:
        n = len(failed)
        all_failed(lake_dir, f"every source in scope failed to ingest ({n} file(s)), nothing to analyse")


def _analysis_of(
    lake_dir,
    window,
    kernel_wait_us,
    peak_tflops,
    model_flops_per_step,
    *palm_shape,
    top_n,
    scheduler,
    runs,
    quiet,
    recompute,
    exact_runs=False,
):
    from ..analyze import kept_analysis

    window_options = _window_options(window, kernel_wait_us, peak_tflops)
    model = _model_options(model_flops_per_step, *palm_shape)
    options = dict(**window_options, top_n=top_n, **model)
    if not recompute and (Path(lake_dir) / "TRACELAKE").exists():
        # every run's result kept for the lake as it is: read back without opening the lake's
        # Parquet (nor importing polars, pyarrow or DuckDB; pipeline/results.py known_keys); runs
        # named as the lake stores them (others are resolved below, from the sources table)
        doc = kept_analysis(Path(lake_dir), options, sorted(set(runs)) if runs else None)
        if doc is not None:
            _nothing_analysed(doc, lake_dir)
            return _timeline_lake(doc, lake_dir), EXIT_OK
    lake = existing_lake(lake_dir)
    if runs and not exact_runs:
        runs = _resolve_runs(runs, set(lake.sources()["run_id"].drop_nulls().to_list()))
    options.update(runs=sorted(set(runs)) if runs else None, recompute=recompute)
    if not scheduler:
        from ..analyze import analyze

        with progress("analyze", quiet) as bar:
            doc = analyze(lake, **options, on_progress=bar)
        _nothing_analysed(doc, lake_dir)
        return _timeline_lake(doc, lake_dir), EXIT_OK
    from ..analyze_cluster import analyze_on_cluster
    from ..cluster import SchedulerError
    from ..oneline import one_line

    try:
        with progress("analyze", quiet) as bar:
            res, failures = analyze_on_cluster(lake, scheduler, **options, on_progress=bar)
    except SchedulerError as e:
        err.print(one_line(f"error: {e}"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    _nothing_analysed(res, lake_dir)
    _timeline_lake(res, lake_dir)
    for f in failures:
        err.print(
            one_line(f"warning: run {f.run_id}: not analysed: the Dask task failed ({f.error})"),
            markup=False,
            style="yellow",
        )
    if not failures:
        return res, EXIT_OK
    return res, EXIT_PARTIAL if res["runs"] else EXIT_FAILED


@command(epilog=exit_help(scheduler=True))
def analyze(
    lake: Path = LAKE,
    as_json: bool = typer.Option(False, "--json", help="Print the tracelake.analyze/5 JSON document."),
    window: str = WINDOW,
    kernel_wait_us: float = KWAIT,
    peak_tflops: Optional[float] = PEAK,
    model_flops_per_step: Optional[float] = MFLOPS,
    params: Optional[float] = PARAMS,
    layers: Optional[int] = LAYERS,
    heads: Optional[int] = HEADS,
    head_dim: Optional[int] = HEAD_DIM,
    seq_len: Optional[int] = SEQ,
    tokens_per_step: Optional[float] = TOKENS,
    global_batch: Optional[float] = GLOBAL_BATCH,
    gpu_hour_cost: Optional[float] = GPU_HOUR_COST,
    scheduler: Optional[str] = SCHEDULER_ANALYSIS,
    runs: Optional[List[str]] = ONLY_RUNS,
    quiet: bool = QUIET,
    recompute: bool = RECOMPUTE,
):
    """Compute the metrics (queries/*.sql) and the verdict for every run in the lake (or the --run ones)."""
    res, code = _analysis(
        lake,
        window,
        kernel_wait_us,
        peak_tflops,
        model_flops_per_step,
        params,
        layers,
        heads,
        head_dim,
        seq_len,
        tokens_per_step,
        global_batch,
        gpu_hour_cost,
        scheduler=scheduler,
        runs=runs,
        quiet=quiet,
        recompute=recompute,
    )
    if as_json:
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
        raise typer.Exit(code)
    from ..oneline import one_line

    print_summary(out, res, ranks_table=True)
    for n in res["notes"]:
        err.print(one_line(f"note: {n}"), markup=False)  # soft-wrapped: one line
    if not res["verdicts"]:
        err.print(
            one_line(
                f"note: {lake}: the lake holds no runs (nothing ingested yet, or every source forgotten)"
            ),
            markup=False,
        )
    raise typer.Exit(code)


def _render(res: dict, fmt: str, base: dict | None = None, quiet: bool = False) -> str:
    """The report of an analysis (and a baseline's) as html, json (tracelake.report/2) or md;
    a progress line on a terminal while it renders (none with quiet)."""
    from ..report import document, markdown

    with progress("report", quiet) as bar:
        bar(fmt, 0, 1)
        doc = document.build(res, base)
        if fmt == "html":
            from ..report.html import render

            return render(res, baseline=base, doc=doc)
        if fmt == "json":
            return json.dumps(doc, indent=1) + "\n"
        return markdown.render(doc)


@command(
    epilog=exit_help(scheduler=True),
    help="Write the report: verdict, ranked findings and charts (html), or the same verdict and findings "
    "as json or md.",
)
def report(
    lake: Path = LAKE,
    output: Optional[Path] = typer.Option(
        None,
        "-o",
        "--output",
        metavar="FILE",
        help="File to write ('-': standard output; default: report.html for html, standard output for "
        "json and md).",
    ),
    fmt: Optional[str] = typer.Option(
        None,
        "--format",
        "-f",
        metavar="html|json|md",
        help="html (self-contained, offline), json "
        "(tracelake.report/2) or md (default: from the output's suffix, .json or .md, else html).",
    ),
    baseline: Optional[Path] = typer.Option(
        None,
        "--baseline",
        metavar="DIR",
        help="Lake of a baseline run: say which step-time components and kernels moved against it.",
    ),
    window: str = WINDOW,
    kernel_wait_us: float = KWAIT,
    peak_tflops: Optional[float] = PEAK,
    model_flops_per_step: Optional[float] = MFLOPS,
    params: Optional[float] = PARAMS,
    layers: Optional[int] = LAYERS,
    heads: Optional[int] = HEADS,
    head_dim: Optional[int] = HEAD_DIM,
    seq_len: Optional[int] = SEQ,
    tokens_per_step: Optional[float] = TOKENS,
    global_batch: Optional[float] = GLOBAL_BATCH,
    gpu_hour_cost: Optional[float] = GPU_HOUR_COST,
    scheduler: Optional[str] = SCHEDULER_ANALYSIS,
    runs: Optional[List[str]] = ONLY_RUNS,
    quiet: bool = QUIET,
    recompute: bool = RECOMPUTE,
):
    fmt = preload_charts(_format(fmt, output, lake))
    shape = (params, layers, heads, head_dim, seq_len, tokens_per_step, global_batch, gpu_hour_cost)
    # with a baseline every kernel is kept (top_n=None) so the comparison is kernel by kernel
    top_n = None if baseline is not None else 20
    res, code = _analysis(
        lake,
        window,
        kernel_wait_us,
        peak_tflops,
        model_flops_per_step,
        *shape,
        top_n=top_n,
        scheduler=scheduler,
        runs=runs,
        quiet=quiet,
        recompute=recompute,
    )
    base = None
    if baseline:
        base, base_code = _analysis(
            baseline,
            window,
            kernel_wait_us,
            peak_tflops,
            model_flops_per_step,
            *shape,
            top_n=None,
            scheduler=scheduler,
            quiet=quiet,
            recompute=recompute,
        )
        code = max(code, base_code)
    text = _render(res, fmt, base, quiet)
    if output is None and fmt != "html" or str(output) == "-":
        sys.stdout.write(text)
        raise typer.Exit(code)
    output = output or Path("report.html")
    _write(output, text)
    err.print(f"wrote {output}", markup=False)
    raise typer.Exit(code)


@command(
    epilog=exit_help(files=True, scheduler=True),
    help="Ingest, analyze and report in one go: the report covers the runs of the files given (ingested "
    "now or already in the lake).",
)
def run(
    paths: List[str] = PATHS,
    output: Path = typer.Option(
        Path("report.html"), "-o", "--output", metavar="FILE", help="Report file to write ('-': stdout)."
    ),
    fmt: Optional[str] = typer.Option(
        None,
        "--format",
        "-f",
        metavar="html|json|md",
        help="html, json or md (default: from the output's suffix, .json or .md, else html).",
    ),
    lake: Path = LAKE,
    run_id: Optional[str] = RUN,
    rank: Optional[int] = RANK,
    force: bool = FORCE,
    comm_pattern: List[str] = COMM,
    step_range: Optional[str] = STEPS,
    window: str = WINDOW,
    kernel_wait_us: float = KWAIT,
    peak_tflops: Optional[float] = PEAK,
    model_flops_per_step: Optional[float] = MFLOPS,
    params: Optional[float] = PARAMS,
    layers: Optional[int] = LAYERS,
    heads: Optional[int] = HEADS,
    head_dim: Optional[int] = HEAD_DIM,
    seq_len: Optional[int] = SEQ,
    tokens_per_step: Optional[float] = TOKENS,
    global_batch: Optional[float] = GLOBAL_BATCH,
    gpu_hour_cost: Optional[float] = GPU_HOUR_COST,
    scheduler: Optional[str] = SCHEDULER,
    exclude: List[str] = EXCLUDE,
    jobs: int = JOBS,
    quiet: bool = QUIET,
    recompute: bool = RECOMPUTE,
    timeline: bool = typer.Option(
        False,
        "--timeline",
        help="Also write each run's worst step (± 1) as a trace for the Perfetto UI beside the report "
        "(REPORT.timeline.json.gz; tracelake timeline).",
    ),
):
    shape = (params, layers, heads, head_dim, seq_len, tokens_per_step, global_batch, gpu_hour_cost)
    _model_options(model_flops_per_step, *shape)  # option errors before any ingest work
    no_empty_path(paths)
    fmt = _format(fmt, output, lake, paths)
    if timeline and str(output) == "-":
        raise typer.BadParameter("--timeline writes beside the report: give -o FILE")
    runs: set = set()
    code = _ingest(
        paths,
        lake,
        run_id,
        rank,
        force,
        comm_pattern,
        step_range,
        jobs=jobs,
        scheduler=scheduler,
        exclude=exclude,
        runs=runs,
        quiet=quiet,
    )
    if code == EXIT_FAILED or not runs:  # the ingest's lines said why; this one says what it means
        from ..oneline import one_line

        err.print(one_line(f"error: no report written to {output}: no input could be ingested"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    preload_charts(fmt)  # altair imported while the analysis runs its queries
    res, acode = _analysis(
        lake,
        window,
        kernel_wait_us,
        peak_tflops,
        model_flops_per_step,
        *shape,
        scheduler=scheduler,
        runs=sorted(runs),
        quiet=quiet,
        recompute=recompute,
        exact_runs=True,  # the ingest's own run ids
    )
    code = max(code, acode)
    if str(output) == "-":
        sys.stdout.write(_render(res, fmt, quiet=quiet))
    else:
        _write(output, _render(res, fmt, quiet=quiet))
    print_summary(err, res)
    if str(output) != "-":
        err.print(f"wrote {output}", markup=False)
    if timeline:
        from ..lake import Lake, safe_run_id
        from .timeline_cmd import write_timeline

        ids = [r["run_id"] for r in res["runs"]]
        for r in res["runs"]:
            if not r.get("ranks_with_gpu_work"):  # NCCL logs alone: nothing to draw, not an error
                err.print(f"note: run {r['run_id']}: no GPU work, so no timeline", markup=False)
        for rid in (r["run_id"] for r in res["runs"] if r.get("ranks_with_gpu_work")):
            stem = output.name[: -len(output.suffix)] if output.suffix else output.name
            name = (
                f"{stem}.timeline.json.gz" if len(ids) == 1 else f"{stem}.{safe_run_id(rid)}.timeline.json.gz"
            )
            code = max(code, write_timeline(Lake(lake), rid, output.with_name(name), doc=res))
    raise typer.Exit(code)
