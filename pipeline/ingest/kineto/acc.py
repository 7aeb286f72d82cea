"""Phase 1 of a parse: the accumulator that turns batches of events into spooled table rows.

Owns: _Acc. add() sorts a batch's events by table (columns.sort_events), converts their fields
once (columns.convert), builds the gpu_activities / cpu_ops / annotations / counters rows
(columns.*_frame) and spools them (spool._Spool), keeping what the whole-trace steps need (comm
host ops, collective metadata, step ranges, used devices, vendor evidence, counts). finish()
checks the base time, writes the notes and builds the whole-trace tables (summary) into a
result.StreamParsed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from ... import classify as classify_mod
from ..errors import TraceError
from ..jobid import METADATA_KEYS
from ..spool import _Budget, _Spool
from . import summary
from .columns import NOT_SCALAR, Part, ann_frame, convert, cpu_frame, ctr_frame, gpu_frame, sort_events
from .decode import KTrace
from .result import StreamParsed
from .values import _int

if TYPE_CHECKING:
    from .stream import _Splitter


def _owned(df: pl.DataFrame) -> pl.DataFrame:
    """The same rows and dtypes in buffers of their own, for the few rows of a batch kept to the
    end of the parse. A polars filter that keeps contiguous rows is a slice of the batch's
    columns, and a gather shares the batch's string buffers: either would keep the whole batch's
    memory (its numpy time columns, its name strings) alive with the rows, about 1 MB a batch of
    16 MB of JSON that holds a ProfilerStep (issue 40: phase-1 RSS grew with the event count).
    Rebuilt from Python values: these frames hold a few rows a batch (ProfilerSteps, comm host
    ops, ops with collective metadata)."""
    return pl.DataFrame(df.to_dict(as_series=False), schema=df.schema)


def _as_is(df: pl.DataFrame) -> pl.DataFrame:
    """The first batch's kept rows, as they are: what they hold alive is at most that one batch,
    and a small trace (one batch) does not pay _owned's 0.15-0.2 ms a frame."""
    return df


