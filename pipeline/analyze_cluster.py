"""Per-run analysis on an existing Dask cluster (`tracelake analyze|report|run --scheduler ADDRESS`).

analyze_on_cluster(lake, scheduler, ...) goes through analyze()'s stages (pipeline/analyze.py):
it selects the runs and reads the kept results of those whose inputs, options and code did not
change; each other run is one task on the cluster (the worker opens the lake from the same path,
which must be on a file system the workers share, and calls pipeline.analyze.analyze(lake,
runs=[run_id]) with the same options, which keeps its result in the lake); the documents are
assembled as analyze() assembles them (every metric is computed per run, every list is ordered
by run first), so the result equals analyze(lake).

A task that fails (an exception in the analysis, a worker lost) does not lose the others: the run
is left out of the document and a one-line note says which run and why (`run ID: not analysed: ...`),
where that run's notes would be; analyze_on_cluster also returns the failures so the command can
say so and exit 3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from .analyze import analyze, assemble, read_kept, run_part, select_runs
from .analyze_compute import failed_note
from .cluster import client
from .lake import Lake, one_line


@dataclass(frozen=True)
class RunFailure:
    run_id: str
    error: str  # one line: the exception's type and message


def _analyze_run(root: str, run_id: str, options: dict) -> dict:
    """The Dask task: the run's part of the analysis of the lake at `root` (on the worker; the
    worker keeps it in the lake)."""
    return run_part(analyze(Lake(Path(root)), runs=[run_id], **options))


def analyze_on_cluster(
    lake: Lake,
    scheduler: str,
    window: str = "all",
    kernel_wait_threshold_ns: int = 30_000,
    top_n: int | None = 20,
    peak_tflops: float | None = None,
    model_flops_per_step: float | None = None,
    runs: list[str] | None = None,
    tokens_per_step: float | None = None,
    palm_flops_per_token: float | None = None,
    global_tokens_per_step: float | None = None,
    gpu_hour_cost: float | None = None,
    on_progress=None,
    keep: bool = True,
    recompute: bool = False,
) -> tuple[dict, list[RunFailure]]:
    """analyze(lake, ...) computed one run per Dask task on the cluster at `scheduler`.

    Returns (document, failures): the document equals analyze(lake, ...) when failures is empty;
    each failed run is absent from it and has a `run ID: not analysed: ...` note. Raises
    FileNotFoundError if the lake does not exist, SchedulerError when the scheduler cannot be
    reached. runs: only these runs (None: every run of the lake). on_progress(run_id, done,
    total), if given, is called as each run's task finishes (or fails). keep: read the kept
    results and have the workers keep theirs (False: every run is a task, nothing kept);
    recompute: every run is a task, and the workers keep their new results."""
    if not lake.exists():
        raise FileNotFoundError(f"{lake.root}: not a tracelake lake (run `tracelake ingest` first)")
    options = dict(
        window=window,
        kernel_wait_threshold_ns=kernel_wait_threshold_ns,
        top_n=top_n,
        peak_tflops=peak_tflops,
        model_flops_per_step=model_flops_per_step,
        tokens_per_step=tokens_per_step,
        palm_flops_per_token=palm_flops_per_token,
        global_tokens_per_step=global_tokens_per_step,
        gpu_hour_cost=gpu_hour_cost,
    )
    src, keys, _ = select_runs(lake, runs, options, keep=keep and not recompute)
    docs = read_kept(lake, keys) if keep and not recompute else {}
    root = str(lake.root.absolute())
    failures: dict[str, str] = {}
    missing = [r for r in sorted(keys) if r not in docs]
    if missing:
        with client(scheduler) as c:
            task = {**options, "keep": keep, "recompute": recompute}
            futures = [(r, c.submit(_analyze_run, root, r, task, pure=False)) for r in missing]
            for r, fut in futures:
                try:
                    docs[r] = fut.result()
                except Exception as e:  # the analysis raised, or the worker died (KilledWorker)
                    first = next(
                        (ln.strip() for ln in str(e).splitlines() if ln.strip()), ""
                    )  # DuckDB adds the SQL below
                    failures[r] = one_line(f"{type(e).__name__}: {first}" if first else type(e).__name__)[
                        :300
                    ]
                finally:
                    fut.release()
                    if on_progress is not None:
                        on_progress(f"run {r}", len(docs) + len(failures), len(keys))
    # a failed task's run: one note for the task, then its files that failed to ingest (as the
    # run's own document would have them)
    if failures and src is None:  # the keys were known without the rows
        src = lake.sources(runs)
    failed = src.filter(pl.col("status") == "failed") if failures else None
    notes = {
        r: [f"run {r}: not analysed: the Dask task failed ({e})"]
        + [failed_note(row) for row in failed.filter(pl.col("run_id") == r).iter_rows(named=True)]
        for r, e in failures.items()
    }
    doc = assemble(options, sorted(keys), docs, extra_notes=notes)
    return doc, [RunFailure(r, failures[r]) for r in sorted(keys) if r in failures]
