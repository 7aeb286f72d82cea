"""A lake in object storage: `--lake s3://bucket/prefix` (Lake(url) makes an S3Lake; the file
system, credentials and errors: pipeline/objstore.py).

Layout: the local lake's (pipeline/lake.py): <url>/<table>/run=<run_id>/<source_id>.parquet, the
marker <url>/TRACELAKE, kept results under <url>/results/ (pipeline/results.py). DuckDB reads the
parts through the same fsspec file system, registered on its connection (query.connect), so no
DuckDB extension is needed.

S3 has no rename and no flock; the lake keeps the local lake's promises this way:
- Readers see whole sources only. A reader lists the `sources` rows first, then the parts, and
  reads a part only when its source's `sources` row was listed. A writer uploads a source's parts
  first (each PUT is atomic: no reader ever sees half an object) and its `sources` row last, so a
  listed row's parts are all there; forgetting deletes the row first, then the parts.
- A source replaced by `ingest --force` loses its `sources` row first (readers stop seeing it),
  then gets its new parts and row. Unlike a local lake, a commit that fails or is killed half-way
  is not undone: the source is then absent (never half there), and the next ingest ingests it
  again, its content being in no `sources` row.
- Crash recovery (recover(), under the lock, before every ingest writes): the parts without a
  `sources` row (a killed commit) are deleted, and so are the staging objects under <url>/.tmp/
  (sources a Dask worker published, never committed).
- One writer at a time: the lock is the object <url>/.lock, created with a conditional PUT
  (If-None-Match: *, which S3 and S3-compatible servers honour), holding the holder's pid, host,
  start and lease expiry. The holder renews the lease every LOCK_TTL_S / 3 seconds (a PUT
  conditional on the lock's ETag) and deletes the lock when done. A lock whose lease expired (its
  holder died without deleting it), or held by a process of this host that no longer runs, is
  taken over by a PUT conditional on its ETag, so of two takers one wins. TRACELAKE_S3_LOCK_TTL_S
  sets the lease (default 300 s). A holder whose lease ran out or was taken over commits nothing
  more (held(): LakeError). pipeline/lake_s3_lock.py.
- Compaction is not done in a bucket (tracelake compact and ingest's automatic compaction leave an
  object-store lake as it is); upgrading older schemas neither (every object-store lake is v3).

Staging is local: a worker writes a source's parts under a local directory
(TRACELAKE_STAGING_DIR, else the system's temporary directory) and the committing process uploads
them; a Dask worker on another machine publishes them to <url>/.tmp/<id>/ first (publish()), and
the commit downloads them.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import lake_journal as journal
from . import objstore
from . import schema as sch
from .lake_base import LakeError, Staged, one_line, stage_into
from .lake_s3_lock import S3Lock
from .parts import rewrite_run_id, write_parquet


class RemoteRoot(str):
    """The lake's URL, answering the few Path methods callers use on a lake root."""

    def __truediv__(self, other) -> RemoteRoot:
        return RemoteRoot(f"{self.rstrip('/')}/{other}")

    def absolute(self) -> RemoteRoot:
        return self

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]


@dataclass
class RemoteView:
    """Which parts are live at one listing (the local lake_manifest.View's questions): singles,
    (run directory, source id) of the committed sources; parts, (table, run directory, source id)
    -> bytes of every part listed after them."""

    singles: set[tuple[str, str]] = field(default_factory=set)
    parts: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def __contains__(self, key) -> bool:
        return key in self.singles

    def gens(self) -> dict[str, str]:
        return {}

    def files(self, table: str, run_dirs=None) -> list:
        return []

    def holders(self, table: str, run_dirs=None) -> set:
        return set()


