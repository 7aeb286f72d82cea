"""A lake in object storage: `--lake s3://bucket/prefix` (Lake(url) makes an S3Lake; the file
system, credentials and errors: pipeline/objstore.py).

Layout: the local lake's (pipeline/lake.py): <url>/<table>/run=<run_id>/<source_id>.parquet, the
marker <url>/TRACELAKE, kept results under <url>/results/ (pipeline/results.py). DuckDB reads the
parts through the same fsspec file system, registered on its connection (query.connect), so no
DuckDB extension is needed.

S3 has no rename and no flock; the lake keeps the local lake's promises this way (the reading
side: pipeline/lake_s3_files.py):
- Readers see whole sources only. A reader lists the `sources` rows first, then the parts, and
  reads a part only when its source's `sources` row was listed. A writer uploads a source's parts
  first (each PUT is atomic: no reader ever sees half an object) and its `sources` row last, so a
  listed row's parts are all there; forgetting deletes the row first, then the parts.
- A source replaced by `ingest --force` keeps its earlier version visible until the new one is
  committed: the new version's parts and row are uploaded beside it, under the stem
  `<source_id>.v<n>` (n one more than the highest version there), and a listing reads only the
  highest version whose row it lists; the earlier version's row and parts are deleted after the
  new row is up. A commit that fails or is killed before that leaves the earlier version as it
  was (and the new version's parts, unread, for recover()); one killed after it, the new version,
  with the old one's objects left for recover(). A source held by its run's compacted generation
  is replaced the same way, the generation then rewritten without it (the switch below).
- Compaction (pipeline/lake_s3_compact.py; the files and the manifest as a local lake's,
  pipeline/lake_compact.py): a run's small sources are merged into new files c-<gen>-<k>.parquet,
  uploaded first (no manifest names them: unread), then the manifest
  <url>/_compacted/run=<run_id>.json is PUT (one atomic object: the switch), then the superseded
  objects are deleted. Readers list the `sources` rows and parts first and read the manifests
  after, as on a local disk.
- Crash recovery (recover(), under the lock, before every ingest writes): the objects no reader
  sees are deleted: parts without a live `sources` row (a killed commit, a replaced version),
  compacted files no manifest names and the own objects of sources a generation holds (a killed
  compaction), and the staging objects under <url>/.tmp/ (sources a Dask worker published, never
  committed).
- One writer at a time: the lock is the object <url>/.lock, created with a conditional PUT
  (If-None-Match: *, which S3 and S3-compatible servers honour), holding the holder's pid, host,
  start and lease expiry. The holder renews the lease every LOCK_TTL_S / 3 seconds (a PUT
  conditional on the lock's ETag) and deletes the lock when done. A lock whose lease expired (its
  holder died without deleting it), or held by a process of this host that no longer runs, is
  taken over by a PUT conditional on its ETag, so of two takers one wins. TRACELAKE_S3_LOCK_TTL_S
  sets the lease (default 300 s). A holder whose lease ran out or was taken over commits nothing
  more (held(): LakeError). pipeline/lake_s3_lock.py.
- Upgrading a lake of an older schema: pipeline/upgrade.py, each part rewritten and PUT in place
  (one atomic object), then the marker.

Staging is local: a worker writes a source's parts under a local directory
(TRACELAKE_STAGING_DIR, else the system's temporary directory) and the committing process uploads
them; a Dask worker on another machine publishes them to <url>/.tmp/<id>/ first (publish()), and
the commit downloads them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path

from . import lake_journal as journal
from . import lake_manifest as manifest
from . import lake_s3_compact as s3compact
from . import objstore
from . import schema as sch
from . import scratch as scratch_dirs
from .lake_base import LakeError, Staged, one_line, stage_into
from .lake_s3_files import S3Files, split_stem, stem_of
from .lake_s3_lock import S3Lock
from .parts import rewrite_run_id, write_parquet


class S3Lake(S3Files, S3Lock):
    """A lake at an s3:// URL: LakeFiles' and Lake's methods, with the protocol of the module doc.
    Every object-store error is raised as LakeError (ensure, the lock, reading the listing) or
    objstore.ObjectStoreError, an OSError naming the object (a commit, a part)."""

    def stage(self, run_id: str, source_id: str, tables: dict[str, object]) -> Staged:
        """Lake.stage, into a local staging directory (module doc)."""
        base = Path(os.environ.get("TRACELAKE_STAGING_DIR") or tempfile.gettempdir())
        return stage_into(scratch_dirs.path("staged", base), run_id, source_id, tables)

    def scratch(self) -> Path:
        """A fresh local directory for one ingest's intermediate files (the caller removes it)."""
        return scratch_dirs.make("scratch")

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

    def _stem_keys(self, run_dir: str, stem: str, tables=None) -> list[str]:
        """The keys of a source version's parts (all tables but `sources`, or these)."""
        tables = [t for t in sch.tables() if t != "sources"] if tables is None else tables
        return [self._key(t, run_dir, f"{stem}.parquet") for t in tables]

    def commit(self, staged: Staged, source_row: dict) -> None:
        """Put a staged source into the lake with its `sources` row (module doc): its parts are
        uploaded, then its row, under the stem of a version above those there; then an earlier
        version (its row, then its parts) is deleted, and a compacted generation holding the source
        is rewritten without it. SchemaError when the row does not fit schema v3; ObjectStoreError
        (an OSError naming the object) when the bucket refuses a step (an earlier version is then
        still the one readers see, or the new one is; recover() removes what is left)."""
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
            run_dir, sid = f"run={staged.run_id}", staged.source_id
            row = self._key("sources", run_dir, f"{sid}.parquet")
            fs = self.filesystem
            try:
                old = self.versions(run_dir, sid)
                held = self.manifest_of(run_dir)
                stem = stem_of(sid, max(old) + 1 if old else 0)
                row = self._key("sources", run_dir, f"{stem}.parquet")
                if staged.tables:
                    fs.put(
                        [str(d / f"{t}.parquet") for t in staged.tables],
                        self._stem_keys(run_dir, stem, staged.tables),
                    )
                journal.crash_point("s3-parts")
                fs.put_file(str(d / "sources.parquet"), row)
                journal.crash_point("s3-replace")
                if held is not None and sid in held.sources:  # the switch makes the new version the one read
                    s3compact.drop(self, run_dir, held, {sid})
                try:  # earlier versions: no reader reads them any more
                    for v in sorted(old):
                        self._rm([self._key("sources", run_dir, f"{old[v]}.parquet")])
                        self._rm(self._stem_keys(run_dir, old[v]))
                except OSError:
                    pass  # the new version is committed; recover() deletes what is left
            except (OSError, LakeError):
                raise
            except Exception as e:  # botocore's own errors
                raise objstore.describe(objstore.url_of(row), e) from None
        finally:
            if not objstore.is_url(staged.dir):
                shutil.rmtree(staged.dir, ignore_errors=True)
        journal.crash_point("commit")

    def write_source(self, run_id, source_id, tables, source_row, replace: bool = True) -> None:
        self.commit(self.stage(run_id, source_id, tables), source_row)

    def recover(self) -> list[str]:
        """Delete what a killed ingest, compaction or forget left (module doc); call with the lock
        held. One line per repair."""
        done = []
        tmp = list(self._find(".tmp"))
        if tmp:
            self._rm(tmp)
            done.append(f"removed {len(tmp)} staged objects under {self.url}/.tmp")
        view = self.committed()
        live = {t: set(view.files(t)) for t in sch.tables()}
        garbage = []
        for t, r, stem in sorted(view.parts, key=lambda p: p[0] == "sources"):  # rows last
            sid = split_stem(stem)[0]
            m = view.manifests.get(r)
            if manifest.is_compacted(stem):
                why = None if (r, stem) in live.get(t, ()) else "not in the run's compacted generation"
            elif view.live.get((r, sid)) != stem:
                why = "no sources row" if (r, sid) not in view.live else "a replaced version"
            else:
                why = "held by the run's compacted generation" if m is not None and sid in m.sources else None
            if why:
                garbage.append(self._key(t, r, f"{stem}.parquet"))
                done.append(f"removed {t}/{r}/{stem}.parquet ({why})")
        self._rm(garbage)
        return done

    def compact(self, runs: Iterable[str] | None = None, min_sources: int = 2) -> list:
        """Lake.compact in a bucket (module doc; pipeline/lake_s3_compact.py). OSError
        (ObjectStoreError) when the bucket refuses a step: the run is then as it was, or compacted."""
        return s3compact.compact(self, runs, min_sources)

    def forget(self, sources: Iterable[tuple[str, str]]) -> int:
        """Lake.forget: sources held by a compacted generation go with one rewrite of it; every
        other source's `sources` rows (all its versions, the live one last) first, then its parts.
        LakeError (one line, naming the object) when a row or part cannot be deleted."""
        sources, n = list(sources), 0
        try:
            n += s3compact.forget_held(self, sources)
            for run_id, source_id in sources:
                run_dir = f"run={run_id}"
                old = self.versions(run_dir, source_id)
                if not old:
                    continue
                for v in sorted(old):
                    self._rm([self._key("sources", run_dir, f"{old[v]}.parquet")])
                journal.crash_point("forget")
                for v in sorted(old):
                    self._rm(self._stem_keys(run_dir, old[v]))
                n += 1
        except OSError as e:
            raise LakeError(one_line(f"{e}; the next ingest removes what is left")) from None
        return n
