"""Inputs in object storage: `s3://bucket/prefix/` given to ingest (pipeline/objstore.py).

plan_urls() lists a prefix (or takes one object) and gives the units of work discover.plan()
gives for a directory: the same suffixes (formats.py), the same `--exclude` rule on the key below
the prefix, text logs only when their first 64 KiB look like NCCL-family output, and the same run
names (an object's "directory" below the prefix: `s3://b/archive/2026-11-04/job-4711/rank0.json`
given `s3://b/archive/` is run 2026-11-04.job-4711; an object right under the prefix, or named
itself, takes the name of the prefix's last part). Each object is one ObjectInput, read as a
stream like an archive member (Kineto JSON, gzipped or not, and NCCL-family logs; an Nsight
Systems export is copied to a local scratch file first, prepare.prepare_extracted). An archive
(.tar, .tar.gz, .tgz, .zip) is an "object_archive" unit: the worker fetches it to a local
temporary file and reads it as a local archive (object_archive.py), its members named
`s3://.../job.tar.gz!rank0.json` and their runs as the archive's beside them would be.

An object the lake already holds, unchanged since it was ingested (known_sha: its URL, size and
LastModified against the `sources` row), is skipped without being fetched again, so a nightly
ingest of a whole prefix reads only what is new. An object of at most WHOLE_BYTES is fetched
once (one GET): hashing reads it and keeps the bytes
for the parse that follows in the same thread (one object held per thread at most).
The `sources` row's path is the object's s3:// URL (no credentials: objstore.normalize refuses
URLs that carry some).
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass

from .. import objstore
from . import nccl, streams
from .formats import ARCHIVE_SUFFIXES, LOG_SUFFIXES, TRACE_SUFFIXES
from .jobid import job_of_name, with_job

WHOLE_BYTES = 64 << 20
MODIFIED_MARGIN_S = 2
_held = threading.local()  # (url, bytes) of the object last read whole by this thread


class _Named:
    """What an input named by its URL shows: its URL, its last part, and its run (`run` when
    given, else the object's "directory", as for a file's directory)."""

    url: str
    run: str | None

    @property
    def display(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def dir_run_name(self) -> str:
        """`run`, else the object's "directory" (the last part of its key's prefix)."""
        if self.run is not None:
            return self.run
        return objstore.key(self.url).rsplit("/", 1)[0].rsplit("/", 1)[-1]

    @property
    def run_name(self) -> str:
        """`run`, else the object's "directory", with the job its name states (jobid.py)."""
        return self.run_name_with(job_of_name(self.name))

    def run_name_with(self, job: str | None) -> str:
        """Its directory's run name with `job` (one its contents state: jobid.with_job)."""
        return with_job(self.dir_run_name, job)


@dataclass
class ObjectInput(_Named):
    """One object of a bucket (the attributes prepare() and work() read of an input)."""

    url: str
    run: str | None = None
    length: int = 0
    fmt: str | None = "stream"
    modified: float | None = None  # LastModified, s since the epoch (known_sha)

    @property
    def path(self) -> str:
        return self.url

    def size(self) -> int:
        return self.length

    def open(self):
        """The object's bytes as a binary file (OSError, one line naming the URL, when it cannot be
        read)."""
        fs = objstore.filesystem()
        try:
            if self.length > WHOLE_BYTES:
                return fs.open(objstore.key(self.url), "rb", block_size=8 << 20)
            held = getattr(_held, "obj", None)
            if held is not None and held[0] == self.url:
                _held.obj = None  # the second read (the parse after the hash) takes it
                return io.BytesIO(held[1])
            data = fs.cat_file(objstore.key(self.url))
            _held.obj = (self.url, data)
            return io.BytesIO(data)
        except Exception as e:
            raise objstore.describe(self.url, e) from None


@dataclass
class RefusedObject(_Named):
    """An object (or a URL) that is not read, with the reason (a failed sources row)."""

    url: str
    error: str
    run: str | None = None


def _looks_like_log(inp: ObjectInput) -> bool:
    """discover._member_looks_like_log for an object (nccl.sniff: discover.log_format's test)."""
    try:
        with inp.open() as raw:
            head = streams.Peek(streams.Inflate(raw).read).head
    except Exception:
        return True  # let ingest say why it cannot be read
    return nccl.sniff(head, inp.name) is not None


