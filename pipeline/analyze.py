"""Analysis of a lake's runs: the `tracelake.analyze/5` document (docs/analyze-json.md), in three
stages, each a function of its own:

1. **select** (`select_runs`): the runs in scope (every run with a `sources` row, runs whose files
   all failed too: their document holds those files' notes) and each run's key
   (pipeline/results.py `run_key`: its `sources` rows, the options, the code, the lake's schema
   version), remembered for the lake's listing so that the next analysis needs no Parquet read
   (`results.known_keys`; `kept_analysis` is the CLI's path through it).
2. **reuse or compute** (`kept_or_computed`): a run whose key has a kept result
   (<lake>/results/<run_id>/<key>.json) is read back; every other run is computed, all of them in
   one pass of the metric queries (pipeline/analyze_compute.py `compute`), after the per-source
   results their large ranks lack are computed and kept in the lake (pipeline/local.py `fill`: a
   run's first analysis), the document cut into one per run (`run_docs`) and each kept under its
   key with its fleet row (pipeline/results_fleet.py), unless the lake changed meanwhile (other
   than by fill's own switches: `_through`).
3. **assemble** (`assemble`): the per-run documents' lists concatenated in run order, their notes
   likewise, under the scalar keys the options give (`analyze_doc.header`).

Every metric is computed per run and every list is ordered by run first, so a run's part of the
document does not depend on which other runs were computed beside it: the document is the same
whether each run was read back or computed (tests/test_results.py checks it on real runs).
A computed run's document goes through the same JSON encoding as a kept one, so both give the
same Python values (lists, never tuples; string keys).

The notes are the run's own, in the order the metric pass writes them (the run's summary notes,
its outlier steps, roofline and throughput notes, its files that failed to ingest, then its
replayed gains); the document's notes are the runs' notes in run order.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from . import results, results_fleet
from .analyze_doc import LIST_KEYS, SCHEMA, header

if TYPE_CHECKING:  # the kept path imports none of them (a second analyze: docs/performance.md)
    import polars as pl
    import pyarrow as pa

    from .lake import Lake


def __getattr__(name: str):
    """METRICS and COUNTER_METRICS, from the metric pass (imported only when asked for)."""
    if name in ("METRICS", "COUNTER_METRICS"):
        from . import analyze_compute

        return getattr(analyze_compute, name)
    raise AttributeError(name)


__all__ = [  # and METRICS, COUNTER_METRICS (module __getattr__)
    "LIST_KEYS",
    "SCHEMA",
    "analyze",
    "assemble",
    "kept_analysis",
    "read_kept",
    "run_docs",
    "run_part",
    "select_runs",
]

# analyze()'s options that decide the document (the run list and progress callback do not), with
# their defaults
_DEFAULTS = dict(
    window="all",
    kernel_wait_threshold_ns=30_000,
    top_n=20,
    peak_tflops=None,
    model_flops_per_step=None,
    tokens_per_step=None,
    palm_flops_per_token=None,
    global_tokens_per_step=None,
    gpu_hour_cost=None,
)


def analyze(
    lake: Lake,
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
) -> dict:
    """Analysis of the lake's runs (the `tracelake.analyze/5` document, docs/analyze-json.md).

    window: 'all' or 'hta' (queries/views/20_scope.sql); kernel_wait_threshold_ns: idle gaps
    shorter than this (and not host wait) are kernel wait; top_n: kernels kept per run in
    top_kernels (None: all); peak_tflops / model_flops_per_step: MFU overrides, tokens_per_step:
    tokens one rank processes per step, for tokens_per_s (queries/mfu.sql); palm_flops_per_token:
    PaLM's 6N + 12LHQT, for palm_mfu_pct; global_tokens_per_step: the whole job's tokens per step
    (global batch x sequence length), shared among the ranks when tokens_per_step is not given;
    gpu_hour_cost: price of one GPU-hour, for each finding's cost_per_1000_steps.
    runs: analyse only these run ids (None: every run in the lake).
    keep: read and write kept results (pipeline/results.py); False computes every run and keeps
    nothing. recompute: compute every run and keep the new results (`--recompute`).
    on_progress(stage, done, total), if given, is called as the work advances: ('kept', 1, 1)
    when every run's result was kept; otherwise ('per-source results', k, n) as each source's
    per-source results are computed (a large run's first analysis: pipeline/local_fill.py fill), then
    'connect' (the derived views bound and the step windows computed), each metric query as it
    finishes (by its file's name), and 'findings' (verdict and findings built); total counts them
    all (each stage's own).
    Raises FileNotFoundError if the lake does not exist."""
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
    src, keys, listing = select_runs(lake, runs, options, keep=keep and not recompute)
    docs = kept_or_computed(
        lake,
        src,
        keys,
        options,
        whole=runs is None,
        keep=keep,
        on_progress=on_progress,
        listing=listing,
        read=not recompute,
    )
    return assemble(options, sorted(keys), docs)


def kept_analysis(root, options: dict, runs: list[str] | None = None) -> dict | None:
    """The document analyze(Lake(root), **options, runs=runs) returns, when every run's result is
    kept for the lake as it is (results.known_keys: its listing and the code unchanged), read
    without opening the lake's Parquet; None otherwise (then call analyze). options: analyze()'s
    options but runs, keep and on_progress (absent ones take analyze()'s defaults)."""
    full = {**_DEFAULTS, **options}
    keys = results.known_keys(root, full, runs)
    if keys is None:
        return None
    docs = {r: d for r, k in keys.items() if (d := results.read(root, r, k)) is not None}
    if len(docs) != len(keys) or any(
        d["runs"] and not results_fleet.fleet_ok(root, r, keys[r]) for r, d in docs.items()
    ):
        return None  # analyze() computes what is missing and writes a missing fleet row again
    return assemble(full, sorted(keys), docs)


def select_runs(
    lake: Lake, runs: list[str] | None, options: dict, keep: bool = True
) -> tuple[pl.DataFrame | None, dict[str, str], str]:
    """Stage 1: (the `sources` rows in scope, run id -> key of its kept result, the lake's listing
    (results.listing_signature) taken before anything was read) for the runs given (None: every
    run of the lake, failed-only runs included). With keep, the keys remembered for the lake's
    current listing and code (results.known_keys) are used when there are some, and the rows are
    then not read (None: kept_or_computed reads them if it needs them)."""
    listing = results.listing_signature(lake.root)  # before the rows: a later commit changes it
    if keep:
        known = results.known_keys(lake.root, options, runs)
        if known is not None:
            return None, known, listing
    src = lake.sources(runs)
    run_ids = sorted(set(src["run_id"].drop_nulls().to_list()))
    keys = results.run_keys(src, run_ids, options, results.lake_marker(lake.root))
    if keep:
        results.remember_keys(lake.root, listing, options, keys, whole=runs is None)
    return src, keys, listing


def _computed(compute, lake, scope, missing: list[str], on_progress, rows, options: dict) -> dict:
    """compute() of the runs in scope; when it fails reading a per-source result part (a local_*
    file cut or damaged: lake_damage.fallback_note finds it), the same computed from the lake's own rows
    (local_results=False: the full metric files, the same numbers) with a note in each run saying
    which file could not be read, rather than no analysis. Other errors are raised."""
    import duckdb

    from .lake_damage import fallback_note

    try:
        return compute(lake, runs=scope, on_progress=on_progress, src=rows, **options)
    except duckdb.Error as e:
        note = fallback_note(lake, e, scope)
        if note is None:
            raise
    fresh = compute(lake, runs=scope, on_progress=on_progress, src=rows, local_results=False, **options)
    fresh["notes"] += [(r, note) for r in missing]
    return fresh


def kept_or_computed(
    lake: Lake,
    src: pl.DataFrame | None,
    keys: dict[str, str],
    options: dict,
    whole: bool = False,
    keep: bool = True,
    on_progress=None,
    listing: str | None = None,
    read: bool = True,
) -> dict[str, dict]:
    """Stage 2: run id -> the run's document (run_docs), read back where a result is kept under
    the run's key (src, keys, listing: select_runs), else computed (one analyze_compute.compute()
    for all of them) and kept, with the run's fleet row (kept_fleet_row; written again for a run
    read back whose row is missing or unreadable). Nothing computed is kept when the lake's
    listing changed while it was computed (an ingest or forget committed meanwhile: what was
    computed may mix the two states). whole: keys holds every run of the lake (then the kept
    results of runs the lake no longer holds are removed); read: False computes every run
    (--recompute) and keeps the new results when keep."""
    docs = read_kept(lake, keys) if keep and read else {}
    missing = [r for r in keys if r not in docs]
    if on_progress is not None and not missing:
        on_progress("kept", 1, 1)
    no_row = [r for r, d in docs.items() if d["runs"] and not results_fleet.fleet_ok(lake.root, r, keys[r])]
    if (missing or no_row) and src is None:
        src = lake.sources(None if whole else sorted(keys))
    if missing:
        from . import local_fill
        from .analyze_compute import compute

        # every run: the connection reads the lake unfiltered (its cheapest form)
        scope = None if whole and len(missing) == len(keys) else missing
        rows = src if scope is None else src.filter(src["run_id"].is_in(scope))  # (read once)
        # the per-source results the runs' sources lack, computed and kept first (a run's first
        # analysis; ingest no longer computes them), so the metrics read them: when the runs hold
        # enough GPU work for that to cost less than computing every metric in full
        switches: list[tuple[str, str]] = []
        local_fill.fill(
            lake,
            scope,
            src=rows,
            switches=switches,
            min_total=local_fill.FILL_MIN_ROWS,
            on_progress=on_progress,
        )
        fresh = _computed(compute, lake, scope, missing, on_progress, rows, options)
        same = listing is not None and results.listing_signature(lake.root) == _through(listing, switches)
        for run_id, doc in run_docs(fresh, missing).items():
            data = results.encode(doc)
            docs[run_id] = results.decode(data)
            if keep and same and results.write(lake.root, run_id, keys[run_id], data):
                no_row.append(run_id)
    for run_id in no_row if keep else ():
        row = kept_fleet_row(options, run_id, docs[run_id], src, keys[run_id])
        if row is not None:
            results_fleet.write_fleet(lake.root, run_id, keys[run_id], row)
    if keep and whole:
        results.prune(lake.root, set(keys))
    return docs


def _through(listing: str, switches: list[tuple[str, str]]) -> str | None:
    """The lake's listing signature after local_fill.fill's own switches of compacted generations
    (each (signature before, after) taken under the lake's lock), from `listing`; None when
    another command's commit came between (what was computed may then mix two states)."""
    for before, after in switches:
        if before != listing:
            return None
        listing = after
    return listing


def kept_fleet_row(options: dict, run_id: str, doc: dict, src: pl.DataFrame, key: str) -> pa.Table | None:
    """The run's row of the fleet view (pipeline/fleet.py fleet_rows of its document) with the
    kept-result columns (results_fleet.FLEET_EXTRA): the key, the options as JSON, the sources' digest
    and the time it was computed; None for a run without a row (its files all failed)."""
    import polars as pl

    from .fleet import fleet_rows

    mine = src.filter(pl.col("run_id") == run_id)
    rows = fleet_rows(assemble(options, [run_id], {run_id: doc}), mine)
    if rows.height == 0:  # a run of failed files only: no row, as in `tracelake runs`
        return None
    extra = {
        "key": key,
        "options": json.dumps(options, sort_keys=True),
        "sources_digest": results_fleet.sources_digest(mine),
        "computed_at_ns": time.time_ns(),
    }
    return rows.with_columns(
        pl.lit(v, getattr(pl, t)).alias(n) for (n, t, _), v in zip(results_fleet.FLEET_EXTRA, extra.values())
    ).to_arrow()


def read_kept(lake: Lake, keys: dict[str, str]) -> dict[str, dict]:
    """run id -> its kept document, for each run of keys (run id -> key) that has one."""
    return {r: d for r, k in keys.items() if (d := results.read(lake.root, r, k)) is not None}


def run_part(doc: dict) -> dict:
    """The per-run document (run_docs' shape) of an assembled document of one run."""
    return {k: doc[k] for k in (*LIST_KEYS, "notes")}


def run_docs(doc: dict, run_ids: list[str]) -> dict[str, dict]:
    """A computed document cut into runs: run id -> {each list of LIST_KEYS: the run's rows,
    "notes": the run's notes}, for each of run_ids (compute() gives notes as (run_id, text))."""
    out = {r: {k: [] for k in (*LIST_KEYS, "notes")} for r in run_ids}
    for k in LIST_KEYS:
        for row in doc[k]:
            if row["run_id"] in out:
                out[row["run_id"]][k].append(row)
    for run_id, text in doc["notes"]:
        if run_id in out:
            out[run_id]["notes"].append(text)
    return out


def assemble(options: dict, run_ids: list[str], docs: dict[str, dict], extra_notes=None) -> dict:
    """Stage 3: the document of the runs: header(options), then each list of LIST_KEYS and the
    notes, the runs' own concatenated in run_ids order (a run absent from docs adds nothing);
    extra_notes: run id -> notes put where that run's would be (analyze_on_cluster: a failed
    task)."""
    doc = {**header(**options), **{k: [] for k in LIST_KEYS}, "notes": []}
    for run_id in run_ids:
        d = docs.get(run_id)
        if d is not None:
            for k in LIST_KEYS:
                doc[k] += d[k]
            doc["notes"] += d["notes"]
        doc["notes"] += (extra_notes or {}).get(run_id, [])
    return doc
