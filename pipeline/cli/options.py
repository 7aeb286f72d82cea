"""The options the commands share (typer declarations with their help) and their checks."""

from __future__ import annotations

import math
import re
from pathlib import Path

import typer

from .app import _clip

PATHS = typer.Argument(
    ...,
    metavar="TRACES...",
    show_default=False,
    help="Traces, exports and logs (Kineto .json/.json.gz; Nsight Systems .sqlite, *_pqtdir/, "
    ".nsys-rep/.qdrep; NCCL logs; .tar, .tar.gz and .zip archives of them) or directories, searched "
    "recursively; or s3://bucket/prefix URLs (docs/usage.md, Object storage).",
)
LAKE = typer.Option(
    Path(".tracelake"),
    "--lake",
    "-l",
    envvar="TRACELAKE_LAKE",
    show_envvar=True,
    metavar="DIR",
    help="Lake directory, or an s3://bucket/prefix URL (docs/usage.md, Object storage).",
)
RUN = typer.Option(
    None,
    "--run",
    metavar="ID",
    help="Run id for all files (default: the path of the file's directory below the directory given, else "
    "its directory's name; an NCCL log of another job than the run's gets a run of its own; "
    "docs/usage.md, Runs).",
)
ONLY_RUNS = typer.Option(
    None,
    "--run",
    metavar="ID",
    help="Analyse only this run of the lake (repeat for several; default: every run).",
)
RANK = typer.Option(
    None,
    "--rank",
    metavar="N",
    help="Rank for a trace that names none (distributedInfo and the file name win).",
)
FORCE = typer.Option(False, "--force", help="Re-ingest files already in the lake.")
QUIET = typer.Option(False, "--quiet", "-q", help="No progress bars (errors and results still print).")
JOBS = typer.Option(
    0,
    "--jobs",
    "-j",
    metavar="N",
    help="Parallel ingest workers (0: one per core; 1: none); threads under 16 MB input.",
)


def _scheduler(what: str):
    return typer.Option(
        None,
        "--scheduler",
        metavar="ADDRESS",
        help=f"Address of an existing Dask scheduler (tcp://host:8786) to work on: {what} "
        "(the lake and the traces on a file system its workers share, or s3:// URLs).",
    )


RECOMPUTE = typer.Option(
    False,
    "--recompute",
    help="Compute every run's analysis again instead of reading the one kept in the lake (kept results "
    "are reused only while the run's sources, the options and tracelake are unchanged; docs/usage.md).",
)
SCHEDULER = _scheduler("ingest parses the files there, analysis runs one task per run")
SCHEDULER_INGEST = _scheduler("the files are parsed there")
SCHEDULER_ANALYSIS = _scheduler("one task per run, the same output as without")
STEPS = typer.Option(
    None,
    "--step-range",
    metavar="REGEX",
    help="Regex of NVTX range names that mark steps in Nsight Systems exports "
    "(default ProfilerStep#N); the step number is the last integer in the name, else the range's "
    "order (when numbers repeat on a rank: its ranges in order from the first one's number).",
)
EXCLUDE = typer.Option(
    [],
    "--exclude",
    "-x",
    metavar="GLOB",
    help="Glob of files, directories or archive members to leave out, matched against the name and path "
    "below the directory given of it and of its directories (e.g. 'config.json', 'checkpoints'). "
    "Repeatable.",
)
COMM = typer.Option(
    [],
    "--comm-pattern",
    metavar="REGEX",
    help="Extra regex marking kernels as communication (e.g. 'dpsk::ep::'). Repeatable.",
)
WINDOW = typer.Option(
    "all",
    "--window",
    metavar="all|hta",
    help="'all' GPU work, or 'hta': HTA's window (drops the last ProfilerStep when there are 2+).",
)
KERNEL_WAIT_MAX_US = 1e9  # 1,000 s: longer than any gap between two kernels of a profiled step
KWAIT = typer.Option(
    30.0,
    "--kernel-wait-us",
    metavar="US",
    help="Idle gaps shorter than this (µs, 0 to 1e9) and not host wait are kernel wait (HTA default 30).",
)
PEAK = typer.Option(
    None,
    "--peak-tflops",
    metavar="TFLOPS",
    help="Device peak for MFU (TFLOP/s), instead of the catalog's (pipeline/catalog/devices.toml).",
)
MFLOPS = typer.Option(
    None,
    "--model-flops-per-step",
    metavar="FLOP",
    help="Model FLOPs per step and rank, instead of those derived from op shapes.",
)
PARAMS = typer.Option(None, "--params", metavar="N", help="PaLM MFU: parameters in matmuls (N).")
GPU_HOUR_COST = typer.Option(
    None,
    "--gpu-hour-cost",
    metavar="PRICE",
    help="Price of one GPU-hour (any currency): each finding's cost per 1,000 steps.",
)
GLOBAL_BATCH = typer.Option(
    None,
    "--global-batch",
    metavar="N",
    help="Sequences per step over all ranks; with --seq-len gives each rank's tokens (tokens/s).",
)
LAYERS = typer.Option(None, "--layers", metavar="L", help="PaLM MFU: layers (L).")
HEADS = typer.Option(None, "--heads", metavar="H", help="PaLM MFU: attention heads (H).")
HEAD_DIM = typer.Option(None, "--head-dim", metavar="Q", help="PaLM MFU: head dimension (Q).")
SEQ = typer.Option(None, "--seq-len", metavar="T", help="PaLM MFU: sequence length (T).")
TOKENS = typer.Option(
    None,
    "--tokens-per-step",
    metavar="N",
    help="Tokens this rank processes per step: tokens/s, and with the PaLM shape options MFU.",
)


