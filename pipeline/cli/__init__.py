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

from ..thread_env import set_cli_threads

set_cli_threads()  # before any command imports numpy or polars (pipeline/thread_env.py)

from . import analysis_cmd, diff_cmd, ingest_cmd, lake_cmd, runs_cmd, timeline_cmd, whatif_cmd  # noqa: E402, F401  (each registers its commands on app)
from .app import EXIT_FAILED, EXIT_HELP, EXIT_OK, EXIT_PARTIAL, app  # noqa: E402


def __getattr__(name: str):
    """_RateColumn, the ingest progress bar's MB/s column (made on first use: ingest_cmd.rate_column)."""
    if name == "_RateColumn":
        return ingest_cmd.rate_column()
    raise AttributeError(name)


__all__ = ["EXIT_FAILED", "EXIT_HELP", "EXIT_OK", "EXIT_PARTIAL", "app", "_RateColumn"]
