"""The `tracelake` command.

Exit codes (all commands):
  0  everything worked
  2  usage error (bad option or argument; typer/click's code)
  3  some input files failed, the others were ingested (ingest, run); with --scheduler, some runs'
     analysis failed on the cluster, the others are in the output (analyze, report, run)
  4  total failure: nothing could be ingested, or the lake/query could not be read, or (--scheduler)
     the scheduler could not be reached or no run could be analysed
"""

from __future__ import annotations

import math

import json
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from . import __version__

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 3, 4
EXIT_HELP = ("Exit codes: 0 all good; 2 usage error; 3 some files (or, with --scheduler, some runs' analyses) failed, "
             "the rest done; 4 total failure.")

app = typer.Typer(
    add_completion=False, no_args_is_help=True,
    help="tracelake: is a distributed training run network-bound or compute-bound? "
         "Ingest PyTorch profiler traces, Nsight Systems exports and NCCL logs into a Parquet lake, query it with DuckDB, "
         "write an offline HTML report. "
         + EXIT_HELP,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def _version(v: bool):
    if v:
        print(f"tracelake {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version.")):
    pass


def _check_patterns(patterns: list[str]) -> None:
    for p in patterns:
        try:
            re.compile(p)
        except re.error as e:
            raise typer.BadParameter(f"--comm-pattern {p!r}: {e}")


def _ingest(paths: list[Path], lake_dir: Path, run: str | None, rank: int | None, force: bool, comm_pattern: list[str],
            step_range: str | None = None, jobs: int = 0, scheduler: str | None = None, exclude: list[str] | None = None,
            runs: set | None = None) -> int:
    """Ingest with the command's options; returns the exit code. runs: filled with the run ids
    of the files ingested or skipped as already in the lake."""
    from .cluster import SchedulerError
    from .ingest import discover, exclude_patterns, ingest_paths
    from .lake import Lake, LakeError, one_line

    _check_patterns(comm_pattern)
    if run is not None and not run.strip():
        raise typer.BadParameter("--run: empty run id (leave --run out to name runs by their directories)")
    if step_range:
        try:
            re.compile(step_range)
        except re.error as e:
            raise typer.BadParameter(f"--step-range {step_range!r}: {e}")
    if jobs < 0:
        raise typer.BadParameter("--jobs must be 0 (one per core) or more")
    try:
        exclude = exclude_patterns(exclude)
    except ValueError as e:
        raise typer.BadParameter(str(e))
    problems: list = []
    left_out: list = []
    files = discover(paths, problems, exclude, left_out)
    if not files and not problems:
        err.print(one_line("error: no trace files (*.json, *.json.gz, *.gz, *.sqlite, *.nsys-rep, *.qdrep, *_pqtdir/, "
                           "*.tar, *.tar.gz, *.zip; NCCL logs *.log, *.txt, *.out, *.err, *.jsonl) in "
                           + ", ".join(str(p) for p in paths)
                           + (f" ({len(left_out)} left out by --exclude)" if left_out else "")), markup=False)
        return EXIT_FAILED
    lake = Lake(lake_dir)
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    not_traces = []
    with Progress(TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TextColumn("files"), _RateColumn(),
                  TextColumn("{task.fields[errors]} error(s)"), TimeElapsedColumn(), console=err, transient=True) as prog:
        task = prog.add_task("ingest", total=None, mb=0.0, errors=0)

        def on_file(res):
            counts["ok" if res.status in ("ok", "partial") else res.status] += 1
            if runs is not None and res.status != "failed" and res.run_id:
                runs.add(res.run_id)
            t = prog.tasks[task]
            if t.total is not None and t.completed + 1 > t.total:  # a compressed tar's members
                prog.update(task, total=t.completed + 1)
            prog.update(task, advance=1, mb=t.fields["mb"] + res.uncompressed_bytes / 1e6, errors=counts["failed"])
            if res.status == "failed":
                prog.console.print(one_line(f"failed {res.path}: {res.error}"), markup=False, style="red")
                if (res.error or "").startswith("not a Kineto trace"):
                    not_traces.append(res.path)
            for n in res.notes:
                if res.status != "skipped":
                    prog.console.print(one_line(f"note {res.path}: {n}"), markup=False)

        try:
            ingest_paths(paths, lake, run=run, rank=rank, force=force, comm_patterns=comm_pattern, on_file=on_file,
                         step_regex=step_range, jobs=jobs, scheduler=scheduler, exclude=exclude,
                         on_plan=lambda n: prog.update(task, total=n))
        except (LakeError, SchedulerError) as e:
            err.print(one_line(f"error: {e}"), markup=False)
            return EXIT_FAILED
        except OSError as e:
            err.print(one_line(f"error: {lake_dir}: cannot write to the lake: {e.strerror or e}"), markup=False)
            return EXIT_FAILED
    err.print(one_line(f"ingested {counts['ok']}, failed {counts['failed']}, skipped {counts['skipped']} (already in the lake) -> {lake_dir}"),
              markup=False)
    if not_traces:
        err.print(one_line(f"hint: {len(not_traces)} file(s) are not traces (e.g. {Path(not_traces[0]).name}); "
                           "leave such files out with --exclude PATTERN"), markup=False)
    if not sum(counts.values()):  # archives whose every member was left out or is not ours
        err.print(one_line("error: nothing to ingest in " + ", ".join(str(p) for p in paths)
                           + (": every archive member was left out by --exclude or is not a trace" if exclude else "")), markup=False)
        return EXIT_FAILED
    if counts["failed"] and counts["ok"] + counts["skipped"] == 0:
        return EXIT_FAILED
    return EXIT_PARTIAL if counts["failed"] else EXIT_OK


