"""Kept fleet rows: each computed run's row of the fleet view (pipeline/fleet.py fleet_rows) kept
beside its analysis as <lake>/results/<run_id>/<key>.fleet.parquet (pipeline/results.py keeps the
analysis itself), and the `runs_overview` view over them (bind_overview, called by
pipeline/query.py). A row is a cache like the analysis: a missing or cut one is written again by
the next analysis (fleet_ok; pipeline/analyze.py kept_or_computed), and an unreadable one is left
out of the view rather than failing the connection.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from . import objstore
from .results import DIR, _dir, _remote_find, _remote_keep

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

FLEET_SUFFIX = ".fleet.parquet"


# the columns a kept fleet row has beyond pipeline/fleet.py FLEET_COLUMNS: (name, polars type
# name, doc)
FLEET_EXTRA = [
    ("key", "String", "the key of the kept result the row was made from (pipeline/results.py)"),
    ("options", "String", "the analysis options it was computed with, as a JSON object"),
    ("sources_digest", "String", "sources_digest() of the run's sources when it was computed"),
    ("computed_at_ns", "Int64", "when it was computed, ns since the Unix epoch"),
]


def write_fleet(lake_root: Path, run_id: str, key: str, table: pa.Table) -> bool:
    """Keep the run's fleet row (pipeline/fleet.py fleet_rows, with the kept-result columns of
    FLEET_EXTRA) beside its document, as <key>.fleet.parquet (the `runs_overview` view reads
    them: pipeline/query.py). Returns whether it was kept."""
    if objstore.is_url(lake_root):
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf)
        return _remote_keep(lake_root, run_id, f"{key}{FLEET_SUFFIX}", buf.getvalue())
    d = _dir(lake_root, run_id)
    try:
        d.mkdir(parents=True, exist_ok=True)
        import pyarrow.parquet as pq

        tmp = d / f".tmp-{uuid.uuid4().hex}"
        pq.write_table(table, tmp)
        os.replace(tmp, d / f"{key}{FLEET_SUFFIX}")
        return True
    except OSError:
        return False


def fleet_ok(lake_root, run_id: str, key: str) -> bool:
    """Whether the run's fleet row under key is there and ends as a Parquet file does (a missing
    or cut one is written again by analyze: pipeline/analyze.py kept_or_computed). A lake in a
    bucket is not checked (one request per run)."""
    if objstore.is_url(lake_root):
        return True
    try:
        with open(_dir(lake_root, run_id) / f"{key}{FLEET_SUFFIX}", "rb") as f:
            f.seek(-4, os.SEEK_END)
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def fleet_files(lake_root: Path) -> list[str]:
    """Every kept fleet row's file of the lake (sorted paths; s3:// URLs for a lake there)."""
    if objstore.is_url(lake_root):
        found = _remote_find(lake_root)
        return sorted(objstore.url_of(k) for k in found if k.endswith(FLEET_SUFFIX))
    base = Path(lake_root) / DIR
    try:
        return sorted(str(p) for p in base.glob(f"*/*{FLEET_SUFFIX}"))
    except OSError:
        return []


def sources_digest(sources: pl.DataFrame) -> str:
    """MD5 (hex) of the run's sources as `runs_overview` recomputes it in SQL to say whether a kept
    row is current: "source_id/ingested_at_ns" of each source, in source id order, joined by
    commas (md5 of DuckDB's string_agg(..., ',' ORDER BY source_id))."""
    rows = sorted(zip(sources["source_id"].to_list(), sources["ingested_at_ns"].to_list()))
    return hashlib.md5(",".join(f"{s}/{t}" for s, t in rows).encode()).hexdigest()


def _fleet_view(con, files: list[str]) -> None:
    listed = ", ".join(
        "'" + f.replace("'", "''").replace("[", "[[]").replace("*", "[*]") + "'" for f in files
    )
    con.execute(
        "CREATE OR REPLACE VIEW internal.fleet_kept AS "
        f"SELECT * FROM read_parquet([{listed}], union_by_name = true, hive_partitioning = false)"
    )


def bind_overview(con, lake_root: Path) -> None:
    """Create the `runs_overview` view on a DuckDB connection whose `sources` view is bound: the
    newest kept fleet row of each run the lake holds (fleet_files), with `current` (whether the
    run's sources are still those it was computed from: sources_digest recomputed in SQL). The
    rows are read only when the view is queried; a lake without kept rows gives an empty view of
    the same columns."""
    files = fleet_files(lake_root)
    if files:
        try:
            _fleet_view(con, files)
        except Exception:  # a damaged row (a cache file): the readable ones, the others ignored
            import pyarrow.parquet as pq

            def readable(f: str) -> bool:
                try:
                    pq.read_metadata(f) if not objstore.is_url(f) else None
                    return True
                except Exception:
                    return False

            files = [f for f in files if readable(f)]
            if files:
                _fleet_view(con, files)
    if not files:
        import polars as pl

        from .fleet import FLEET_SCHEMA  # the columns of an empty view (no kept row yet)

        extra = {n: getattr(pl, t) for n, t, _ in FLEET_EXTRA}
        empty = pl.DataFrame(schema={**FLEET_SCHEMA, **extra}).to_arrow()
        con.register("_fleet_empty", empty)
        con.execute("CREATE TABLE internal.fleet_kept AS SELECT * FROM _fleet_empty")
        con.unregister("_fleet_empty")
    con.execute(
        "CREATE VIEW runs_overview AS "
        "SELECT k.* EXCLUDE (key, sources_digest, options, computed_at_ns), "
        "k.sources_digest = d.digest AS current, k.computed_at_ns, k.options "
        "FROM internal.fleet_kept k JOIN ("
        "  SELECT run_id, md5(string_agg(source_id || '/' || CAST(ingested_at_ns AS VARCHAR), ',' "
        "  ORDER BY source_id)) AS digest FROM sources GROUP BY run_id"
        ") d USING (run_id) "
        "QUALIFY row_number() OVER (PARTITION BY k.run_id ORDER BY k.computed_at_ns DESC) = 1 "
        "ORDER BY k.run_id"
    )
