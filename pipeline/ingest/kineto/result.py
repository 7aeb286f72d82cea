"""The results of a parse: what a trace says about itself and its tables.

Owns: TraceMeta (distributedInfo, host, base time, versions, how much could be read), Parsed
(all tables as polars frames; parse()) and StreamParsed (parse_stream(): the large tables
spooled, streamed by tables() with timestamps made absolute, GPU work classified and the
collectives table built last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ... import classify as classify_mod
from ...arrow_calls import add
from . import comm as kineto_comm
from .collectives import _collectives


@dataclass
class TraceMeta:
    """What a trace file says about itself (distributedInfo, host, base time, versions) and how
    much of it could be read; shared by Parsed and StreamParsed."""

    rank: int | None
    world_size: int | None
    backend: str | None
    host: str | None
    base_time_ns: int | None
    tool_versions: dict
    event_count: int
    notes: list[str]
    partial: bool
    unreadable_bytes: int
    # the top-level values naming the trace's job (pipeline/ingest/jobid.py METADATA_KEYS), as given
    job_metadata: dict


@dataclass
class Parsed(TraceMeta):
    """Tables of one trace (polars frames), plus what the file says about itself (parse())."""

    gpu: pl.DataFrame
    cpu: pl.DataFrame
    steps: pl.DataFrame
    collectives: pl.DataFrame
    devices: pl.DataFrame
    process_groups: pl.DataFrame
    annotations: pl.DataFrame
    counters: pl.DataFrame


@dataclass
class StreamParsed(TraceMeta):
    """A parsed trace whose large tables are spooled: tables(ids) streams them, with timestamps
    made absolute and GPU work classified (phase 2). What the file says about itself is in the
    attributes. close() removes spill files."""

    acc: Any  # the acc._Acc whose spools hold the tables (not imported: acc imports this module)
    base_ns: int
    comm_ext: pl.Series
    comm_patterns: list[str] | None
    steps: pl.DataFrame
    devices: pl.DataFrame
    process_groups: pl.DataFrame
    rpc: pl.DataFrame
    comm_hosts: (
        pl.DataFrame
    )  # comm host ops (event_index, pid, tid, name, start_ns, end_ns, input_dims, input_types)
    decompressed_bytes: int
    trace_start_ns: int | None
    trace_end_ns: int | None

    def close(self) -> None:
        self.acc.close()

    def _launch_chains(self, comm: pl.DataFrame | None) -> dict[int, list[int]]:
        """correlation -> the comm host ops around the launch of each communication kernel
        without Collective name args of its own (kineto_comm.launch_chains)."""
        if comm is None or not comm.height:
            return {}
        own = self.acc.gpu_meta
        want = [
            c
            for c, ei in zip(comm["correlation"].to_list(), comm["event_index"].to_list())
            if c is not None and ei not in own
        ]
        if not want:
            return {}
        want_df = pl.DataFrame({"correlation": want}, schema={"correlation": pl.Int64}).unique()
        parts = [df.join(want_df, on="correlation", how="semi") for df in self.acc.spools["launch"]]
        if not parts:
            return {}
        launches = pl.concat(parts).unique("correlation", keep="first", maintain_order=True)
        return kineto_comm.launch_chains(
            launches.with_columns(start_ns=pl.col("start_ns") + self.base_ns), self.comm_hosts
        )

    def tables(self, ids: dict | None = None, arrow: bool = False) -> dict:
        """Table name -> iterator of chunks (or a callable giving them, for tables that need an
        earlier table fully read), polars frames, or pyarrow tables when arrow=True. ids: columns
        to add to every row (run_id, source_id, rank); devices also get host."""
        ids = ids or {}
        base = self.base_ns
        comm_rows: list[pl.DataFrame] = []
        state = {"gpu_done": False}

        def out(df, with_rank: bool = True):
            """The chunk with the id columns (a polars frame, or in arrow mode a polars frame or
            an Arrow table: the columns appended as Arrow arrays, no polars call)."""
            if not arrow:
                cols = [pl.lit(v).alias(k) for k, v in ids.items() if k != "rank"]
                if with_rank and "rank" in ids:
                    cols.append(pl.lit(ids["rank"], dtype=pl.Int32).alias("rank"))
                return df.with_columns(cols) if cols else df
            t = df.to_arrow() if isinstance(df, pl.DataFrame) else df
            for k, v in ids.items():
                if k != "rank" or with_rank:
                    t = _with_column(t, k, repeat(v, t.num_rows, pa.int32() if k == "rank" else None))
            return t

        def whole(df: pl.DataFrame) -> list:
            """A table built whole as its one chunk; in arrow mode none when it has no rows (an
            empty chunk stores nothing: its conversion, about 0.3 ms, is saved)."""
            return [out(df)] if df.height or not arrow else []

        def gpu_chunks():
            for df in self.acc.spools["gpu"]:
                # one plan: absolute times, then the classification (classify's two columns)
                lf = df.lazy().with_columns(
                    start_ns=pl.col("start_ns") + base, end_ns=pl.col("start_ns") + base + pl.col("dur_ns")
                )
                df = (
                    classify_mod.classify(lf, self.comm_ext, self.comm_patterns)
                    .drop("has_comm_args")
                    .collect()
                )
                comm_rows.append(df.filter(pl.col("category") == "communication"))
                yield out(df)
            state["gpu_done"] = True

        def cpu_chunks():
            if arrow:  # Arrow compute: two calls, not a polars plan per chunk
                b = _i64(base)
                for t in self.acc.spools["cpu"].arrow():
                    t = t if isinstance(t, pa.Table) else pa.Table.from_batches([t])
                    start = add(t.column("start_ns"), b)
                    t = _with_column(t, "start_ns", start)
                    yield out(_with_column(t, "end_ns", add(start, t.column("dur_ns"))))
                return
            for df in self.acc.spools["cpu"]:
                yield out(
                    df.with_columns(start_ns=pl.col("start_ns") + base).with_columns(
                        end_ns=pl.col("start_ns") + pl.col("dur_ns")
                    )
                )

        def shifted(spool: str, cols: tuple[str, ...]):
            """The spool's chunks with `cols` made absolute (+ the base time)."""
            if arrow:
                b = _i64(base)
                for t in self.acc.spools[spool].arrow():
                    t = t if isinstance(t, pa.Table) else pa.Table.from_batches([t])
                    for c in cols:
                        t = _with_column(t, c, add(t.column(c), b))
                    yield out(t)
                return
            for df in self.acc.spools[spool]:
                yield out(df.with_columns(pl.col(c) + base for c in cols))

        def collectives():
            if not state["gpu_done"]:  # gpu_activities was not streamed first: classify here
                comm_rows.clear()
                for _ in gpu_chunks():
                    pass
            comm = pl.concat(comm_rows, how="vertical_relaxed") if comm_rows else None
            if arrow and (comm is None or not comm.height) and not self.rpc.height:
                return []  # no communication kernel nor collective op: _collectives has no row
            return [
                out(
                    _collectives(
                        comm,
                        self.rpc,
                        self.acc.gpu_meta,
                        self.acc.cpu_meta,
                        self._launch_chains(comm),
                        self.comm_hosts,
                    )
                )
            ]

        return {
            "gpu_activities": gpu_chunks(),
            "cpu_ops": cpu_chunks(),
            "steps": whole(self.steps),
            "collectives": collectives,
            "devices": whole(
                self.devices.with_columns(host=pl.lit(self.host, dtype=pl.String)) if ids else self.devices
            ),
            "process_groups": whole(self.process_groups),
            "annotations": shifted("ann", ("start_ns", "end_ns")),
            "counters": shifted("ctr", ("ts_ns",)),
        }


