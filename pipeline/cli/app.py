"""The `tracelake` typer application, its exit codes and its two consoles (results on stdout,
messages on stderr). The commands live in ingest_cmd.py, analysis_cmd.py and lake_cmd.py.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import typer

try:  # typer vendors click (typer._click) since 0.2x; its exceptions are not click's
    from typer._click import exceptions as clickx
except ImportError:  # pragma: no cover
    from click import exceptions as clickx

from .. import __version__
from .params import plain_params

EXIT_OK, EXIT_USAGE, EXIT_PARTIAL, EXIT_FAILED = 0, 2, 3, 4


def exit_help(files: bool = False, scheduler: bool = False) -> str:
    """The epilog of a command: its exit codes, naming only what the command does (files: it
    ingests; scheduler: it takes --scheduler)."""
    partial = (
        "3 some files failed, the rest were ingested; "
        if files and not scheduler
        else "3 some files or, with --scheduler, some runs' analyses failed, the rest done; "
        if files
        else "3 with --scheduler, some runs' analyses failed, the rest done; "
        if scheduler
        else ""
    )
    usage = "2 usage error (a bad option, a path that does not exist)"
    return f"Exit codes: 0 all good; {usage}; {partial}4 failed."


EXIT_HELP = exit_help(files=True, scheduler=True)


class Group(typer.core.TyperGroup):
    """The `tracelake` group: a usage error, click's own (a missing argument, a bad option value,
    no such option or command) or a BadParameter a command raises, is one line on stderr,
    `error: MESSAGE (see tracelake CMD --help)`, exit 2, as usage_error() writes its own; click
    wrote four (Usage:, Try ... --help, a blank line, Error: ...). Its parameters convert their
    values through cli/params.py (plain_params)."""

    def get_params(self, ctx):
        return plain_params(super().get_params(ctx))

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except clickx.UsageError as e:
            raise _one_line(e)
        except BrokenPipeError:  # --help or --version into a closed pipe
            raise pipe_closed()
        except OSError as e:  # or into a full one
            raise output_failed(e)

    def invoke(self, ctx):
        try:
            try:
                return super().invoke(ctx)
            finally:  # a reader gone is found here, not by the interpreter's last flush at exit
                if sys.stdout is not None:
                    sys.stdout.flush()
        except clickx.UsageError as e:
            sub = ctx.invoked_subcommand
            raise _one_line(e, f"{ctx.command_path} {sub}" if sub else ctx.command_path)
        except BrokenPipeError:
            raise pipe_closed()
        except OSError as e:  # standard output (or a file) on a full or failing disk
            raise output_failed(e)


EXIT_PIPE = 128 + 13  # SIGPIPE's number: the code a shell reports for `yes | head -1`'s yes


def pipe_closed() -> typer.Exit:
    """Standard output's reader went away (`tracelake runs | head -1`): what is left to write goes
    to /dev/null (Python's documented recipe, so no "Exception ignored" line at exit) and the
    command ends quietly, exit 141 (128 + SIGPIPE), as a Unix tool the signal ends; click's own
    handling exited 1 without a word."""
    _stdout_to_devnull()
    return typer.Exit(EXIT_PIPE)


def _stdout_to_devnull() -> None:
    """What is left to write on standard output goes to /dev/null (Python's documented recipe
    for a broken pipe), so no "Exception ignored" line at exit; nothing when it has no file."""
    import io
    import os

    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def output_failed(e: OSError) -> BaseException:
    """A write that failed for want of room or a device error (ENOSPC, EDQUOT, EFBIG, EIO: `tracelake
    sql ... > file` on a full disk; rich's console raises it), or to a closed standard output
    (EBADF: _ClosedStdout), as one line on stderr and exit 4;
    what is left to write goes to /dev/null, so no "Exception ignored" line at exit. Any other
    OSError is returned as it is (raised again)."""
    import errno

    if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF):
        return e
    from ..oneline import one_line

    where = f"{e.filename}" if e.filename else "standard output"
    _stdout_to_devnull()
    sys.stderr.write(one_line(f"error: cannot write {where}: {e.strerror or e}") + "\n")
    return typer.Exit(EXIT_FAILED)


def _one_line(e: clickx.UsageError, where: str | None = None) -> clickx.UsageError:
    """e, shown as one line (Group); where: the command whose help to name when e has no
    context (an option missing its value). `tracelake` without arguments still prints its help."""
    if not isinstance(e, clickx.NoArgsIsHelpError):
        line = usage_line(e, where)
        # written as it is (what err.print wrote, without importing rich for it, nor rich's :emoji:
        # codes replaced in a path)
        e.show = lambda file=None: sys.stderr.write(line + "\n")
    return e


def usage_line(e: clickx.UsageError, where: str | None = None) -> str:
    """The one line of a usage error: click's message (a BadParameter a command raises without
    naming its option says it itself) with its first word in lower case, and where help is."""
    from ..oneline import one_line

    if isinstance(e, clickx.BadParameter) and e.param is None and e.param_hint is None:
        msg = e.message
    else:
        msg = e.format_message()
    if msg[:1].isupper() and msg[1:2].islower():
        msg = msg[0].lower() + msg[1:]
    path = (e.ctx.command_path if e.ctx is not None else where or "").split()
    cmd = " ".join(["tracelake", *path[1:]])  # the program as the docs name it, however it was started
    return one_line(f"error: {msg.rstrip('.')} (see {cmd} --help)")


# plain click help (no rich panels): options shown as `--lake DIR`, wrapped at 80 columns, as
# git or pip print theirs; errors are one line, never a rich traceback of locals
app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 80},
    help="tracelake: is a distributed training run network-bound, waiting on a peer, or compute-bound? "
    "Ingest PyTorch "
    "profiler traces, Nsight Systems exports and NCCL logs into a Parquet lake, query it with DuckDB, "
    "write an offline HTML report. " + EXIT_HELP,
)


class Command(typer.core.TyperCommand):
    """A command whose help follows click's conventions: an argument is shown by its metavar
    (`TRACES...`), never with a Python type name (typer prints `<list[Path]>` for it); its
    parameters convert their values through cli/params.py (plain_params)."""

    def get_params(self, ctx):
        return plain_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx):
        return [self.options_metavar] + [
            (p.metavar or p.name.upper())
            if p.param_type_name == "argument"
            else " ".join(p.get_usage_pieces(ctx))
            for p in self.get_params(ctx)
            if p.get_usage_pieces(ctx)
        ]

    def format_options(self, ctx, formatter):
        args, opts = [], []
        for p in self.get_params(ctx):
            rv = p.get_help_record(ctx)
            if rv is None:
                continue
            if p.param_type_name == "argument":
                args.append((p.metavar or p.name.upper(), p.help or ""))
            else:
                opts.append(rv)
        for title, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def command(**kwargs):
    """app.command with the Command class: every tracelake command is declared with it."""
    return app.command(cls=Command, **kwargs)


class LazyConsole:
    """A rich Console made on first use, with these arguments: `tracelake --help` and a usage
    error import no rich (0.05 of their 0.15 CPU-s). Attribute lookups go to the Console;
    `.console` is the Console itself (for what needs one, such as a Progress)."""

    def __init__(self, **kwargs):
        self._kwargs, self._console = kwargs, None

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
            self._console.on_broken_pipe = _broken_pipe  # rich's own exits 1: Group.invoke decides
        return self._console

    def __getattr__(self, name: str):
        return getattr(self.console, name)


def _broken_pipe() -> None:
    raise BrokenPipeError(32, "Broken pipe")


def real_console(console):
    """The rich Console behind a LazyConsole (a Console given as it is)."""
    return console.console if isinstance(console, LazyConsole) else console


class _ClosedStdout:
    """Standard output when the command was started with it closed (`tracelake runs >&-`: Python
    sets sys.stdout to None): a command that prints nothing succeeds; one that prints fails in
    one line, exit 4 (output_failed), as on a full disk."""

    def write(self, text: str) -> int:
        import errno

        raise OSError(errno.EBADF, "standard output is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("standard output is closed")


if sys.stdout is None:
    sys.stdout = _ClosedStdout()
err = LazyConsole(stderr=True, highlight=False, soft_wrap=True)
out = LazyConsole(highlight=False, width=None if sys.stdout.isatty() else 240)


def _version(v: bool):
    if v:
        print(f"tracelake {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
):
    pass


class NoBar:
    """A rich Progress that shows nothing, for when no bar is shown (quiet, or stderr not a
    terminal: logs, CI, scripts), without importing rich.progress (12-20 ms of the small job's
    `run`, `python -X importtime`). It keeps what the commands read back of their task (total,
    completed, fields) and prints through `console` (prog.console.print)."""

    def __init__(self, console):
        self.console = console
        self.tasks: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description: str, total=None, **fields) -> int:
        import types

        self.tasks.append(
            types.SimpleNamespace(description=description, total=total, completed=0, fields=fields)
        )
        return len(self.tasks) - 1

    def update(self, task: int, *, total=None, completed=None, advance=None, **fields) -> None:
        t = self.tasks[task]
        if total is not None:
            t.total = total
        if completed is not None:
            t.completed = completed
        if advance:
            t.completed += advance
        t.fields.update(fields)


def bar(quiet: bool, *columns):
    """A rich Progress on stderr with these columns (each a callable of rich.progress, called with
    it: the columns need it imported), transient; a NoBar when quiet or stderr is not a
    terminal."""
    if quiet or not err.is_terminal:
        return NoBar(err)
    import rich.progress as rp

    return rp.Progress(*(c(rp) for c in columns), console=real_console(err), transient=True)


@contextlib.contextmanager
def progress(label: str, quiet: bool = False):
    """A progress bar on stderr (shown only on a terminal; none with quiet), for work reported
    as on_progress(stage, done, total): yields that callback. Results go to stdout; the bar is
    cleared when the work ends."""
    with bar(
        quiet,
        lambda rp: rp.TextColumn(f"[bold]{label}"),
        lambda rp: rp.BarColumn(),
        lambda rp: rp.MofNCompleteColumn(),
        lambda rp: rp.TextColumn("{task.fields[stage]}"),
        lambda rp: rp.TimeElapsedColumn(),
    ) as prog:
        task = prog.add_task(label, total=None, stage="")

        def update(stage: str, done: int, total: int) -> None:
            prog.update(task, completed=done, total=total, stage=stage)

        yield update


def preload_charts(fmt: str) -> str:
    """fmt; when it is html and the report's chart templates were not kept yet for this altair and
    these chart modules (pipeline/report/spec_cache.py: with them kept, the report needs no altair),
    the report's chart library (altair, pipeline/report/altair_lib.py: 0.3-0.6 s of imports, 2.6 s
    in an environment with jsonschema's format extras before altair_lib) starts importing in a
    thread of its own, so that it overlaps the analysis before the report (most of its time is
    DuckDB binding and running the queries, which releases the GIL); the report then finds it
    imported, or waits for the import to end (Python's module lock). A failed import is left to
    the report's own import, which then raises it."""
    if fmt == "html" and "altair" not in sys.modules:
        from ..report import spec_cache

        if spec_cache.warm():
            return fmt
        import threading

        def load() -> None:
            with contextlib.suppress(Exception):
                from ..report.altair_lib import load

                load()

        threading.Thread(target=load, name="tracelake-preload-charts", daemon=True).start()
    return fmt


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        err.print(f"error: {path}: cannot write: {e.strerror or e}", markup=False)
        raise typer.Exit(EXIT_FAILED)


def usage_error(message: str) -> typer.Exit:
    """Print one line `error: message` on stderr; the Exit(2) to raise (a usage error: the
    command did no work)."""
    from ..oneline import one_line

    err.print(one_line(f"error: {message}"), markup=False)
    return typer.Exit(EXIT_USAGE)


def existing_lake(lake_dir: Path):
    """The Lake at lake_dir for a command that reads it (analyze, report, sql, forget). Raises
    Exit(2) with one line when there is no lake there (nothing is created)."""
    from ..lake import Lake, LakeError

    lake = Lake(lake_dir)
    try:
        exists = lake.exists()
    except LakeError as e:  # a lake in a bucket that cannot be reached (pipeline/lake_s3.py)
        raise usage_error(str(e))
    if not exists and getattr(lake, "remote", False):
        raise usage_error(
            f"{lake.root}: not a tracelake lake (no TRACELAKE object; run `tracelake ingest TRACES "
            f"--lake {lake.root}` first)"
        )
    if not exists:
        hint = (
            "a file, not a directory"
            if lake.root.exists() and not lake.root.is_dir()
            else "a directory without the TRACELAKE marker"
            if lake.root.is_dir() and any(lake.root.iterdir())
            else f"run `tracelake ingest TRACES --lake {lake_dir}` first"
            if not lake.root.exists()
            else "an empty directory"
        )
        raise usage_error(f"{lake_dir}: not a tracelake lake ({hint})")
    return lake


def _clip(text: str, n: int = 300) -> str:
    """A message cut to n characters (ids and run lists can be long)."""
    return text if len(text) <= n else text[: n - 1] + "…"
