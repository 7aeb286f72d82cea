"""Lakes written with an older schema, brought to the current one (schemas/v3.toml, "Versions").

Schema v2 added the derived columns of gpu_activities (pipeline/derive.py); schema v3 the
traffic columns of cpu_ops (pipeline/opbytes.py: computed here from the part's own input_dims and
input_types) and gpu_activities.work_op (re-derived). A lake whose
TRACELAKE marker names schema v1 may hold gpu_activities parts without them; read as they are,
those columns would be NULL and every step, launch and graph-replay figure would be silently
wrong. Its parts may also lack columns added during v1 (sources.unreadable_bytes), and readers
now expect every part of a table to have exactly the schema's columns. So, before a lake is
read (pipeline/query.py connect) or written (pipeline/ingest):
- upgrade(lake): with the writer lock held, each such part is rewritten (gpu_activities
  re-derived from its own source's cpu_ops and steps parts, others with NULL in the missing
  columns) and replaced atomically (os.replace: a reader sees the old part or the
  new one, never half of one; a kill in between leaves old parts, found again next time); then
  the marker is set to the current version. Returns the number of parts rewritten. A lake in a
  bucket (pipeline/lake_s3.py) the same way: its stale parts fetched, rewritten locally and each
  PUT over its object (one object, whole or not at all), the marker last.
- current_parts(lake): what connect calls. It upgrades when it can; when the lake cannot be
  written (a read-only archive) or another command holds its lock, it derives the old parts into
  a temporary directory (removed at exit) and returns {old part: derived copy} for the reader to
  use instead (a lake in a bucket another command holds: LakeError, run again). Raises
  LakeError (one line) when a part cannot be read.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import derive, objstore, opbytes, scratch
from . import schema as sch
from .lake import Lake, LakeBusy, LakeError, one_line
from .parts import write_stream

_MARKER = re.compile(rb"schema v(\d+)")


def marker_version(lake: Lake) -> int:
    """The schema version the lake's TRACELAKE marker names (1 for a marker without one)."""
    try:
        if getattr(lake, "remote", False):  # a lake in a bucket (pipeline/lake_s3.py)
            text = lake.filesystem.cat_file(lake._key("TRACELAKE"))[:200]
        else:
            text = (lake.root / "TRACELAKE").read_bytes()[:200]
    except OSError:
        return sch.SCHEMA_VERSION  # no lake yet: it will be written current
    except Exception as e:
        raise LakeError(f"{lake.root}/TRACELAKE: cannot be read ({str(e).splitlines()[0]})") from None
    m = _MARKER.search(text)
    return int(m.group(1)) if m else 1


def _schema_names(lake: Lake, f: str) -> list[str]:
    """The column names of a part (a path, or an object's URL: its footer read over the network)."""
    if getattr(lake, "remote", False):
        with lake.filesystem.open(objstore.key(f), "rb") as fh:
            return pq.ParquetFile(fh).schema_arrow.names
    return pq.read_schema(f).names


def _stale(lake: Lake) -> list[tuple[str, Path]]:
    """(table, part) of every committed part whose columns are not exactly the current schema's:
    gpu_activities parts without the derived columns, and parts written before a column was
    added (sources.unreadable_bytes and named_run_id came during v1). Readers rely on every part
    of a table having the schema's columns (pipeline/query.py reads them without union_by_name,
    which would read every part's footer at connect time)."""
    out = []
    for t in sch.tables():
        want = sch.arrow_schema(t).names
        for f in lake.table_files(t):
            try:
                names = _schema_names(lake, f)
            except (OSError, pa.ArrowException) as e:
                raise LakeError(f"{f}: unreadable {t} part ({str(e).splitlines()[0]})") from None
            if names != want:
                out.append((t, f if getattr(lake, "remote", False) else Path(f)))
    # gpu_activities last: its derived columns are read from the source's cpu_ops and steps
    # parts, which must have the current columns by then
    return sorted(out, key=lambda x: x[0] == "gpu_activities")


def _sibling(lake: Lake, part: Path, table: str, copies: dict[str, str]) -> Path | None:
    """The same source's part of another table (its upgraded copy when there is one)."""
    p = lake.root / table / part.parent.name / part.name
    if str(p) in copies:
        return Path(copies[str(p)])
    return p if p.is_file() else None


def _with_traffic(t: pa.Table, memo: dict) -> pa.Table:
    """A cpu_ops batch of a schema v2 part with mem_bytes and vector_flops computed from its own
    input_dims and input_types (pipeline/opbytes.py; no Concrete Inputs are stored, so
    convolutions stay NULL). memo: (name, dims, types) -> op_bytes."""
    names = t.column("name").to_pylist()
    dims = t.column("input_dims").to_pylist()
    types = t.column("input_types").to_pylist()
    mem, vec = [None] * t.num_rows, [None] * t.num_rows
    for i, key in enumerate(zip(names, dims, types)):
        if key[0] in opbytes.MODELLED_OPS and key[1]:
            r = memo.get(key)
            if r is None:
                r = memo[key] = opbytes.op_bytes(*key)
            mem[i], vec[i] = r
    return t.append_column("mem_bytes", pl.Series(mem, dtype=pl.Float64).to_arrow()).append_column(
        "vector_flops", pl.Series(vec, dtype=pl.Float64).to_arrow()
    )


