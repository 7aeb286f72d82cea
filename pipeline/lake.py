"""The lake: hive-partitioned Parquet, one directory per table and run.

Layout: <lake>/<table>/run=<run_id>/<source_id>.parquet, for every table of schema v1
(schemas/v1.toml). DuckDB (`read_parquet('<lake>/<table>/*/*.parquet', hive_partitioning=true)`),
polars (`pl.scan_parquet('<lake>/<table>/**/*.parquet', hive_partitioning=True)`) and Spark read it
as is. The partition key is `run`; every file also holds `run_id` as a column.

Writes are per source file and atomic per part: each part is written under <lake>/.tmp and renamed
into place, and the source's `sources` row is written last, so a source without its row is
incomplete and is ignored by readers of the manifest. Failed files get a `sources` row with
status=failed and no other rows.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (imported here, not lazily inside the first write)
import pyarrow.parquet as pq

from . import schema as sch

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_run_id(name: str) -> str:
    """A run id usable as a hive partition value: [A-Za-z0-9._-], other runs of characters -> '_'.
    A name that had to change gets '-' and 6 hex digits of its SHA-1, so two different names never
    map to one run id."""
    s = _SAFE.sub("_", name).strip("._")[:100] or "run"
    if s != name:
        s += "-" + hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:6]
    return s


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: str | None) -> str | None:
    """Text safe to print as one terminal line: control characters (newlines, ESC, ...) become
    \\xNN escapes."""
    if text is None:
        return None
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class LakeError(RuntimeError):
    pass


def _write_parquet(tbl: pa.Table, path: Path) -> None:
    """zstd; min/max statistics only for non-string columns (numbers and times prune row groups;
    statistics of long text columns such as input_dims cost as much as the data)."""
    stats = [f.name for f in tbl.schema if not pa.types.is_string(f.type) and not pa.types.is_list(f.type)]
    pq.write_table(tbl, path, compression="zstd", write_statistics=stats)


class Lake:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def ensure(self) -> None:
        """Create the lake directory if needed. Raises LakeError (one line) when it cannot."""
        try:
            if self.root.exists() and not self.root.is_dir():
                raise LakeError(f"{self.root}: exists and is not a directory")
            self.root.mkdir(parents=True, exist_ok=True)
            marker = self.root / "TRACELAKE"
            if not marker.exists():
                marker.write_text(f"tracelake lake, schema v{sch.SCHEMA_VERSION}\n")
        except OSError as e:
            raise LakeError(f"{self.root}: cannot create the lake: {e.strerror or e}") from None

    def writable(self) -> bool:
        return os.access(self.root, os.W_OK)

    def exists(self) -> bool:
        return (self.root / "TRACELAKE").exists()

    def part_path(self, table: str, run_id: str, source_id: str) -> Path:
        return self.root / table / f"run={run_id}" / f"{source_id}.parquet"

    def table_files(self, table: str) -> list[str]:
        """The table's Parquet parts (listed here, so no character of the lake path is a glob)."""
        d = self.root / table
        return sorted(str(p) for p in d.glob("run=*/*.parquet")) if d.is_dir() else []

    def has_table(self, table: str) -> bool:
        return bool(self.table_files(table))

    def sources(self) -> pl.DataFrame:
        """The manifest: all sources rows (empty frame with the v1 columns when none)."""
        if not self.has_table("sources"):
            return pl.from_arrow(sch.empty("sources"))
        parts = self.table_files("sources")
        return pl.concat([pl.read_parquet(p) for p in parts], how="vertical_relaxed")

    def write_source(self, run_id: str, source_id: str, tables: dict[str, object], source_row: dict,
                     replace: bool = False) -> None:
        """Write one source's tables, then its sources row.

        tables: table name -> a pyarrow Table, an iterable of pyarrow Tables/RecordBatches (streamed
        into the Parquet part chunk by chunk, so memory stays bounded), or a callable returning
        either (called after the tables before it are written, in dict order). Each chunk is
        conformed to schema v1 (SchemaError on mismatch; nothing of this source reaches the lake
        then). replace: an earlier version of the same source in the same run is swapped out only
        after the new parts are fully written (its sources row goes first, so readers of the
        manifest never see a mix)."""
        whole = {t: sch.conform(t, d) for t, d in tables.items() if isinstance(d, (pa.Table, dict))}
        src = sch.conform("sources", {k: [v] for k, v in source_row.items()})
        tmp = self.root / ".tmp" / uuid.uuid4().hex
        tmp.mkdir(parents=True)
        try:
            staged = [(tmp / f"{t}.parquet", self.part_path(t, run_id, source_id), tbl)
                      for t, tbl in whole.items() if tbl.num_rows]
            # Parquet encoding releases the GIL: write the tables side by side
            with ThreadPoolExecutor(max_workers=2) as pool:
                list(pool.map(lambda x: _write_parquet(x[2], x[0]), staged))
            staged = [(f, dest) for f, dest, _ in staged]
            for t, d in tables.items():
                if d is None or t in whole:
                    continue
                f = tmp / f"{t}.parquet"
                if _write_stream(t, d() if callable(d) else d, f):
                    staged.append((f, self.part_path(t, run_id, source_id)))
            f = tmp / "sources.parquet"
            _write_parquet(src, f)
            staged.append((f, self.part_path("sources", run_id, source_id)))
            if replace:
                new = {dest for _, dest in staged}
                self.part_path("sources", run_id, source_id).unlink(missing_ok=True)
                for t in sch.tables():
                    old = self.part_path(t, run_id, source_id)
                    if old not in new:
                        old.unlink(missing_ok=True)
            for f, dest in staged:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def scratch(self) -> Path:
        """A fresh private directory under <lake>/.tmp for one ingest's intermediate files (the
        caller removes it; a crashed ingest leaves it to the next cleanup of .tmp)."""
        d = self.root / ".tmp" / ("scratch-" + uuid.uuid4().hex)
        d.mkdir(parents=True)
        return d


def _write_stream(table: str, chunks, path: Path) -> bool:
    """Write an iterable of chunks (pyarrow Table/RecordBatch, or a whole Table) as one Parquet
    file, conforming each; returns False (no file) when there were no rows."""
    if isinstance(chunks, (pa.Table, dict)):
        tbl = sch.conform(table, chunks)
        if tbl.num_rows:
            _write_parquet(tbl, path)
        return tbl.num_rows > 0
    writer = None
    rows = 0
    try:
        for c in chunks:
            if isinstance(c, pa.RecordBatch):
                c = pa.Table.from_batches([c])
            tbl = sch.conform(table, c)
            if not tbl.num_rows:
                continue
            if writer is None:
                stats = [f.name for f in tbl.schema if not pa.types.is_string(f.type) and not pa.types.is_list(f.type)]
                writer = pq.ParquetWriter(path, tbl.schema, compression="zstd", write_statistics=stats)
            writer.write_table(tbl)
            rows += tbl.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows > 0
