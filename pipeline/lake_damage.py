"""A lake part that cannot be read, found on a reader's error path: DuckDB's error for a Parquet
file cut short or damaged inside does not always name it ("TProtocolException: Invalid data"), so
the parts in question are read whole with pyarrow to find it.

- first_unreadable(files): '<path>: <why>' of the first that cannot be read whole, or None;
- fallback_note(lake, e, runs): the note of a reader that reads past the per-source results
  (analysis, `tracelake sql`, the Python API: each then connects again with
  query.connect(local_results=False), every metric from the lake's own rows) because DuckDB's
  error `e` came from one of their local_* parts; None when it did not.
Both read files whole: for an error path only. Nothing here raises.
"""

from __future__ import annotations

from . import schema as sch


def first_unreadable(files) -> str | None:
    """'<path>: <why>' of the first of `files` (local paths) that pyarrow cannot read whole: one
    cut short, zeroed or overwritten inside, gone, or not a Parquet file; None when every one
    reads."""
    import pyarrow.parquet as pq

    for f in files:
        try:
            pq.ParquetFile(f).read()
        except Exception as e:  # pyarrow's ArrowException, OSError, thrift's errors: anything unreadable
            first = (str(e).splitlines() or [type(e).__name__])[0][:200]
            return f"{f}: {first}"
    return None


def fallback_note(lake, e: BaseException, runs=None) -> str | None:
    """The note of a reader that reads past the per-source results because `e`, DuckDB's error,
    came from one of their parts: naming the first local_* part of `runs` (None: all) that cannot
    be read whole (the tables query.connect leaves empty with local_results=False: those whose
    name starts with local_). None when `e` is the error of a query's own text or values
    (ParserException, BinderException, CatalogException, DataError), when every such part reads
    (`e` is then something else, for the caller to raise) and for a lake in a bucket."""
    import duckdb

    if not isinstance(e, duckdb.Error) or getattr(lake, "remote", False):
        return None
    if isinstance(
        e, (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException, duckdb.DataError)
    ):
        return None
    try:
        files = [f for t in sch.tables() if t.startswith("local_") for f in lake.table_files(t, runs)]
    except Exception:  # a lake that cannot be listed: not the per-source results' failure
        return None
    bad = first_unreadable(files)
    if bad is None:
        return None
    return f"per-source results could not be read ({bad}): every metric computed from the lake's own rows"
