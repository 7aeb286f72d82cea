"""Export readers: table, column and record-batch access to an SQLite export (_Sqlite) or a
parquetdir export (_ParquetDir), plus the small-table helper _small. Both readers give the same
interface: kind, bad_utf8, bad_values, notes, tables(), columns(table), batches(table, cols,
where), payload_rows(), close().

An SQLite export is opened read-only and immutable (no lock taken, nothing written beside it),
which makes SQLite read the database file alone. When SQLite keeps part of the database beside it
(sidecars(): a write-ahead log holding committed rows not yet copied into the file, or the
rollback journal of a transaction cut short), the file alone is not the database: the export is
then copied, with those files, into the ingest's scratch directory and the copy is opened as
SQLite opens any database (the log's rows read, the cut-short transaction rolled back), so the
user's files are still never changed; a note says so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..formats import JOURNAL_MAGIC, SQLITE_SIDECARS, WAL_HEADER_BYTES, WAL_MAGIC
from .export import CHUNK_ROWS, NsysError
from .stage import I64, STR

PAYLOAD_COLUMNS = ("globalTid", "start", "end", "text", "textId", "binaryData")


def _need(have: list[str], cols: tuple[str, ...]) -> None:
    missing = [c for c in cols if c not in have]
    if missing:
        raise NsysError(f"NVTX_EVENTS has payloads (binaryData) but lacks column(s) {', '.join(missing)}")


def _message(e: UnicodeDecodeError) -> str:
    """The text Python could not decode: SQLite's error message (e.g. 'malformed database schema
    (...)' quoting a damaged name), invalid bytes replaced."""
    obj = e.object
    return obj.decode("utf-8", "replace") if isinstance(obj, (bytes, bytearray)) else str(e)


def sidecars(path: Path) -> list[Path]:
    """The files beside the SQLite database at `path` that hold part of it (module doc): its
    write-ahead log when that has a frame, its rollback journal when that holds a transaction cut
    short (its header not zeroed). Looked for where SQLite looks: beside the file the path
    resolves to. NsysError (one line, naming it) for one that exists but cannot be read."""
    out = []
    real = os.path.realpath(path)
    for suffix in SQLITE_SIDECARS:
        f = Path(real + suffix)
        try:
            with open(f, "rb") as fh:
                head, size = fh.read(WAL_HEADER_BYTES), os.fstat(fh.fileno()).st_size
        except FileNotFoundError:
            continue
        except OSError as e:
            raise NsysError(
                f"its {'write-ahead log' if suffix == '-wal' else 'rollback journal'} {f} cannot be read "
                f"({e.strerror or e}), so the database cannot be read whole"
            ) from None
        if (suffix == "-wal" and size > WAL_HEADER_BYTES and head[:4] in WAL_MAGIC) or (
            suffix == "-journal" and head[:8] == JOURNAL_MAGIC
        ):
            out.append(f)
    return out


def content_sha256(sha: str, path: Path) -> str:
    """The content hash of an SQLite export whose file hashes to `sha`: `sha` itself when the file
    is the whole database, else a hash of it and of its sidecars' bytes (a log that grows is new
    content). A sidecar that cannot be read counts as absent here (the reader fails the file)."""
    try:
        side = sidecars(path)
    except NsysError:
        return sha
    if not side:
        return sha
    h = hashlib.sha256(sha.encode())
    for f in side:
        h.update(f.name[len(os.path.basename(os.path.realpath(path))) :].encode() + b"\x00")
        try:
            with open(f, "rb") as fh:
                while block := fh.read(1 << 20):
                    h.update(block)
        except OSError:
            pass
    return h.hexdigest()


def _uri(path: Path, query: str) -> str:
    """An SQLite URI naming `path` exactly (%, ? and # in it escaped)."""
    escaped = str(path.absolute()).replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    return f"file:{escaped}?{query}"


def _stat(f: Path) -> tuple:
    st = os.stat(f)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _private_copy(path: Path, side: list[Path], scratch: Path) -> Path:
    """Copy the database at `path` and its sidecars into a new directory under `scratch`; the
    copy's path. NsysError when a file changes while it is copied (still being written)."""
    real = Path(os.path.realpath(path))
    d = scratch / "sqlite-copy"
    d.mkdir()
    dest = d / "export.sqlite"
    pairs = [(real, dest)] + [(f, Path(str(dest) + f.name[len(real.name) :])) for f in side]
    before = [_stat(src) for src, _ in pairs]
    for src, to in pairs:
        shutil.copyfile(src, to)
    if [_stat(src) for src, _ in pairs] != before:
        raise NsysError(
            "the database or the files SQLite keeps beside it changed while they were read (a program is "
            "still writing it?): ingest it again once that program has closed it"
        )
    return dest


