"""Inputs read as streams: plain files, gzip (inflated as a stream, bounded) and the members of
.tar, .tar.gz / .tgz and .zip archives, read in place (nothing is extracted, except a member in a
format that needs a real file — an Nsight Systems SQLite export — which is copied to the lake's
scratch space first).

- A member's path in the lake is `<archive>!<member>`; the Kineto rank-from-file-name rule applies
  to the member's own name, and its default run is the member's parent directory inside the
  archive, else the archive's name without its suffix, else (a member at the top stating a job)
  the archive's directory with that job (member_run_name).
- Members whose names are absolute or contain `..`, links and device members are refused (a
  failed `sources` row each); archives inside archives are not opened (a failed row says so).
- Decompression is bounded: a gzip stream (a file, a member, or the tar.gz itself) that expands
  beyond TRACELAKE_MAX_UNCOMPRESSED_BYTES (default 16 GiB), or by more than
  TRACELAKE_MAX_COMPRESSION_RATIO (default 200:1) once past 64 MiB, fails cleanly as a possible
  gzip bomb; a zip or tar member that declares more than the limit is refused before it is read.
  Memory stays bounded either way: everything is read in pieces (the streams:
  pipeline/ingest/streams.py).
- .tar and .zip members are read by random access (each one can go to its own worker); a
  compressed tar can only be read front to back, so all its members are one unit of work.
"""

from __future__ import annotations

import hashlib
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import TraceError
from .formats import ARCHIVE_SUFFIXES, LOG_SUFFIXES, TRACE_SUFFIXES, archive_stem
from .jobid import job_of_name, with_job
from .runs import dir_name
from .streams import (
    RATIO_FLOOR,
    READ_BLOCK,
    Closing,
    Inflate,
    Window,
    max_ratio,
    max_uncompressed_bytes,
    open_regular,
)

# an archive whose member list holds no file (none at all, or directories only)
EMPTY_ARCHIVE = "archive holds no files"

# ------------------------------------------------------------------ inputs


@dataclass
class FileInput:
    """A plain file on disk. run: its run name as planned, else None (the name of the directory it
    is in): found by searching a directory given, in a subdirectory, that subdirectory's path
    below it ('job1/traces'), as TensorBoard names the runs of a log directory, so archives of
    many jobs with the same inner layout (<job>/traces/rank*.json) keep one run per job
    (pipeline/ingest/runs.py). fmt: its format when discover.sniff_path() knows it from the
    file's first bytes (Nsight Systems exports, nsys-jax), "stream" when it sniffed as none of
    those (Kineto or an NCCL-family log, told apart from the stream), None when not sniffed yet."""

    path: str
    run: str | None = None
    fmt: str | None = None

    @property
    def display(self) -> str:
        return str(Path(self.path).absolute())

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def run_name(self) -> str:
        """Its directory's run name, with the job its file name states (jobid.py)."""
        return self.run_name_with(job_of_name(self.name))

    def run_name_with(self, job: str | None) -> str:
        """Its directory's run name with `job` (one its contents state: jobid.with_job)."""
        return with_job(self.run if self.run is not None else dir_name(self.path), job)

    def size(self) -> int:
        return Path(self.path).stat().st_size

    def open(self):
        return open_regular(self.path)


class _Member:
    """What every archive member answers (needs archive, member, length attributes)."""

    @property
    def display(self) -> str:
        return f"{self.archive}!{self.member}"

    @property
    def name(self) -> str:
        return PurePosixPath(self.member).name

    @property
    def run_name(self) -> str:
        return member_run_name(self.archive, self.member, self.below)

    def run_name_with(self, job: str | None) -> str:
        """Its run name with `job` (one its contents state) in place of its name's (member_run_name)."""
        return member_run_name(self.archive, self.member, self.below, job)

    def size(self) -> int:
        return self.length


@dataclass
class MemberInput(_Member):
    """A member of a .zip or uncompressed .tar, read in place (random access)."""

    archive: str  # absolute path of the archive
    kind: str  # zip | tar
    member: str  # name inside the archive
    stored: int  # bytes as stored in the archive (compressed size for zip)
    length: int  # bytes of the member itself
    offset: int = 0  # tar: offset of the member's data
    below: str | None = None  # the archive's directory below the directory given (member_run_name)

    def open(self):
        check_member_size(self.member, self.length, self.stored)
        if self.kind == "zip":
            z = zipfile.ZipFile(self.archive)
            try:
                return Closing(z.open(self.member), z)
            except Exception:
                z.close()
                raise
        f = open_regular(self.archive)
        f.seek(self.offset)
        return Closing(Window(f, self.length), f)


@dataclass
class StreamMember(_Member):
    """A member of a compressed tar being read front to back (only inside that one pass)."""

    archive: str
    member: str
    length: int
    fileobj: object = None
    below: str | None = None

    def open(self):
        return self.fileobj


_NAME_JOB = object()  # member_run_name's default job: the one the member's file name states


