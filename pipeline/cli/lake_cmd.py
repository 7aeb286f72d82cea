"""`tracelake forget`, `tracelake compact` and `tracelake sql`: removing sources from the lake, merging
its small parts, ad-hoc SQL over it."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .app import EXIT_FAILED, EXIT_OK, EXIT_USAGE, command, err, existing_lake, exit_help, out
from .lake_errors import lake_read_error, lake_read_failure
from .options import (
    KWAIT,
    LAKE,
    MFLOPS,
    PEAK,
    QUIET,
    TOKENS,
    WINDOW,
    _clip,
    _model_options,
    _resolve_runs,
    _window_options,
)


@command(epilog=exit_help())
def forget(
    lake: Path = LAKE,
    runs: Optional[List[str]] = typer.Option(
        None, "--run", metavar="ID", help="Only sources of this run (repeatable)."
    ),
    source_ids: Optional[List[str]] = typer.Option(
        None,
        "--source",
        metavar="ID",
        help="Only this source: its sources.source_id, or RUN/SOURCE_ID as --dry-run lists it (repeatable).",
    ),
    failed: bool = typer.Option(False, "--failed", help="Only sources whose ingest failed."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed; change nothing."),
    quiet: bool = QUIET,
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
        # a source as --dry-run lists it, RUN/SOURCE_ID, names that run's source (the same
        # content can be stored in two runs); a bare SOURCE_ID names it in every run
        bare = {s for s in source_ids or () if "/" not in s}
        pairs = {tuple(s.rsplit("/", 1)) for s in source_ids or () if "/" in s}
        held = set(zip(src["run_id"].to_list(), src["source_id"].to_list()))
        missing = sorted(
            [s for s in bare if s not in {sid for _, sid in held}]
            + [f"{r}/{i}" for r, i in pairs if (r, i) not in held]
        )
        if missing:
            raise typer.BadParameter(one_line(_clip(f"--source {', '.join(missing)}: not in the lake")))
        if want_runs:
            src = src.filter(pl.col("run_id").is_in(want_runs))
        if source_ids:
            src = src.filter(
                pl.col("source_id").is_in(list(bare))
                | pl.struct("run_id", "source_id").is_in([{"run_id": r, "source_id": i} for r, i in pairs])
            )
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
        one_line(f"{'would remove' if dry_run else 'removed'} {len(rows)} source(s) from {lk.root}"),
        markup=False,
    )
    raise typer.Exit(EXIT_OK)


@command(epilog=exit_help())
def compact(
    lake: Path = LAKE,
    runs: Optional[List[str]] = typer.Option(None, "--run", metavar="ID", help="Only this run (repeatable)."),
    quiet: bool = QUIET,
):
    """Merge each run's small parts into a few files per table, sorted by rank and time (an ingest does it
    for runs of 16 or more small sources). Crash-safe; readers see the old parts or the new ones."""
    from ..lake import LakeError, one_line

    lk = existing_lake(lake)
    try:
        with lk.lock():
            for line in lk.recover():
                err.print(one_line(f"note {lake}: {line}"), markup=False)
            want = _resolve_runs(runs, set(lk.sources()["run_id"].drop_nulls().to_list())) if runs else None
            done = lk.compact(want)
    except (LakeError, OSError) as e:
        what = f"{e.filename}: {e.strerror or e}" if isinstance(e, OSError) and e.filename else str(e)
        err.print(
            one_line(f"error: {lake}: cannot compact ({what})" if isinstance(e, OSError) else f"error: {e}"),
            markup=False,
        )
        raise typer.Exit(EXIT_FAILED)
    for run_id, before, after in done:
        err.print(one_line(f"compacted run {run_id}: {before:,} parts -> {after:,} files"), markup=False)
    err.print(one_line(f"compacted {len(done)} run(s) of {lk.root}"), markup=False)
    raise typer.Exit(EXIT_OK)


@command(
    epilog=exit_help().replace("a path that does not exist", "a path that does not exist, an SQL error")
    + " What can be queried: --list (every table and view with one line), --describe NAME (its columns with "
    "type, unit and meaning); docs/sql-reference.md has both."
)
def sql(
    query: Optional[str] = typer.Argument(
        None, metavar="QUERY", help="SQL text, or @FILE to read it from a file."
    ),
    lake: Path = LAKE,
    fmt: str = typer.Option("table", "--format", "-f", metavar="table|csv|json", help="Output format."),
    window: str = WINDOW,
    kernel_wait_us: float = KWAIT,
    peak_tflops: Optional[float] = PEAK,
    model_flops_per_step: Optional[float] = MFLOPS,
    tokens_per_step: Optional[float] = TOKENS,
    quiet: bool = QUIET,
    list_: bool = typer.Option(
        False,
        "--list",
        help="List every table and view a query can read, with its one-line doc (no lake read).",
    ),
    describe: Optional[str] = typer.Option(
        None,
        "--describe",
        metavar="NAME",
        help="The columns of a table or view: type, unit, doc (no lake read).",
    ),
):
    """Run ad-hoc DuckDB SQL over the lake: the schema tables, the derived views and one view per
    metric (tracelake sql --list names them all). The metric views take the analysis options
    analyze and report take, so a finding's SQL gives its numbers under the same options."""
    if fmt not in ("table", "csv", "json"):
        raise typer.BadParameter("--format must be table, csv or json")
    if list_ or describe is not None:
        if query is not None or (list_ and describe is not None):
            raise typer.BadParameter("give one of a query, --list or --describe NAME")
        # the docs are static (schemas/v3.toml, the SQL files' doc comments): no lake is read
        _list(fmt) if list_ else _describe(describe, fmt)
        raise typer.Exit(EXIT_OK)
    if query is None:
        raise typer.BadParameter("give a query (or --list, --describe NAME)")
    model = _model_options(model_flops_per_step, None, None, None, None, None, tokens_per_step)
    options = dict(
        **_window_options(window, kernel_wait_us, peak_tflops),
        model_flops_per_step=model["model_flops_per_step"],
        tokens_per_step=model["tokens_per_step"],
    )
    _run_query(query, lake, fmt, options)


