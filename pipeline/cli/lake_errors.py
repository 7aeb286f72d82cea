"""The one line a command prints for a lake it cannot read (exit 4, EXIT_FAILED), shared by
`analyze`, `report`, `run` and `sql`: which of DuckDB's errors are the lake's rather than a
query's (lake_read_failure), and the line itself, naming the damaged part where DuckDB's message
does not (lake_read_error)."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def lake_read_failure(e: BaseException, lake_dir: Path | None = None) -> bool:
    """Whether DuckDB's error `e` is the lake's, not a query's: an IOException; an error of
    DuckDB's own base class, which a Parquet part damaged inside gives ("TProtocolException:
    Invalid data"; every error of a query's text or values has a subclass); or an
    InvalidInputException whose first line names a file under lake_dir ("Failed to read file
    '<part>': ZSTD Decompression failure")."""
    duckdb = sys.modules.get("duckdb")
    if duckdb is None:
        return False
    if isinstance(e, duckdb.IOException) or type(e) is duckdb.Error:
        return True
    first = (str(e).splitlines() or [""])[0]
    return (
        isinstance(e, duckdb.InvalidInputException)
        and lake_dir is not None
        and str(Path(lake_dir).resolve()) in first
    )


# the table whose parts a DuckDB error came from, in the excerpt of query.connect's SQL it quotes
# ("LINE 1: ...._empty_steps UNION ALL BY NAME SELECT ... read_parquet([...": cut at its start)
_TABLE_IN_ERROR = re.compile(r"_(?:empty|t)_([a-z][a-z_]*) UNION ALL BY NAME")


def lake_read_error(lake_dir: Path, e: Exception) -> str:
    """One line for a lake that could not be read: a part removed while read (an ingest --force or
    a forget at work), or an unreadable (corrupt) part, named: DuckDB's message when it names one,
    else the first part of the table its excerpt of the SQL names that cannot be read whole
    (lake_damage.first_unreadable)."""
    from ..lake import Lake, LakeError, one_line
    from ..schema import tables

    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, LakeError):
        return one_line(f"error: {first}")
    if "No files found" in first or "No such file" in first:
        return one_line(
            f"error: {lake_dir}: the lake changed while it was read (an ingest or forget is writing); "
            f"run the command again ({first})"
        )
    m = _TABLE_IN_ERROR.search(str(e))
    if m is not None and ".parquet" not in first and m.group(1) in tables():
        from ..lake_damage import first_unreadable

        try:
            lake = Lake(lake_dir)
            bad = None if getattr(lake, "remote", False) else first_unreadable(lake.table_files(m.group(1)))
        except Exception:  # naming the part is a courtesy: the error is reported either way
            bad = None
        if bad is not None:
            first = f"{first}; {bad}"
    return one_line(f"error: {lake_dir}: cannot read the lake ({first})")
