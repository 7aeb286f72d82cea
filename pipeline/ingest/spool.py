"""Phase-1 table storage: Arrow tables held in memory up to a shared byte budget, then spilled.

Owns: _Budget (the byte limit shared by all spools of one parse and the spill directory),
_Spool (one kind of table, in the order added: in memory, or an lz4 Arrow IPC file read back
batch by batch) and SPOOL_BYTES (the default budget).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

SPOOL_BYTES = 256 << 20  # phase-1 tables kept in memory up to this, then spilled to disk


class _Budget:
    """The byte limit shared by the spools of one parse, and where they spill: a directory, a
    callable giving one (called at the first spill only: a small input never makes one), or
    None (never spilled)."""

    def __init__(self, limit: int, directory):
        self.limit, self.used, self.dir = limit, 0, directory

    def directory(self) -> Path:
        if callable(self.dir):
            self.dir = self.dir()
        return Path(self.dir)


class _Spool:
    """Tables of one kind in the order added: in memory while the shared budget allows, then in
    an Arrow IPC file (lz4) in the budget's directory, read back batch by batch. A table is added
    as an Arrow table or a polars frame and kept in memory as given, so a spool read as frames
    (iter) costs a small trace no conversion to Arrow and back (0.6-0.8 ms each, whatever the
    rows); it becomes Arrow when spilled or read as Arrow (arrow()). Every table comes back with
    the first one's types (later ones cast to them)."""

    def __init__(self, name: str, budget: _Budget):
        self.name, self.budget = name, budget
        self.mem: list[pa.Table | pl.DataFrame] = []
        self.writer = None
        self.path = None
        self.schema = None  # the first table's: an Arrow schema, or a polars one
        self.rows = 0

    def add(self, tbl: pa.Table | pl.DataFrame) -> None:
        if self.schema is None:
            self.schema = tbl.schema
        frame = isinstance(tbl, pl.DataFrame)
        n = tbl.height if frame else tbl.num_rows
        if n == 0:
            return
        self.rows += n
        if self.writer is None:
            self.mem.append(tbl)
            self.budget.used += tbl.estimated_size() if frame else tbl.nbytes
            if self.budget.used > self.budget.limit and self.budget.dir is not None:
                self._spill()
        else:
            self.writer.write_table(self._arrow(tbl))

    def _arrow_schema(self) -> pa.Schema:
        """The first table's types as an Arrow schema."""
        if isinstance(self.schema, pa.Schema):
            return self.schema
        return pl.DataFrame(schema=self.schema).to_arrow().schema

    def _arrow(self, tbl: pa.Table | pl.DataFrame) -> pa.Table:
        """tbl as Arrow, with the first table's types."""
        if isinstance(tbl, pl.DataFrame):
            tbl = self._frame(tbl).to_arrow()
        schema = self._arrow_schema()
        return tbl if tbl.schema == schema else tbl.cast(schema)

    def _frame(self, df: pl.DataFrame) -> pl.DataFrame:
        """A frame with the first table's types (a column all null in one batch and typed in
        another)."""
        if isinstance(self.schema, pa.Schema):  # Arrow first: the Arrow path casts
            return pl.from_arrow(self._arrow(df.to_arrow()))
        return df if df.schema == self.schema else df.cast(dict(self.schema))

    def _spill(self) -> None:
        import uuid

        self.path = self.budget.directory() / f"spool-{self.name}-{uuid.uuid4().hex}.arrow"
        self.writer = pa.ipc.new_file(
            str(self.path), self._arrow_schema(), options=pa.ipc.IpcWriteOptions(compression="lz4")
        )
        for t in self.mem:
            self.writer.write_table(self._arrow(t))
            self.budget.used -= t.estimated_size() if isinstance(t, pl.DataFrame) else t.nbytes
        self.mem = []

    def __iter__(self):
        """The tables as polars frames, in the order added (arrow() as frames; frames kept in
        memory as they are)."""
        if self.writer is None and self.path is None and self.mem:
            for t in self.mem:
                yield self._frame(t) if isinstance(t, pl.DataFrame) else pl.from_arrow(self._arrow(t))
            return
        for t in self.arrow():
            yield pl.from_arrow(t)

    def arrow(self):
        """The tables in the order added, as Arrow tables (record batches when spilled); with no
        rows, one empty table, so the columns are known; without a schema (nothing added),
        nothing."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.mem = []
        if self.path is not None:
            with pa.OSFile(str(self.path)) as f:
                r = pa.ipc.open_file(f)
                for i in range(r.num_record_batches):
                    yield r.get_batch(i)
        elif self.mem:
            for t in self.mem:
                yield self._arrow(t)
        elif self.schema is not None:
            # built column by column: Schema.empty_table() imports pandas, ~0.3 s
            schema = self._arrow_schema()
            yield pa.Table.from_arrays([pa.nulls(0, type=f.type) for f in schema], schema=schema)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.path is not None:
            Path(self.path).unlink(missing_ok=True)
        self.mem = []