def _run_query(query: str, lake: Path, fmt: str, options: dict) -> None:
    """The query's rows on stdout in fmt; options: query.connect's analysis options."""
    import duckdb
    import polars as pl

    from ..lake import LakeError, one_line
    from ..lake_damage import fallback_note
    from ..query import connect, for_query

    lk = existing_lake(lake)  # a usage error (exit 2) that creates nothing
    try:
        text = _query_file(Path(query[1:])) if query.startswith("@") else query
    except (OSError, ValueError) as e:  # (UnicodeDecodeError is a ValueError)
        if isinstance(e, UnicodeDecodeError):
            why = f"not UTF-8 text ({e})"
        else:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        err.print(one_line(f"error: {query[1:] or '@'}: {why}"), markup=False)
        raise typer.Exit(EXIT_USAGE)
    if not text.strip():
        err.print("error: empty query", markup=False)
        raise typer.Exit(EXIT_USAGE)
    _check_read_only(text)
    # critical_path and critical_path_summary are computed by the replay (docs/whatif.md), on demand
    replay = re.search(r"\bcritical_path", text, re.IGNORECASE) is not None
    views = {"metric_views": ()} if replay else for_query(text)
    # a per-source result part that cannot be read (pipeline/lake_damage.py fallback_note) is not the
    # lake's failure: the query runs once more on the lake's own rows, with a note
    for local in (True, False):
        try:
            con = connect(lk, **options, **views, local_results=local)
            if replay:
                from ..whatif import register

                for why in register(con):
                    err.print(one_line(f"note: critical_path: {why}"), markup=False)
        except (LakeError, duckdb.Error) as e:  # connecting runs no text of the user's: the lake's
            note = fallback_note(lk, e) if local else None
            if note is not None:
                err.print(f"note: {note}", markup=False)
                continue
            err.print(lake_read_error(lake, e), markup=False)
            raise typer.Exit(EXIT_FAILED)
        try:
            rel = con.sql(text)
            if rel is None:
                err.print("error: the statement returns no rows (tracelake sql runs queries)", markup=False)
                raise typer.Exit(EXIT_USAGE)
            table = rel.to_arrow_table()
            break
        except duckdb.Error as e:
            note = fallback_note(lk, e) if local else None
            if note is not None:
                err.print(f"note: {note}", markup=False)
                continue
            if lake_read_failure(e, lk.root):  # a part that cannot be read: the lake's failure
                err.print(lake_read_error(lake, e), markup=False)
                raise typer.Exit(EXIT_FAILED)
            # the query's own error (syntax, unknown name, bad cast): a usage error
            err.print(f"error: {(str(e).splitlines() or [type(e).__name__])[0]}", markup=False)
            raise typer.Exit(EXIT_USAGE)
    try:
        df = pl.from_arrow(table)
        _write_frame(df, fmt)
    except (pl.exceptions.PolarsError, ValueError, TypeError) as e:  # a type polars cannot take
        bad = ", ".join(f"{f.name} ({f.type})" for f in table.schema) or "?"
        err.print(
            one_line(
                f"error: cannot print the result as {fmt} (columns: {bad}): {str(e).splitlines()[0]}; "
                "cast the column, e.g. col::VARCHAR"
            ),
            markup=False,
        )
        raise typer.Exit(EXIT_USAGE)