def repeat(value, n: int, typ: pa.DataType | None = None) -> pa.Array:
    """n copies of value (a str, an int or None) as an Arrow array: string, `typ` (int32 or
    int64, the default) or null. Built from buffers: pa.array and pa.scalar import pandas where
    it is installed (0.3 s). TypeError for another kind of value."""
    if value is None:
        return pa.nulls(n)
    if isinstance(value, str):
        b = value.encode()
        if n * len(b) >= 2**31:
            off = np.arange(n + 1, dtype=np.int64) * len(b)
            return pa.LargeStringArray.from_buffers(n, pa.py_buffer(off), pa.py_buffer(b * n))
        off = np.arange(n + 1, dtype=np.int32) * len(b)
        return pa.StringArray.from_buffers(n, pa.py_buffer(off), pa.py_buffer(b * n))
    if isinstance(value, int) and not isinstance(value, bool):
        typ = typ or pa.int64()
        vals = np.full(n, value, dtype=np.int32 if typ == pa.int32() else np.int64)
        return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(vals)])
    raise TypeError(f"cannot repeat a {type(value).__name__}")


def _i64(v: int) -> pa.Scalar:
    """An int64 Arrow scalar (pa.scalar imports pandas)."""
    return repeat(v, 1)[0]


def _with_column(t: pa.Table, name: str, col) -> pa.Table:
    """t with column `name` replaced by col, or appended when t has none (polars' with_columns)."""
    i = t.schema.get_field_index(name)
    field = pa.field(name, col.type)
    return t.set_column(i, field, col) if i >= 0 else t.append_column(field, col)
