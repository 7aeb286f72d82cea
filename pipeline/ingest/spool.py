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
    """Arrow tables of one kind in the order added: in memory while the shared budget allows,
    then in an Arrow IPC file (lz4) in the budget's directory, read back batch by batch."""

    def __init__(self, name: str, budget: _Budget):
        self.name, self.budget = name, budget
        self.mem: list[pa.Table] = []
        self.writer = None
        self.path = None
        self.schema = None
        self.rows = 0

    def add(self, tbl: pa.Table) -> None:
        if self.schema is None:
            self.schema = tbl.schema
        if tbl.num_rows == 0:
            return
        self.rows += tbl.num_rows
        if tbl.schema != self.schema:
            tbl = tbl.cast(self.schema)
        if self.writer is None:
            self.mem.append(tbl)
            self.budget.used += tbl.nbytes
            if self.budget.used > self.budget.limit and self.budget.dir is not None:
                self._spill()
        else:
            self.writer.write_table(tbl)

    def _spill(self) -> None:
        import uuid

        self.path = self.budget.directory() / f"spool-{self.name}-{uuid.uuid4().hex}.arrow"
        self.writer = pa.ipc.new_file(
            str(self.path), self.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")
        )
        for t in self.mem:
            self.writer.write_table(t)
            self.budget.used -= t.nbytes
        self.mem = []

    def __iter__(self):
        """The tables as polars frames, in the order added (arrow() as frames)."""
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
            yield from self.mem
        elif self.schema is not None:
            # built column by column: Schema.empty_table() imports pandas, ~0.3 s
            yield pa.Table.from_arrays([pa.nulls(0, type=f.type) for f in self.schema], schema=self.schema)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.path is not None:
            Path(self.path).unlink(missing_ok=True)
        self.mem = []
