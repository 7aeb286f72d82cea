"""The results of a parse: what a trace says about itself and its tables.

Owns: TraceMeta (distributedInfo, host, base time, versions, how much could be read), Parsed
(all tables as polars frames; parse()) and StreamParsed (parse_stream(): the large tables
spooled, streamed by tables() with timestamps made absolute, GPU work classified and the
collectives table built last).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from ... import classify as classify_mod
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

        def out(df: pl.DataFrame, with_rank: bool = True):
            cols = [pl.lit(v).alias(k) for k, v in ids.items() if k != "rank"]
            if with_rank and "rank" in ids:
                cols.append(pl.lit(ids["rank"], dtype=pl.Int32).alias("rank"))
            df = df.with_columns(cols) if cols else df
            return df.to_arrow() if arrow else df

        def gpu_chunks():
            for df in self.acc.spools["gpu"]:
                df = df.with_columns(start_ns=pl.col("start_ns") + base).with_columns(
                    end_ns=pl.col("start_ns") + pl.col("dur_ns")
                )
                df = classify_mod.classify(df, self.comm_ext, self.comm_patterns).drop("has_comm_args")
                comm_rows.append(df.filter(pl.col("category") == "communication"))
                yield out(df)
            state["gpu_done"] = True

        def cpu_chunks():
            for df in self.acc.spools["cpu"]:
                yield out(
                    df.with_columns(start_ns=pl.col("start_ns") + base).with_columns(
                        end_ns=pl.col("start_ns") + pl.col("dur_ns")
                    )
                )

        def ann_chunks():
            for df in self.acc.spools["ann"]:
                yield out(df.with_columns(start_ns=pl.col("start_ns") + base, end_ns=pl.col("end_ns") + base))

        def ctr_chunks():
            for df in self.acc.spools["ctr"]:
                yield out(df.with_columns(ts_ns=pl.col("ts_ns") + base))

        def collectives():
            if not state["gpu_done"]:  # gpu_activities was not streamed first: classify here
                comm_rows.clear()
                for _ in gpu_chunks():
                    pass
            comm = pl.concat(comm_rows, how="vertical_relaxed") if comm_rows else None
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
            "steps": [out(self.steps)],
            "collectives": collectives,
            "devices": [
                out(
                    self.devices.with_columns(host=pl.lit(self.host, dtype=pl.String))
                    if ids
                    else self.devices
                )
            ],
            "process_groups": [out(self.process_groups)],
            "annotations": ann_chunks(),
            "counters": ctr_chunks(),
        }