def _model_options(
    model_flops_per_step,
    params,
    layers,
    heads,
    head_dim,
    seq_len,
    tokens_per_step,
    global_batch=None,
    gpu_hour_cost=None,
) -> dict:
    """The model options as analyze() takes them: model_flops_per_step (the user's FLOPs, which
    replace the shape-derived ones in mfu_pct), palm_flops_per_token (PaLM's 6N + 12LHQT from
    --params --layers --heads --head-dim --seq-len: palm_mfu_pct next to mfu_pct), tokens_per_step
    (per rank), global_tokens_per_step (--global-batch x --seq-len) and gpu_hour_cost. Raises
    BadParameter (exit 2) for a partial PaLM shape, a non-positive value, or --global-batch
    without --seq-len."""
    for name, v in (
        ("--model-flops-per-step", model_flops_per_step),
        ("--tokens-per-step", tokens_per_step),
        ("--global-batch", global_batch),
        ("--gpu-hour-cost", gpu_hour_cost),
        ("--params", params),
        ("--layers", layers),
        ("--heads", heads),
        ("--head-dim", head_dim),
        ("--seq-len", seq_len),
    ):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise typer.BadParameter(f"{name} must be a positive finite number")
    if seq_len is not None and global_batch is None and params is None:
        raise typer.BadParameter("--seq-len is used with --global-batch or the PaLM shape options")
    palm = None
    if any(v is not None for v in (params, layers, heads, head_dim)):
        from ..flops import palm_flops_per_token  # (polars: imported only for these options)

        try:
            palm = palm_flops_per_token(params, layers, heads, head_dim, seq_len)
        except (TypeError, ValueError) as e:
            raise typer.BadParameter(f"PaLM MFU needs --params --layers --heads --head-dim --seq-len: {e}")
    if global_batch is not None and seq_len is None:
        raise typer.BadParameter("--global-batch needs --seq-len (tokens = sequences x sequence length)")
    if global_batch is not None and tokens_per_step is not None:
        raise typer.BadParameter("give either --tokens-per-step or --global-batch, not both")
    return dict(
        model_flops_per_step=model_flops_per_step,
        palm_flops_per_token=palm,
        tokens_per_step=tokens_per_step,
        global_tokens_per_step=global_batch * seq_len if global_batch is not None else None,
        gpu_hour_cost=gpu_hour_cost,
    )