class _RateColumn(ProgressColumn):
    """Uncompressed MB ingested per second of the task's elapsed time."""

    def render(self, task) -> Text:
        mb, el = task.fields.get("mb", 0.0), task.elapsed or 0.0
        return Text(f"{mb:,.1f} MB  {mb / el if el > 0 else 0.0:,.1f} MB/s")


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        err.print(f"error: {path}: cannot write: {e.strerror or e}", markup=False)
        raise typer.Exit(EXIT_FAILED)


PATHS = typer.Argument(..., help="Traces, exports and logs (Kineto .json/.json.gz; Nsight Systems .sqlite, *_pqtdir/, "
                       ".nsys-rep/.qdrep; NCCL logs; .tar, .tar.gz and .zip archives of them) or directories, searched recursively.")
LAKE = typer.Option(..., "--lake", "-l", help="Lake directory.")
RUN = typer.Option(None, "--run", help="Run id for all files (default: the path of the file's directory below the directory given, else its directory's name; README, Runs).")
ONLY_RUNS = typer.Option(None, "--run", help="Analyse only this run of the lake (repeat for several; default: every run).")
RANK = typer.Option(None, "--rank", help="Rank for a trace that names none (distributedInfo and the file name win).")
FORCE = typer.Option(False, "--force", help="Re-ingest files already in the lake.")
JOBS = typer.Option(0, "--jobs", "-j", help="Worker processes for ingest (0: one per core; 1: no pool).")
SCHEDULER = typer.Option(None, "--scheduler", help="Address of an existing Dask scheduler (tcp://host:8786) to work on: "
                         "ingest parses the files there, analysis runs one task per run (same output as without); "
                         "the lake and the traces must be on a file system its workers share.")
STEPS = typer.Option(None, "--step-range", help="Regex of NVTX range names that mark steps in Nsight Systems exports "
                     "(default ProfilerStep#N); the step number is the last integer in the name, else the range's order.")
EXCLUDE = typer.Option([], "--exclude", "-x", help="Glob of files, directories or archive members to leave out, matched "
                       "against the name and path below the directory given of it and of its directories (e.g. 'config.json', 'checkpoints'). "
                       "Repeatable.")
