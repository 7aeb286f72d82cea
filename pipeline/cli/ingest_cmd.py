"""`tracelake ingest`: files into the lake, with a progress bar of files, MB/s and errors."""

from __future__ import annotations

import contextlib
import functools
import re
from pathlib import Path
from typing import List, Optional

import typer

from .app import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, bar, command, err, exit_help, usage_error
from .interrupt import Interrupted, signals_interrupt
from .options import (
    COMM,
    EXCLUDE,
    FORCE,
    JOBS,
    LAKE,
    PATHS,
    QUIET,
    RANK,
    RUN,
    SCHEDULER_INGEST,
    STEPS,
    _check_patterns,
)


def check_inputs(paths: list[Path], lake_dir: Path) -> None:
    """Usage errors (exit 2, one line, nothing created) before any ingest work: a path given that
    does not exist, or a --lake that is a file or a non-empty directory without the TRACELAKE
    marker (a mistyped --lake never mixes the lake into, say, a directory of traces). An s3:// path
    or lake: its bucket must exist (pipeline/objstore.py; the lake's prefix is checked by Lake.ensure)."""
    from .. import objstore

    for p in [*paths, lake_dir]:
        if objstore.is_url(p):
            try:
                objstore.check_bucket(str(p), whole=p is not lake_dir)
            except objstore.ObjectStoreError as e:
                raise usage_error(str(e))
    if objstore.is_url(lake_dir):
        lake_dir = Path("/nonexistent/tracelake")  # (its prefix is checked by Lake.ensure)
    paths = [p for p in paths if not objstore.is_url(p)]
    missing = [str(p) for p in paths if not (p.exists() or p.is_symlink())]
    if missing:
        raise usage_error(f"{', '.join(missing)}: no such file or directory")
    if lake_dir.exists() and not lake_dir.is_dir():
        raise usage_error(f"--lake {lake_dir}: exists and is not a directory")
    if lake_dir.is_dir() and not (lake_dir / "TRACELAKE").exists() and any(lake_dir.iterdir()):
        raise usage_error(
            f"--lake {lake_dir}: not a tracelake lake (no TRACELAKE file), and not empty; give a new "
            "or empty directory, or an existing lake"
        )


def _ingest_run(run: str, lake) -> str:
    """The run `ingest --run` adds to: the lake's run the value names for the read commands
    (runid.resolve_run: `--run v1.2` is v1.2/'s run v1.2-<6 hex> when the lake holds it, as
    `runs --run v1.2` reads it), with a note on stderr when that is not the run the value alone
    names (runid.given_run_id: a new lake's); else
    the value as a new run's id (runs.run_for). Raises BadParameter when it names several runs."""
    from ..ingest.runid import given_run_id
    from ..lake import one_line
    from .options import resolve_one

    found = resolve_one(run, set(lake.sources()["run_id"].drop_nulls().to_list()))
    if found is not None and found != given_run_id(run):
        err.print(
            one_line(f"note: --run {run} is run {found} of the lake (as runs and analyze read it)"),
            markup=False,
        )
    return found or run


def no_empty_path(paths: list[str]) -> None:
    """TRACES arrive as text: an empty one (an unset `$TRACES`) names no file, where Path('') would
    be the current directory, searched and ingested. Raises BadParameter (exit 2)."""
    if any(not str(p) for p in paths):
        raise typer.BadParameter("TRACES: an empty path names no file (an unset variable?)")