class _Sqlite:
    kind = "nsys_sqlite"
    views: list[str]  # the names of the views in the file, never read

    def __init__(self, path: Path, scratch: Path | None = None):
        """Open the export at `path` (module doc); scratch: where a private copy may go (without
        one, an export with sidecars is refused). NsysError (one line) when it cannot be read."""
        self.path = path
        self.bad_utf8 = 0
        self.bad_values: dict[str, int] = {}  # "TABLE.column" -> values not of the column's type
        self.notes: list[str] = []
        side = sidecars(path)
        if side and scratch is None:
            raise NsysError(f"part of the database is in {side[0]}; open it once with sqlite3 to fold it in")
        try:
            if side:
                uri = _uri(_private_copy(path, side, scratch), "mode=rw")  # our copy: SQLite may write it
                self.notes += [_sidecar_note(f) for f in side]
            else:
                uri = _uri(path, "mode=ro&immutable=1")
            self.con = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self.con.text_factory = self._text
            # real tables only: a view is SQL the file's author wrote, which can run for ever
            # (a recursive view) or read anything; Nsight Systems writes none (build.py fails a
            # file that has one)
            kinds = self.con.execute("SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view')")
            self._tables, self.views = set(), []
            for kind, name in kinds:
                (self._tables.add(name) if kind == "table" else self.views.append(name))
        except sqlite3.DatabaseError as e:
            raise NsysError(f"not a readable SQLite database ({e})") from None
        except UnicodeDecodeError as e:  # SQLite's own error message quotes invalid UTF-8 (a damaged schema)
            raise NsysError(f"not a readable SQLite database ({_message(e)})") from None

    def _text(self, b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            self.bad_utf8 += 1
            return b.decode("utf-8", "replace")

    def tables(self) -> set[str]:
        return self._tables

    def columns(self, table: str) -> list[str]:
        try:
            return [r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')]
        except sqlite3.DatabaseError as e:
            raise NsysError(f"SQLite table {table} cannot be read ({e})") from None
        except UnicodeDecodeError as e:
            raise NsysError(f"SQLite table {table} cannot be read ({_message(e)})") from None

    def batches(self, table: str, cols: dict[str, pa.DataType], where: str = "") -> Iterator[pa.Table]:
        have = set(self.columns(table))
        sel = ", ".join(f'"{c}"' if c in have else "NULL" for c in cols)
        try:
            cur = self.con.execute(f'SELECT {sel} FROM "{table}" {where}')
            while True:
                rows = cur.fetchmany(CHUNK_ROWS)
                if not rows:
                    return
                arrays = [
                    _array(v, t, self.bad_values, f"{table}.{c}")
                    for (c, t), v in zip(cols.items(), zip(*rows))
                ]
                yield pa.Table.from_arrays(arrays, names=list(cols))
        except sqlite3.DatabaseError as e:
            raise NsysError(f"SQLite table {table} cannot be read ({e})") from None
        except UnicodeDecodeError as e:
            raise NsysError(f"SQLite table {table} cannot be read ({_message(e)})") from None

    def payload_rows(self) -> list[tuple]:
        """(globalTid, start, end, text, textId, blob) of NVTX events that carry a binary payload.
        NsysError naming the columns when NVTX_EVENTS has binaryData but lacks one of the others."""
        if "NVTX_EVENTS" not in self._tables or "binaryData" not in self.columns("NVTX_EVENTS"):
            return []
        _need(self.columns("NVTX_EVENTS"), PAYLOAD_COLUMNS)
        try:
            return self.con.execute(
                'SELECT globalTid, start, "end", text, textId, binaryData FROM NVTX_EVENTS '
                'WHERE binaryData IS NOT NULL AND "end" IS NOT NULL'
            ).fetchall()
        except sqlite3.DatabaseError as e:  # a damaged page under the payloads
            raise NsysError(f"SQLite table NVTX_EVENTS cannot be read ({e})") from None
        except UnicodeDecodeError as e:
            raise NsysError(f"SQLite table NVTX_EVENTS cannot be read ({_message(e)})") from None

    def close(self):
        self.con.close()


def _sidecar_note(f: Path) -> str:
    if f.name.endswith("-wal"):
        return (
            f"read with the {f.stat().st_size:,} bytes of its write-ahead log {f.name} (rows committed but "
            "not yet copied into the database file), from a private copy: the files were not changed"
        )
    return (
        f"its rollback journal {f.name} holds a transaction cut short: read as SQLite reads it, with "
        "that transaction rolled back (from a private copy: the files were not changed)"
    )


class _ParquetDir:
    views: tuple[str, ...] = ()  # a parquetdir has no views

    kind = "nsys_parquetdir"

    def __init__(self, path: Path):
        self.path = path
        self.bad_utf8 = 0
        self.bad_values: dict[str, int] = {}  # Parquet columns are typed: stays empty
        self.notes: list[str] = []
        self._files = {p.stem: p for p in path.glob("*.parquet")}
        if not self._files:
            raise NsysError("parquetdir export without any .parquet table")

    def tables(self) -> set[str]:
        return set(self._files)

    def columns(self, table: str) -> list[str]:
        try:
            return pq.read_schema(self._files[table]).names
        except (OSError, pa.ArrowInvalid) as e:
            raise NsysError(f"{self._files[table].name} is not readable Parquet ({e})") from None

    def batches(self, table: str, cols: dict[str, pa.DataType], where: str = "") -> Iterator[pa.Table]:
        have = set(self.columns(table))
        try:
            pf = pq.ParquetFile(self._files[table])
            for b in pf.iter_batches(batch_size=CHUNK_ROWS, columns=[c for c in cols if c in have]):
                arrays = []
                for c, t in cols.items():
                    if c in have:
                        a = b.column(c)
                        arrays.append(a.cast(t) if a.type != t else a)
                    else:
                        arrays.append(pa.nulls(b.num_rows, t))
                yield pa.Table.from_arrays(arrays, names=list(cols))
        except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise NsysError(f"{self._files[table].name} cannot be read ({e})") from None

    def payload_rows(self) -> list[tuple]:
        if "NVTX_EVENTS" not in self._files or "binaryData" not in self.columns("NVTX_EVENTS"):
            return []
        _need(self.columns("NVTX_EVENTS"), PAYLOAD_COLUMNS)
        cols = list(PAYLOAD_COLUMNS)
        t = pq.ParquetFile(self._files["NVTX_EVENTS"]).read(columns=cols)  # no pyarrow.dataset
        return [
            tuple(r[c] for c in cols)
            for r in t.to_pylist()
            if r["binaryData"] is not None and r["end"] is not None
        ]

    def close(self):
        pass


I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def _as_i64(v):
    """An integer column's value as int64, else None: SQLite stores whatever it is given, so an
    INTEGER column can hold REAL, TEXT or BLOB values."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if I64_MIN <= v <= I64_MAX else None
    if isinstance(v, float) and v.is_integer() and I64_MIN <= v <= I64_MAX:
        return int(v)
    return None


def _array(values, t: pa.DataType, bad: dict | None = None, key: str = "") -> pa.Array:
    """One column of a batch as an Arrow array of type t. Values that are not of that type (a
    REAL 1e300 or a TEXT in an INTEGER column, a BLOB in a TEXT column) become NULL, counted in
    `bad[key]` (the readers turn the counts into one note per column: build.py)."""
    try:
        return pa.array(values, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    if t == STR:
        fixed = [v if v is None or isinstance(v, str) else None for v in values]
    elif pa.types.is_integer(t):
        fixed = [None if v is None else _as_i64(v) for v in values]
    else:
        fixed = [v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in values]
    if bad is not None:
        n = sum(1 for a, b in zip(values, fixed) if a is not None and b is None)
        bad[key] = bad.get(key, 0) + n
    return pa.array(fixed, type=t)


def _small(ex, table: str, cols: list[str], where: str = "") -> list[dict]:
    if table not in ex.tables():
        return []
    out = []
    for b in ex.batches(table, {c: _guess(c) for c in cols}, where):
        out.extend(b.to_pylist())
    return out


def _guess(col: str) -> pa.DataType:
    return (
        STR
        if col in ("name", "value", "utcTime", "busLocation", "uuid", "chipName", "metricName", "text")
        else I64
    )