class _Acc:
    """Phase 1: per batch, the table rows with raw (file) timestamps, spooled; plus what the
    whole-trace steps need (comm host ops' External ids, collective metadata, step ranges, used
    devices, vendor evidence, counts)."""

    def __init__(self, budget: _Budget):
        self.spools = {k: _Spool(k, budget) for k in ("gpu", "cpu", "ann", "ctr", "launch")}
        self.n = 0
        self.unknown_cats: dict[str, int] = {}
        self.bad_t = self.bad_dur = self.neg = 0
        self.ts_lo = self.ts_hi = None
        self.start_lo = self.end_hi = None
        self.used_devices: set = set()
        self.vendor_hip = self.vendor_cu = self.vendor_mtia = False
        self.comm_ext: set = set()
        self.steps: list[pl.DataFrame] = []
        self.rpc: list[pl.DataFrame] = []
        self.hosts: list[
            pl.DataFrame
        ] = []  # comm host ops (comm_host_ops), for the launch chains of NCCL kernels
        self.gpu_meta: dict = {}
        self.cpu_meta: dict = {}
        self.host_re = classify_mod.comm_host_op_regex()
        self.flops_memo: dict = {}  # (name, dims, types, concrete inputs) -> op_flops

    def close(self):
        for s in self.spools.values():
            s.close()

    def _span(self, ts, ok):
        if ok.any():
            lo, hi = int(ts[ok].min()), int(ts[ok].max())
            self.ts_lo = lo if self.ts_lo is None else min(self.ts_lo, lo)
            self.ts_hi = hi if self.ts_hi is None else max(self.ts_hi, hi)

    def _extent(self, df: pl.DataFrame):
        if df.height:
            lo, hi = df["start_ns"].min(), (df["start_ns"] + df["dur_ns"]).max()
            self.start_lo = lo if self.start_lo is None else min(self.start_lo, lo)
            self.end_hi = hi if self.end_hi is None else max(self.end_hi, hi)

    def _count(self, p: Part) -> None:
        """Count a table's events without a readable ts (dropped) and with a negative dur (clamped)."""
        self.bad_t += int((~p.ok_ts).sum())
        self.neg += int(((p.du < 0) & p.ok_du).sum())

    def add(self, events: list) -> None:
        off = self.n
        self.n += len(events)
        # one pass: the events of each table, by phase and category
        gpu_idx, cpu_idx, ann_idx, ctr = sort_events(events, self.unknown_cats)
        b = convert(events, gpu_idx, cpu_idx, ann_idx)
        self.bad_dur += int((b.ok_ts & ~b.ok_du).sum())
        self._span(b.ts, b.ok_ts)
        self._add_gpu(b.gpu, off)
        self._add_cpu(b.cpu, off)
        # ---------------- annotations
        self.spools["ann"].add(ann_frame(b.ann).to_arrow())
        # ---------------- counters (ph C: one series per args key)
        self.spools["ctr"].add(ctr_frame(events, ctr).to_arrow())

    def _add_gpu(self, p: Part, off: int) -> None:
        """GPU activities: spooled; Collective name args and used devices kept."""
        self._count(p)
        gpu, meta = gpu_frame(p, off)
        self.gpu_meta.update(meta)
        self.used_devices |= set(gpu["device"].to_list()) - {None}
        self._extent(gpu)
        self.spools["gpu"].add(gpu)  # read back as frames (result.gpu_chunks): kept as one

    def _add_cpu(self, p: Part, off: int) -> None:
        """CPU ops: spooled, with the runtime launches; comm host ops, collective metadata, vendor
        evidence and ProfilerStep ranges kept."""
        self._count(p)
        cpu, meta = cpu_frame(p, off, self.flops_memo)
        self.cpu_meta.update(meta)
        self._extent(cpu)
        own = _owned if off else _as_is
        # which rows each kept piece needs, and the vendor evidence, in one polars call
        kind, name = pl.col("kind"), pl.col("name")
        runtime = kind.is_in(["runtime", "driver"])
        m = cpu.select(
            host=name.str.contains(self.host_re),
            launch=runtime & pl.col("correlation").is_not_null(),
            step=kind.is_in(["annotation", "op"]) & name.str.contains(r"^ProfilerStep\s*#\s*\d+$"),
            hip=(runtime & name.str.starts_with("hip")).any(),
            cu=(runtime & name.str.starts_with("cu")).any(),
            mtia=(pl.col("category") == "mtia_runtime").any(),
        )
        if m.height:
            self.vendor_hip |= bool(m["hip"][0])
            self.vendor_cu |= bool(m["cu"][0])
            self.vendor_mtia |= bool(m["mtia"][0])
        host, launch, step = m["host"], m["launch"], m["step"]
        if host.any():
            hosts = cpu.filter(host)
            self.comm_ext |= set(hosts["external_id"].drop_nulls().to_list())
            self.hosts.append(
                own(
                    hosts.select(
                        "event_index", "pid", "tid", "name", "start_ns", "dur_ns", "input_dims", "input_types"
                    )
                )
            )
        self.spools["launch"].add(cpu.select("correlation", "pid", "tid", "start_ns").filter(launch))
        if step.any():
            self.steps.append(own(cpu.filter(step).select("name", "start_ns", "dur_ns", "pid", "tid")))
        if meta:
            self.rpc.append(
                own(
                    cpu.filter(pl.col("event_index").is_in(list(meta))).select(
                        "event_index", "external_id", "start_ns", "dur_ns"
                    )
                )
            )
        self.spools["cpu"].add(cpu.to_arrow())

    def _notes(self, sp: _Splitter, has_base: bool) -> list[str]:
        """What the parse noticed about the file (notes of the result), in order."""
        notes = list(sp.notes)
        if sp.utf8_fixed:
            notes.append(f"invalid UTF-8 replaced by U+FFFD ({sp.utf8_fixed} places)")
        odd = self.unknown_cats.get(NOT_SCALAR, 0)
        if odd:
            notes.append(
                f"{odd} events had a JSON list or object as cat, name, pid or tid; read as its JSON text"
            )
        cats = {k: v for k, v in self.unknown_cats.items() if k != NOT_SCALAR}
        if cats:
            notes.append(
                "unrecognized categories kept as cpu_ops kind=other: "
                + ", ".join(f"{k} ({v})" for k, v in sorted(cats.items()))
            )
        if self.bad_t:
            notes.append(
                f"{self.bad_t} events without a readable ts (or beyond the int64 ns range) were dropped"
            )
        if self.bad_dur:
            notes.append(
                f"{self.bad_dur} events without a readable dur (or beyond the int64 ns range) "
                "were given dur 0"
            )
        if self.neg:
            notes.append(f"{self.neg} events with negative dur clamped to 0")
        if sp.truncated:
            where = (
                "after the traceEvents array, in its trailing keys"
                if sp.tail_lost
                else "inside the traceEvents array"
            )
            notes.append(
                f"truncated: the file ends {where}; {self.n} complete events kept, "
                f"{sp.unreadable_bytes} bytes "
                f"(of {sp.total_bytes}) unreadable; the profiler was probably killed while writing"
            )
            if not has_base and self.ts_hi is not None and self.ts_hi < 10**17:
                notes.append(
                    "baseTimeNanoseconds, which Kineto writes at the end of the file, is missing: "
                    "timestamps are relative to an unknown base"
                )
        return notes

    def finish(self, sp: _Splitter, comm_patterns) -> StreamParsed:
        top = sp.top or KTrace()
        if sp.truncated and self.n == 0:
            raise TraceError(
                f"truncated JSON (the file ends after {sp.total_bytes} bytes, before any complete event); "
                "the profiler was probably killed while writing"
            )
        base_ns, has_base = summary.base_time(top)
        if base_ns and self.ts_hi is not None and (self.ts_hi > 2**63 - 1 - base_ns or self.ts_lo < -base_ns):
            raise TraceError("timestamps plus baseTimeNanoseconds fall outside the int64 ns range")
        notes = self._notes(sp, has_base)
        di = top.distributed_info if isinstance(top.distributed_info, dict) else {}
        for key in ("rank", "world_size"):
            if di.get(key) is not None and _int(di.get(key)) is None:
                notes.append(f"distributedInfo {key} {str(di.get(key))[:40]!r} is not an integer: left out")
        process_groups = summary.process_groups_frame(di)
        vendor = summary.vendor(top, self.vendor_hip, self.vendor_cu, self.vendor_mtia)
        devices = summary.devices_frame(top, vendor, self.used_devices)
        versions = summary.tool_versions(top, di)
        host = top.host_name or top.hostname
        steps = summary.steps_frame(self.steps, base_ns)
        rpc = summary.rpc_frame(self.rpc, base_ns)
        hosts = summary.hosts_frame(self.hosts, base_ns)
        return StreamParsed(
            acc=self,
            base_ns=base_ns,
            comm_ext=pl.Series(sorted(self.comm_ext), dtype=pl.Int64),
            comm_patterns=comm_patterns,
            steps=steps,
            devices=devices,
            process_groups=process_groups,
            rpc=rpc,
            comm_hosts=hosts,
            rank=_int(di.get("rank")),
            world_size=_int(di.get("world_size")),
            backend=di.get("backend") if isinstance(di.get("backend"), str) else None,
            host=host if isinstance(host, str) else None,
            base_time_ns=base_ns if has_base else None,
            tool_versions=versions,
            event_count=self.n,
            notes=notes,
            partial=sp.truncated,
            unreadable_bytes=sp.unreadable_bytes,
            job_metadata={k: getattr(top, k) for k in METADATA_KEYS if getattr(top, k) is not None},
            decompressed_bytes=sp.total_bytes,
            trace_start_ns=None if self.start_lo is None else self.start_lo + base_ns,
            trace_end_ns=None if self.end_hi is None else self.end_hi + base_ns,
        )