def _rewrite(lake: Lake, table: str, part: Path, out: Path, copies: dict[str, str] | None = None) -> None:
    """Write `out`: the part with the current schema's columns (derived ones recomputed for
    gpu_activities, others NULL where the part predates them). copies: {part: its upgraded copy}
    for a lake upgraded into copies (current_parts)."""
    copies = copies or {}
    try:
        if table == "gpu_activities":
            ok = derive.derive_files(
                part,
                _sibling(lake, part, "cpu_ops", copies),
                _sibling(lake, part, "steps", copies),
                out,
                lambda chunks, path: write_stream(table, chunks, path),
            )
        else:
            pf = pq.ParquetFile(part)
            batches = (pa.Table.from_batches([b]) for b in pf.iter_batches())
            if table == "cpu_ops" and "mem_bytes" not in pf.schema_arrow.names:
                batches = map(_with_traffic, batches, itertools.repeat({}))
            try:
                ok = write_stream(table, batches, out)
            finally:
                pf.close()
    except (OSError, pa.ArrowException, sch.SchemaError, pl.exceptions.PolarsError) as e:
        out.unlink(missing_ok=True)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LakeError(
            f"{part}: cannot upgrade this {table} part to schema v{sch.SCHEMA_VERSION} ({why})"
        ) from None
    if not ok:  # an empty part: keep an empty file of the current schema
        pq.write_table(sch.empty(table), out)


def _upgrade_remote(lake, stale: list[tuple[str, str]]) -> None:
    """upgrade() of a lake in a bucket: the stale parts (and, for gpu_activities, the same
    source's cpu_ops and steps parts it is derived from) fetched into a local copy of the lake's
    layout, rewritten there (gpu_activities last, from the upgraded siblings, as in place), and each
    PUT over its object (one object, whole or not at all); then the marker."""
    fs = lake.filesystem
    with scratch.temporary("upgrade") as tmp:
        root = Path(tmp)
        want = {url for _, url in stale}
        for t, url in stale:
            if t == "gpu_activities":
                rest = url[len(lake.url) + 1 :].split("/", 1)[1]
                want |= {f"{lake.url}/{sib}/{rest}" for sib in ("cpu_ops", "steps")}
        for url in sorted(want):
            local = root / url[len(lake.url) + 1 :]
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                fs.get_file(objstore.key(url), str(local))
            except FileNotFoundError:
                continue  # a source without cpu_ops or steps: derived without them
            except Exception as e:
                raise LakeError(one_line(f"{url}: cannot be read ({objstore.describe(url, e)})")) from None
        here = SimpleNamespace(root=root)
        for t, url in stale:
            part = root / url[len(lake.url) + 1 :]
            out = part.with_name(f".{part.name}.upgrade")
            _rewrite(here, t, part, out)
            os.replace(out, part)
            try:
                fs.put_file(str(part), objstore.key(url))
            except Exception as e:
                raise LakeError(
                    one_line(f"{url}: cannot be upgraded ({objstore.describe(url, e)})")
                ) from None
    fs.pipe_file(lake._key("TRACELAKE"), f"tracelake lake, schema v{sch.SCHEMA_VERSION}\n".encode())


def upgrade(lake: Lake) -> int:
    """Rewrite the lake's old parts in place; call with the writer lock held (module doc)."""
    if marker_version(lake) >= sch.SCHEMA_VERSION:
        return 0
    stale = _stale(lake)
    if getattr(lake, "remote", False):
        _upgrade_remote(lake, stale)
        return len(stale)
    for table, part in stale:
        tmp = part.with_name(f".{part.name}.upgrade")
        _rewrite(lake, table, part, tmp)
        os.replace(tmp, part)
    marker = lake.root / "TRACELAKE"
    tmp = lake.root / ".TRACELAKE.upgrade"
    tmp.write_text(f"tracelake lake, schema v{sch.SCHEMA_VERSION}\n")
    os.replace(tmp, marker)
    return len(stale)


def current_parts(lake: Lake) -> dict[str, str]:
    """{old part path: path of a derived copy to read instead}; empty when the lake is current
    (upgraded here if it was not and could be). Module doc."""
    if not lake.exists() or marker_version(lake) >= sch.SCHEMA_VERSION:
        return {}
    if lake.writable():
        try:
            with lake.lock():
                upgrade(lake)
            return {}
        except LakeBusy:
            if getattr(lake, "remote", False):
                raise LakeError(
                    f"{lake.root}: this lake of schema v{marker_version(lake)} is being written by another "
                    "command; run this one again once it is done (it is then upgraded)"
                ) from None
    stale = _stale(lake)
    if not stale:
        return {}
    dest = scratch.make("upgrade")
    atexit.register(shutil.rmtree, dest, True)
    out = {}
    for i, (table, part) in enumerate(stale):
        copy = dest / str(i) / part.parent.name / part.name  # keeps the run=<id> directory for hive reads
        copy.parent.mkdir(parents=True)
        _rewrite(lake, table, part, copy, out)
        out[str(part)] = str(copy)
    return out
