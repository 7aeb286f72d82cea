"""`tracelake timeline`: a run's window as a trace file for the Perfetto UI and chrome://tracing
(pipeline/timeline/), and the timeline `tracelake run --timeline` writes beside its report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import EXIT_FAILED, EXIT_OK, command, err, existing_lake, exit_help, usage_error
from .options import (
    LAKE,
    MAX_EVENTS,
    QUIET,
    TIMELINE_ALL,
    TIMELINE_AROUND,
    TIMELINE_RANKS,
    TIMELINE_RUN,
    TIMELINE_STEPS,
    one_run,
)


@command(epilog=exit_help())
def timeline(
    output: Path = typer.Option(
        Path("timeline.json.gz"),
        "-o",
        "--output",
        metavar="FILE",
        help="Trace file to write: .json or .json.gz (Chrome JSON), or .pftrace (Perfetto's protobuf).",
    ),
    lake: Path = LAKE,
    run_id: Optional[str] = TIMELINE_RUN,
    steps: Optional[str] = TIMELINE_STEPS,
    ranks: Optional[str] = TIMELINE_RANKS,
    around: Optional[str] = TIMELINE_AROUND,
    all_steps: bool = TIMELINE_ALL,
    max_events: int = MAX_EVENTS,
    quiet: bool = QUIET,
):
    """Write one run's timeline for the Perfetto UI (ui.perfetto.dev) or chrome://tracing: a process per
    rank with its CPU threads and GPU streams, the GPU's idle gaps by cause, flows from the last rank into
    each matched collective, and the findings (docs/usage.md, Timeline)."""
    from .. import timeline as tlm

    try:
        tlm.check_output(output)
    except tlm.TimelineError as e:
        raise usage_error(str(e))
    if not output.absolute().parent.is_dir():
        raise usage_error(f"-o {output}: directory {output.absolute().parent} does not exist")
    if all_steps and steps is not None:
        raise usage_error("give --steps or --all, not both")
    if all_steps and around is not None:
        raise usage_error("give --around or --all, not both (--around shows the finding's steps)")
    lk = existing_lake(lake)
    run_id = one_run(lk, lake, run_id)
    code = write_timeline(
        lk,
        run_id,
        output,
        ranks=ranks,
        steps=steps,
        around=around,
        all_steps=all_steps,
        max_events=max_events,
    )
    raise typer.Exit(code)


def write_timeline(lk, run_id: str, output: Path, doc: dict | None = None, **selection) -> int:
    """Build and write one timeline; prints what it wrote (stderr). Returns the exit code: 0, 2
    for a selection that cannot be given (one line), 4 when the lake cannot be read or the file
    written."""
    import duckdb

    from .. import timeline as tlm
    from ..lake import LakeError, one_line
    from ..timeline.window import ranges_text

    try:
        tl = tlm.build(lk, run_id, doc=doc, **selection)
        size = tlm.write(tl, output)
    except tlm.TimelineError as e:
        err.print(one_line(f"error: {e}"), markup=False)
        return 2
    except (LakeError, duckdb.Error) as e:
        err.print(one_line(f"error: {lk.root}: {str(e).splitlines()[0]}"), markup=False)
        return EXIT_FAILED
    except OSError as e:
        err.print(one_line(f"error: {output}: cannot write: {e.strerror or e}"), markup=False)
        return EXIT_FAILED
    lanes = sum(1 for n in tl.thread_names.values() if "(overlap" in n)
    err.print(
        one_line(
            f"wrote {output}: run {run_id}, {tl.window.how}, ranks {ranges_text(tl.ranks)}: "
            f"{len(tl.slices):,} slices, {len(tl.flows):,} flows"
            + (f", {lanes} overlap track(s)" if lanes else "")
            + f", {size / 2**20:.1f} MiB"
        ),
        markup=False,
    )
    return EXIT_OK
