"""Compaction: the small parts of a run merged into a few files per table (pipeline/lake.py
module doc, "Compaction"; what makes them live: pipeline/lake_manifest.py). Called with the
lake's lock held, through Lake.compact(), Lake.commit() and Lake.forget(); `lake` is a Lake
(duck-typed, as in lake_journal.py, so this module does not import lake.py).

Which sources: a committed source with parts of its own whose parts add up to less than
SMALL_SOURCE_BYTES (larger ones are already files of a sensible size and stay as they are). A
run is compacted when it holds at least `min_sources` such sources (Lake.compact: 2 for
`tracelake compact`, AUTO_MIN_SOURCES after an ingest); its existing generation, if any, is
merged with them into a new one.

The files: per table, the inputs (the old generation's files, then the new sources' parts) in
groups of at most TARGET_FILE_BYTES of Parquet, each group one file whose rows are sorted by rank,
source id and the table's time column (SORT_TIME; what queries/views/*.sql filter and join on),
written in row groups of ROW_GROUP_ROWS (the min/max statistics of rank and time then prune
row groups; a source's rows stay together).

The steps, each safe to kill (TRACELAKE_CRASH_AT points compact-written, compact-switched,
compact-clean; tests/test_compact.py):
1. the new generation's files are written under <lake>/.tmp/compact-<gen>/ and renamed into
   their run directories: nothing reads them yet (no manifest names their generation);
2. the switch: the run's manifest is replaced (os.replace of a complete file; or removed when no
   source is left in the generation). Readers listing the run before it read the old parts, after
   it the new ones, never both or neither;
3. the old generation's files and the merged sources' own parts (now held by the manifest, so
   read by no one) are removed.
A kill before 2 leaves files of a generation no manifest names; a kill after it, parts the
manifest supersedes: recover() removes both. append() adds sources that were never parts (an
ingest's small sources held in memory, pipeline/ingest/hold.py) to a run's generation with the
same steps: their files written, the switch (a manifest naming the old files and the new ones),
nothing to remove. Errors: OSError from the file system, pyarrow's
errors from reading a part.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import lake_journal as journal
from . import lake_manifest as manifest
from . import schema as sch
from .arrow_calls import sort_by
from .parts import parquet_options

# a source is small when its parts hold less than this much Parquet (the corpus's ranks of a
# 50 MB trace write 5-10 MB; a 67 KB trace about 40 KB over six tables)
SMALL_SOURCE_BYTES = 32 << 20
# one compacted file holds at most this much of its inputs' Parquet (decoded in memory at once
# to be sorted: a few hundred MB)
TARGET_FILE_BYTES = 64 << 20
# rows per row group of a compacted file (DuckDB's own is 122,880)
ROW_GROUP_ROWS = 128 * 1024
# an ingest compacts a run it wrote to when the run holds at least this many small sources of
# their own (a 16-rank job of small traces; smaller runs cost little to read as they are)
AUTO_MIN_SOURCES = 16
# the time column rows are sorted by within a rank and source, the first of these a table has
_TIME_COLUMNS = (
    "start_ns",
    "ts_ns",
    "time_ns",
    "local_time_ns",
    "time_created_ns",
    "step_start_ns",
    "first_ns",
)


def sort_keys(table: str) -> list[tuple[str, str]]:
    """The sort keys of a table's compacted files: rank (when it has one), source_id, its time
    column (when it has one)."""
    names = sch.arrow_schema(table).names
    keys = [c for c in ("rank",) if c in names] + ["source_id"]
    keys += [c for c in _TIME_COLUMNS if c in names][:1]
    return [(k, "ascending") for k in keys]


def own_parts(lake, run_dir: str, view: manifest.View) -> dict[str, dict[str, int]]:
    """source id -> {table: bytes of its own part} for the run's committed sources with parts of
    their own (one scandir per table)."""
    out: dict[str, dict[str, int]] = {}
    for t in sch.tables():
        try:
            entries = list(os.scandir(lake.root / t / run_dir))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            sid = e.name[:-8]
            if e.name.endswith(".parquet") and (run_dir, sid) in view:
                out.setdefault(sid, {})[t] = e.stat().st_size
    return out


def small_sources(lake, run_dir: str, view: manifest.View) -> dict[str, dict[str, int]]:
    """The run's sources that compaction merges (module doc): own_parts() of those under
    SMALL_SOURCE_BYTES."""
    if not any(r == run_dir for r, _ in view.singles):
        return {}
    return {s: p for s, p in own_parts(lake, run_dir, view).items() if sum(p.values()) < SMALL_SOURCE_BYTES}


def fragmented(lake, run_dir: str, m: manifest.Manifest | None, min_files: int) -> bool:
    """Whether the run's generation has a table of at least min_files (and 2) files that merged
    would make fewer files (write_groups' grouping by TARGET_FILE_BYTES): each ingest that holds
    some of a run's small sources appends one more file per table (append), so a run filled by
    many such ingests would otherwise keep one file per table per ingest."""
    if m is None:
        return False
    for t, names in m.files.items():
        if len(names) >= max(min_files, 2):
            try:
                sizes = [(lake.root / t / run_dir / n).stat().st_size for n in names]
            except OSError:  # removed meanwhile: not this command's to merge
                return False
            if len(_groups(sizes)) < len(names):
                return True
    return False


def compact(lake, runs, min_sources: int) -> list[tuple[str, int, int]]:
    """Lake.compact: compact_run() for each run id of `runs` (None: every run with parts of its
    own or a fragmented generation); (run id, parts before, files after) per run compacted."""
    view = lake.committed()
    if runs is None:
        dirs = {r for r, _ in view.singles}
        dirs |= {r for r, m in view.manifests.items() if fragmented(lake, r, m, min_sources)}
    else:
        dirs = {lake.part_path("sources", r, "x").parent.name for r in runs}
    return each_run(lake, dirs, view, min_sources, compact_run)


def each_run(lake, dirs, view, min_sources: int, compact_one) -> list[tuple[str, int, int]]:
    """compact_one(lake, run dir, view, min_sources) for each run directory, in order: (run id,
    parts before, files after) of those it compacted (a local lake's compact_run, or a bucket's:
    pipeline/lake_s3_compact.py)."""
    out = []
    for d in sorted(dirs):
        got = compact_one(lake, d, view, min_sources)
        if got:
            out.append((d[4:], *got))
    return out


def forget_held(lake, sources: list[tuple[str, str]]) -> int:
    """Lake.forget's part for the sources held by their run's generation: each such run's
    generation rewritten without them (drop); returns how many were held."""
    held: dict[str, set[str]] = {}
    for run_id, source_id in sources:
        held.setdefault(lake.part_path("sources", run_id, "x").parent.name, set()).add(source_id)
    n = 0
    for d, sids in held.items():
        m = manifest.read_one(lake.root, d)
        if m is not None and sids & m.sources.keys():
            n += len(sids & m.sources.keys())
            drop(lake, d, m, sids, keep_own=False)
    return n


def unpack(lake, run_id: str, source_id: str) -> None:
    """Before a commit of source_id into run_id: when the run's generation holds it, its rows go
    back to parts of its own (drop with keep_own), which the commit then replaces as usual."""
    d = lake.part_path("sources", run_id, "x").parent.name
    m = manifest.read_one(lake.root, d)
    if m is not None and source_id in m.sources:
        drop(lake, d, m, {source_id}, keep_own=True)


def compact_run(lake, run_dir: str, view: manifest.View, min_sources: int) -> tuple[int, int] | None:
    """Merge the run's small sources with its generation (module doc); None when it holds fewer
    than min_sources small sources (its generation counting as one) and its generation is not
    fragmented (min_sources files of a table that merged make fewer), else (parts before, files
    after) of the merged tables."""
    small = small_sources(lake, run_dir, view)
    old = view.manifests.get(run_dir)
    if (not small or len(small) + (old is not None) < max(min_sources, 2)) and not fragmented(
        lake, run_dir, old, min_sources
    ):
        return None
    gen = uuid.uuid4().hex[:16]
    stage = lake.root / ".tmp" / f"compact-{gen}"
    files: dict[str, list[str]] = {}
    before = 0
    try:
        for t in sch.tables():
            inputs = [(lake.root / t / run_dir / n, None) for n in (old.files.get(t, ()) if old else ())]
            inputs += [
                (lake.root / t / run_dir / f"{s}.parquet", None) for s in sorted(small) if t in small[s]
            ]
            before += len(inputs)
            if inputs:
                files[t] = write_groups(t, inputs, stage / t, gen)
        sources = dict(old.sources) if old else {}
        sources.update({s: sorted(p) for s, p in small.items()})
        new = manifest.Manifest(gen, {t: n for t, n in files.items() if n}, sources)
        placed = _place(lake, run_dir, stage, new)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    journal.crash_point("compact-written")
    _switch(lake, run_dir, new, placed)
    garbage = [lake.root / t / run_dir / n for t, ns in (old.files.items() if old else ()) for n in ns]
    garbage += [
        lake.root / t / run_dir / f"{s}.parquet" for s, p in small.items() for t in p if t != "sources"
    ]
    garbage += [lake.root / "sources" / run_dir / f"{s}.parquet" for s in small]
    _remove(garbage)
    return before, sum(len(n) for n in new.files.values())


def append(lake, run_dir: str, batch: list[tuple[str, dict[str, pa.Table], pa.Table]]) -> None:
    """Add sources that are not in the lake yet, held in memory (pipeline/ingest/hold.py), to the
    run's generation as new files: per table, the sources' rows (in source id order, as
    compact_run reads parts) sorted by sort_keys() into one file c-<gen>-0.parquet; the new
    manifest names the old generation's files, which stay as they are, and these. batch: (source
    id, table -> its rows, its `sources` row), each conformed to schema v3. The same steps, crash
    points and switch as compact_run. OSError from the file system (the run is then as it was)."""
    old = manifest.read_one(lake.root, run_dir)
    gen = uuid.uuid4().hex[:16]
    stage = lake.root / ".tmp" / f"compact-{gen}"
    batch = sorted(batch, key=lambda b: b[0])
    files = {t: list(ns) for t, ns in old.files.items()} if old else {}
    sources = dict(old.sources) if old else {}
    written: dict[str, list[str]] = {}
    try:
        for t in sch.tables():
            rows = [b[2] if t == "sources" else b[1].get(t) for b in batch]
            rows = [r for r in rows if r is not None and r.num_rows]
            if not rows:
                continue
            name = _stage_table(stage, t, gen, rows)
            files.setdefault(t, []).append(name)
            written[t] = [name]
        for sid, tables, _ in batch:
            sources[sid] = sorted({"sources", *(t for t, v in tables.items() if v.num_rows)})
        new = manifest.Manifest(gen, files, sources)
        placed = _place(lake, run_dir, stage, manifest.Manifest(gen, written, {}))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    journal.crash_point("compact-written")
    _switch(lake, run_dir, new, placed)


def _stage_table(stage: Path, t: str, gen: str, rows: list[pa.Table]) -> str:
    """Write `rows` of table t, concatenated and sorted by sort_keys(t), as generation gen's one
    new file of t under stage; its name."""
    tbl = sort_by(pa.concat_tables(rows), sort_keys(t))
    (stage / t).mkdir(parents=True, exist_ok=True)
    name = f"c-{gen}-0.parquet"
    pq.write_table(tbl, stage / t / name, row_group_size=ROW_GROUP_ROWS, **parquet_options(tbl.schema))
    return name


def add_tables(lake, run_dir: str, gen: str, adds: dict[str, dict[str, pa.Table]]) -> bool:
    """Add rows of tables a held source has none in yet (its per-source results, pipeline/local.py
    fill) to the run's generation, as append() adds sources: per table, the sources' new rows
    (source id order, sorted by sort_keys()) in one new file, the manifest naming the old files
    and these, each source's list of tables extended. adds: source id -> table -> its rows,
    conformed to schema v3; every source must be held by the generation `gen`. False, and nothing
    changed, when the run's live generation is not `gen` any more (a compaction, append or forget
    switched it since the caller read it) or does not hold every source of adds. The same steps,
    crash points and switch as append (a kill leaves the old generation or the new one). OSError
    from the file system (the run is then as it was)."""
    old = manifest.read_one(lake.root, run_dir)
    if old is None or old.gen != gen or not adds.keys() <= old.sources.keys():
        return False
    new_gen = uuid.uuid4().hex[:16]
    stage = lake.root / ".tmp" / f"compact-{new_gen}"
    files = {t: list(ns) for t, ns in old.files.items()}
    sources = {s: list(ts) for s, ts in old.sources.items()}
    written: dict[str, list[str]] = {}
    try:
        for t in sorted({t for tables in adds.values() for t in tables}):
            rows = [adds[s][t] for s in sorted(adds) if t in adds[s] and adds[s][t].num_rows]
            if not rows:
                continue
            name = _stage_table(stage, t, new_gen, rows)
            files.setdefault(t, []).append(name)
            written[t] = [name]
        for s, tables in adds.items():
            sources[s] = sorted({*sources[s], *(t for t, v in tables.items() if v.num_rows)})
        placed = _place(lake, run_dir, stage, manifest.Manifest(new_gen, written, {}))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    journal.crash_point("compact-written")
    _switch(lake, run_dir, manifest.Manifest(new_gen, files, sources), placed)
    return True


def drop(lake, run_dir: str, old: manifest.Manifest, sids: set[str], keep_own: bool) -> None:
    """Take sources out of the run's generation: its files rewritten without their rows, switched
    to as a compaction is. keep_own: each such source's rows are first written back as parts of
    its own (live from the switch on: a source about to be replaced by a commit, which then
    replaces them, or restores them when it is undone); else they are gone at the switch
    (forget)."""
    sids = sids & old.sources.keys()
    if not sids:
        return
    gen = uuid.uuid4().hex[:16]
    stage = lake.root / ".tmp" / f"compact-{gen}"
    files: dict[str, list[str]] = {}
    try:
        for t, names in old.files.items():
            inputs = [(lake.root / t / run_dir / n, sids) for n in names]
            files[t] = write_groups(t, inputs, stage / t, gen)
            if keep_own:
                for s in sorted(sids):
                    if t in old.sources[s]:
                        _write_own(t, inputs, s, stage / "own" / t / f"{s}.parquet")
        sources = {s: v for s, v in old.sources.items() if s not in sids}
        new = manifest.Manifest(gen, {t: n for t, n in files.items() if n}, sources) if sources else None
        placed = _place(lake, run_dir, stage, new)
        if keep_own:  # sources rows last, as a commit puts them
            try:
                for t in sorted(os.listdir(stage / "own"), key=lambda t: t == "sources"):
                    for f in sorted((stage / "own" / t).iterdir()):
                        dest = lake.root / t / run_dir / f.name
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        os.replace(f, dest)
                        placed.append(dest)
            except OSError:
                _unplace(placed)
                raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    journal.crash_point("compact-written")
    _switch(lake, run_dir, new, placed)
    _remove([lake.root / t / run_dir / n for t, ns in old.files.items() for n in ns])


def garbage(lake, view: manifest.View) -> list[tuple[Path, str]]:
    """Parts no reader sees, with why (recover() removes them): parts of a source without its
    `sources` part ('no sources row'), compacted files of no live generation and the own parts of
    sources a generation holds ('not in the run's compacted generation'), a manifest's temporary
    file, and the hidden temporary file of a part a kill stopped before its rename ('an unfinished
    write': pipeline/local_fill.py's `.<source id>.<hex>.tmp`, pipeline/upgrade.py's
    `.<part>.upgrade`; both are written only under the lake's lock, so under the lock one is
    always a leftover)."""
    out = []
    for t in sch.tables():
        out += [(p, "an unfinished write") for p in _unfinished(lake.root / t)]
        live = set(view.files(t))
        for r, stem in lake._listing(t):
            m = view.manifests.get(r)
            if manifest.is_compacted(stem):
                ok = (r, stem) in live
            elif m is not None and stem in m.sources:
                ok = False
            else:
                ok = t == "sources" or (r, stem) in view
                if not ok:
                    out.append((lake.root / t / r / f"{stem}.parquet", "no sources row"))
                    continue
            if not ok:
                out.append((lake.root / t / r / f"{stem}.parquet", "not in the run's compacted generation"))
    tmp = lake.root / manifest.MANIFEST_DIR
    if tmp.is_dir():
        out += [(p, "an unfinished manifest") for p in tmp.iterdir() if not p.name.endswith(".json")]
    return out


# ------------------------------------------------------------------ helpers


def _unfinished(table_dir: Path) -> list[Path]:
    """Hidden temporary files (`.*.tmp`, `.*.upgrade`) in a table's run directories."""
    out = []
    try:
        runs = [e.path for e in os.scandir(table_dir) if e.name.startswith("run=") and e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    for r in runs:
        try:
            out += [
                Path(e.path)
                for e in os.scandir(r)
                if e.name.startswith(".") and e.name.endswith((".tmp", ".upgrade")) and e.is_file()
            ]
        except FileNotFoundError:  # a run directory removed meanwhile
            continue
    return sorted(out)


def _groups(sizes: list[int]) -> list[list[int]]:
    """Indexes of sizes (bytes) in consecutive groups of at most TARGET_FILE_BYTES each (a size
    over it alone)."""
    groups: list[list[int]] = [[]]
    total = 0
    for i, n in enumerate(sizes):
        if groups[-1] and total + n > TARGET_FILE_BYTES:
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups


def write_groups(table: str, inputs: list[tuple[Path, set | None]], out_dir: Path, gen: str) -> list[str]:
    """Write the inputs (path, source ids to leave out or None) as files c-<gen>-<k>.parquet in
    out_dir, a group of at most TARGET_FILE_BYTES of input each; returns their names (none when no
    row is left)."""
    names = []
    for idx in _groups([p.stat().st_size for p, _ in inputs]):
        group = [inputs[i] for i in idx]
        tbl = _read(table, group)
        if not tbl.num_rows:
            continue
        tbl = sort_by(tbl, sort_keys(table))
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"c-{gen}-{len(names)}.parquet"
        pq.write_table(tbl, out_dir / name, row_group_size=ROW_GROUP_ROWS, **parquet_options(tbl.schema))
        names.append(name)
    return names


def _read(table: str, group: list[tuple[Path, set | None]]) -> pa.Table:
    parts = []
    for p, skip in group:
        tbl = sch.conform(table, pq.ParquetFile(p).read())  # not read_table: no pyarrow.dataset
        if skip:
            import pyarrow.compute as pc  # only here: 34 ms of import a small run never needs

            keep = pc.invert(pc.is_in(tbl.column("source_id"), pa.array(sorted(skip))))
            tbl = tbl.filter(keep)
        parts.append(tbl)
    return pa.concat_tables(parts) if parts else sch.empty(table)


def _write_own(table: str, inputs: list[tuple[Path, set | None]], sid: str, out: Path) -> None:
    import pyarrow.compute as pc  # only here: 34 ms of import a small run never needs

    rows = []
    for p, _ in inputs:  # ParquetFile, not read_table(filters=...): no pyarrow.dataset (pandas)
        t = pq.ParquetFile(p).read()
        rows.append(sch.conform(table, t.filter(pc.equal(t.column("source_id"), sid))))
    tbl = pa.concat_tables(rows)
    if tbl.num_rows:
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(tbl, out, **parquet_options(tbl.schema))


def _place(lake, run_dir: str, stage: Path, new: manifest.Manifest | None) -> list[Path]:
    """Rename the new generation's files from the staging directory into their run directories;
    the paths placed. OSError (a full disk, a directory that cannot be written): those placed
    so far are removed first (no manifest names them)."""
    placed: list[Path] = []
    try:
        for t, names in new.files.items() if new else ():
            dest = lake.root / t / run_dir
            dest.mkdir(parents=True, exist_ok=True)
            for n in names:
                os.replace(stage / t / n, dest / n)
                placed.append(dest / n)
    except OSError:
        _unplace(placed)
        raise
    return placed


def _unplace(placed: list[Path]) -> None:
    """Remove files placed for a generation that never became live, last placed first (a source's
    `sources` part, placed last, goes first); one that cannot be removed is left to recover()."""
    for p in reversed(placed):
        try:
            p.unlink(missing_ok=True)
        except OSError:
            continue


def _switch(lake, run_dir: str, new: manifest.Manifest | None, placed: list[Path] = ()) -> None:
    """Make `new` the run's live generation in one step (None: the run has none). OSError (the
    manifest not replaced: the old generation stays live): the files `placed` for new are
    removed (_unplace), then the error is raised."""
    p = manifest.path(lake.root, run_dir)
    tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp")
    try:
        if new is None:
            p.unlink(missing_ok=True)
        else:
            p.parent.mkdir(exist_ok=True)
            tmp.write_bytes(manifest.encode(new))
            os.replace(tmp, p)
    except OSError:
        _unplace([*placed, tmp])
        raise
    journal.crash_point("compact-switched")


def _remove(paths: list[Path]) -> None:
    """Remove parts no reader sees any more; one that cannot be removed is left to recover()."""
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError:
            continue
        journal.crash_point("compact-clean")