def _window_options(window: str, kernel_wait_us: float, peak_tflops: float | None) -> dict:
    """The analysis window options as query.connect and analyze() take them (window,
    kernel_wait_threshold_ns, peak_tflops), for every command that computes metrics (analyze,
    report, run, sql). Raises BadParameter (exit 2) for a window other than all / hta, a
    --kernel-wait-us that is not a finite number from 0 to KERNEL_WAIT_MAX_US (nan, inf, 1e300:
    the threshold in ns must fit the lake's BIGINT), a --peak-tflops that is not a positive
    finite number."""
    if window not in ("all", "hta"):
        raise typer.BadParameter("--window must be 'all' or 'hta'")
    if peak_tflops is not None and not (peak_tflops > 0 and math.isfinite(peak_tflops)):
        raise typer.BadParameter("--peak-tflops must be a positive finite number")
    if not (math.isfinite(kernel_wait_us) and 0 <= kernel_wait_us <= KERNEL_WAIT_MAX_US):
        raise typer.BadParameter(
            f"--kernel-wait-us {kernel_wait_us:g}: give a finite number of µs from 0 to "
            f"{KERNEL_WAIT_MAX_US:,.0f} (1,000 s)"
        )
    return dict(window=window, kernel_wait_threshold_ns=int(kernel_wait_us * 1000), peak_tflops=peak_tflops)


def _check_patterns(patterns: list[str]) -> None:
    if not patterns:
        return
    from ..classify import check_regex  # (polars: imported when a pattern is given)

    for p in patterns:
        try:
            check_regex(p)
        except re.error as e:
            raise typer.BadParameter(f"--comm-pattern {p!r}: {e}")


FORMATS = ("html", "json", "md")


def resolve_one(value: str, known: set[str]) -> str | None:
    """The lake's run a --run value names (ingest.runid.resolve_run), None when none. Raises
    BadParameter when it names several runs (one per job), listing them."""
    from ..ingest.runid import resolve_run
    from ..lake import one_line

    found = resolve_run(value, known)
    if len(found) > 1:
        raise typer.BadParameter(
            one_line(
                _clip(f"--run {value}: names {len(found)} runs (one per job): {', '.join(found)}; give one")
            )
        )
    return found[0] if found else None


def _resolve_runs(runs: list[str], known: set[str]) -> list[str]:
    """--run values as the lake's run ids (ingest.runid.resolve_run, as `ingest --run` resolves
    them): an id as printed, or a directory path a run was named by (docs/usage.md, Runs; './',
    '..' and a trailing '/' normalised), names the run it was stored as (`job1/traces` is run
    job1.traces; safe_run_id's id, as lakes written before stored it, also names it); a directory
    whose traces state a numbered job names that job's run (`meta` finds `meta.job-4712`).
    Raises BadParameter naming the values the lake does not hold, or a directory path that
    names several runs (listing them)."""
    from ..lake import one_line

    out, missing = [], []
    for r in runs:
        found = resolve_one(r, known)
        if found is None:
            missing.append(r)
        out.append(found or r)
    if missing:
        raise typer.BadParameter(
            one_line(
                _clip(
                    f"--run {', '.join(missing)}: not in the lake (runs: "
                    f"{', '.join(sorted(known)) or 'none'})"
                )
            )
        )
    return out


def _format(fmt: str | None, output: Path | None, lake: Path | None = None, inputs=()) -> str:
    """The report format: --format (any case), else the output's suffix (.json, .md), else html.
    Raises BadParameter (exit 2) for another format, or an output that is a directory or lies in
    a directory that does not exist, inside the lake directory `lake` (it would replace a part or
    add a stray file there), or that is an existing trace or log among `inputs` (a file given, or
    one with a trace or log suffix inside a directory given: the report would replace the input);
    checked before any work; '-' is standard output."""
    if fmt is None:
        fmt = (
            {".json": "json", ".md": "md"}.get(output.suffix.lower(), "html")
            if output is not None
            else "html"
        )
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise typer.BadParameter("--format must be html, json or md")
    check_output(output, [lake] if lake is not None else [], inputs)
    return fmt


def check_output(output: Path | None, lakes, inputs=()) -> None:
    """Raise BadParameter (exit 2) for an -o that is a directory, lies in a directory that does not
    exist, inside one of `lakes`, or is one of the `inputs` (module doc of _format); '-' and None
    pass."""
    if output is not None and str(output) != "-":
        if output.is_dir():
            raise typer.BadParameter(f"-o {output}: is a directory")
        if not output.absolute().parent.is_dir():
            raise typer.BadParameter(f"-o {output}: directory {output.absolute().parent} does not exist")
        where = output.resolve()
        for lake in lakes:
            if where.is_relative_to(Path(lake).resolve()):
                raise typer.BadParameter(
                    f"-o {output}: lies inside the lake {lake}: write the report elsewhere"
                )
        if where.is_file() and _is_input(where, inputs):
            raise typer.BadParameter(
                f"-o {output}: is one of the inputs: it would be overwritten by the report"
            )


