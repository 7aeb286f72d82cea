"""The reading side of a lake in object storage (pipeline/lake_s3.py's module doc: the layout and
what holds without rename): which parts are live at one listing (RemoteView), the table's part
URLs, one source's rows, the `sources` rows, and the readers' local copies of the parts.

Live parts. A source's objects are `<table>/run=<run_id>/<stem>.parquet`, stem `<source_id>` or,
once `ingest --force` replaced it, `<source_id>.v<n>` (n = 1, 2, ...: the replacement is uploaded
beside the version it replaces, lake_s3.py). A listing takes, per (run, source id), the `sources`
row of the highest version as the live one; a part is read only when its stem is its source's
live stem. Then the compaction manifests `_compacted/run=<run_id>.json` are read (after the
`sources` rows, as a local lake does: pipeline/lake_manifest.py): a source its run's generation
holds is read from the generation's files `c-<gen>-<k>.parquet`, not from parts of its own.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import lake_manifest as manifest
from . import objstore
from . import schema as sch
from .lake_base import LakeError, one_line


def split_stem(stem: str) -> tuple[str, int]:
    """(source id, version) of a part's file stem: `<id>` is version 0, `<id>.v<n>` version n
    (source ids are hex digits: pipeline/ingest/rows.py)."""
    sid, sep, v = stem.partition(".v")
    return (sid, int(v)) if sep and v.isdigit() else (stem, 0)


def stem_of(source_id: str, version: int) -> str:
    return source_id if version == 0 else f"{source_id}.v{version}"


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
class RemoteView(manifest.View):
    """lake_manifest.View of one listing (singles: (run directory, source id) of the committed
    sources read from parts of their own; manifests: each run's live generation), with live:
    (run directory, source id) -> the live stem of every committed source (held by a generation or
    not), parts: (table, run directory, stem) -> bytes of every object listed, and tags: run
    directory -> the ETag of its manifest (unchanged() compares them)."""

    live: dict[tuple[str, str], str] = field(default_factory=dict)
    parts: dict[tuple[str, str, str], int] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)  # run directory -> its manifest's ETag


class S3Listing:
    """Where a lake at an s3:// URL is and what one listing of it shows (module doc). Errors of the
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

    def part_path(self, table: str, run_id: str, source_id: str) -> str:
        return f"{self.url}/{table}/run={run_id}/{source_id}.parquet"

    # ------------------------------------------------------------------ listing

    def _find(self, sub: str | None, prefix: str = "") -> dict[str, tuple[int, str]]:
        """bucket/key -> (size, ETag) of every object under the lake (sub: under <url>/<sub>/;
        prefix: only keys whose part below it starts so)."""
        try:
            found = self.filesystem.find(
                self._key(sub) if sub else self._base, detail=True, withdirs=False, prefix=prefix
            )
        except FileNotFoundError:
            return {}
        except Exception as e:
            raise self._fail("cannot list the lake", e) from None
        return {k: (int(v.get("size") or 0), str(v.get("ETag"))) for k, v in found.items()}

    def _parse(self, k: str) -> tuple[str, str, str] | None:
        """(table, run directory, stem) of a part's key; None for other objects."""
        rel = k[len(self._base) + 1 :].split("/")
        if len(rel) == 3 and rel[1].startswith("run=") and rel[2].endswith(".parquet"):
            return rel[0], rel[1], rel[2][:-8]
        return None

    def versions(self, run_dir: str, source_id: str) -> dict[int, str]:
        """version -> stem of the source's `sources` rows (one listing of its prefix)."""
        out = {}
        for k in self._find(f"sources/{run_dir}", prefix=source_id):
            p = self._parse(k)
            if p and split_stem(p[2])[0] == source_id:
                out[split_stem(p[2])[1]] = p[2]
        return out

    def _decode(self, k: str, data: bytes) -> manifest.Manifest:
        try:
            return msgspec.json.decode(data, type=manifest.Manifest)
        except msgspec.DecodeError as e:
            raise LakeError(one_line(f"{objstore.url_of(k)}: damaged compaction manifest ({e})")) from None

    def _manifest_tags(self) -> dict[str, str]:
        """run directory -> the ETag of its compaction manifest (one listing): a switch PUTs a new
        manifest, whose ETag differs."""
        found = self._find(manifest.MANIFEST_DIR)
        return {k.rsplit("/", 1)[-1][:-5]: tag for k, (_, tag) in found.items() if k.endswith(".json")}

    def manifests(self, tags: dict[str, str] | None = None) -> dict[str, manifest.Manifest]:
        """run directory -> its compaction manifest (lake_manifest.Manifest), those of `tags`
        (_manifest_tags(), else listed now) fetched side by side (one batch of GETs). LakeError
        naming one that cannot be read."""
        tags = self._manifest_tags() if tags is None else tags
        keys = {self._key(manifest.MANIFEST_DIR, f"{r}.json"): r for r in tags}
        if not keys:
            return {}
        try:
            got = self.filesystem.cat(sorted(keys), on_error="return")
        except Exception as e:
            raise self._fail("cannot read the compaction manifests", e) from None
        out = {}
        for k, data in got.items():
            k = k.split("://", 1)[-1]
            if isinstance(data, FileNotFoundError):
                continue  # removed since it was listed: the run has no generation any more
            if isinstance(data, BaseException):
                raise self._fail("cannot read a compaction manifest", data)
            out[keys[k]] = self._decode(k, data)
        return out

    def manifest_of(self, run_dir: str) -> manifest.Manifest | None:
        """The run's compaction manifest (one GET), None when it has no generation."""
        k = self._key(manifest.MANIFEST_DIR, f"{run_dir}.json")
        try:
            data = self.filesystem.cat_file(k)
        except FileNotFoundError:
            return None
        except Exception as e:
            raise objstore.describe(objstore.url_of(k), e) from None
        return self._decode(k, data)

    def committed(self, tables: Iterable[str] | None = None) -> RemoteView:
        """One listing of the lake (module doc): the `sources` rows first, then the parts of every
        table (or of these tables only), then the manifests."""
        live: dict[tuple[str, str], str] = {}
        rows = self._find("sources")
        for k in rows:
            if (p := self._parse(k)) and not manifest.is_compacted(p[2]):
                sid, v = split_stem(p[2])
                if split_stem(live.get((p[1], sid), sid))[1] <= v:
                    live[(p[1], sid)] = p[2]
        found: dict[str, tuple[int, str]] = {}
        for sub in [None] if tables is None else [t for t in tables if t != "sources"]:
            found.update(self._find(sub))
        if tables is not None and "sources" in tables:
            found.update(rows)
        tags = self._manifest_tags()
        mans = self.manifests(tags)
        for r, m in mans.items():  # files of a generation switched to after the listing
            for t, names in m.files.items():
                for n in names:
                    k = self._key(t, r, n)
                    if k not in found and (tables is None or t in tables):
                        try:
                            info = self.filesystem.info(k)
                        except FileNotFoundError:
                            continue
                        found[k] = (int(info.get("size") or 0), str(info.get("ETag")))
        parts: dict[tuple[str, str, str], int] = {}
        for k, (n, etag) in found.items():
            if p := self._parse(k):
                parts[p] = n
                self._sizes[f"{self.url}/{p[0]}/{p[1]}/{p[2]}.parquet"] = n
                self._etags[f"{self.url}/{p[0]}/{p[1]}/{p[2]}.parquet"] = etag
        singles = {(r, s) for r, s in live if s not in (mans[r].sources if r in mans else ())}
        return RemoteView(singles, mans, live, parts, tags)

    _committed = committed

    def unchanged(self, view) -> bool:
        """Whether no compaction switched a generation since `view` was taken (LakeFiles.unchanged)."""
        try:
            return self._manifest_tags() == view.tags
        except LakeError:
            return False


class S3Files(S3Listing):
    """The reading side of a lake at an s3:// URL (LakeFiles' methods; module doc)."""

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

    # ------------------------------------------------------------------ reading

    def _own(self, view: RemoteView, table: str, dirs) -> list[tuple[str, str]]:
        """(run directory, stem) of the table's live parts of sources read from parts of their own."""
        return sorted(
            (r, s)
            for (t, r, s) in view.parts
            if t == table
            and (dirs is None or r in dirs)
            and (r, split_stem(s)[0]) in view.singles
            and view.live.get((r, split_stem(s)[0])) == s
        )

    def table_files(self, table: str, runs: Iterable[str] | None = None, committed=None) -> list[str]:
        """URLs of the table's live parts (module doc), then of its compacted files; runs: only
        these run ids."""
        view = self.committed([table]) if committed is None else committed
        dirs = None if runs is None else {f"run={r}" for r in runs}
        files = self._own(view, table, dirs) + view.files(table, dirs)
        return [f"{self.url}/{table}/{r}/{s}.parquet" for r, s in files]

    def part_size(self, url: str) -> int:
        """Bytes of a part as last listed (query.connect decides materializing with it)."""
        return self._sizes[url]

    def holders(self, table: str, runs: Iterable[str] | None = None) -> set[tuple[str, str]]:
        """(run directory, source id) of the committed sources with rows in `table`."""
        view, dirs = self.committed([table]), None if runs is None else {f"run={r}" for r in runs}
        return {(r, split_stem(s)[0]) for r, s in self._own(view, table, dirs)} | view.holders(table, dirs)

    def has_table(self, table: str) -> bool:
        return bool(self.table_files(table))

    def _read(self, url: str, columns=None) -> pa.Table:
        with self.filesystem.open(objstore.key(url), "rb") as f:  # ParquetFile: pq.read_table imports pandas
            pf = pq.ParquetFile(f)
            cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
            return pf.read(columns=cols)

    def read_source(self, table: str, run_id: str, source_id: str, columns: list[str] | None = None):
        """One committed source's rows of `table` (None when it has none), from its live parts or
        its run's generation."""
        run_dir = f"run={run_id}"
        m = self.manifest_of(run_dir)
        try:
            if m is not None and source_id in m.sources:
                if table not in m.sources[source_id]:
                    return None
                cols = None if columns is None else sorted({*columns, "source_id"})
                tbls = [self._read(f"{self.url}/{table}/{run_dir}/{n}", cols) for n in m.files.get(table, ())]
                tbl = pa.concat_tables(tbls) if tbls else None
                if tbl is None:
                    return None
                tbl = tbl.filter(pc.equal(tbl.column("source_id"), source_id))
                return pl.from_arrow(
                    tbl.select([c for c in tbl.column_names if columns is None or c in columns])
                )
            v = self.versions(run_dir, source_id)
            if not v:
                return None
            return pl.from_arrow(self._read(f"{self.url}/{table}/{run_dir}/{v[max(v)]}.parquet", columns))
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


@lru_cache(maxsize=None)
def _cache_dir():
    from pathlib import Path

    if os.environ.get("TRACELAKE_S3_CACHE_DIR"):
        return Path(os.environ["TRACELAKE_S3_CACHE_DIR"])
    from . import scratch

    d = scratch.make("s3cache")
    atexit.register(shutil.rmtree, d, True)
    return d
