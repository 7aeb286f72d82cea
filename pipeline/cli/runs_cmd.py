"""`tracelake runs`: the fleet view, one row per run of the lake (pipeline/fleet.py), filtered
with --where (a DuckDB boolean expression over the fleet columns), sorted with --sort, printed as a
table, CSV, JSON or Markdown."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from .analysis_cmd import _analysis
from .app import EXIT_OK, command, err, exit_help, out, usage_error
from .options import (
    GLOBAL_BATCH,
    GPU_HOUR_COST,
    KWAIT,
    LAKE,
    MFLOPS,
    ONLY_RUNS,
    PEAK,
    QUIET,
    RECOMPUTE,
    SCHEDULER_ANALYSIS,
    SEQ,
    TOKENS,
    WINDOW,
)

RUNS_FORMATS = ("table", "csv", "json", "md")
WHERE_HELP = (
    "Keep the runs for which this DuckDB SQL boolean expression over the fleet columns is true, "
    "e.g. \"verdict = 'network-bound' AND world_size >= 8\" or \"start_time >= '2026-11-01'\" "
    "(columns: docs/usage.md, Runs: the fleet view). A null compares as unknown: the run is left out. "
    "Repeated, a run must match every one (AND)."
)


def parse_sort(spec: str | None, columns: list[str]) -> list[tuple[str, bool]]:
    """--sort COL[,-COL...] as [(column, descending)]; '-' sorts that column in descending order.
    Raises BadParameter naming an unknown or empty column and the known ones."""
    if spec is None:
        from ..fleet import DEFAULT_ORDER

        return DEFAULT_ORDER
    keys = []
    for part in spec.split(","):
        name = part.strip()
        desc = name.startswith("-")
        name = name.lstrip("-+").strip()
        if name not in columns:
            raise typer.BadParameter(
                f"unknown column {name!r} (columns: {', '.join(columns)})", param_hint="--sort"
            )
        keys.append((name, desc))
    return keys


def filter_rows(df, where: str):
    """The rows of df (a fleet frame) for which the DuckDB expression `where` is true, in df's
    order. DuckDB parses it as one expression (a statement, `;` or a subquery of another table is
    an error) on a connection without file access. Raises ValueError with one line: an empty
    condition; several statements (`1; select 1`) or a clause after the expression (`ORDER BY`),
    named so; else DuckDB's one-line message (it cannot be parsed, names an unknown column or is
    not boolean)."""
    import duckdb
    import polars as pl

    if not where.strip():
        raise ValueError(
            "empty condition: give one SQL expression over the columns (verdict = 'network-bound')"
        )
    try:
        statements = len(duckdb.extract_statements(f"SELECT 1 WHERE {where}"))
    except duckdb.Error:
        statements = 1  # DuckDB's own message below says what does not parse
    if statements > 1:
        raise ValueError(f"{where!r} holds {statements} statements (';' ends one): give one SQL expression")
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        con.register("runs", df.with_row_index("__row").to_arrow())
        kept = con.table("runs").filter(where).select("__row").fetchall()
    except duckdb.Error as e:
        line = (str(e).splitlines() or [type(e).__name__])[0]
        if "Cannot have any modifiers" in line:  # DuckDB's words for `x ORDER BY y`, `x LIMIT 1`
            line = f"{where!r}: one SQL expression expected (ORDER BY, LIMIT and the like are no part of one)"
        raise ValueError(line) from None
    finally:
        con.close()
    rows = sorted(r[0] for r in kept)
    return df.with_row_index("__row").filter(pl.col("__row").is_in(rows)).drop("__row")


def shown(df) -> tuple[list[str], list[list[str]]]:
    """The header and cells of the table and Markdown forms (fleet.DISPLAY; null as '—')."""
    from ..fleet import DISPLAY, display_cells

    return [h for _, h, _ in DISPLAY], display_cells(df)


def markdown(df) -> str:
    """A Markdown table of the fleet.DISPLAY columns ('|' in values escaped)."""
    header, cells = shown(df)

    def line(vals):
        return "| " + " | ".join(v.replace("|", "\\|").replace("\n", " ") for v in vals) + " |"

    right = {
        "world",
        "hosts",
        "GPUs",
        "steps",
        "median step",
        "MFU",
        "tokens/s",
        "could win",
        "GPU-h/1k steps",
    }
    sep = "| " + " | ".join("---:" if h in right else "---" for h in header) + " |"
    return "\n".join([line(header), sep, *(line(r) for r in cells)]) + "\n"


def write_rows(df, fmt: str) -> None:
    """The fleet rows on stdout: table (rich), md (fleet.DISPLAY columns), csv and json (every column,
    start_time as ISO 8601 UTC, NaN as null; JSON in UTF-8, msgspec's, letters of any script as
    they are)."""
    import polars as pl

    if fmt in ("csv", "json"):
        df = df.with_columns(pl.col("start_time").dt.strftime("%Y-%m-%dT%H:%M:%S%.fZ"))
    if fmt == "csv":
        sys.stdout.write(df.write_csv())
    elif fmt == "json":  # UTF-8 as it is (`über`, not `\u00fcber`), whatever the locale
        import msgspec

        from .lake_cmd import _finite

        data = msgspec.json.encode(_finite(df.to_dicts())) + b"\n"
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
    elif fmt == "md":
        sys.stdout.write(markdown(df))
    else:
        from rich.table import Table

        # the run id last, as `docker ps` puts its NAMES: terminals give letters of some scripts
        # another width than rich counts (Devanagari's vowel signs: 3 cells by rich's count, 4 by
        # wcwidth's, 5 by glibc's for हिन्दी), which would shift every column after a name there
        header, cells = shown(df)
        order = [*range(1, len(header)), 0]
        table = Table(*[header[i] for i in order], show_edge=False, pad_edge=False)
        for r in cells:
            table.add_row(*[r[i] for i in order])
        out.print(table)


@command(
    epilog=exit_help(scheduler=True).replace(
        "a path that does not exist", "a path that does not exist, a bad --where or --sort"
    )
)
def runs(
    lake: Path = LAKE,
    where: Optional[List[str]] = typer.Option(None, "--where", "-w", metavar="EXPR", help=WHERE_HELP),
    sort: Optional[str] = typer.Option(
        None,
        "--sort",
        "-s",
        metavar="COL[,-COL]",
        help="Sort by these columns, '-' for descending (default: start time, then run id); nulls last.",
    ),
    fmt: str = typer.Option(
        "table",
        "--format",
        "-f",
        metavar="table|csv|json|md",
        help="Output format (csv and json: every column).",
    ),
    window: str = WINDOW,
    kernel_wait_us: float = KWAIT,
    peak_tflops: Optional[float] = PEAK,
    model_flops_per_step: Optional[float] = MFLOPS,
    tokens_per_step: Optional[float] = TOKENS,
    global_batch: Optional[float] = GLOBAL_BATCH,
    seq_len: Optional[int] = SEQ,
    gpu_hour_cost: Optional[float] = GPU_HOUR_COST,
    scheduler: Optional[str] = SCHEDULER_ANALYSIS,
    only_runs: Optional[List[str]] = ONLY_RUNS,
    recompute: bool = RECOMPUTE,
    quiet: bool = QUIET,
):
    """One row per run of the lake: start time, world size, hosts, GPUs, steps, median step time,
    MFU, tokens/s, verdict and confidence, top finding and its cost (the fleet view)."""
    import polars as pl

    from ..fleet import FLEET_SCHEMA, fleet_rows, sort_rows

    fmt = fmt.lower()
    if fmt not in RUNS_FORMATS:
        raise typer.BadParameter("table, csv, json or md", param_hint="--format")
    keys = parse_sort(sort, list(FLEET_SCHEMA.names()))
    wheres = list(where or [])  # each parsed on its own, the rows kept by all of them (AND)
    for w in wheres:  # checked on the empty table before any analysis: a typo costs nothing
        try:
            filter_rows(pl.DataFrame(schema=FLEET_SCHEMA), w)
        except ValueError as e:
            raise usage_error(f"--where: {e}")
    res, code = _analysis(
        lake,
        window,
        kernel_wait_us,
        peak_tflops,
        model_flops_per_step,
        None,
        None,
        None,
        None,
        seq_len,
        tokens_per_step,
        global_batch,
        gpu_hour_cost,
        scheduler=scheduler,
        runs=only_runs,
        quiet=quiet,
        recompute=recompute,
    )
    from .app import existing_lake

    df = fleet_rows(res, existing_lake(lake).sources())
    for w in wheres:
        try:
            df = filter_rows(df, w)
        except ValueError as e:  # a value the empty table could not show (a bad cast)
            raise usage_error(f"--where: {e}")
    write_rows(sort_rows(df, keys), fmt)
    if df.height == 0:
        err.print("note: no run matches" if wheres else "note: the lake holds no runs", markup=False)
    raise typer.Exit(code if code != EXIT_OK else EXIT_OK)
