"""The `tracelake` typer application, its exit codes and its two consoles (results on stdout,
messages on stderr). The commands live in ingest_cmd.py, analysis_cmd.py and lake_cmd.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from .. import __version__

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED = 0, 3, 4
EXIT_USAGE = 2  # typer/click's code for a bad option or argument
EXIT_HELP = (
    "Exit codes: 0 all good; 2 usage error; 3 some files (or, with --scheduler, some runs' analyses) failed, "
    "the rest done; 4 total failure."
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="tracelake: is a distributed training run network-bound or compute-bound? Ingest PyTorch "
    "profiler traces, Nsight Systems exports and NCCL logs into a Parquet lake, query it with DuckDB, "
    "write an offline HTML report. " + EXIT_HELP,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 240)


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


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        err.print(f"error: {path}: cannot write: {e.strerror or e}", markup=False)
        raise typer.Exit(EXIT_FAILED)


def _clip(text: str, n: int = 300) -> str:
    """A message cut to n characters (ids and run lists can be long)."""
    return text if len(text) <= n else text[: n - 1] + "…"