def _is_input(where: Path, inputs) -> bool:
    """Whether the existing file `where` (resolved) is one of inputs or a trace or log file that
    ingest would read inside one of the input directories."""
    # only inputs that exist can be it: with none (report; a mistyped path, said next), no import
    # of the ingest package (and with it the lake, polars and DuckDB) to say so
    inputs = [q for q in (Path(p).resolve() for p in inputs or ()) if q.exists()]
    if not inputs:
        return False
    from ..ingest.formats import LOG_SUFFIXES, TRACE_SUFFIXES

    for q in inputs:
        if where == q:
            return True
        if (
            q.is_dir()
            and where.is_relative_to(q)
            and where.name.lower().endswith(TRACE_SUFFIXES + LOG_SUFFIXES)
        ):
            return True
    return False


TIMELINE_RUN = typer.Option(
    None, "--run", metavar="ID", help="The run to show (needed when the lake holds several)."
)
TIMELINE_STEPS = typer.Option(
    None,
    "--steps",
    metavar="N-M",
    help="Steps to show (ProfilerStep numbers, e.g. 10-12; default: the worst step and one either side).",
)
TIMELINE_RANKS = typer.Option(
    None, "--ranks", metavar="LIST", help="Ranks to show, e.g. 0-7 or 0,3,5-6 (default: every rank)."
)
TIMELINE_AROUND = typer.Option(
    None,
    "--around",
    metavar="FINDING",
    help="The window of this finding of `tracelake analyze` (its kind, or timeline.id in the JSON).",
)
TIMELINE_ALL = typer.Option(False, "--all", help="The whole run instead of a window of steps.")
MAX_EVENTS = typer.Option(
    500_000,
    "--max-events",
    min=1,
    metavar="N",
    help="Refuse a selection of more events than this (counted before anything is written).",
)


def lake_option(lake_dir: Path) -> str:
    """'--lake LAKE_DIR ' (as given, shell-quoted) for a command this one prints, when that
    command without --lake would open another lake (LAKE_DIR is not ./.tracelake, or
    TRACELAKE_LAKE names another); '' otherwise."""
    import os
    import shlex

    default = os.path.abspath(".tracelake")
    if (
        os.path.abspath(lake_dir) == default
        and os.path.abspath(os.environ.get("TRACELAKE_LAKE") or default) == default
    ):
        return ""
    return f"--lake {shlex.quote(str(lake_dir))} "


def all_failed(lake_dir, what: str) -> None:
    """Exit 4 (EXIT_FAILED) with one line on stderr: 'error: LAKE_DIR: WHAT; their errors:' and
    the `tracelake sql` command that lists the failed sources' errors. For a lake whose every
    source (in scope) failed to ingest: nothing to work on is a failure a CI job must see."""
    from ..oneline import one_line
    from .app import EXIT_FAILED, err

    err.print(
        one_line(
            f"error: {lake_dir}: {what}; their errors: tracelake sql {lake_option(lake_dir)}"
            "\"SELECT path, error FROM sources WHERE status = 'failed'\""
        ),
        markup=False,
    )
    raise typer.Exit(EXIT_FAILED)


def one_run(lk, lake: Path, run_id: str | None) -> str:
    """The run a one-run command (timeline, whatif) works on: --run resolved as _resolve_runs
    does, else the lake's only run (failed sources left out). Raises a one-line usage error (exit
    2) for an unknown run or a lake of several runs without --run; exits 4 with one line when
    every source of the lake failed to ingest (as analyze does)."""
    from .app import usage_error

    src = lk.sources()
    known = set(src.filter(src["status"] != "failed")["run_id"].drop_nulls().to_list())
    if run_id is None:
        failed = int((src["status"] == "failed").sum())
        if not known and failed:  # as analyze says it: a failure, not a usage error
            all_failed(lake, f"every source failed to ingest ({failed} file(s)), no run to work on")
        if len(known) != 1:
            raise usage_error(
                f"{lake}: the lake holds {len(known)} runs: name one with --run (runs: "
                f"{', '.join(sorted(known)) or 'none'})"
            )
        return next(iter(known))
    try:
        return _resolve_runs([run_id], known)[0]
    except typer.BadParameter as e:
        raise usage_error(str(e.message))