COMM = typer.Option([], "--comm-pattern", help="Extra regex marking kernels as communication (e.g. 'dpsk::ep::'). Repeatable.")
WINDOW = typer.Option("all", "--window", help="'all' GPU work, or 'hta': HTA's window (drops the last ProfilerStep when there are 2+).")
KWAIT = typer.Option(30.0, "--kernel-wait-us", min=0.0, help="Idle gaps shorter than this (µs) and not host wait are kernel wait (HTA default 30).")
PEAK = typer.Option(None, "--peak-tflops", help="Device peak for MFU (TFLOP/s), instead of the catalog's (pipeline/catalog/devices.toml).")
MFLOPS = typer.Option(None, "--model-flops-per-step", help="Model FLOPs per step and rank, instead of those derived from op shapes.")
PARAMS = typer.Option(None, "--params", help="PaLM MFU: parameters in matmuls (N).")
LAYERS = typer.Option(None, "--layers", help="PaLM MFU: layers (L).")
HEADS = typer.Option(None, "--heads", help="PaLM MFU: attention heads (H).")
HEAD_DIM = typer.Option(None, "--head-dim", help="PaLM MFU: head dimension (Q).")
SEQ = typer.Option(None, "--seq-len", help="PaLM MFU: sequence length (T).")
TOKENS = typer.Option(None, "--tokens-per-step", help="Tokens this rank processes per step: tokens/s, and with the PaLM shape options MFU.")


def _model_flops(model_flops_per_step, params, layers, heads, head_dim, seq_len, tokens_per_step):
    shape = (params, layers, heads, head_dim, seq_len, tokens_per_step)
    if any(v is not None for v in shape[:5]):  # --tokens-per-step alone only gives tokens/s
        if model_flops_per_step is not None:
            raise typer.BadParameter("give either --model-flops-per-step or the PaLM shape options, not both")
        from .flops import palm_flops_per_step

        try:
            return palm_flops_per_step(*shape)
        except (TypeError, ValueError) as e:
            raise typer.BadParameter(f"PaLM MFU needs --params --layers --heads --head-dim --seq-len --tokens-per-step: {e}")
    return model_flops_per_step


@app.command(epilog=EXIT_HELP)
def ingest(paths: List[Path] = PATHS, lake: Path = LAKE, run: Optional[str] = RUN, rank: Optional[int] = RANK,
           force: bool = FORCE, comm_pattern: List[str] = COMM, step_range: Optional[str] = STEPS, jobs: int = JOBS,
           scheduler: Optional[str] = SCHEDULER, exclude: List[str] = EXCLUDE):
    """Ingest traces and archives of them (.tar, .tar.gz, .zip) into the lake: in parallel, skipping files
    already there, crash-safe (one bad file never stops the batch)."""
    raise typer.Exit(_ingest(paths, lake, run, rank, force, comm_pattern, step_range, jobs, scheduler, exclude))


def _analysis(lake_dir: Path, window: str, kernel_wait_us: float, peak_tflops: float | None,
              model_flops_per_step: float | None, *palm_shape, top_n: int | None = 20,
              scheduler: str | None = None, runs: list[str] | None = None) -> tuple[dict, int]:
    """Analysis of the lake with the command's options, and its exit code; palm_shape = (params,
    layers, heads, head_dim, seq_len, tokens_per_step), all None when not given; top_n: kernels
    kept per run; scheduler: a Dask scheduler's address to analyse on, one task per run (each run
    whose task fails gets a warning here and a note in the document; the code is then
    EXIT_PARTIAL, or EXIT_FAILED when no run could be analysed); runs: only these runs (a usage
    error names any the lake does not hold)."""
    import duckdb

    from .lake import LakeError

    try:
        return _analysis_of(lake_dir, window, kernel_wait_us, peak_tflops, model_flops_per_step, *palm_shape, top_n=top_n,
                            scheduler=scheduler, runs=runs)
    except (LakeError, duckdb.IOException, duckdb.InvalidInputException) as e:
        err.print(_lake_read_error(lake_dir, e), markup=False)
        raise typer.Exit(EXIT_FAILED)