class S3Files:
    """The reading side of a lake at an s3:// URL (LakeFiles' methods; module doc). Errors of the
    object store are raised as LakeError, one line naming the URL."""

    remote = True

    def __init__(self, root):
        self.url = objstore.normalize(root)
        self.root = RemoteRoot(self.url)
        self._base = objstore.key(self.url)
        self._sizes: dict[str, int] = {}
        self._etags: dict[str, str] = {}

    def __getstate__(self):
        return {"url": self.url}

    def __setstate__(self, state):
        self.__init__(state["url"])

    def __repr__(self) -> str:
        return f"S3Lake({self.url!r})"

    @property
    def filesystem(self):
        return objstore.filesystem()

    def _key(self, *parts: str) -> str:
        return "/".join((self._base, *parts))

    def _fail(self, what: str, e: BaseException) -> LakeError:
        return LakeError(one_line(f"{what}: {objstore.describe(self.url, e)}"))

    # ------------------------------------------------------------------ the lake itself

    def ensure(self) -> None:
        """Create the lake (its TRACELAKE marker) if needed. LakeError (one line) when the bucket
        is missing or unreachable, or the prefix holds objects but no marker (not a lake)."""
        try:
            objstore.check_bucket(self.url)
            fs = self.filesystem
            if fs.exists(self._key("TRACELAKE")):
                return
            try:
                held = fs.ls(self._base, detail=False)
            except FileNotFoundError:
                held = []
            if held:
                raise LakeError(
                    f"{self.url}: a non-empty prefix that is not a tracelake lake (no TRACELAKE object); "
                    "give a new or empty prefix as --lake"
                )
            fs.pipe_file(self._key("TRACELAKE"), f"tracelake lake, schema v{sch.SCHEMA_VERSION}\n".encode())
        except LakeError:
            raise
        except Exception as e:
            raise LakeError(one_line(str(objstore.describe(self.url, e)))) from None

    def exists(self) -> bool:
        try:
            return self.filesystem.exists(self._key("TRACELAKE"))
        except Exception as e:
            raise LakeError(one_line(str(objstore.describe(self.url, e)))) from None

    def writable(self) -> bool:
        return True

    def part_path(self, table: str, run_id: str, source_id: str) -> str:
        return f"{self.url}/{table}/run={run_id}/{source_id}.parquet"

    # ------------------------------------------------------------------ reading

    def _find(self, sub: str | None) -> dict[str, tuple[int, str]]:
        """bucket/key -> (size, ETag) of every object under the lake (sub: under <url>/<sub>/)."""
        try:
            found = self.filesystem.find(self._key(sub) if sub else self._base, detail=True, withdirs=False)
        except FileNotFoundError:
            return {}
        except Exception as e:
            raise self._fail("cannot list the lake", e) from None
        return {k: (int(v.get("size") or 0), str(v.get("ETag"))) for k, v in found.items()}

    def _parse(self, k: str) -> tuple[str, str, str] | None:
        rel = k[len(self._base) + 1 :].split("/")
        if len(rel) == 3 and rel[1].startswith("run=") and rel[2].endswith(".parquet"):
            return rel[0], rel[1], rel[2][:-8]
        return None

    def committed(self, tables: Iterable[str] | None = None) -> RemoteView:
        """One listing of the lake: the `sources` rows first, then the parts (module doc) of every
        table, or of these tables only (each one listing of its prefix)."""
        rows = {p[1:] for k in self._find("sources") if (p := self._parse(k))}
        found: dict[str, tuple[int, str]] = {}
        for sub in [None] if tables is None else [t for t in tables if t != "sources"]:
            found.update(self._find(sub))
        parts = {p: n for k, n in found.items() if (p := self._parse(k)) and p[0] != "sources"}
        src = self._find("sources") if tables is None or "sources" in tables else {}
        parts.update({p: n for k, n in src.items() if (p := self._parse(k)) and p[1:] in rows})
        for (t, r, s), (n, etag) in parts.items():
            self._sizes[f"{self.url}/{t}/{r}/{s}.parquet"] = n
            self._etags[f"{self.url}/{t}/{r}/{s}.parquet"] = etag
        return RemoteView(rows, {p: n for p, (n, _) in parts.items()})

    _committed = committed

    def unchanged(self, view) -> bool:
        return True  # no compaction in a bucket

    def table_files(self, table: str, runs: Iterable[str] | None = None, committed=None) -> list[str]:
        """URLs of the table's parts of committed sources (runs: only these run ids)."""
        view = self.committed([table]) if committed is None else committed
        dirs = None if runs is None else {f"run={r}" for r in runs}
        return [
            f"{self.url}/{t}/{r}/{s}.parquet"
            for (t, r, s) in sorted(view.parts)
            if t == table and (r, s) in view and (dirs is None or r in dirs)
        ]

    def part_size(self, url: str) -> int:
        """Bytes of a part as last listed (query.connect decides materializing with it)."""
        return self._sizes[url]

    def holders(self, table: str, runs: Iterable[str] | None = None) -> set[tuple[str, str]]:
        """(run directory, source id) of the committed sources with a part in `table`."""
        view, dirs = self.committed([table]), None if runs is None else {f"run={r}" for r in runs}
        return {
            (r, s)
            for (t, r, s) in view.parts
            if t == table and (r, s) in view and (dirs is None or r in dirs)
        }

    def has_table(self, table: str) -> bool:
        return bool(self.table_files(table))

    def read_source(self, table: str, run_id: str, source_id: str, columns: list[str] | None = None):
        """One source's rows of `table` (None when it has no part)."""
        k = objstore.key(self.part_path(table, run_id, source_id))
        try:
            with self.filesystem.open(k, "rb") as f:  # ParquetFile: pq.read_table imports pandas
                return pl.from_arrow(pq.ParquetFile(f).read(columns=columns))
        except FileNotFoundError:
            return None

    def sources(self, runs: Iterable[str] | None = None) -> pl.DataFrame:
        """The `sources` rows (module doc of pipeline/lake.py, LakeFiles.sources), through the
        local copies of their parts (local_parts). LakeError naming a part that cannot be read."""
        files = self.table_files("sources", runs)
        if not files:
            return pl.from_arrow(sch.empty("sources"))
        try:
            local = self.local_parts(files)
        except Exception as e:
            raise self._fail("cannot read the sources rows", e) from None
        frames = [pl.from_arrow(sch.empty("sources"))]
        for url, path in zip(files, local):
            try:
                frames.append(pl.from_arrow(pq.ParquetFile(path).read()))
            except (OSError, pa.ArrowException) as e:
                raise LakeError(one_line(f"{url}: unreadable sources part ({e})")) from None
        return pl.concat(frames, how="diagonal_relaxed")

    def local_parts(self, urls: list[str]) -> list[str]:
        """Local copies of parts listed by committed(), fetched side by side (one batch of GETs;
        DuckDB reading each part over the network cost 10x more): a read-through cache under
        TRACELAKE_S3_CACHE_DIR (kept between commands), else a temporary directory of this process
        (removed at its exit), each copy under a directory named by the object's URL and ETag (a
        replaced part is fetched again) with the lake's <table>/run=<id>/ layout. Raises
        FileNotFoundError (a part removed since it was listed) or ObjectStoreError."""
        base, out, todo = _cache_dir(), [], []
        for u in urls:
            tag = hashlib.sha1(f"{u}\0{self._etags.get(u)}".encode()).hexdigest()[:16]
            local = base / tag / u[len(self.url) + 1 :]
            out.append(str(local))
            if not local.exists():
                local.parent.mkdir(parents=True, exist_ok=True)
                todo.append((objstore.key(u), str(local)))
        if todo:
            try:
                self.filesystem.get([r for r, _ in todo], [f"{loc}.part" for _, loc in todo])
            except FileNotFoundError:
                raise
            except Exception as e:
                raise objstore.describe(self.url, e) from None
            for _, loc in todo:
                os.replace(f"{loc}.part", loc)
        return out


