"""What `analyze` and `run` print of an analysis: each run's verdict and numbered findings, and
the per-rank table."""

from __future__ import annotations


def print_summary(console, res: dict, ranks_table: bool = False) -> None:
    """Print each run's verdict (with its confidence) and its numbered findings, as `analyze` and
    `run` show them; ranks_table: also the per-rank table (rank rows of the analysis document:
    each rank's whole GPU span in scope, captioned so, since the verdict may rest on the steps).
    Lines are not wrapped by rich (soft wrap): a piped verdict stays one line."""
    from rich.markup import escape
    from rich.table import Table

    from ..diagnosis.findings import MIN_FLOP_COVERAGE_PCT, mfu_measurable
    from ..report.document import steps_found_text, timing_text

    def measurable(rank_row: dict) -> bool:  # as the report and `runs` state a run's MFU
        return mfu_measurable(rank_row["mfu_pct"], rank_row["flop_coverage_pct"])

    found = {r["run_id"]: r.get("steps_found_by") or [] for r in res["runs"]}
    for v in res["verdicts"]:
        console.print(
            f"[bold]run {escape(v['run_id'])}[/bold]: {v['verdict']}"
            + (f" ({v['confidence']})" if v["confidence"] else "")
            + f" — {escape(v['reason'])}",
            markup=True,
            soft_wrap=True,
        )
        if set(found.get(v["run_id"], [])) & {"nvtx_repeat", "kernel_period"}:
            console.print(
                f"  steps found from {steps_found_text(found[v['run_id']])}", markup=False, soft_wrap=True
            )
        for i, f in enumerate((f for f in res["findings"] if f["run_id"] == v["run_id"]), 1):
            console.print(f"  {i}. {f['title']} — {timing_text(f)}", markup=False, soft_wrap=True)
        rows = [r for r in res["ranks"] if r["run_id"] == v["run_id"]]
        if not (ranks_table and rows):
            continue
        on = {"steps": "the verdict is on the analysed steps", "trace": "as the verdict"}.get(v["basis"])
        t = Table(
            "rank",
            "span ms",
            "compute ms",
            "comm ms",
            "exposed comm ms",
            "overlap %",
            "idle ms",
            "host wait ms",
            "MFU %",
            "FLOP cov. %",
            caption_justify="left",
            caption="per rank, over its whole GPU span in the analysis window"
            + (f" ({on})" if on else "")
            + (f"; first 64 of {len(rows)} ranks" if len(rows) > 64 else "")
            # as the report and `runs` state it (diagnosis/findings.py mfu_measurable)
            + (
                f"; MFU — where under {MIN_FLOP_COVERAGE_PCT:g} % of the compute has modelled FLOPs"
                if any(r["mfu_pct"] is not None and not measurable(r) for r in rows[:64])
                else ""
            ),
        )
        f = lambda x, d=1e6: "—" if x is None else f"{x / d:,.3f}"  # noqa: E731
        for r in rows[:64]:
            t.add_row(
                str(r["rank"]),
                f(r["span_ns"]),
                f(r["compute_ns"]),
                f(r["comm_ns"]),
                f(r["exposed_comm_ns"]),
                f(r["comm_comp_overlap_pct"], 1),
                f(r["gpu_idle_ns"]),
                f(r["idle_host_wait_ns"]),
                f(r["mfu_pct"] if measurable(r) else None, 1),
                f(r["flop_coverage_pct"], 1),
            )
        console.print(t)
