"""The metric pass of an analysis: the lake's metric queries for a set of runs in one DuckDB
connection, and from their rows each run's summary, notes, verdict, findings and replayed gains
(the `tracelake.analyze/5` document, docs/analyze-json.md, before it is cut into runs).

compute() is the stage of pipeline/analyze.py that makes what is not kept: analyze() selects the
runs, reads the kept results of those whose inputs, options and code did not change
(pipeline/results.py), calls compute() once for all the others, and assembles the document.

The document: {"schema", "window", "peak_tflops_override", "model_flops_per_step_override",
"model_inputs", "kernel_wait_threshold_ns"} and the lists "runs", "idle_streams", "steps",
"ranks", "collectives", ..., "findings", "whatif", "critical_path" (LIST_KEYS: every row holds
its run_id) and "notes". Numbers are int ns, *_pct 0-100, *_gbps 1e9 bytes/s; a metric the
input cannot answer is null and a note says why (never 0 or NaN). compute() returns the notes as
(run_id, text) pairs, so that each run's document holds its own.
"""

from __future__ import annotations

import polars as pl

from . import query
from . import schema as sch
from .analyze_doc import LIST_KEYS, SCHEMA, header  # noqa: F401  (LIST_KEYS: the document's lists)
from .analyze_fields import (
    _clean,
    _records,
    _summary,
    is_pytorch,
    link_kind,
    nccl_matching,
    nic_peak,
    rank_frame,
    step_frame,
    timeline_fields,
)
from .diagnosis import cost, nccl_findings, throughput
from .diagnosis import roofline as roofline_diag
from .diagnosis.caveats import MAX_SPAN_NS, caveats_for_run
from .diagnosis.findings import findings_for_run, rank_findings
from .diagnosis.phases import findings as phase_findings
from .diagnosis.phases import phase_note
from .diagnosis.steady import OUTLIER_FACTOR
from .diagnosis.straggler import straggler_profile
from .diagnosis.verdict import verdict_for_run
from .lake import Lake
from .whatif import analysis as whatif_analysis

# the metric files analyze() runs, the slowest first (run_many starts them in this order)
METRICS = (
    "phases",
    "breakdown",
    "step_time",
    "collective_bandwidth",
    "collective_exposure",
    "step_status",
    "mfu",
    "collective_matching",
    "idle_gaps",
    "idle_breakdown",
    "stragglers",
    "top_kernels",
    "step_kernels",
    "memcpy_bandwidth",
    "roofline",
    "energy",
    "gpu_metrics",
)
COUNTER_METRICS = ("energy", "gpu_metrics")  # read only the counters table


def failed_note(row: dict) -> str:
    """The note of a source that failed to ingest (row: its `sources` row)."""
    return f"{row['path']}: not ingested: {row['error']}"