class S3Lake(S3Files, S3Lock):
    """A lake at an s3:// URL: LakeFiles' and Lake's methods, with the protocol of the module doc.
    Every object-store error is raised as LakeError (ensure, the lock, reading the listing) or
    objstore.ObjectStoreError, an OSError naming the object (a commit, a part)."""

    def stage(self, run_id: str, source_id: str, tables: dict[str, object]) -> Staged:
        """Lake.stage, into a local staging directory (module doc)."""
        base = Path(os.environ.get("TRACELAKE_STAGING_DIR") or tempfile.gettempdir())
        return stage_into(base / f"tracelake-staged-{uuid.uuid4().hex}", run_id, source_id, tables)

    def scratch(self) -> Path:
        """A fresh local directory for one ingest's intermediate files (the caller removes it)."""
        return Path(tempfile.mkdtemp(prefix="tracelake-scratch-"))

    def publish(self, staged: Staged) -> None:
        """Upload a locally staged source to <url>/.tmp/<id>/ (a Dask worker on another machine:
        the committing process reads it from there); staged.dir becomes that URL."""
        if objstore.is_url(staged.dir):
            return
        dest = self._key(".tmp", uuid.uuid4().hex)
        local = [str(Path(staged.dir) / f"{t}.parquet") for t in staged.tables]
        try:
            if local:
                self.filesystem.put(local, [f"{dest}/{t}.parquet" for t in staged.tables])
        except Exception as e:
            raise objstore.describe(objstore.url_of(dest), e) from None
        shutil.rmtree(staged.dir, ignore_errors=True)
        staged.dir = objstore.url_of(dest)

    def _localize(self, staged: Staged) -> None:
        if not objstore.is_url(staged.dir):
            return
        remote = objstore.key(staged.dir)
        local = Path(self.stage(staged.run_id, staged.source_id, {}).dir)
        try:
            if staged.tables:
                self.filesystem.get(
                    [f"{remote}/{t}.parquet" for t in staged.tables],
                    [str(local / f"{t}.parquet") for t in staged.tables],
                )
        except Exception as e:
            raise objstore.describe(staged.dir, e) from None
        self._rm([f"{remote}/{t}.parquet" for t in staged.tables])
        staged.dir = str(local)

    def discard(self, staged: Staged) -> None:
        if objstore.is_url(staged.dir):
            self._rm([f"{objstore.key(staged.dir)}/{t}.parquet" for t in staged.tables])
        else:
            shutil.rmtree(staged.dir, ignore_errors=True)

    def retarget(self, staged: Staged, run_id: str) -> None:
        if run_id == staged.run_id:
            return
        self._localize(staged)
        for t in staged.tables:
            rewrite_run_id(Path(staged.dir) / f"{t}.parquet", run_id)
        staged.run_id = run_id

    def _rm(self, keys: list[str]) -> None:
        """Delete objects (missing ones are fine); ObjectStoreError naming the first that is not."""
        if not keys:
            return
        try:
            self.filesystem.rm(keys)
        except FileNotFoundError:
            pass
        except Exception as e:
            raise objstore.describe(objstore.url_of(keys[0]), e) from None

    def commit(self, staged: Staged, source_row: dict) -> None:
        """Put a staged source into the lake with its `sources` row (module doc): an earlier version's
        row goes first, then its parts of tables the new version lacks; the new parts are uploaded,
        then the `sources` row. SchemaError when the row does not fit schema v3; ObjectStoreError
        (an OSError naming the object) when the bucket refuses a step (the source is then absent,
        and recover() removes its parts)."""
        try:
            self.held()
            self._localize(staged)
            d = Path(staged.dir)
            src = sch.conform("sources", {k: [v] for k, v in source_row.items()})
            if (
                src.column("run_id")[0].as_py() != staged.run_id
                or src.column("source_id")[0].as_py() != staged.source_id
            ):
                raise ValueError("sources row does not match the staged source")
            write_parquet(src, d / "sources.parquet")
            row = objstore.key(self.part_path("sources", staged.run_id, staged.source_id))
            fs = self.filesystem
            try:
                if fs.exists(row):  # --force: the earlier version leaves readers first
                    self._rm([row])
                    journal.crash_point("s3-replace")
                    gone = [t for t in sch.tables() if t != "sources" and t not in staged.tables]
                    self._rm([objstore.key(self.part_path(t, staged.run_id, staged.source_id)) for t in gone])
                if staged.tables:
                    fs.put(
                        [str(d / f"{t}.parquet") for t in staged.tables],
                        [
                            objstore.key(self.part_path(t, staged.run_id, staged.source_id))
                            for t in staged.tables
                        ],
                    )
                journal.crash_point("s3-parts")
                fs.put_file(str(d / "sources.parquet"), row)
            except OSError as e:
                raise objstore.describe(objstore.url_of(row), e) from None
            except Exception as e:  # botocore's own errors
                raise objstore.describe(objstore.url_of(row), e) from None
        finally:
            if not objstore.is_url(staged.dir):
                shutil.rmtree(staged.dir, ignore_errors=True)
        journal.crash_point("commit")

    def write_source(self, run_id, source_id, tables, source_row, replace: bool = True) -> None:
        self.commit(self.stage(run_id, source_id, tables), source_row)

    def recover(self) -> list[str]:
        """Delete what a killed ingest left (module doc); call with the lock held. One line per
        repair."""
        done = []
        tmp = list(self._find(".tmp"))
        if tmp:
            self._rm(tmp)
            done.append(f"removed {len(tmp)} staged objects under {self.url}/.tmp")
        view = self.committed()
        orphans = [(t, r, s) for (t, r, s) in view.parts if t != "sources" and (r, s) not in view.singles]
        self._rm([objstore.key(f"{self.url}/{t}/{r}/{s}.parquet") for t, r, s in orphans])
        done += [f"removed {t}/{r}/{s}.parquet (no sources row)" for t, r, s in sorted(orphans)]
        return done

    def compact(self, runs: Iterable[str] | None = None, min_sources: int = 2) -> list:
        return []  # not in a bucket (module doc)

    def forget(self, sources: Iterable[tuple[str, str]]) -> int:
        """Lake.forget: each source's `sources` row first, then its parts. LakeError (one line,
        naming the object) when a row or part cannot be deleted."""
        n = 0
        for run_id, source_id in sources:
            row = objstore.key(self.part_path("sources", run_id, source_id))
            try:
                if not self.filesystem.exists(row):
                    continue
                self._rm([row])
                journal.crash_point("forget")
                self._rm(
                    [
                        objstore.key(self.part_path(t, run_id, source_id))
                        for t in sch.tables()
                        if t != "sources"
                    ]
                )
            except OSError as e:
                raise LakeError(one_line(f"{e}; the next ingest removes what is left")) from None
            n += 1
        return n


@lru_cache(maxsize=None)
def _cache_dir() -> Path:
    if os.environ.get("TRACELAKE_S3_CACHE_DIR"):
        return Path(os.environ["TRACELAKE_S3_CACHE_DIR"])
    d = Path(tempfile.mkdtemp(prefix="tracelake-s3cache-"))
    atexit.register(shutil.rmtree, d, True)
    return d