READ_STATEMENTS = ("SELECT",)  # what `tracelake sql` runs (and EXPLAIN of it): it reads, never writes


def _check_read_only(text: str) -> None:
    """Exit 2 (one line) unless text is one statement that reads (SELECT, which covers FROM,
    VALUES, WITH, SHOW, DESCRIBE and SUMMARIZE, or EXPLAIN [ANALYZE] of one): COPY ... TO, CREATE,
    ATTACH, INSTALL, SET and the rest could write files, into the lake too, so `tracelake sql`
    refuses them, also under EXPLAIN ANALYZE, which runs what it explains (the
    Python API's connection does not: pipeline/api.py)."""
    import duckdb

    try:
        stmts = duckdb.connect().extract_statements(text)
    except duckdb.Error as e:
        err.print(f"error: {(str(e).splitlines() or [type(e).__name__])[0]}", markup=False)
        raise typer.Exit(EXIT_USAGE)
    if len(stmts) != 1:
        err.print(f"error: give one statement ({len(stmts)} given)", markup=False)
        raise typer.Exit(EXIT_USAGE)
    kind = stmts[0].type.name
    if kind == "EXPLAIN":
        # EXPLAIN ANALYZE runs the statement it explains (EXPLAIN ANALYZE COPY ... TO writes the
        # file), so the statement explained must be a query too; it is found by dropping the
        # leading keywords of the statement's own text (comments before them are refused)
        m = re.match(r"\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(.*)\Z", stmts[0].query, re.IGNORECASE | re.DOTALL)
        try:
            inner = duckdb.connect().extract_statements(m.group(1)) if m else []
        except duckdb.Error:
            inner = []
        if len(inner) == 1 and inner[0].type.name == "SELECT":
            return
        kind = (
            f"EXPLAIN {inner[0].type.name}"
            if len(inner) == 1
            else "an EXPLAIN it cannot read (a comment first?)"
        )
    if kind not in READ_STATEMENTS:
        err.print(
            f"error: tracelake sql runs queries (SELECT, EXPLAIN [ANALYZE] SELECT), not {kind}: "
            "it never writes",
            markup=False,
        )
        raise typer.Exit(EXIT_USAGE)


# the most a query file (`sql @FILE`) may hold: SQL a person wrote, not `@/dev/zero`, which was read
# until the memory ran out
MAX_QUERY_BYTES = 16 * 2**20


def _query_file(path: Path) -> str:
    """The text of `sql @FILE`. Raises OSError, UnicodeDecodeError, or ValueError for a file of
    more than MAX_QUERY_BYTES."""
    with open(path, "rb") as f:
        data = f.read(MAX_QUERY_BYTES + 1)
    if len(data) > MAX_QUERY_BYTES:
        raise ValueError(f"more than {MAX_QUERY_BYTES // 2**20} MiB: not a query")
    return data.decode("utf-8")


def _list(fmt: str) -> None:
    """`--list`: every listed table and view (pipeline/sqldoc.py listed()) with its kind and summary."""
    import polars as pl

    from ..sqldoc import listed

    docs = listed()
    if fmt == "table":
        width = max(len(d.name) for d in docs)
        for d in docs:
            out.print(
                f"{d.kind:<8} {d.name:<{width}}  {d.summary}", markup=False, overflow="ignore", crop=False
            )
        return
    _write_frame(
        pl.DataFrame(
            {
                "name": [d.name for d in docs],
                "kind": [d.kind for d in docs],
                "doc": [d.summary for d in docs],
                "source": [d.source for d in docs],
            }
        ),
        fmt,
    )


