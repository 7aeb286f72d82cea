"""Per-run analysis on an existing Dask cluster (`tracelake analyze|report|run --scheduler ADDRESS`).

analyze_on_cluster(lake, scheduler, ...) lists the lake's runs, submits one task per run to the
cluster (each worker opens the lake from the same path, which must be on a file system the workers
share, and calls pipeline.analyze.analyze(lake, runs=[run_id]) with the same options), and merges
the per-run documents into the one `tracelake.analyze/5` document that analyze(lake) returns on
one machine: every metric is computed per run, every list of the document is ordered by run first,
and the runs are sorted by id, so the lists are the per-run lists concatenated in run order.
The notes are the exception (analyze() writes them in three groups: per run, then the verdicts'
outlier steps per run, then every source that failed to ingest, in the lake's order); merge()
rebuilds those groups so each note appears once and where analyze(lake) puts it.

A task that fails (an exception in the analysis, a worker lost) does not lose the others: the run
is left out of the document and a one-line note says which run and why (`run ID: not analysed: ...`);
analyze_on_cluster also returns the failures so the command can say so and exit 3.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .analyze import analyze
from .cluster import client
from .lake import Lake, one_line


@dataclass(frozen=True)
class RunFailure:
    run_id: str
    error: str  # one line: the exception's type and message


def _analyze_run(root: str, run_id: str, options: dict) -> dict:
    """The Dask task: analysis of one run of the lake at `root` (on the worker)."""
    return analyze(Lake(Path(root)), runs=[run_id], **options)


def _failed_sources(src) -> list[tuple[str, str, str]]:
    """(run_id, path, error) of every failed source, in the order analyze() writes their notes."""
    f = src.filter(src["status"] == "failed")
    return list(zip(f["run_id"].to_list(), f["path"].to_list(), f["error"].to_list()))


def _outlier_notes(doc: dict) -> int:
    """How many notes analyze() wrote after the per-run loop for this document's verdicts (one per
    verdict with an outlier step left out; pipeline/analyze.py)."""
    return sum(
        1 for v in doc["verdicts"] if any(e["why"] == "outlier" for e in v.get("excluded_steps") or [])
    )


def merge(
    skeleton: dict,
    run_ids: list[str],
    docs: dict[str, dict],
    failures: dict[str, str],
    failed_sources: list[tuple[str, str, str]],
) -> dict:
    """One document from per-run documents, equal to analyze() over all of them.

    skeleton: a document of the same options (its scalar keys are kept, its lists replaced);
    run_ids: every run of the lake, sorted; docs: run id -> analyze(lake, runs=[run id]);
    failures: run id -> one-line error for runs whose task failed; failed_sources: (run_id, path,
    error) of every source that failed to ingest, in lake.sources() order."""
    out = {k: ([] if isinstance(v, list) else v) for k, v in skeleton.items()}
    loop_notes: list[str] = []
    outlier_notes: list[str] = []
    tails: dict[str, list[str]] = {}
    n_failed = Counter(r for r, _, _ in failed_sources)
    for run_id in run_ids:
        if run_id in failures:
            loop_notes.append(f"run {run_id}: not analysed: the Dask task failed ({failures[run_id]})")
            continue
        doc = docs[run_id]
        for k, v in doc.items():
            if k != "notes" and isinstance(v, list):
                out.setdefault(k, []).extend(v)
        notes = list(doc["notes"])
        k_failed, k_outlier = n_failed[run_id], _outlier_notes(doc)
        tails[run_id] = notes[len(notes) - k_failed :] if k_failed else []
        body = notes[: len(notes) - k_failed] if k_failed else notes
        loop_notes += body[: len(body) - k_outlier] if k_outlier else body
        outlier_notes += body[len(body) - k_outlier :] if k_outlier else []
    source_notes = []
    for run_id, path, error in failed_sources:
        tail = tails.get(run_id)
        # the run's own document wrote the note (same text as analyze(lake)); a failed task did not
        source_notes.append(tail.pop(0) if tail else f"{path}: not ingested: {error}")
    out["notes"] = loop_notes + outlier_notes + source_notes
    return out


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
) -> tuple[dict, list[RunFailure]]:
    """analyze(lake, ...) computed one run per Dask task on the cluster at `scheduler`.

    Returns (document, failures): the document equals analyze(lake, ...) when failures is empty;
    each failed run is absent from it and has a `run ID: not analysed: ...` note. Raises
    FileNotFoundError if the lake does not exist, SchedulerError when the scheduler cannot be
    reached. runs: only these runs (None: every run of the lake). on_progress(run_id, done,
    total), if given, is called as each run's task finishes (or fails)."""
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
    src = lake.sources(runs)
    # every run with a sources row, failed-only runs too: their document holds their failed notes
    run_ids = sorted(set(src["run_id"].drop_nulls().to_list()))
    root = str(lake.root.absolute())
    docs: dict[str, dict] = {}
    failures: dict[str, str] = {}
    if run_ids:
        with client(scheduler) as c:
            futures = [(r, c.submit(_analyze_run, root, r, options, pure=False)) for r in run_ids]
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
                        on_progress(f"run {r}", len(docs) + len(failures), len(run_ids))
    # scalar keys and the full key list from a run's own document, else from an empty analysis
    ok = [docs[r] for r in run_ids if r in docs]
    skeleton = ok[0] if ok else analyze(lake, **{**options, "runs": []})
    doc = merge(skeleton, run_ids, docs, failures, _failed_sources(src))
    return doc, [RunFailure(r, failures[r]) for r in run_ids if r in failures]
