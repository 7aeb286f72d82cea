"""`tracelake whatif`: what a run's step would take after a change, replayed across ranks
(pipeline/whatif/; docs/usage.md "What-if"; docs/whatif.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .app import EXIT_FAILED, _write, command, err, existing_lake, exit_help, usage_error
from .options import LAKE, check_output, one_run

EPILOG = exit_help()


def _ms(ns: float) -> str:
    return f"{round(ns / 1e6, 3) + 0.0:.3f}"  # + 0.0: no "-0.000" for a gain of a few ns


def _segments(items: list[dict]) -> str:
    return ", ".join(f"{s['kind']} (rank {s['rank']}) {_ms(s['ns'])} ms" for s in items) or "-"


def render_text(doc: dict) -> str:
    lines = [
        f"run {doc['run_id']}: {doc['ranks']} rank(s), {doc['steps']} step(s) replayed",
        f"measured step {_ms(doc['baseline_step_ns'])} ms; identity replay {_ms(doc['identity_step_ns'])} ms "
        f"(error {doc['identity_error_pct']:.3f} %)",
        f"critical path per step: {_segments(doc['critical_path'])}",
        "",
    ]
    width = max([len(c["label"]) for c in doc["changes"]] + [10])
    lines.append(f"{'what if':<{width}}  {'step ms':>10}  {'gain ms':>9}  {'gain %':>7}")
    for c in doc["changes"]:
        lines.append(
            f"{c['label']:<{width}}  {_ms(c['predicted_step_ns']):>10}  {_ms(c['gain_ns']):>9}  "
            f"{round(c['gain_pct'], 2) + 0.0:>7.2f}"
        )
        lines.append(f"  critical path: {_segments(c['critical_path'])}")
        if c.get("leaves_out"):
            lines.append(f"  leaves out: {c['leaves_out']}")
    return "\n".join(lines) + "\n"  # the notes go to stderr (whatif(), as analyze's)


@command(epilog=EPILOG)
def whatif(
    lake: Path = LAKE,
    run_id: Optional[str] = typer.Option(
        None, "--run", metavar="RUN", help="The run (default: the lake's only run)."
    ),
    scale: List[str] = typer.Option(
        [],
        "--scale",
        metavar="kernel:GLOB=F|category:NAME=F",
        help="GPU work whose name matches GLOB, or of category NAME (compute, communication, memory), "
        "takes F times its time; repeatable, each its own what-if.",
    ),
    collectives: List[str] = typer.Option(
        [],
        "--collectives",
        metavar="peak|overlap",
        help="Collectives at the link's peak bus bandwidth, or free.",
    ),
    on_time: List[int] = typer.Option(
        [],
        "--on-time",
        metavar="RANK",
        help="RANK arrives at every collective when the last other rank does.",
    ),
    no_launch_gaps: bool = typer.Option(
        False, "--no-launch-gaps", help="The host's launch work takes no time (as in a CUDA graph)."
    ),
    no_data_loading: bool = typer.Option(False, "--no-data-loading", help="DataLoader fetches take no time."),
    durations_from: Optional[str] = typer.Option(
        None,
        "--durations-from",
        metavar="RUN",
        help="Every kernel takes the duration of the same kernel (name and shape) in RUN (of --lake, "
        "or of --durations-lake).",
    ),
    durations_lake: Optional[Path] = typer.Option(
        None, "--durations-lake", metavar="DIR", help="The lake that holds --durations-from's run."
    ),
    host_durations: bool = typer.Option(
        False,
        "--host-durations",
        help="With --durations-from: the host's calls and the host work between them take RUN's "
        "durations too (by name and occurrence in the step).",
    ),
    fmt: str = typer.Option("text", "--format", "-f", metavar="text|json", help="Output format."),
    output: Optional[Path] = typer.Option(
        None, "-o", "--output", metavar="FILE", help="File to write (default: standard output)."
    ),
):
    """Replay one run's steps across ranks with changes: the measured step, the identity replay's error,
    and per change the predicted step time with its critical path. Without a change: the default
    what-ifs (the straggler on time, collectives at peak and overlapped, no launch gaps, no data
    loading)."""
    import duckdb

    from .. import query
    from .. import whatif as wi
    from ..lake import Lake, LakeError, one_line

    if fmt not in ("text", "json"):
        raise usage_error(f"--format {fmt!r}: text or json")
    for c in collectives:  # checked before any import of the replay (a usage error stays cheap)
        if c not in ("peak", "overlap"):
            raise usage_error(f"--collectives {c!r}: peak or overlap")
    given_alone = (("--durations-lake", durations_lake is not None), ("--host-durations", host_durations))
    for flag, given in given_alone:
        if given and durations_from is None:
            raise usage_error(f"{flag} goes with --durations-from RUN: give --durations-from too")
    check_output(output, [lake])
    lk = existing_lake(lake)
    run_id = one_run(lk, lake, run_id)
    try:
        wanted = [wi.changes.scale(s) for s in scale]
    except ValueError as e:
        raise usage_error(str(e))
    wanted += [wi.changes.collectives(c) for c in collectives] + [wi.changes.on_time(r) for r in on_time]
    if no_launch_gaps:
        wanted.append(wi.changes.no_launch_gaps())
    if no_data_loading:
        wanted.append(wi.changes.no_data_loading())
    try:
        # the collective views computed once; no metric view (the replay's SQL reads none)
        con = query.connect(lk, runs=[run_id], materialize=True, metric_views=())
        if durations_from is not None:
            olk = existing_lake(durations_lake) if durations_lake is not None else lk
            okn = set(olk.sources()["run_id"].drop_nulls().to_list())
            if durations_from not in okn:
                raise usage_error(
                    f"--durations-from {durations_from}: not a run of {olk.root} "
                    f"(runs: {', '.join(sorted(okn)) or 'none'})"
                )
            ocon = query.connect(olk, runs=[durations_from], materialize=True, metric_views=())
            try:
                other = wi.build(ocon, durations_from)
            except ValueError as e:  # a run with no GPU work has no durations to give
                raise usage_error(f"--durations-from {durations_from}: {e}") from None
            wanted.append(wi.changes.durations_from(other, host=host_durations))
            del other
            ocon.close()
        g = wi.build(con, run_id)
        try:  # a change the run cannot take (Change.check): a usage error
            wi.changes.check(g, wanted)
        except ValueError as e:
            raise usage_error(str(e)) from None
        if not wanted:
            wanted = wi.changes.defaults(g)
        doc = wi.whatif(con, run_id, wanted, graph=g)
    except ValueError as e:
        err.print(one_line(f"error: {e}"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    except (LakeError, duckdb.Error) as e:
        err.print(one_line(f"error: {Lake(lake).root}: {str(e).splitlines()[0]}"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    text = json.dumps(doc, indent=2) + "\n" if fmt == "json" else render_text(doc)
    if output is None or str(output) == "-":
        sys.stdout.write(text)
    else:
        _write(output, text)
    if fmt != "json":  # as analyze: the text's notes on stderr, one line each (JSON: in "notes")
        for n in doc["notes"]:
            err.print(one_line(f"note: {n}"), markup=False)