def _describe(name: str, fmt: str) -> None:
    """`--describe NAME`: the columns of a table or view with type, unit and doc; exit 2 for a name
    that is neither."""
    import polars as pl

    from ..sqldoc import catalog

    d = catalog().get(name.strip().lower())
    if d is None:
        raise typer.BadParameter(f"{name}: no such table or view (tracelake sql --list names them)")
    cols = {
        "column": [c.name for c in d.columns],
        "type": [c.type for c in d.columns],
        "unit": [c.unit for c in d.columns],
        "doc": [c.doc for c in d.columns],
    }
    if fmt == "json":
        _write_json(
            {
                "name": d.name,
                "kind": d.kind,
                "source": d.source,
                "doc": d.summary,
                "internal": d.internal,
                "columns": pl.DataFrame(cols).to_dicts(),
            }
        )
        return
    if fmt == "csv":
        _write_frame(pl.DataFrame(cols), fmt)
        return
    note = " (an implementation detail, not in --list)" if d.internal else ""
    out.print(f"{d.name}: {d.kind} ({d.source}){note}", markup=False, overflow="ignore", crop=False)
    out.print(d.summary, markup=False, overflow="ignore", crop=False)
    out.print("", markup=False)
    w = [
        max([len(h)] + [len(v) for v in vs])
        for h, vs in zip(("column", "type", "unit"), list(cols.values())[:3])
    ]
    out.print(
        f"{'column':<{w[0]}}  {'type':<{w[1]}}  {'unit':<{w[2]}}  doc",
        markup=False,
        overflow="ignore",
        crop=False,
    )
    for c in d.columns:
        out.print(
            f"{c.name:<{w[0]}}  {c.type:<{w[1]}}  {c.unit:<{w[2]}}  {c.doc}",
            markup=False,
            overflow="ignore",
            crop=False,
        )


# integers JavaScript, jq and pandas read exactly (IEEE doubles): above it JSON gets text
MAX_SAFE_INT = 2**53 - 1


def _json_value(v):
    """JSON for what json cannot write itself: a DECIMAL (DuckDB's sum of integers is HUGEINT,
    polars reads it as a decimal) as a number, an integer when it is whole (as text past
    MAX_SAFE_INT); dates, times and the rest as text."""
    import decimal

    if isinstance(v, decimal.Decimal):
        if v != v.to_integral_value():
            return float(v)
        return int(v) if abs(v) <= MAX_SAFE_INT else str(int(v))
    return str(v)


def _write_json(obj, **kw) -> None:
    """obj as one line of JSON on stdout, non-ASCII text as UTF-8 bytes (`über`, not `\\u00fcber`)
    whatever the locale's encoding, as `tracelake runs --format json` writes (runs_cmd.write_rows);
    kw: json.dumps' options."""
    sys.stdout.flush()
    sys.stdout.buffer.write((json.dumps(obj, ensure_ascii=False, **kw) + "\n").encode())


def _finite(v):
    """v with every float NaN or infinity (not JSON) replaced by None, and every integer past
    MAX_SAFE_INT as its decimal text (a double-based reader would round it), through lists and
    dicts."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if abs(v) <= MAX_SAFE_INT else str(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, list):
        return [_finite(x) for x in v]
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    return v


def _write_frame(df, fmt: str) -> None:
    """A result frame on stdout as table, csv (nested values as JSON text) or json."""
    import polars as pl

    if fmt == "csv":  # CSV has no nested values: lists, structs and maps are written as JSON text
        nested = [c for c, t in df.schema.items() if t.is_nested()]
        df = df.with_columns(
            pl.Series(
                c,
                [
                    None if v is None else json.dumps(v, default=_json_value, ensure_ascii=False)
                    for v in df[c].to_list()
                ],
                dtype=pl.String,
            )
            for c in nested
        )
        sys.stdout.write(df.write_csv())
    elif fmt == "json":  # NaN and infinities are not JSON: null
        _write_json(_finite(df.to_dicts()), default=_json_value, allow_nan=False)
    else:
        from ..oneline import CONTROL_CHARS, one_line

        # a trace's names reach the terminal: control characters (ESC sequences that set the title
        # or clear the screen) as \xNN, as every other line the commands print (oneline.py); the
        # string cells that hold one first (found vectorised: the common frame holds none), so
        # the columns keep their widths, then whatever a nested value or a column name still
        # holds (the table's own line breaks kept)
        text_cols = [c for c, t in df.schema.items() if t == pl.String]
        dirty = [c for c in text_cols if df[c].str.contains(CONTROL_CHARS).any()]
        shown = df.with_columns(pl.col(c).map_elements(one_line, return_dtype=pl.String) for c in dirty)
        shown = shown.rename({c: one_line(c) for c in shown.columns if one_line(c) != c})
        with pl.Config(
            tbl_rows=200,
            tbl_cols=50,
            fmt_str_lengths=80,
            tbl_width_chars=240,
            tbl_hide_dataframe_shape=True,
            tbl_hide_column_data_types=True,
        ):
            text = "\n".join(one_line(line) for line in str(shown).split("\n"))
            out.print(text, markup=False)
        if df.height > 200 or df.width > 50:
            err.print(
                f"note: the table shows {min(df.height, 200)} of {df.height} rows and {min(df.width, 50)} of "
                f"{df.width} columns; --format csv or json prints them all",
                markup=False,
            )
