"""Small sources held in memory and committed in batches, straight into their run's compacted
generation (issue 37: an archive of thousands of small traces).

A small trace's own cost is a few milliseconds of parsing; writing it the usual way (a staged
Parquet part per table, the gpu_activities part read back and rewritten with its derived columns,
a journal, a rename per part, then at the end of the ingest all of it read back, sorted and
rewritten by compaction) cost about 40 ms more per file. For a run of several small sources (at
least HOLD_MIN_SOURCES units of work name it, and compaction is on; until 2026-12-05 only runs the
ingest would compact anyway, lake_compact.AUTO_MIN_SOURCES: PARAM's 8-rank DLRM job, held, costs
0.78-0.82 CPU-s to ingest instead of 0.95-1.01, and `tracelake run` 1.45-1.63 instead of
1.65-1.86, the same analysis):

1. the worker (prepare.py) keeps a source whose tables add up to under HOLD_BYTES of Arrow in
   memory: its tables conformed to schema v3, gpu_activities with its derived columns still
   NULL; a Held, not a Staged, goes back to the ingesting process (pickled with the Prepared).
   (A source of many GPU activities gets its per-source metric results at its run's first
   analysis, pipeline/local_fill.py fill, from the run's generation as from parts of its own);
2. commit.py decides its run as for any source and hands it with its `sources` row to Pending,
   which keeps it until the end of the ingest (or until PENDING_BYTES are held): then the derived
   columns of each run's held sources are computed in one polars plan (derive.derive_many: the
   same values Lake.stage computes from each source's parts; one plan per source cost about 4 ms
   of a small file's ingest), their `sources` rows conformed to the schema in one table, and
   they are written as new files of the run's compacted generation in one switch
   (lake_compact.append: files written, then the manifest replaced; the rows sorted as
   compaction sorts them). A run that ends up with fewer than
   HOLD_MIN_SOURCES held sources (sources moved to another run by a rank claim), and a source
   whose run already holds a version of it (--force), are committed one by one as before.

The lake's promises hold: a source is in the lake whole or not at all (the switch puts every
held source of a run in at once), a kill at any moment leaves the lake as it was before the
switch or after it (recover() removes unswitched files), and re-running the ingest adds what a
kill lost. What changes is when: a held source is in the lake once the batch ends, not as soon
as it is reported. A batch that cannot be written (OSError) is committed source by source
instead; a source that cannot be written then is reported again as failed (on_file) and gets a
failed `sources` row, as a source that cannot be committed always did; so does a source whose
`sources` row does not fit the schema (SchemaError: the run's other sources are written).
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

import pyarrow as pa

from .. import derive
from .. import lake_compact as compaction
from .. import lake_manifest as manifest
from .. import schema as sch
from ..lake import Lake, Staged

# a source is held when its conformed tables add up to less than this (a 300 kB Kineto trace
# of the corpus: about 0.5 MB of Arrow); a larger one is staged as parts, streamed
HOLD_BYTES = 16 << 20
# a run's small sources are held when at least this many units of work name it (a run of one
# source gains nothing: its parts are as many files as a generation of it)
HOLD_MIN_SOURCES = 2
# held sources of all runs kept in the ingesting process before they are written
PENDING_BYTES = 256 << 20


@dataclass
class Held:
    """A small source's tables in memory (table -> pa.Table of schema v3, rows only; the derived
    columns of gpu_activities NULL: Pending.flush and Lake.stage compute them), in place of a
    Staged. nbytes: their Arrow size when held (counted once, in the worker: Table.nbytes walks
    every buffer). dir names no directory (Lake.discard of it is a no-op)."""

    run_id: str
    source_id: str
    tables: dict[str, pa.Table]
    nbytes: int = 0
    dir: str = field(default_factory=lambda: f"/nonexistent/held-{uuid.uuid4().hex}")

    # A pool worker pickles its Held back to the ingesting process. pyarrow pickles a Table
    # column by column and buffer by buffer; one Arrow IPC stream per table is one call each way
    # (a small trace of the archive benchmark, 3 tables, 220 kB: 0.23 + 0.14 ms to write and read
    # against 0.84-1.14 + 0.46-0.59 ms pickled, per file, on each side of the pipe). The tables
    # read back equal the ones written (tests/test_hold.py).
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["tables"] = {t: _to_ipc(tab) for t, tab in self.tables.items()}
        return state

    def __setstate__(self, state: dict) -> None:
        state["tables"] = {t: _from_ipc(v) for t, v in state["tables"].items()}
        self.__dict__.update(state)


def _to_ipc(table: pa.Table) -> bytes | pa.Table:
    """The table as the bytes of one Arrow IPC stream; the table itself (pickled as pyarrow does)
    when the stream cannot hold it."""
    sink = pa.BufferOutputStream()
    try:
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return table
    return sink.getvalue().to_pybytes()


def _from_ipc(v: bytes | pa.Table) -> pa.Table:
    """The table _to_ipc gave (read from its stream's bytes without a copy)."""
    return pa.ipc.open_stream(pa.py_buffer(v)).read_all() if isinstance(v, bytes) else v


def hold_or_stage(lake: Lake, run_id: str, source_id: str, tables: dict[str, object]) -> Held | Staged:
    """A Held when the source is small (module doc, step 1), else lake.stage(...) of the same
    tables (the chunks read so far included: memory stays bounded by HOLD_BYTES). tables: as
    Lake.stage takes them. SchemaError as Lake.stage."""
    held: dict[str, list] = {}
    size = 0
    items = list(tables.items())
    for i, (t, d) in enumerate(items):
        if d is None:
            continue
        chunks = iter([d] if isinstance(d, (pa.Table, dict)) else (d() if callable(d) else d))
        got = held.setdefault(t, [])
        for c in chunks:
            if isinstance(c, pa.RecordBatch):
                c = pa.Table.from_batches([c])
            c = sch.conform(t, c)
            if c.num_rows:
                got.append(c)
                size += c.nbytes
            if size > HOLD_BYTES:  # not small: staged as parts, streaming the rest
                rest = {k: v for k, v in held.items() if k != t}
                rest[t] = itertools.chain(got, chunks)
                rest.update({k: v for k, v in items[i + 1 :]})
                return lake.stage(run_id, source_id, rest)
    whole = {t: pa.concat_tables(c) for t, c in held.items() if c}
    return Held(run_id, source_id, whole, size)


def retarget(held: Held, run_id: str) -> None:
    """Move a held source to another run (its run_id column rewritten)."""
    for t, tbl in held.tables.items():
        j = tbl.schema.get_field_index("run_id")
        held.tables[t] = tbl.set_column(
            j, tbl.schema.field(j), pa.array([run_id] * tbl.num_rows, pa.string())
        )
    held.run_id = run_id


def stage(lake: Lake, held: Held) -> Staged:
    """A held source written as staged parts (Lake.stage), to be committed as any other."""
    return lake.stage(held.run_id, held.source_id, held.tables)


def stored(lake: Lake, run_id: str, source_id: str) -> bool:
    """Whether the lake holds a version of the source (its own `sources` part or in its run's
    generation)."""
    if lake.part_path("sources", run_id, source_id).exists():
        return True
    m = manifest.read_one(lake.root, lake.part_path("sources", run_id, "x").parent.name)
    return m is not None and source_id in m.sources


@dataclass
class _Entry:
    held: Held
    row: dict  # its `sources` row (conformed with the run's others by flush)
    key: object  # the caller's handle (its place in the results), given back on failure


# what a held source's `sources` row is counted as against PENDING_BYTES
ROW_BYTES = 1 << 10


class Pending:
    """Held sources committed but not yet written (module doc, step 2), per run in input order."""

    def __init__(self, lake: Lake, min_sources: int = HOLD_MIN_SOURCES):
        self.lake, self.min_sources = lake, min_sources
        self.runs: dict[str, list[_Entry]] = {}
        self.bytes = 0
        self.failures: list[tuple[object, OSError]] = []

    def add(self, held: Held, source_row: dict, key: object = None) -> None:
        """Take a held source with its `sources` row (ValueError when it is not the held
        source's; a row that does not fit schema v3 is a failure of the flush that writes it);
        writes what is held when PENDING_BYTES are reached (flush; its failures are given by the
        next flush())."""
        if source_row.get("run_id") != held.run_id or source_row.get("source_id") != held.source_id:
            raise ValueError("sources row does not match the held source")
        self.runs.setdefault(held.run_id, []).append(_Entry(held, source_row, key))
        self.bytes += held.nbytes + ROW_BYTES
        if self.bytes > PENDING_BYTES:
            self.failures += self.flush()

    def flush(self) -> list[tuple[object, OSError | sch.SchemaError]]:
        """Write every held source (module doc); returns (key, OSError or SchemaError) of each
        source that could not be written at all, since the last call (the caller reports it
        failed). LakeError as Lake.commit."""
        failures, self.failures = self.failures, []
        runs, self.runs, self.bytes = self.runs, {}, 0
        for run_id, entries in runs.items():
            entries, rows, bad = _rows(entries)
            failures += bad
            if len(entries) >= self.min_sources:
                run_dir = self.lake.part_path("sources", run_id, "x").parent.name
                try:
                    gpus = _derived(entries)
                    batch = [
                        (e.held.source_id, {**e.held.tables, **g}, r) for e, g, r in zip(entries, gpus, rows)
                    ]
                    compaction.append(self.lake, run_dir, batch)
                    continue
                except OSError:  # one by one below: only what cannot be written fails
                    pass
            for e in entries:
                try:
                    self.lake.commit(stage(self.lake, e.held), e.row)
                except OSError as err:
                    failures.append((e.key, err))
        return failures

    def drop(self) -> None:
        """Forget what is held (an interrupted ingest: nothing of it reaches the lake)."""
        self.runs, self.bytes = {}, 0


def _rows(
    entries: list[_Entry],
) -> tuple[list[_Entry], list[pa.Table], list[tuple[object, sch.SchemaError]]]:
    """(the entries whose `sources` row fits schema v3, those rows conformed (a one-row table
    each), (key, SchemaError) of the others). One conform for all of them (about 0.7 ms a row
    alone), each row alone only when that fails."""
    names = entries[0].row.keys()
    if all(e.row.keys() == names for e in entries):
        try:
            whole = sch.conform("sources", {k: [e.row[k] for e in entries] for k in names})
            return entries, [whole.slice(i, 1) for i in range(len(entries))], []
        except sch.SchemaError:
            pass
    good, rows, bad = [], [], []
    for e in entries:
        try:
            rows.append(sch.conform("sources", {k: [v] for k, v in e.row.items()}))
            good.append(e)
        except sch.SchemaError as err:
            bad.append((e.key, err))
    return good, rows, bad


def _derived(entries: list[_Entry]) -> list[dict[str, pa.Table]]:
    """Each entry's gpu_activities with its derived columns (one plan: derive.derive_many), as
    {"gpu_activities": rows conformed}, or {} for a source without GPU activities."""
    tables = [e.held.tables for e in entries]
    have = [(t["gpu_activities"], t.get("cpu_ops"), t.get("steps")) for t in tables if "gpu_activities" in t]
    gpus = iter(derive.derive_many(have, lambda g: sch.conform("gpu_activities", g)))
    return [{"gpu_activities": next(gpus)} if "gpu_activities" in t else {} for t in tables]


def hold_runs(units, run: str | None, run_for, compact: bool) -> frozenset[str]:
    """The natural run ids whose small sources are held (module doc): those at least
    HOLD_MIN_SOURCES of the units name, when the ingest compacts (units: discover.plan's; run:
    --run; run_for: runs.run_for)."""
    if not compact:
        return frozenset()
    counts: dict[str, int] = {}
    for u in units:
        name = getattr(u.item, "run_name", None)
        if u.kind != "targz" and name is not None:
            r = run_for(name, run)
            counts[r] = counts.get(r, 0) + 1
    return frozenset(r for r, n in counts.items() if n >= HOLD_MIN_SOURCES)