def compute(
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
    src: pl.DataFrame | None = None,
    local_results: bool = True,
) -> dict:
    """The analysis document of the runs (one connection, one pass of the metric queries), its
    notes as (run_id, text) pairs; pipeline/analyze.py analyze() is the public face.

    window: 'all' or 'hta' (queries/views/20_scope.sql); kernel_wait_threshold_ns: idle gaps
    shorter than this (and not host wait) are kernel wait; top_n: kernels kept per run in
    top_kernels (None: all); peak_tflops / model_flops_per_step: MFU overrides, tokens_per_step:
    tokens one rank processes per step, for tokens_per_s (queries/mfu.sql); palm_flops_per_token:
    PaLM's 6N + 12LHQT, for palm_mfu_pct; global_tokens_per_step: the whole job's tokens per step
    (global batch x sequence length), shared among the ranks when tokens_per_step is not given;
    gpu_hour_cost: price of one GPU-hour, for each finding's cost_per_1000_steps.
    runs: analyse only these run ids (None: every run in the lake).
    on_progress(stage, done, total), if given, is called as the work advances: 'connect' (the
    derived views bound and the step windows computed), then each metric query as it finishes
    (by its file's name), then 'findings' (verdict and findings built); total counts them all.
    src: the `sources` rows of the runs in scope when the caller has read them (analyze's
    select_runs), else None (read here). local_results: False never reads the per-source results
    (query.connect's; the same numbers from the full metric files).
    Raises FileNotFoundError if the lake does not exist."""
    if not lake.exists():
        raise FileNotFoundError(f"{lake.root}: not a tracelake lake (run `tracelake ingest` first)")
    # the metrics of sampled counters only when the runs have counters parts (a trace without
    # them would pay two queries for no rows)
    counters = bool(lake.table_files("counters", runs))
    names = METRICS if counters else tuple(n for n in METRICS if n not in COUNTER_METRICS)
    total, done = len(names) + 2, [0]

    def advance(stage: str) -> None:
        done[0] += 1
        if on_progress is not None:
            on_progress(stage, done[0], total)

    # the NCCL findings' views are bound only when a run in scope holds NCCL logs or nccl-tests
    # output (binding them cost a small job of traces alone 0.1 s for no finding)
    nccl = nccl_findings.has_inputs(lake, runs)
    con = query.connect(
        lake,
        window=window,
        kernel_wait_threshold_ns=kernel_wait_threshold_ns,
        peak_tflops=peak_tflops,
        model_flops_per_step=model_flops_per_step,
        materialize=True,
        runs=runs,
        tokens_per_step=tokens_per_step,
        palm_flops_per_token=palm_flops_per_token,
        global_tokens_per_step=global_tokens_per_step,
        metric_views=nccl_findings.VIEWS if nccl else (),  # the rest it runs itself (query.run_many)
        skip_views=() if nccl else ("50_nccl",),  # the NCCL logs' joins to the traces
        fleet=False,  # runs_overview: not read by the analysis
        local_results=local_results,
    )
    if nccl:
        query.materialize(con, nccl_findings.PER_RUN_VIEWS)
    advance("connect")
    m = query.run_many(con, names, query.query_workers(lake, runs), on_done=advance)
    bd, idle, mfu, status = m["breakdown"], m["idle_breakdown"], m["mfu"], m["step_status"]
    coll, matched, exposure = m["collective_bandwidth"], m["collective_matching"], m["collective_exposure"]
    coll = nic_peak(con, coll) if nccl else coll.with_columns(link_kind=link_kind(coll))
    stragglers, mem, top = m["stragglers"], m["memcpy_bandwidth"], m["top_kernels"]
    idle_gaps, step_kernels, phases = m["idle_gaps"], m["step_kernels"], m["phases"]
    roofline = m["roofline"]
    energy_rows = _records(m["energy"]) if counters else []
    gpu_metrics = _records(m["gpu_metrics"]) if counters else []
    step_time = m["step_time"].join(
        status.select("run_id", "rank", "step", "complete"), on=["run_id", "rank", "step"], how="left"
    )
    phase_rows, step_rows = _records(phases), _records(step_time)  # once, for the notes and the document
    devices = query.frame(con, "SELECT run_id, rank, name, used FROM devices")
    # how each run's steps were found (steps.source: pipeline/ingest/nsys/step_detect.py)
    found_by, step_kinds = {}, {}
    for r, s, k in con.execute(
        "SELECT run_id, list(DISTINCT source), list(DISTINCT regexp_replace(name, '\\d+', '#', 'g')) "
        "FROM steps GROUP BY run_id"
    ).fetchall():
        found_by[r], step_kinds[r] = sorted(s), sorted(k)
    collectives_notes = query.frame(
        con,
        "SELECT run_id, msg_bytes_note, count(*) AS n FROM collectives WHERE msg_bytes IS NULL "
        "GROUP BY ALL ORDER BY run_id, n DESC, msg_bytes_note",
    )
    src = lake.sources(runs) if src is None else src
    nccl_tests, nccl_tests_bw = nccl_findings.tests_results(con) if nccl else ([], [])
    notes: list[tuple[str, str]] = []  # (run_id, text): the run's document holds it

    steps, ranks = step_frame(step_time, mfu), rank_frame(bd, mfu)
    calls_json = [
        {**r, "wait_ns": {str(k): v for k, v in (r["wait_ns"] or {}).items()}}
        for r in _records(matched.drop("pg_key"))
    ]

    runs = []
    log_only: set[str] = set()  # runs of NCCL logs or nccl-tests output alone (no trace)
    mfu_why: dict[str, str] = {}  # run -> why MFU is unavailable (the note's text)
    ok = src.filter(pl.col("status") != "failed")
    log_match = _records(query.frame(con, "SELECT * FROM nccl_log_match")) if nccl else []
    for run_id in sorted(ok["run_id"].unique().to_list()):

        def say(text: str, run_id: str = run_id) -> None:
            notes.append((run_id, text))

        s = ok.filter(pl.col("run_id") == run_id)
        r_ranks = ranks.filter(pl.col("run_id") == run_id)
        r_steps = steps.filter(pl.col("run_id") == run_id)
        matching, summary_rows = nccl_matching(s, [m for m in log_match if m["run_id"] == run_id])
        world = summary_rows["world_size"].drop_nulls()
        run = {
            "run_id": run_id,
            "ranks": sorted(
                {int(x) for x in s["rank"].drop_nulls().to_list()}
                | {
                    int(x)
                    for lst in (s["ranks"].drop_nulls().to_list() if "ranks" in s.columns else [])
                    for x in lst
                }
            ),
            "world_size": int(world.max()) if len(world) else None,
            "sources": s.height,
            # the earliest event of its files that were read (sources.trace_start_ns), absolute
            "start_ns": s["trace_start_ns"].min(),
            "steps": sorted(
                int(x) for x in status.filter(pl.col("run_id") == run_id)["step"].unique().to_list()
            ),
            "steps_found_by": found_by.get(run_id, []),
            "step_kinds": step_kinds.get(run_id, []),
            "incomplete_steps": r_steps.filter(pl.col("complete") == False).select("rank", "step").to_dicts(),  # noqa: E712
            "ranks_with_gpu_work": r_ranks.height,
            **_summary(summary_rows, devices.filter(pl.col("run_id") == run_id), inputs=s),
            "nccl_matching": matching,
        }
        run["pytorch"] = is_pytorch(con, run_id, run.get("formats") or [])
        runs.append(run)
        for row in s.filter(pl.col("status") == "partial").sort("path").iter_rows(named=True):
            cut = (
                f"{row['unreadable_bytes']:,} bytes at its end unreadable"
                if row.get("unreadable_bytes") is not None
                else "cut short"
            )
            say(
                f"run {run_id}: {row['path']} is partial ({cut}: the job was killed while the profiler "
                "wrote?): its complete events are analysed; events after the cut are missing, from any of "
                "its steps (Kineto does not write in time order), so its steps are marked incomplete"
            )
        if r_ranks.height == 0:
            only_logs = s["format"].is_in(sch.NCCL_FORMATS).all()
            if only_logs:
                log_only.add(run_id)
            say(
                f"run {run_id}: NCCL logs only, no trace: GPU time, overlap and MFU need the job's traces "
                "(the findings below come from the logs)"
                if only_logs
                else f"run {run_id}: no GPU activity (CPU-only trace): GPU time, overlap and MFU are not "
                "available"
            )
            continue
        if r_steps.height == 0:
            mfu_why[run_id] = (
                "the run has no steps (MFU is FLOPs per step; for Nsight Systems exports give --step-range)"
            )
            say(
                f"run {run_id}: no ProfilerStep in the trace (for Nsight Systems exports: no NVTX step "
                "range; see --step-range): per-step rows are absent, per-rank rows cover the whole trace, "
                "and MFU (FLOPs per step) is not computed"
            )
            per_step = [
                name
                for name, v in (
                    ("--tokens-per-step", tokens_per_step),
                    ("--global-batch", global_tokens_per_step),
                    ("the PaLM shape options", palm_flops_per_token),
                    ("--gpu-hour-cost", gpu_hour_cost),
                )
                if v is not None
            ]
            if per_step:
                say(
                    f"run {run_id}: {', '.join(per_step)} not applied: "
                    "a per-step option, and the run has no steps"
                )
        why_phases = phase_note(run_id, phase_rows, step_rows)
        if why_phases:
            say(why_phases)
        if r_ranks["comm_ns"].sum() == 0:
            say(f"run {run_id}: no communication kernels: comm_comp_overlap_pct is null (nothing to overlap)")
        if r_steps.height and r_steps["mfu_pct"].is_null().all():
            m = mfu.filter(pl.col("run_id") == run_id)
            if m["model_flops"].is_null().all():
                why = (
                    "no op with modelled FLOPs (record_shapes off, or no matmul, attention or convolution "
                    "ops with usable shapes); give --model-flops-per-step or the PaLM shape options"
                )
            else:
                names = sorted({str(x) for x in m["device_name"].to_list() if x})
                if names:
                    why = (
                        f"no catalog peak for device {', '.join(names)} in the FLOPs' precision "
                        "(pipeline/catalog/devices.toml); give it with --peak-tflops"
                    )
                else:
                    why = (
                        "the trace does not name its device (no deviceProperties), so no peak is "
                        "known; give it with --peak-tflops"
                    )
            mfu_why[run_id] = why
            say(f"run {run_id}: MFU not available: {why}")
        c = coll.filter(pl.col("run_id") == run_id)
        if c.height and c["msg_bytes"].is_null().any():
            why = collectives_notes.filter(pl.col("run_id") == run_id)
            reasons = "; ".join(
                f"{r['msg_bytes_note'] or 'no reason recorded'} ({r['n']} kernel(s))"
                for r in why.iter_rows(named=True)
            )
            which = (
                "not available"
                if c["msg_bytes"].is_null().all()
                else f"not available for {c['msg_bytes'].is_null().sum()} of {c.height} calls"
            )
            say(f"run {run_id}: collective bandwidth {which}: no message size: {reasons}")
        mc = matched.filter(pl.col("run_id") == run_id)
        if mc.height and not mc["complete"].all():
            n_inc = mc.filter(~pl.col("complete")).height
            exp = mc["expected_ranks"].max()
            seen = mc["ranks_seen"].max()
            say(
                f"run {run_id}: {n_inc} of {mc.height} collective calls were not seen on every rank of "
                f"their group (expected {exp}, at most {seen} ingested): transfer time, wait and straggler "
                "cover the ingested ranks only"
            )
        gw = query.sql_count(
            con,
            "SELECT count(*) FROM gpu_work WHERE graph_replay AND run_id = "
            f"'{run_id.replace(chr(39), chr(39) * 2)}'",
        )
        if gw:
            say(
                f"run {run_id}: {gw} kernels ran from CUDA/HIP graph replays: their GPU time is counted, "
                "but their idle cause (idle_unreliable_ns) and per-op attribution (FLOP coverage) are "
                "unreliable"
            )
    verdicts = []
    for r in runs:
        rid = r["run_id"]
        r_st = step_time.filter(pl.col("run_id") == rid)
        r_calls = [c for c in calls_json if c["run_id"] == rid]
        partial = sorted(
            str(p)
            for p in ok.filter((pl.col("run_id") == rid) & (pl.col("status") == "partial"))["path"].to_list()
        )
        run_ok = ok.filter(pl.col("run_id") == rid)
        long_spans = sorted(
            str(p)
            for p, t0, t1 in run_ok.select("path", "trace_start_ns", "trace_end_ns").iter_rows()
            if t0 is not None and t1 is not None and t1 - t0 > MAX_SPAN_NS
        )
        caveats = caveats_for_run(
            r, partial, mfu_why.get(rid), r_calls, has_steps=bool(r_st.height), long_spans=long_spans
        )
        # straggler_profile reads only the rows of the steps it is given (or the rank rows on the trace basis)
        rows = r_st.to_dicts() if r_st.height else ranks.filter(pl.col("run_id") == rid).to_dicts()
        verdicts.append(
            verdict_for_run(
                rid,
                ranks.filter(pl.col("run_id") == rid),
                r_st,
                straggler_of=lambda analysed, kept=None, calls=r_calls, rows=rows: straggler_profile(
                    calls, rows if kept is None else kept, analysed
                ),
                caveats=caveats,
                split_known=any(c["consistent"] for c in r_calls),
                no_trace=rid in log_only,
            )
        )
    for v in verdicts:
        out = [e for e in v["excluded_steps"] if e["why"] == "outlier"]
        if out:
            ex = ", ".join(f"{e['step']} (rank {e['rank']}: {e['step_ns'] / 1e6:.1f} ms)" for e in out[:5])
            notes.append(
                (
                    v["run_id"],
                    f"run {v['run_id']}: step(s) {ex}{' ...' if len(out) > 5 else ''} took more than "
                    f"{OUTLIER_FACTOR:g}x the median step ({v['median_step_ns'] / 1e6:.1f} ms) and are left "
                    "out of the verdict",
                )
            )
    if top_n is not None:
        top = (
            top.with_columns(rn=pl.int_range(pl.len()).over("run_id")).filter(pl.col("rn") < top_n).drop("rn")
        )
    roof_summary, roof_rows, roof_notes = roofline_diag.for_runs(
        con,
        _records(roofline),
        [r["run_id"] for r in runs],
        set(ranks.filter(pl.col("compute_ns") > 0)["run_id"].to_list()),
        None if top_n is None else 5 * top_n,
    )
    notes += roof_notes  # (run_id, text)
    mfu_rows = _records(mfu)
    rank_rows = _records(ranks)
    tput = [
        {k: _clean(v) for k, v in t.items()}  # a product past the float range is null, not Infinity
        for r in runs
        if (t := throughput.run_throughput(r["run_id"], mfu_rows, rank_rows, r["world_size"])) is not None
    ]
    notes += [(t["run_id"], n) for t in tput if (n := throughput.note(t))]
    notes += [(t["run_id"], n) for t in tput if (n := throughput.palm_note(t, phase_rows, step_rows))]
    tok = {t["run_id"]: t["tokens_per_step"] for t in tput}
    energy = [
        {k: _clean(v) for k, v in e.items()}
        for r in runs
        if (e := cost.energy(r["run_id"], energy_rows, tok.get(r["run_id"]))) is not None
    ]
    for row in src.filter(pl.col("status") == "failed").iter_rows(named=True):
        notes.append((row["run_id"], failed_note(row)))
    doc = {
        **header(
            window=window,
            kernel_wait_threshold_ns=kernel_wait_threshold_ns,
            peak_tflops=peak_tflops,
            model_flops_per_step=model_flops_per_step,
            tokens_per_step=tokens_per_step,
            palm_flops_per_token=palm_flops_per_token,
            global_tokens_per_step=global_tokens_per_step,
            gpu_hour_cost=gpu_hour_cost,
        ),
        "runs": runs,
        "idle_streams": _records(
            idle.group_by("run_id", "rank", "device", "stream")
            .agg(pl.col("host_wait_ns", "kernel_wait_ns", "other_ns", "unreliable_ns", "gaps").sum())
            .sort("run_id", "rank", "device", "stream")
        ),
        "steps": _records(steps),
        "ranks": rank_rows,
        "collectives": calls_json,
        "collectives_per_rank": _records(coll),
        "collective_exposure": _records(exposure),
        "stragglers": _records(stragglers.with_columns(pl.col("complete_calls").cast(pl.Int64))),
        "memcpy": _records(mem),
        "top_kernels": _records(top),
        "step_time": step_rows,
        "idle_gaps": _records(idle_gaps),
        "step_kernels": _records(step_kernels),
        "phases": phase_rows,
        "roofline": roof_rows,
        "roofline_summary": roof_summary,
        "throughput": tput,
        "energy": energy,
        "gpu_metrics": gpu_metrics,
        "nccl_tests": nccl_tests,
        "nccl_tests_bandwidth": nccl_tests_bw,
        "verdicts": verdicts,
        "findings": [],
        "whatif": [],
        "critical_path": [],
        "notes": notes,
    }
    for r in runs:
        m = r.get("nccl_matching") or {}
        stray = {x["source_id"] for x in m.get("logs", []) if not x["ranks"]}  # logs matching no traced rank
        logs = nccl_findings.findings(con, r["run_id"], stray) if nccl else []
        roof = next((x for x in roof_summary if x["run_id"] == r["run_id"]), None)
        v = next(v for v in verdicts if v["run_id"] == r["run_id"])
        # events on two clocks: the trace's times mean nothing (the verdict abstains), so only
        # what the NCCL logs state is a finding
        two_clocks = any(c["kind"] == "clock_mismatch" for c in v["caveats"])
        fs = rank_findings(
            (
                []
                if two_clocks
                else findings_for_run(r["run_id"], doc)
                + phase_findings(r["run_id"], doc)
                + roofline_diag.findings(r["run_id"], roof, gpu_metrics)
            )
            + logs
        )
        if not two_clocks:  # each timed finding's gain replayed across ranks (pipeline/whatif/analysis.py)
            left_out = {(x["rank"], x["step"]) for x in v.get("excluded_steps") or []}
            wi, cp = whatif_analysis.for_run(con, r["run_id"], fs, left_out)
            fs = rank_findings(fs)
            if wi and "skipped" in wi:
                notes.append(
                    (
                        r["run_id"],
                        f"run {r['run_id']}: the findings' gains are not replayed ({wi['skipped']}): "
                        "they are the additive estimates",
                    )
                )
            elif wi:
                doc["whatif"].append(wi)
            doc["critical_path"] += cp
        cost.annotate(fs, r, gpu_hour_cost)
        timeline_fields(r["run_id"], fs, doc)  # the `tracelake timeline --around` window of each
        doc["findings"] += [{"run_id": r["run_id"], **f} for f in fs]
    advance("findings")
    return doc