def member_run_name(archive: str, member: str, below: str | None = None, job=_NAME_JOB) -> str:
    """The run name of an archive member (docs/usage.md "Runs", rule 1), as if the archive were
    unpacked where it lies: a member in a directory inside the archive is named by that
    directory's path ('job1/traces'); a member at the archive's top by the archive's name without
    its suffix ('rank0' for rank0.tar.gz: an archive stands for the directory of its top members,
    as before tracelake named runs by jobs), unless it states a job: then by the archive's own
    directory, as a file beside the archive would be, so that per-rank archives of one job
    (ar4/rank0.tar.gz, ar4/rank1.tar.gz holding job-4711_rank<N>.json) are one run (ar4/job-4711).
    below: the path of the archive's directory below a directory given that was searched (as
    FileInput.run), put in front ('job7/traces' for job7/traces.tar.gz's top members without a
    job; 'job7/job-9' for one stating job-9), so archives with the same name in different jobs'
    directories stay apart as the same files unpacked would; else (the archive given by name, or
    lying directly in the directory given) the archive's directory's own name stands for it when
    a top member states a job. job: the job the member states (jobid.py), by default its file
    name's; None for none. Then jobid.with_job puts the job after the name."""
    if job is _NAME_JOB:
        job = job_of_name(PurePosixPath(member).name)
    parent = PurePosixPath(member).parent
    top = below if below not in (None, "", ".") else None
    if str(parent) not in ("", "."):
        name = str(parent)
    elif job is not None:  # where the archive lies, as its members unpacked there would be named
        return with_job(top if top is not None else dir_name(archive), job)
    else:
        name = archive_stem(Path(archive).name)
    name = f"{top}/{name}" if top is not None else name
    return with_job(name, job)


def sha256_of(inp) -> str:
    """SHA-256 of an input's bytes as stored (a member: its bytes in the archive, decompressed
    from the zip's own compression but not gunzipped)."""
    h = hashlib.sha256()
    with inp.open() as f:
        while block := f.read(READ_BLOCK):
            h.update(block)
    return h.hexdigest()


def check_member_size(member: str, length: int, stored: int) -> None:
    limit = max_uncompressed_bytes()
    if length > limit:
        raise TraceError(
            f"archive member expands to {length} bytes, beyond {limit} (TRACELAKE_MAX_UNCOMPRESSED_BYTES); "
            "refusing a possible zip bomb"
        )
    if length > RATIO_FLOOR and length > max_ratio() * max(stored, 1):
        raise TraceError(
            f"archive member expands more than {max_ratio():g}:1 (TRACELAKE_MAX_COMPRESSION_RATIO); "
            "refusing a possible zip bomb"
        )


# ------------------------------------------------------------------ archives


def unsafe_name(name: str) -> str | None:
    """Why a member name is refused, or None."""
    n = name.replace("\\", "/")
    if n.startswith("/") or (len(n) > 1 and n[1] == ":"):
        return "absolute member path"
    if ".." in PurePosixPath(n).parts:
        return "member path with '..'"
    return None


def is_tar_header(block: bytes) -> bool:
    if block[257:262] != b"ustar":
        return False
    try:
        tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
        return True
    except tarfile.HeaderError:
        return False


@dataclass
class Refused:
    """A member that is not read, with the reason (a failed sources row)."""

    archive: str
    member: str
    error: str
    below: str | None = None

    @property
    def display(self) -> str:
        return f"{self.archive}!{self.member}"

    @property
    def run_name(self) -> str:
        return member_run_name(self.archive, self.member, self.below)


def wanted(name: str) -> bool:
    return name.lower().endswith(TRACE_SUFFIXES + LOG_SUFFIXES + ARCHIVE_SUFFIXES)


NOT_UTF8 = "its name is not UTF-8 text (a name in another encoding); refused"


def escaped_name(name: str) -> str | None:
    """name with the bytes that are not UTF-8 (decoded as surrogates) written as \\xNN, or None
    when name is UTF-8 text: the lake stores member names and run names as UTF-8."""
    try:
        name.encode("utf-8")
        return None
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _tar_refusal(m) -> str | None:
    """Why a wanted tar member is refused before its kind is looked at (its name made printable
    where it is not UTF-8), else classify_member's answer."""
    shown = escaped_name(m.name)
    if shown is not None:
        m.name = shown
        return NOT_UTF8
    return classify_member(m.name)


def classify_member(name: str) -> str | None:
    """Why a regular member with a wanted suffix is refused without reading it, else None."""
    why = unsafe_name(name)
    if why:
        return f"{why}; refused"
    if name.lower().endswith(ARCHIVE_SUFFIXES):
        return "an archive inside an archive is not read; extract it first"
    return None