def _analysis_of(lake_dir, window, kernel_wait_us, peak_tflops, model_flops_per_step, *palm_shape, top_n, scheduler, runs):
    from .analyze import analyze
    from .lake import Lake, one_line

    if window not in ("all", "hta"):
        raise typer.BadParameter("--window must be 'all' or 'hta'")
    model_flops_per_step = _model_flops(model_flops_per_step, *palm_shape)
    lake = Lake(lake_dir)
    if not lake.exists():
        hint = ("no TRACELAKE file" if lake.root.is_dir() and any(lake.root.iterdir())
                else f"run `tracelake ingest PATH --lake {lake_dir}` first")
        err.print(one_line(f"error: {lake_dir}: not a tracelake lake ({hint})"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    for name, v in (("--peak-tflops", peak_tflops), ("--model-flops-per-step", model_flops_per_step)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise typer.BadParameter(f"{name} must be a positive finite number")
    if not (kernel_wait_us >= 0 and math.isfinite(kernel_wait_us)):
        raise typer.BadParameter("--kernel-wait-us must be a finite number >= 0")
    if runs:
        runs = _resolve_runs(runs, set(lake.sources()["run_id"].drop_nulls().to_list()))
    tokens_per_step = palm_shape[5] if len(palm_shape) > 5 else None
    if tokens_per_step is not None and not (tokens_per_step > 0 and math.isfinite(tokens_per_step)):
        raise typer.BadParameter("--tokens-per-step must be a positive finite number")
    options = dict(window=window, kernel_wait_threshold_ns=int(kernel_wait_us * 1000), peak_tflops=peak_tflops,
                   model_flops_per_step=model_flops_per_step, top_n=top_n, runs=sorted(set(runs)) if runs else None,
                   tokens_per_step=tokens_per_step)
    if not scheduler:
        return analyze(lake, **options), EXIT_OK
    from .cluster import SchedulerError, analyze_on_cluster

    try:
        res, failures = analyze_on_cluster(lake, scheduler, **options)
    except SchedulerError as e:
        err.print(one_line(f"error: {e}"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    for f in failures:
        err.print(one_line(f"warning: run {f.run_id}: not analysed: the Dask task failed ({f.error})"), markup=False, style="yellow")
    if not failures:
        return res, EXIT_OK
    return res, EXIT_PARTIAL if res["runs"] else EXIT_FAILED


@app.command(epilog=EXIT_HELP)
def analyze(lake: Path = LAKE, as_json: bool = typer.Option(False, "--json", help="Print the tracelake.analyze/3 JSON document."),
            window: str = WINDOW, kernel_wait_us: float = KWAIT, peak_tflops: Optional[float] = PEAK,
            model_flops_per_step: Optional[float] = MFLOPS, params: Optional[float] = PARAMS, layers: Optional[int] = LAYERS,
            heads: Optional[int] = HEADS, head_dim: Optional[int] = HEAD_DIM, seq_len: Optional[int] = SEQ,
            tokens_per_step: Optional[float] = TOKENS, scheduler: Optional[str] = SCHEDULER,
            runs: Optional[List[str]] = ONLY_RUNS):
    """Compute the metrics (queries/*.sql) and the verdict for every run in the lake (or the --run ones)."""
    res, code = _analysis(lake, window, kernel_wait_us, peak_tflops, model_flops_per_step, params, layers, heads, head_dim,
                          seq_len, tokens_per_step, scheduler=scheduler, runs=runs)
    if as_json:
        sys.stdout.write(json.dumps(res, indent=1) + "\n")
        raise typer.Exit(code)
    from rich.table import Table

    from .lake import one_line
    from .report.document import timing_text

    for v in res["verdicts"]:
        out.print(f"[bold]run {escape(v['run_id'])}[/bold]: {v['verdict']}" + (f" ({v['confidence']})" if v["confidence"] else "")
                  + f" — {escape(v['reason'])}", markup=True)
        for i, f in enumerate((f for f in res["findings"] if f["run_id"] == v["run_id"]), 1):
            out.print(f"  {i}. {f['title']} — {timing_text(f)}", markup=False)
        rows = [r for r in res["ranks"] if r["run_id"] == v["run_id"]]
        if rows:
            t = Table("rank", "span ms", "compute ms", "comm ms", "exposed comm ms", "overlap %", "idle ms", "host wait ms",
                      "MFU %", "FLOP cov. %")
            f = lambda x, d=1e6: "—" if x is None else f"{x / d:,.3f}"  # noqa: E731
            for r in rows[:64]:
                t.add_row(str(r["rank"]), f(r["span_ns"]), f(r["compute_ns"]), f(r["comm_ns"]), f(r["exposed_comm_ns"]),
                          f(r["comm_comp_overlap_pct"], 1), f(r["gpu_idle_ns"]), f(r["idle_host_wait_ns"]), f(r["mfu_pct"], 1),
                          f(r["flop_coverage_pct"], 1))
            out.print(t)
    for n in res["notes"]:
        out.print(f"note: {n}", markup=False)
    if not res["verdicts"]:
        err.print(one_line(f"note: {lake}: the lake holds no runs (nothing ingested yet, or every source forgotten)"), markup=False)
    raise typer.Exit(code)


FORMATS = ("html", "json", "md")


def _lake_read_error(lake_dir: Path, e: Exception) -> str:
    """One line for a lake that could not be read: a part removed while read (an ingest --force or
    a forget at work), or an unreadable (corrupt) part."""
    from .lake import LakeError, one_line

    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, LakeError):
        return one_line(f"error: {first}")
    if "No files found" in first or "No such file" in first:
        return one_line(f"error: {lake_dir}: the lake changed while it was read (an ingest or forget is writing); "
                        f"run the command again ({first})")
    return one_line(f"error: {lake_dir}: cannot read the lake ({first})")


def _resolve_runs(runs: list[str], known: set[str]) -> list[str]:
    """--run values as the lake's run ids: an id as given to `ingest --run`, or a directory path a
    run was named by (README, Runs; a trailing '/' ignored), names the run it was stored as
    (safe_run_id). Raises BadParameter naming the ones the lake does not hold."""
    from .lake import one_line, safe_run_id

    def resolve(r: str) -> str:
        for name in (r, r.rstrip("/") or r):
            if name in known:
                return name
            if safe_run_id(name) in known:
                return safe_run_id(name)
        return r

    out = [resolve(r) for r in runs]
    missing = [r for r in out if r not in known]
    if missing:
        raise typer.BadParameter(one_line(_clip(f"--run {', '.join(missing)}: not in the lake (runs: {', '.join(sorted(known)) or 'none'})")))
    return out


def _clip(text: str, n: int = 300) -> str:
    """A message cut to n characters (ids and run lists can be long)."""
    return text if len(text) <= n else text[: n - 1] + "…"


def _format(fmt: str | None, output: Path | None) -> str:
    """The report format: --format (any case), else the output's suffix (.json, .md), else html.
    Raises BadParameter (exit 2) for another format, or an output that is a directory or lies in
    a directory that does not exist (checked before any work; '-' is standard output)."""
    if fmt is None:
        fmt = {".json": "json", ".md": "md"}.get(output.suffix.lower(), "html") if output is not None else "html"
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise typer.BadParameter("--format must be html, json or md")
    if output is not None and str(output) != "-":
        if output.is_dir():
            raise typer.BadParameter(f"-o {output}: is a directory")
        if not output.absolute().parent.is_dir():
            raise typer.BadParameter(f"-o {output}: directory {output.absolute().parent} does not exist")
    return fmt


def _render(res: dict, fmt: str, base: dict | None = None) -> str:
    """The report of an analysis (and a baseline's) as html, json (tracelake.report/2) or md."""
    from .report import document, markdown
    from .report.html import render

    doc = document.build(res, base)
    if fmt == "html":
        return render(res, baseline=base, doc=doc)
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    return markdown.render(doc)


@app.command(epilog=EXIT_HELP)
def report(lake: Path = LAKE,
           output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                 help="File to write ('-': standard output; default: report.html for html, standard output for json and md)."),
           fmt: Optional[str] = typer.Option(None, "--format", "-f", help="html (self-contained, offline), json "
                                             "(tracelake.report/2) or md (default: from the output's suffix, .json or .md, else html)."),
           baseline: Optional[Path] = typer.Option(None, "--baseline", help="Lake of a baseline run: say which step-time "
                                                   "components and kernels moved against it."),
           window: str = WINDOW, kernel_wait_us: float = KWAIT, peak_tflops: Optional[float] = PEAK,
           model_flops_per_step: Optional[float] = MFLOPS, params: Optional[float] = PARAMS, layers: Optional[int] = LAYERS,
           heads: Optional[int] = HEADS, head_dim: Optional[int] = HEAD_DIM, seq_len: Optional[int] = SEQ,
           tokens_per_step: Optional[float] = TOKENS, scheduler: Optional[str] = SCHEDULER,
           runs: Optional[List[str]] = ONLY_RUNS):
    """Write the report: verdict, ranked findings and charts (html), or the same verdict and findings as json or md."""
    fmt = _format(fmt, output)
    shape = (params, layers, heads, head_dim, seq_len, tokens_per_step)
    # with a baseline every kernel is kept (top_n=None) so the comparison is kernel by kernel
    top_n = None if baseline is not None else 20
    res, code = _analysis(lake, window, kernel_wait_us, peak_tflops, model_flops_per_step, *shape, top_n=top_n, scheduler=scheduler,
                          runs=runs)
    base = None
    if baseline:
        base, base_code = _analysis(baseline, window, kernel_wait_us, peak_tflops, model_flops_per_step, *shape, top_n=None,
                                    scheduler=scheduler)
        code = max(code, base_code)
    text = _render(res, fmt, base)
    if output is None and fmt != "html" or str(output) == "-":
        sys.stdout.write(text)
        raise typer.Exit(code)
    output = output or Path("report.html")
    _write(output, text)
    err.print(f"wrote {output}", markup=False)
    raise typer.Exit(code)


@app.command(epilog=EXIT_HELP)
def forget(lake: Path = LAKE,
           runs: Optional[List[str]] = typer.Option(None, "--run", help="Only sources of this run (repeatable)."),
           source_ids: Optional[List[str]] = typer.Option(None, "--source", help="Only this source id (sources.source_id; "
                                                          "repeatable)."),
           failed: bool = typer.Option(False, "--failed", help="Only sources whose ingest failed."),
           dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed; change nothing.")):
    """Remove sources from the lake with all their rows: those matching every filter given (whole runs, single
    sources, failed ingests). Crash-safe; a removed file is ingested again by the next ingest."""
    import polars as pl

    from .lake import Lake, LakeError, one_line

    if not (runs or source_ids or failed):
        raise typer.BadParameter("give --run, --source or --failed (several narrow the selection)")
    lk = Lake(lake)
    if not lk.exists():
        err.print(f"error: {lake}: not a tracelake lake", markup=False)
        raise typer.Exit(EXIT_FAILED)
    def select():
        src = lk.sources()
        want_runs = _resolve_runs(runs, set(src["run_id"].drop_nulls().to_list())) if runs else []
        missing = sorted(set(source_ids or ()) - set(src["source_id"].drop_nulls().to_list()))
        if missing:
            raise typer.BadParameter(one_line(_clip(f"--source {', '.join(missing)}: not in the lake")))
        if want_runs:
            src = src.filter(pl.col("run_id").is_in(want_runs))
        if source_ids:
            src = src.filter(pl.col("source_id").is_in(source_ids))
        if failed:
            src = src.filter(pl.col("status") == "failed")
        return src.sort("run_id", "path").select("run_id", "source_id", "path", "status").rows()

    try:
        if dry_run:  # reads only: no lock, no repair
            rows = select()
        else:
            with lk.lock():
                for line in lk.recover():
                    err.print(one_line(f"note {lake}: {line}"), markup=False)
                rows = select()
                lk.forget((r, s_) for r, s_, _, _ in rows)
    except LakeError as e:
        err.print(one_line(f"error: {e}"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    for run_id, source_id, path, status in rows:
        err.print(one_line(f"{'would remove' if dry_run else 'removed'} {run_id}/{source_id} {path} ({status})"), markup=False)
    err.print(one_line(f"{'would remove' if dry_run else 'removed'} {len(rows)} source(s) from {lake}"), markup=False)
    raise typer.Exit(EXIT_OK)


@app.command(epilog=EXIT_HELP + " Views: every schema table (sources, gpu_activities, cpu_ops, steps, collectives, devices, "
             "process_groups, annotations, counters) plus gpu_work, scope, rank_device, device_catalog, collective_catalog.")
def sql(query: str = typer.Argument(..., help="SQL text, or @FILE to read it from a file."), lake: Path = LAKE,
        fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."), window: str = WINDOW):
    """Run ad-hoc DuckDB SQL over the lake (one view per schema table)."""
    import duckdb

    from .lake import Lake, LakeError
    from .query import connect

    if fmt not in ("table", "csv", "json"):
        raise typer.BadParameter("--format must be table, csv or json")
    lk = Lake(lake)
    if not lk.exists():
        err.print(f"error: {lake}: not a tracelake lake", markup=False)
        raise typer.Exit(EXIT_FAILED)
    try:
        text = Path(query[1:]).read_text() if query.startswith("@") else query
    except OSError as e:
        err.print(f"error: {query[1:]}: {e.strerror or e}", markup=False)
        raise typer.Exit(EXIT_FAILED)
    if not text.strip():
        err.print("error: empty query", markup=False)
        raise typer.Exit(EXIT_FAILED)
    try:
        con = connect(lk, window=window)
    except (LakeError, duckdb.IOException, duckdb.InvalidInputException) as e:
        err.print(_lake_read_error(lake, e), markup=False)
        raise typer.Exit(EXIT_FAILED)
    try:
        import polars as pl

        rel = con.sql(text)
        if rel is None:
            err.print("error: the statement returns no rows (tracelake sql runs queries)", markup=False)
            raise typer.Exit(EXIT_FAILED)
        df = pl.from_arrow(rel.to_arrow_table())
    except duckdb.Error as e:
        err.print(f"error: {str(e).splitlines()[0]}", markup=False)
        raise typer.Exit(EXIT_FAILED)
    if fmt == "csv":  # CSV has no nested values: lists, structs and maps are written as JSON text
        nested = [c for c, t in df.schema.items() if t.is_nested()]
        df = df.with_columns(pl.Series(c, [None if v is None else json.dumps(v, default=str) for v in df[c].to_list()], dtype=pl.String)
                             for c in nested)
        sys.stdout.write(df.write_csv())
    elif fmt == "json":
        sys.stdout.write(json.dumps(df.to_dicts(), default=str) + "\n")
    else:
        import polars as pl

        with pl.Config(tbl_rows=200, tbl_cols=50, fmt_str_lengths=80, tbl_width_chars=240,
                       tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
            out.print(str(df), markup=False)


@app.command(epilog=EXIT_HELP)
def run(paths: List[Path] = PATHS, output: Path = typer.Option(Path("report.html"), "-o", "--output", help="Report file to write."),
        fmt: Optional[str] = typer.Option(None, "--format", "-f", help="html, json or md (default: from the output's "
                                          "suffix, .json or .md, else html)."),
        lake: Path = typer.Option(Path(".tracelake"), "--lake", "-l", help="Lake directory (default .tracelake/)."),
        run_id: Optional[str] = RUN, rank: Optional[int] = RANK, force: bool = FORCE, comm_pattern: List[str] = COMM,
        step_range: Optional[str] = STEPS, window: str = WINDOW, kernel_wait_us: float = KWAIT, peak_tflops: Optional[float] = PEAK,
        model_flops_per_step: Optional[float] = MFLOPS, params: Optional[float] = PARAMS, layers: Optional[int] = LAYERS,
        heads: Optional[int] = HEADS, head_dim: Optional[int] = HEAD_DIM, seq_len: Optional[int] = SEQ,
        tokens_per_step: Optional[float] = TOKENS, scheduler: Optional[str] = SCHEDULER, exclude: List[str] = EXCLUDE,
        jobs: int = JOBS):
    """Ingest, analyze and report in one go: the report covers the runs of the files given (ingested now or already in the lake)."""
    shape = (params, layers, heads, head_dim, seq_len, tokens_per_step)
    _model_flops(model_flops_per_step, *shape)  # option errors before any ingest work
    fmt = _format(fmt, output)
    runs: set = set()
    code = _ingest(paths, lake, run_id, rank, force, comm_pattern, step_range, jobs=jobs, scheduler=scheduler, exclude=exclude,
                   runs=runs)
    if code == EXIT_FAILED or not runs:
        raise typer.Exit(EXIT_FAILED)
    res, acode = _analysis(lake, window, kernel_wait_us, peak_tflops, model_flops_per_step, *shape, scheduler=scheduler,
                           runs=sorted(runs))
    code = max(code, acode)
    if str(output) == "-":
        sys.stdout.write(_render(res, fmt))
    else:
        _write(output, _render(res, fmt))
    for v in res["verdicts"]:
        err.print(f"run {v['run_id']}: {v['verdict']} — {v['reason']}", markup=False)
    if str(output) != "-":
        err.print(f"wrote {output}", markup=False)
    raise typer.Exit(code)


if __name__ == "__main__":  # pragma: no cover
    app()