def _ingest(
    paths: list[str],
    lake_dir: Path,
    run: str | None,
    rank: int | None,
    force: bool,
    comm_pattern: list[str],
    step_range: str | None = None,
    jobs: int = 0,
    scheduler: str | None = None,
    exclude: list[str] | None = None,
    runs: set | None = None,
    quiet: bool = False,
) -> int:
    """Ingest with the command's options; returns the exit code. runs: filled with the run ids
    of the files ingested or skipped as already in the lake; quiet: no progress bar. Raises
    Exit(2) for a usage error (check_inputs) before any work; Exit(128 + N) when signal N (SIGINT,
    SIGTERM, SIGHUP) stops the ingest, once every process it started has ended (one line says
    so)."""
    from .. import objstore

    _check_patterns(comm_pattern)
    if run is not None and not run.strip():
        raise typer.BadParameter("--run: empty run id (leave --run out to name runs by their directories)")
    if step_range:
        from ..classify import check_regex  # (polars: imported when a pattern is given)

        try:
            check_regex(step_range)
        except re.error as e:
            raise typer.BadParameter(f"--step-range {step_range!r}: {e}")
    if jobs < 0:
        raise typer.BadParameter("--jobs must be 0 (one per core) or more")
    if rank is not None and not 0 <= rank < 2**31:  # the lake's rank column is INTEGER
        raise typer.BadParameter(f"--rank {rank}: a rank is 0 to {2**31 - 1}")
    no_empty_path(paths)
    # s3:// paths (typer's Path dropped one slash of the scheme): pipeline/objstore.py
    paths = [objstore.normalize(p) if objstore.is_url(p) else Path(p) for p in paths]
    lake_dir = objstore.normalize(lake_dir) if objstore.is_url(lake_dir) else lake_dir
    check_inputs(paths, lake_dir)  # (before ingest's imports: a mistyped path costs no pyarrow)
    # a process pool's forkserver imports beside this process's imports, and is stopped whatever
    # happens once the ingest is done (pipeline/pool_scope.py early_start); from its start on, a
    # stopping signal ends the command cleanly, as it does during the ingest
    from .. import pool_scope

    workers = pool_scope.pool_workers(paths, jobs) if scheduler is None else 0
    work = functools.partial(
        _ingest_files, paths, lake_dir, run, rank, force, comm_pattern, step_range, jobs, scheduler, exclude,
        runs, quiet,
    )  # fmt: skip
    if not workers:
        return work()
    with contextlib.ExitStack() as early:
        try:
            early.enter_context(signals_interrupt())
            early.enter_context(pool_scope.helpers_stopped())
            pool_scope.early_start(workers)
            return work()
        except Interrupted as e:  # outside the ingest itself (which says how many files it stored)
            early.close()  # the forkserver and the resource tracker stopped first
            raise interrupted(e)


def interrupted(e: Interrupted, files: int | None = None) -> typer.Exit:
    """The one line an ingest stopped by a signal says (with the files it stored, when it counted
    them), and its exit (128 + the signal's number)."""
    done = "" if files is None else f" ({files} file(s))"
    err.print(
        f"error: interrupted by {e.name}: what was ingested before it{done} stays in the lake; run the "
        "same command again to ingest the rest",
        markup=False,
    )
    return typer.Exit(e.exit_code)