def _overlapping(infos: list) -> dict:
    """The zip entries whose bytes overlap an earlier entry's (member -> the earlier one's name):
    each entry's span runs from its local header to the end of its compressed data (30 header
    bytes + its name + compress_size; the local extra field is left out, so the span is never
    too long). A well-formed zip's entries are disjoint; a bomb points many entries at one
    deflated stream (APPNOTE 4.3.6: each file has its own local header and data)."""
    spans = []
    for k, i in enumerate(infos):
        if not i.is_dir():
            name = len(i.orig_filename.encode("utf-8", "surrogateescape"))
            spans.append((i.header_offset, i.header_offset + 30 + name + i.compress_size, k))
    spans.sort()
    out: dict = {}
    end, owner = -1, None
    for start, stop, k in spans:
        if owner is not None and start < end:
            out[infos[k]] = infos[owner].filename
        if stop > end:
            end, owner = stop, k
    return out


def list_members(path: Path, kind: str) -> list:
    """The members of a zip or uncompressed tar to ingest, in archive order: MemberInput for those
    to read, Refused for those refused. Raises TraceError when the archive cannot be read."""
    archive = str(Path(path).absolute())
    out: list = []
    if kind == "zip":
        try:
            with zipfile.ZipFile(path) as z:
                infos = z.infolist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise TraceError(f"corrupt or truncated zip ({e})") from None
        if all(i.is_dir() for i in infos):
            raise TraceError(EMPTY_ARCHIVE)
        shared = _overlapping(infos)
        total = sum(i.file_size for i in infos if not i.is_dir() and wanted(i.filename) and i not in shared)
        size = Path(path).stat().st_size
        if total > RATIO_FLOOR and total > max_ratio() * max(size, 1):
            raise TraceError(
                f"zip declares {total} bytes uncompressed in all, more than {max_ratio():g}:1 its "
                f"{size} bytes (TRACELAKE_MAX_COMPRESSION_RATIO); refusing a possible zip bomb"
            )
        # a zip may hold several entries of one name; zipfile opens a name as its last entry, so
        # each would be read as that one (and all but one skipped as the same content): refused,
        # once for the name (they would share one `sources` row: archive!member)
        names: dict[str, int] = {}
        for i in infos:
            names[i.filename] = names.get(i.filename, 0) + 1
        listed: set[str] = set()
        for i in infos:
            if i.is_dir() or not wanted(i.filename) or i.filename in listed:
                continue
            listed.add(i.filename)
            mode = (i.external_attr >> 16) & 0o170000
            why = classify_member(i.filename)
            if why is None and names[i.filename] > 1:
                why = (
                    f"the zip holds {names[i.filename]} members of this name: which one is meant is "
                    "unclear; refused"
                )
            if why is None and mode and stat.S_ISLNK(mode):
                why = "a link member; refused"
            if why is None and i in shared:
                why = (
                    f"its bytes overlap member {shared[i]} (zip entries that share data inflate it again "
                    "for each entry); refused as a possible zip bomb"
                )
            out.append(
                Refused(archive, i.filename, why)
                if why
                else MemberInput(archive, "zip", i.filename, i.compress_size, i.file_size)
            )
        return out
    files = 0
    try:
        with tarfile.open(path, mode="r:") as t:
            for m in t:
                files += not m.isdir()
                if m.isdir() or not wanted(m.name):
                    continue
                why = _tar_refusal(m)
                if why is None and not m.isreg():
                    why = "a link or special member; refused"
                if why is None and m.sparse is not None:
                    why = "a sparse member; refused"
                out.append(
                    Refused(archive, m.name, why)
                    if why
                    else MemberInput(archive, "tar", m.name, m.size, m.size, m.offset_data)
                )
    except (tarfile.TarError, OSError, EOFError) as e:
        raise TraceError(f"corrupt or truncated tar ({e})") from None
    if not files:
        raise TraceError(EMPTY_ARCHIVE)
    return out


def stream_members(path: Path):
    """(member TarInfo, file object or None, refusal or None) for each wanted member of a
    compressed tar, front to back; the file object is valid until the next item. The gzip stream
    is bounded like any other. Raises TraceError for a corrupt or oversized archive."""
    f = open_regular(path)
    try:
        inflate = Inflate(f)
        try:
            t = tarfile.open(fileobj=inflate, mode="r|")
        except tarfile.TarError as e:
            raise TraceError(f"corrupt or truncated tar.gz ({e})") from None
        files = 0
        with t:
            while True:
                try:
                    m = t.next()
                except tarfile.TarError as e:
                    raise TraceError(f"corrupt or truncated tar.gz ({e})") from None
                if m is None:
                    break
                files += not m.isdir()
                if m.isdir() or not wanted(m.name):
                    continue
                why = _tar_refusal(m)
                if why is None and not m.isreg():
                    why = "a link or special member; refused"
                if why is None:
                    try:
                        check_member_size(m.name, m.size, m.size)
                    except TraceError as e:
                        why = str(e)
                yield m, (None if why else t.extractfile(m)), why
            if inflate.truncated:
                raise TraceError("corrupt or truncated gzip (the tar.gz ends before its end marker)")
            if not files:
                raise TraceError(EMPTY_ARCHIVE)
    finally:
        f.close()
