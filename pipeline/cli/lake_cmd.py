"""`tracelake forget` and `tracelake sql`: removing sources from the lake, ad-hoc SQL over it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .analysis_cmd import _lake_read_error
from .app import EXIT_FAILED, EXIT_HELP, EXIT_OK, command, err, existing_lake, exit_help, out
from .options import LAKE, WINDOW, _clip, _resolve_runs


@command(epilog=exit_help())
def forget(
    lake: Path = LAKE,
    runs: Optional[List[str]] = typer.Option(
        None, "--run", metavar="ID", help="Only sources of this run (repeatable)."
    ),
    source_ids: Optional[List[str]] = typer.Option(
        None, "--source", metavar="ID", help="Only this source id (sources.source_id; repeatable)."
    ),
    failed: bool = typer.Option(False, "--failed", help="Only sources whose ingest failed."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed; change nothing."),
):
    """Remove sources from the lake with all their rows: those matching every filter given (whole runs, single
    sources, failed ingests). Crash-safe; a removed file is ingested again by the next ingest."""
    import polars as pl

    from ..lake import LakeError, one_line

    if not (runs or source_ids or failed):
        raise typer.BadParameter("give --run, --source or --failed (several narrow the selection)")
    lk = existing_lake(lake)

    def select():
        src = lk.sources()
        want_runs = _resolve_runs(runs, set(src["run_id"].drop_nulls().to_list())) if runs else []
        missing = sorted(set(source_ids or ()) - set(src["source_id"].drop_nulls().to_list()))
        if missing:
            raise typer.BadParameter(one_line(_clip(f"--source {', '.join(missing)}: not in the lake")))
        if want_runs:
            src = src.filter(pl.col("run_id").is_in(want_runs))
        if source_ids:
            src = src.filter(pl.col("source_id").is_in(source_ids))
        if failed:
            src = src.filter(pl.col("status") == "failed")
        return src.sort("run_id", "path").select("run_id", "source_id", "path", "status").rows()

    try:
        if dry_run:  # reads only: no lock, no repair
            rows = select()
        else:
            with lk.lock():
                for line in lk.recover():
                    err.print(one_line(f"note {lake}: {line}"), markup=False)
                rows = select()
                lk.forget((r, s_) for r, s_, _, _ in rows)
    except LakeError as e:
        err.print(one_line(f"error: {e}"), markup=False)
        raise typer.Exit(EXIT_FAILED)
    for run_id, source_id, path, status in rows:  # a listing: stdout with --dry-run
        (out if dry_run else err).print(
            one_line(f"{'would remove' if dry_run else 'removed'} {run_id}/{source_id} {path} ({status})"),
            markup=False,
        )
    err.print(
        one_line(f"{'would remove' if dry_run else 'removed'} {len(rows)} source(s) from {lake}"),
        markup=False,
    )
    raise typer.Exit(EXIT_OK)


@command(
    epilog=EXIT_HELP
    + " Views: every schema table (sources, gpu_activities, cpu_ops, steps, collectives, devices, "
    "process_groups, annotations, counters) plus gpu_work, scope, rank_device, device_catalog, "
    "collective_catalog."
)
def sql(
    query: str = typer.Argument(..., help="SQL text, or @FILE to read it from a file."),
    lake: Path = LAKE,
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    window: str = WINDOW,
):
    """Run ad-hoc DuckDB SQL over the lake (one view per schema table)."""
    import duckdb

    from ..lake import Lake, LakeError
    from ..query import connect, for_query

    if fmt not in ("table", "csv", "json"):
        raise typer.BadParameter("--format must be table, csv or json")
    lk = Lake(lake)
    if not lk.exists():
        err.print(f"error: {lake}: not a tracelake lake", markup=False)
        raise typer.Exit(EXIT_FAILED)
    try:
        text = Path(query[1:]).read_text() if query.startswith("@") else query
    except OSError as e:
        err.print(f"error: {query[1:]}: {e.strerror or e}", markup=False)
        raise typer.Exit(EXIT_FAILED)
    if not text.strip():
        err.print("error: empty query", markup=False)
        raise typer.Exit(EXIT_FAILED)
    try:
        con = connect(lk, window=window, **for_query(text))
    except (LakeError, duckdb.IOException, duckdb.InvalidInputException) as e:
        err.print(_lake_read_error(lake, e), markup=False)
        raise typer.Exit(EXIT_FAILED)
    try:
        import polars as pl

        rel = con.sql(text)
        if rel is None:
            err.print("error: the statement returns no rows (tracelake sql runs queries)", markup=False)
            raise typer.Exit(EXIT_FAILED)
        df = pl.from_arrow(rel.to_arrow_table())
    except duckdb.Error as e:
        err.print(f"error: {str(e).splitlines()[0]}", markup=False)
        raise typer.Exit(EXIT_FAILED)
    if fmt == "csv":  # CSV has no nested values: lists, structs and maps are written as JSON text
        nested = [c for c, t in df.schema.items() if t.is_nested()]
        df = df.with_columns(
            pl.Series(
                c,
                [None if v is None else json.dumps(v, default=str) for v in df[c].to_list()],
                dtype=pl.String,
            )
            for c in nested
        )
        sys.stdout.write(df.write_csv())
    elif fmt == "json":
        sys.stdout.write(json.dumps(df.to_dicts(), default=str) + "\n")
    else:
        import polars as pl

        with pl.Config(
            tbl_rows=200,
            tbl_cols=50,
            fmt_str_lengths=80,
            tbl_width_chars=240,
            tbl_hide_dataframe_shape=True,
            tbl_hide_column_data_types=True,
        ):
            out.print(str(df), markup=False)