def plan_urls(urls, excluded, exclude, not_logs: list | None = None) -> list[tuple[str, object, int]]:
    """(kind, item, size) of each unit for the s3:// URLs given, in order: ("input", ObjectInput,
    bytes) or ("refused", RefusedObject, 0) (a missing bucket or prefix, an unreadable listing, an
    archive). excluded(relpath, exclude): discover.excluded. not_logs gets the URLs of objects with
    a log suffix that are passed over as not NCCL-family logs."""
    out: list[tuple[str, object, int]] = []
    fs = None
    for given in urls:
        try:
            url = objstore.normalize(given)
            fs = fs or objstore.filesystem()
            base = objstore.key(url)
            named = "/" in base and fs.isfile(base)
            if named:
                found = {base: fs.info(base)}
                top = base.rsplit("/", 1)[0]
            else:
                found = fs.find(base, detail=True, withdirs=False)
                top = base
        except Exception as e:
            out.append(("refused", RefusedObject(str(given), str(objstore.describe(str(given), e))), 0))
            continue
        if not found:
            out.append(("refused", RefusedObject(url, f"{url}: no objects under this prefix"), 0))
        for k in sorted(found):
            rel = k[len(top) :].lstrip("/")
            below = rel.rsplit("/", 1)[0] if "/" in rel else None
            obj_url = objstore.url_of(k)
            low = k.lower()
            if excluded(rel, exclude) or not low.endswith(TRACE_SUFFIXES + LOG_SUFFIXES):
                continue
            when = found[k].get("LastModified")
            if low.endswith(ARCHIVE_SUFFIXES):
                arch = ObjectInput(obj_url, below, int(found[k].get("size") or 0))
                out.append(("object_archive", arch, arch.length))
                continue
            inp = ObjectInput(
                obj_url, below, int(found[k].get("size") or 0), modified=when and when.timestamp()
            )
            if low.endswith(LOG_SUFFIXES) and not named and not _looks_like_log(inp):
                if not_logs is not None:
                    not_logs.append(obj_url)
                continue
            out.append(("input", inp, inp.length))
    return out


def stored_index(stored) -> dict[str, list[tuple[int, int, str]]]:
    """path -> (size_bytes, ingested_at_ns, content_sha256) of the lake's sources rows whose path is
    an s3:// URL (stored: runs.stored_sources, the rows that did not fail)."""
    out: dict[str, list[tuple[int, int, str]]] = {}
    cols = ("path", "size_bytes", "ingested_at_ns", "content_sha256")
    for path, size, at, sha in stored.select(cols).iter_rows():
        if path and objstore.is_url(path) and size is not None and at is not None and sha:
            out.setdefault(path, []).append((size, at, sha))
    return out


def known_sha(item, index: dict | None) -> str | None:
    """The content hash of an object the lake holds unchanged, so that a nightly ingest of a whole
    prefix does not fetch it again: a sources row with its URL as path and its size, whose ingest
    started more than MODIFIED_MARGIN_S after the object was last written (a replaced object is
    newer: read again; the margin covers LastModified's whole seconds and the clocks of the store
    and of the ingesting machine). None otherwise, and for anything but an ObjectInput."""
    if not index or not isinstance(item, ObjectInput) or item.modified is None:
        return None
    after = int((item.modified + MODIFIED_MARGIN_S) * 1e9)
    return next(
        (sha for size, at, sha in index.get(item.url, ()) if size == item.length and at > after), None
    )


def published(work, unit, opts, done) -> list:
    """work(unit, opts, done) (executors.work) on a Dask worker that shares only the lake's bucket
    with the ingesting process: each staged source is uploaded to <lake>/.tmp/ (lake_s3
    S3Lake.publish) before it is handed back, so the commit reads it from there. Raises what
    work() or the upload raises (executors.run_dask reports it as the unit's failure)."""
    from ..lake import Lake

    out = work(unit, opts, done)
    lake = Lake(opts.lake)
    for p in out:
        if p.staged is not None:
            lake.publish(p.staged)
    return out
