"""The lake: hive-partitioned Parquet, one directory per table and run.

Layout: <lake>/<table>/run=<run_id>/<source_id>.parquet (or compacted files c-<gen>-<k>.parquet:
"Compaction" below), for every table of schema v3
(schemas/v3.toml). DuckDB (`read_parquet('<lake>/<table>/*/*.parquet', hive_partitioning=true)`),
polars (`pl.scan_parquet('<lake>/<table>/**/*.parquet', hive_partitioning=True)`) and Spark read it
as is. The partition key is `run`; every file also holds `run_id` as a column.

Crash safety. A source (one input file) reaches the lake whole or not at all:
1. stage(): its parts are written under <lake>/.tmp/<uuid>/ (nothing in the lake changes);
2. commit(): its `sources` row is staged too, then a journal <lake>/.tmp/<uuid>/COMMIT is written
   (to a temporary name, then renamed: it exists whole or not at all). From then on the commit is
   decided. The earlier version of the same source (same run and source id) is moved out of the
   lake into the staging directory's old/, its `sources` row first; then each new part is renamed
   into place and the `sources` row last; the staging directory is removed.
   When a step fails (a part that cannot be moved or replaced: `chattr +i`, a read-only
   directory), the commit is undone instead: an UNDO marker is written, the new parts placed so
   far go back to the staging directory, the earlier version's parts and then its `sources` row
   go back where they were, and the staging directory is removed. The lake is then exactly as it
   was before (commit raises the OSError, naming the lake file that could not be changed).
3. recover() (run under the lock by every ingest, forget and compact before it writes, and by a
   run's first analysis before it writes the per-source results, pipeline/local_fill.py fill): a
   staging directory with an
   UNDO marker is undone, one with a COMMIT journal is finished (or, when that fails, undone), the
   same steps each time (each one is idempotent), one without either is removed, a part with
   no `sources` row of its run and source id (left by a kill in step 2) is removed, and so is a
   hidden temporary file in a run directory (a part killed before its rename).
Steps 2 and 3 are pipeline/lake_journal.py. Readers (table_files(), so DuckDB through
pipeline/query.py) list only parts whose `sources` row exists, so a source being replaced is
either seen whole or not at all. Killing an ingest with SIGKILL at any moment and running it
again therefore leaves the same lake as an uninterrupted run. (A power loss can still lose
renames the file system had not written back; nothing is fsynced.)

One writer at a time: lock() takes an exclusive flock(2) on <lake>/.lock for the whole ingest;
a second ingest gets LakeError naming the holder (pid, host, start time). A writer waits (up to
BRIEF_HOLD_WAIT_S) only for an analysis writing its per-source results, whose holds are a few
milliseconds. The kernel releases the lock when the holder dies, however it dies.

Failed files get a `sources` row with status=failed and no other rows.

forget() removes sources under the same lock: the `sources` row first (the source disappears for
readers at once), then its parts; recover() removes what a kill in between leaves.

Compaction (pipeline/lake_compact.py writes, pipeline/lake_manifest.py reads). An archive of
thousands of small traces would otherwise stay one part per source and table forever. compact()
merges a run's small sources (parts under 32 MiB in all) into files <table>/run=<run_id>/
c-<gen>-<k>.parquet of at most 64 MiB of input each, rows sorted by rank, source and time, and
the manifest <lake>/_compacted/run=<run_id>.json names that generation's files and the sources it
holds. Replacing the manifest (one os.replace) is the switch: from then on the generation's
files are read and the merged sources' own parts are not, and only then are the superseded parts
removed; a kill before it leaves the old parts live and the new files unread, a kill after it
the reverse, and recover() removes what no reader sees. A reader lists the parts first and reads
the manifests after (query.connect lists again when a generation changed while it listed). An
ingest compacts each run it wrote to that holds at least 16 small sources of their own
(lake_compact.AUTO_MIN_SOURCES: cheap when none does: one listing of the run); `tracelake
compact` any run with two or more. A run that 16 or more of an ingest's inputs name gets its
small sources without parts of their own: held in memory by the ingest and added at its end to
the run's generation as new files (lake_compact.append, the same switch: every held source of
the run at once; pipeline/ingest/hold.py). A source inside a generation is forgotten, or replaced by a
--force ingest, by rewriting the generation without it (the same switch; a replaced source's
rows go back to parts of its own first, so an undone commit restores them). Hive readers of the
files themselves (DuckDB, polars, Spark) see every row once except while a compaction runs or
after a kill, until recover().
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import lake_compact as compaction
from . import lake_journal as journal
from . import lake_manifest as manifest
from . import objstore
from . import schema as sch
from .lake_base import LakeBusy, LakeError, Staged, one_line, stage_into  # noqa: F401  (re-exported)
from .parts import rewrite_run_id, write_parquet

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_SHORTENED = re.compile(r".{100}-[0-9a-f]{6}")


def name_hash(name: str) -> str:
    """6 hex digits of the SHA-1 of a name's UTF-8 (surrogates escaped): what a run id that had
    to change carries after a '-' (safe_run_id; pipeline/ingest/runid.py)."""
    return hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:6]


def safe_run_id(name: str) -> str:
    """A run id usable as a hive partition value: [A-Za-z0-9._-], other runs of characters -> '_'.
    A name that had to change gets '-' and 6 hex digits of its SHA-1, so two different names never
    map to one run id. Idempotent: a run id given back (a stored id, even one shortened to 100
    characters plus its hash) is returned as it is."""
    if (
        _SAFE.sub("_", name) == name
        and name.strip("._") == name
        and (len(name) <= 100 or _SHORTENED.fullmatch(name))
    ):
        return name
    s = _SAFE.sub("_", name).strip("._")[:100] or "run"
    if s != name:
        s += "-" + name_hash(name)
    return s


class LakeFiles:
    """The lake's layout and its reading side: where each part lives, which parts are committed
    (a part counts only once its source's `sources` row exists), the manifest. Lake adds the one
    writer: the lock, staging, commits, recovery and forgetting. A root given as an s3:// URL
    (pipeline/objstore.py) makes a lake_s3.S3Lake instead (its module doc)."""

    def __new__(cls, root: str | os.PathLike = "", *args, **kwargs):
        if objstore.is_url(root):
            from .lake_s3 import S3Lake

            return S3Lake(root)
        return super().__new__(cls)

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def ensure(self) -> None:
        """Create the lake directory if needed. Raises LakeError (one line) when it cannot, or when
        the path is a file or a non-empty directory that is not a lake (no TRACELAKE marker): a
        mistyped --lake must not mix the lake's tables into, say, a directory of traces."""
        try:
            if self.root.exists() and not self.root.is_dir():
                raise LakeError(f"{self.root}: exists and is not a directory")
            marker = self.root / "TRACELAKE"
            if self.root.is_dir() and not marker.exists() and any(self.root.iterdir()):
                raise LakeError(
                    f"{self.root}: a non-empty directory that is not a tracelake lake (no TRACELAKE file); "
                    "give a new or empty directory as --lake"
                )
            self.root.mkdir(parents=True, exist_ok=True)
            if not marker.exists():
                tmp = self.root / f".TRACELAKE.{uuid.uuid4().hex}"
                tmp.write_text(f"tracelake lake, schema v{sch.SCHEMA_VERSION}\n")
                os.replace(tmp, marker)
        except OSError as e:
            raise LakeError(f"{self.root}: cannot create the lake: {e.strerror or e}") from None

    def writable(self) -> bool:
        return os.access(self.root, os.W_OK)

    def exists(self) -> bool:
        return (self.root / "TRACELAKE").exists()

    def part_path(self, table: str, run_id: str, source_id: str) -> Path:
        return self.root / table / f"run={run_id}" / f"{source_id}.parquet"

    # ------------------------------------------------------------------ reading

    def _listing(self, table: str) -> list[tuple[str, str]]:
        """(run directory name, source id) of the table's parts, sorted (os.scandir: a lake of
        thousands of sources is listed in milliseconds, not in pathlib's seconds)."""
        out = []
        try:
            runs = [e.name for e in os.scandir(self.root / table) if e.name.startswith("run=") and e.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        for r in runs:
            try:
                out += [
                    (r, e.name[:-8]) for e in os.scandir(self.root / table / r) if e.name.endswith(".parquet")
                ]
            except FileNotFoundError:  # a run directory removed meanwhile (forget)
                continue
        return sorted(out)

    def _parts(self, table: str) -> list[Path]:
        return [self.root / table / r / f"{sid}.parquet" for r, sid in self._listing(table)]

    def committed(self) -> manifest.View:
        """Which parts are live (lake_manifest.View): the committed sources with parts of their own
        ((run directory, source id) in the view), and each run's compacted generation. The
        `sources` listing is made before the manifests are read (lake_manifest's module doc).
        LakeError naming a manifest that cannot be read."""
        listing = self._listing("sources")
        try:
            return manifest.view(listing, manifest.read_all(self.root))
        except manifest.ManifestError as e:
            raise LakeError(one_line(str(e))) from None

    _committed = committed

    def unchanged(self, view: manifest.View) -> bool:
        """Whether no compaction switched a generation since `view` was taken (a reader that listed
        tables after taking it checks this, and lists again when not)."""
        try:
            return {r: m.gen for r, m in manifest.read_all(self.root).items()} == view.gens()
        except manifest.ManifestError:
            return False

    def table_files(
        self, table: str, runs: Iterable[str] | None = None, committed: manifest.View | None = None
    ) -> list[str]:
        """The table's live Parquet parts (listed here, so no character of the lake path is a glob):
        the parts of committed sources not held by a compacted generation, then the files of each
        run's generation (lake_manifest). Parts of a source without its `sources` row (a commit in
        progress, or one killed half-way and not yet recovered) and compacted files of no live
        generation are left out. runs: only the parts of these run ids (None: all). committed:
        committed() when the caller lists several tables at once (taken once; the caller then
        checks unchanged() after listing)."""
        parts = [p for p in self._listing(table) if not manifest.is_compacted(p[1])]
        view = self.committed() if committed is None else committed
        dirs = None if runs is None else {self.part_path(table, r, "x").parent.name for r in runs}
        if dirs is not None:
            parts = [p for p in parts if p[0] in dirs]
        parts = [p for p in parts if p in view]
        parts += view.files(table, dirs)
        base = str(self.root / table)
        return [f"{base}/{r}/{sid}.parquet" for r, sid in parts]

    def holders(self, table: str, runs: Iterable[str] | None = None) -> set[tuple[str, str]]:
        """(run directory, source id) of the committed sources with rows in `table`, whether in
        parts of their own or in a compacted generation. runs: only these run ids."""
        view = self.committed()
        dirs = None if runs is None else {self.part_path(table, r, "x").parent.name for r in runs}
        own = {p for p in self._listing(table) if p in view and (dirs is None or p[0] in dirs)}
        return own | view.holders(table, dirs)

    def read_source(self, table: str, run_id: str, source_id: str, columns: list[str] | None = None):
        """One committed source's rows of `table` (lake_manifest.read_source)."""
        run_dir = self.part_path(table, run_id, "x").parent.name
        return manifest.read_source(self.root, table, run_dir, source_id, columns)

    def has_table(self, table: str) -> bool:
        return bool(self.table_files(table))

    def sources(self, runs: Iterable[str] | None = None) -> pl.DataFrame:
        """The manifest: all sources rows (empty frame with the v2 columns when none); runs: only
        those of these run ids. Raises LakeError naming a part that cannot be read."""
        parts = self.table_files("sources", runs)
        if not parts:
            return pl.from_arrow(sch.empty("sources"))
        # all parts in one DuckDB read when they share the v2 columns (a lake of 5,000 sources:
        # 2 s instead of 18 s one part at a time with pyarrow, 5.6 s with pyarrow.dataset); else
        # (an old lake's parts lack unreadable_bytes, or a part is unreadable) part by part,
        # diagonally from the empty v2 frame: every v2 column in schema order, null where a part
        # predates it, and an unreadable part named in the error
        if len(parts) > 1:
            try:
                import duckdb

                with duckdb.connect(":memory:") as con:
                    tbl = con.sql(
                        "SELECT * FROM read_parquet($1, union_by_name = false, hive_partitioning = false)",
                        params=[parts],
                    ).to_arrow_table()
                if tbl.schema.names == sch.arrow_schema("sources").names:
                    return pl.from_arrow(sch.conform("sources", tbl))
            except (duckdb.Error, pa.ArrowException, sch.SchemaError):
                pass
        return pl.concat(
            [pl.from_arrow(sch.empty("sources")), *map(_read_sources_part, parts)], how="diagonal_relaxed"
        )


# how long a writer waits for the lock where its holder is an analysis writing its per-source
# results (Lake.lock; a few ms per rank): longer holds (an ingest, a forget) fail at once
BRIEF_HOLD_WAIT_S = 10.0


class Lake(LakeFiles):
    """A lake: LakeFiles plus the crash-safe writing protocol of this module's docstring."""

    @contextmanager
    def lock(self, purpose: str | None = None):
        """Hold the lake's writer lock (flock on <lake>/.lock) for the duration. Raises LakeBusy
        (one line, naming the holder) when another process holds it, at once, or after up to
        BRIEF_HOLD_WAIT_S where the holder said its purpose is "analysis" (a run's first analysis
        writing its per-source results, pipeline/local.py: a few ms per rank, which an ingest or
        forget then waits out instead of failing). purpose: what this holder writes, recorded
        with its pid for the others."""
        self.ensure()
        path = self.root / ".lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise LakeError(f"{self.root}: cannot open the lock file: {e.strerror or e}") from None
        try:
            deadline = time.monotonic() + BRIEF_HOLD_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise LakeError(f"{self.root}: cannot lock the lake: {e.strerror or e}") from None
                try:
                    holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
                except ValueError:
                    holder = {}
                if holder.get("purpose") == "analysis" and time.monotonic() < deadline:
                    time.sleep(0.02)  # an analysis's short write: wait it out
                    continue
                who = (
                    f" (pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')})"
                    if holder.get("pid")
                    else ""
                )
                raise LakeBusy(
                    f"{self.root}: another tracelake command ({holder.get('purpose') or 'ingest or forget'}) "
                    f"is writing to this lake{who}; wait for it to finish, then run this one again"
                ) from None
            info = json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                    **({"purpose": purpose} if purpose else {}),
                }
            ).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
            yield self
        finally:
            os.close(fd)  # releases the flock

    # ------------------------------------------------------------------ writing

    def stage(self, run_id: str, source_id: str, tables: dict[str, object]) -> Staged:
        """Write one source's tables under <lake>/.tmp/<id>/ (the lake itself is untouched).

        tables: table name -> a pyarrow Table, an iterable of pyarrow Tables/RecordBatches (streamed
        into the Parquet part chunk by chunk, so memory stays bounded), or a callable returning
        either (called after the tables before it are written, in dict order). Each chunk is
        conformed to schema v3 (SchemaError on mismatch; nothing is left staged then). Once the
        tables are written, the derived columns of gpu_activities (launch, step, graph replay,
        FLOP attribution: pipeline/derive.py) are computed from the source's own cpu_ops and steps
        and the part is rewritten with them; values given for those columns are replaced."""
        return stage_into(self.root / ".tmp" / uuid.uuid4().hex, run_id, source_id, tables)

    def discard(self, staged: Staged) -> None:
        shutil.rmtree(staged.dir, ignore_errors=True)

    def retarget(self, staged: Staged, run_id: str) -> None:
        """Move a staged source to another run: its parts' run_id column is rewritten (row group by
        row group) before it is committed."""
        if run_id == staged.run_id:
            return
        for t in staged.tables:
            rewrite_run_id(Path(staged.dir) / f"{t}.parquet", run_id)
        staged.run_id = run_id

    def commit(self, staged: Staged, source_row: dict) -> None:
        """Put a staged source into the lake with its `sources` row (module doc: crash safety).
        The row's run_id and source_id must be the staged ones. SchemaError when the row does not
        fit schema v3 (the staged parts are discarded then). OSError, naming the lake file, when a
        part cannot be moved or replaced: the commit is undone first, so the lake, an earlier
        version of the source included, is as it was; LakeError when it cannot be undone either
        (the next recover() finishes or undoes it)."""
        d = Path(staged.dir)
        try:
            compaction.unpack(self, staged.run_id, staged.source_id)  # from its run's generation, if there
            src = sch.conform("sources", {k: [v] for k, v in source_row.items()})
            if (
                src.column("run_id")[0].as_py() != staged.run_id
                or src.column("source_id")[0].as_py() != staged.source_id
            ):
                raise ValueError("sources row does not match the staged source")
            write_parquet(src, d / "sources.parquet")
            entry = {"run_id": staged.run_id, "source_id": staged.source_id, "tables": staged.tables}
            (d / "COMMIT.part").write_text(json.dumps(entry))
            os.replace(d / "COMMIT.part", d / "COMMIT")
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        journal.crash_point("journal")
        try:
            journal.apply(self, d)
        except OSError as e:
            try:
                journal.undo(self, d)
            except OSError as u:
                raise LakeError(
                    one_line(
                        f"{e.filename}: cannot be changed ({e.strerror or e}), and the commit could not be "
                        f"undone ({u.filename}: {u.strerror or u}); the next ingest finishes or undoes it"
                    )
                ) from None
            raise
        journal.crash_point("commit")

    def write_source(
        self, run_id: str, source_id: str, tables: dict[str, object], source_row: dict, replace: bool = True
    ) -> None:
        """stage() then commit(): one source's tables and its sources row, replacing an earlier
        version of the same source in the same run (`replace` is kept for callers; a source is
        always replaced whole)."""
        self.commit(self.stage(run_id, source_id, tables), source_row)

    def recover(self) -> list[str]:
        """Finish or undo what a killed ingest left (module doc); call with the lock held.
        Returns one line per repair made."""
        done = []
        tmp = self.root / ".tmp"
        if tmp.is_dir():
            for d in sorted(tmp.iterdir()):
                if d.is_dir() and (d / "COMMIT").is_file():
                    done.append(journal.recover(self, d))
                else:
                    shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
        for p, why in compaction.garbage(self, self.committed()):
            try:
                p.unlink(missing_ok=True)
            except OSError as e:  # e.g. chattr +i: readers do not see it; left for next time
                done.append(f"could not remove {p.relative_to(self.root)} ({why}): {e.strerror}")
                continue
            done.append(f"removed {p.relative_to(self.root)} ({why})")
        return done

    def compact(self, runs: Iterable[str] | None = None, min_sources: int = 2) -> list[tuple[str, int, int]]:
        """Merge the small parts of each run (runs: only these run ids) holding at least
        min_sources small sources (module doc, "Compaction"); call with the lock held. Returns
        (run id, parts before, files after) per run compacted. OSError from the file system (the
        run is then as it was, or compacted: recover() removes what is left)."""
        return compaction.compact(self, runs, min_sources)

    def forget(self, sources: Iterable[tuple[str, str]]) -> int:
        """Remove sources, given as (run_id, source_id), with all their rows; call with the lock
        held. Each source's `sources` row goes first, so readers stop seeing the whole source at
        once, and a kill half-way leaves parts without a row, which recover() removes. Run
        directories left empty stay (removing them would race with readers listing the lake).
        Returns how many sources were removed. LakeError (one line, naming the file) when a
        source's `sources` row cannot be removed (that source is kept whole, the ones before it
        are removed), or when one of its parts cannot be (the source is removed for readers; the
        part, which nothing reads, is removed by a later recover() once it can be)."""
        sources, n = list(sources), 0
        try:  # those held by their run's compacted generation: it is rewritten without them
            n += compaction.forget_held(self, sources)
        except OSError as e:
            raise LakeError(
                one_line(f"{e.filename}: cannot be changed ({e.strerror or e}); the run is kept")
            ) from None
        for run_id, source_id in sources:
            row = self.part_path("sources", run_id, source_id)
            if not row.exists():
                continue
            try:
                row.unlink()
            except OSError as e:
                raise LakeError(
                    one_line(f"{row}: cannot be removed ({e.strerror or e}); that source is kept")
                ) from None
            journal.crash_point("forget")
            stuck = []
            for t in sch.tables():
                try:
                    if t != "sources":
                        self.part_path(t, run_id, source_id).unlink(missing_ok=True)
                except OSError as e:
                    stuck.append(f"{self.part_path(t, run_id, source_id)} ({e.strerror or e})")
            n += 1
            if stuck:
                raise LakeError(
                    one_line(
                        f"{stuck[0]}: cannot be removed; its source {run_id}/{source_id} is forgotten (no "
                        "reader sees the part), and a later ingest or forget removes the part once it can"
                    )
                )
        return n

    def scratch(self) -> Path:
        """A fresh private directory under <lake>/.tmp for one ingest's intermediate files (the
        caller removes it; a crashed ingest leaves it to the next recover())."""
        d = self.root / ".tmp" / ("scratch-" + uuid.uuid4().hex)
        d.mkdir(parents=True)
        return d


def _read_sources_part(path: str) -> pl.DataFrame:
    """One `sources` part (read as a literal path: no character of it is a glob)."""
    try:
        # ParquetFile, not pq.read_table: that goes through pyarrow.dataset, which imports pandas
        # where it is installed (0.3 s a process; tests/test_imports.py)
        return pl.from_arrow(pq.ParquetFile(path).read())
    except FileNotFoundError:
        raise LakeError(
            f"{path}: removed while read (an ingest or forget is writing to the lake); run the command again"
        ) from None
    except (OSError, pa.ArrowException) as e:
        raise LakeError(
            one_line(
                f"{path}: unreadable sources part "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); move it out of the lake to "
                "drop that source"
            )
        ) from None