def _ingest_files(
    paths, lake_dir, run, rank, force, comm_pattern, step_range, jobs, scheduler, exclude, runs, quiet
) -> int:
    """_ingest's work once its options are checked (paths: Path or normalized s3:// URLs)."""
    from .. import objstore
    from ..cluster import SchedulerError
    from ..ingest import discover, exclude_patterns, ingest_paths
    from ..lake import Lake, LakeError, one_line

    try:
        exclude = exclude_patterns(exclude)
    except ValueError as e:
        raise typer.BadParameter(str(e))
    problems: list = []
    left_out: list = []
    not_logs: list = []
    local = [p for p in paths if not objstore.is_url(p)]
    files = discover(local, problems, exclude, left_out, not_logs=not_logs)
    if not files and not problems and len(local) == len(paths):
        err.print(
            one_line(
                "error: no trace files (*.json, *.json.gz, *.gz, *.sqlite, *.nsys-rep, *.qdrep, *_pqtdir/, "
                "*.tar, *.tar.gz, *.zip; NCCL logs *.log, *.txt, *.out, *.err, *.jsonl) in "
                + ", ".join(str(p) for p in paths)
                + (f" ({len(left_out)} left out by --exclude)" if left_out else "")
                + (f"; {passed_over(not_logs)}" if not_logs else "")
            ),
            markup=False,
        )
        return EXIT_FAILED
    not_logs = []  # filled again by the ingest, with the archive members passed over
    lake = Lake(lake_dir)
    if run is not None:
        run = _ingest_run(run, lake)
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    not_traces = []
    with bar(
        quiet,
        lambda rp: rp.TextColumn("[bold]ingest"),
        lambda rp: rp.BarColumn(),
        lambda rp: rp.MofNCompleteColumn(),
        lambda rp: rp.TextColumn("files"),
        lambda rp: rate_column()(),
        lambda rp: rp.TextColumn("{task.fields[errors]} error(s)"),
        lambda rp: rp.TimeElapsedColumn(),
    ) as prog:
        task = prog.add_task("ingest", total=None, mb=0.0, errors=0)

        def on_file(res):
            counts["ok" if res.status in ("ok", "partial") else res.status] += 1
            if res.again:  # a held file reported ok before, failed now: counted once, as failed
                counts["ok"] -= 1
            if runs is not None and res.status != "failed" and res.run_id:
                runs.add(res.run_id)
            t = prog.tasks[task]
            if not res.again and t.total is not None and t.completed + 1 > t.total:  # a tar's members
                prog.update(task, total=t.completed + 1)
            prog.update(
                task,
                advance=0 if res.again else 1,
                mb=t.fields["mb"] + (0 if res.again else res.uncompressed_bytes / 1e6),
                errors=counts["failed"],
            )
            if res.status == "failed":
                prog.console.print(one_line(f"failed {res.path}: {res.error}"), markup=False, style="red")
                if (res.error or "").startswith("not a Kineto trace"):
                    not_traces.append(res.path)
            # a skipped file's note only when its content is held in another run (so the run
            # this file names lacks it); re-ingesting a directory already in the lake stays quiet
            for n in res.notes:
                if res.status != "skipped" or res.held_in is not None:
                    prog.console.print(one_line(f"note {res.path}: {n}"), markup=False)

        try:
            with signals_interrupt():  # a clean stop: nothing it started outlives the command
                ingest_paths(
                    paths,
                    lake,
                    run=run,
                    rank=rank,
                    force=force,
                    comm_patterns=comm_pattern,
                    on_file=on_file,
                    step_regex=step_range,
                    jobs=jobs,
                    scheduler=scheduler,
                    exclude=exclude,
                    on_plan=lambda n: prog.update(task, total=n),
                    not_logs=not_logs,
                )
        except Interrupted as e:
            raise interrupted(e, sum(counts.values()))
        except (LakeError, SchedulerError) as e:
            err.print(one_line(f"error: {e}"), markup=False)
            return EXIT_FAILED
        except OSError as e:
            err.print(
                one_line(f"error: {lake_dir}: cannot write to the lake: {e.strerror or e}"), markup=False
            )
            return EXIT_FAILED
    err.print(
        one_line(
            f"ingested {counts['ok']}, failed {counts['failed']}, skipped {counts['skipped']} (already in "
            f"the lake) -> {lake_dir}"
        ),
        markup=False,
    )
    if not_logs:
        err.print(one_line(f"note: {passed_over(not_logs)}"), markup=False)
    given = [o for o, v in (("--comm-pattern", comm_pattern), ("--step-range", step_range)) if v]
    if given and counts["skipped"] and not force:
        # they change the rows ingest writes, but a file already in the lake is not read again
        err.print(
            f"note: {' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to the files "
            f"ingested now, not to the {counts['skipped']} skipped as already in the lake: --force "
            "re-ingests those with them",
            markup=False,
        )
    if not_traces:
        err.print(
            one_line(
                f"hint: {len(not_traces)} file(s) are not traces (e.g. {Path(not_traces[0]).name}); "
                "leave such files out with --exclude PATTERN"
            ),
            markup=False,
        )
    if not sum(counts.values()):  # archives whose every member was left out or is not ours
        err.print(
            one_line(
                "error: nothing to ingest in "
                + ", ".join(str(p) for p in paths)
                + (": every archive member was left out by --exclude or is not a trace" if exclude else "")
            ),
            markup=False,
        )
        return EXIT_FAILED
    if counts["failed"] and counts["ok"] + counts["skipped"] == 0:
        return EXIT_FAILED
    return EXIT_PARTIAL if counts["failed"] else EXIT_OK


def passed_over(paths: list) -> str:
    """What a batch passed over as files named like logs that are not NCCL-family logs (found by
    searching a directory, or archive members): one clause naming the first three."""
    from ..ingest.discover import NOT_A_LOG

    names = [str(p) for p in paths]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"passed over {len(names)} file(s) named like logs that are {NOT_A_LOG}: {shown}"


@functools.cache
def rate_column() -> type:
    """The progress bar's column of uncompressed MB ingested per second of the task's elapsed time
    (a rich ProgressColumn class, made on first use: rich.progress is imported only by a command
    that shows a bar, not by `--help`; `_RateColumn`, this module's attribute, is the same)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class _RateColumn(ProgressColumn):
        def render(self, task) -> Text:
            mb, el = task.fields.get("mb", 0.0), task.elapsed or 0.0
            return Text(f"{mb:,.1f} MB  {mb / el if el > 0 else 0.0:,.1f} MB/s")

    return _RateColumn


def __getattr__(name: str):
    if name == "_RateColumn":
        return rate_column()
    raise AttributeError(name)


@command(epilog=exit_help(files=True))
def ingest(
    paths: List[str] = PATHS,
    lake: Path = LAKE,
    run: Optional[str] = RUN,
    rank: Optional[int] = RANK,
    force: bool = FORCE,
    comm_pattern: List[str] = COMM,
    step_range: Optional[str] = STEPS,
    jobs: int = JOBS,
    scheduler: Optional[str] = SCHEDULER_INGEST,
    exclude: List[str] = EXCLUDE,
    quiet: bool = QUIET,
):
    """Ingest traces and archives of them (.tar, .tar.gz, .zip) into the lake: in parallel, skipping files
    already there, crash-safe (one bad file never stops the batch)."""
    raise typer.Exit(
        _ingest(
            paths, lake, run, rank, force, comm_pattern, step_range, jobs, scheduler, exclude, quiet=quiet
        )
    )
