"""Inputs read as streams: plain files, gzip (inflated as a stream, bounded) and the members of
.tar, .tar.gz / .tgz and .zip archives, read in place (nothing is extracted, except a member in a
format that needs a real file — an Nsight Systems SQLite export — which is copied to the lake's
scratch space first).

- A member's path in the lake is `<archive>!<member>`; the Kineto rank-from-file-name rule applies
  to the member's own name, and its default run is the member's parent directory inside the
  archive, else the archive's name without its suffix.
- Members whose names are absolute or contain `..`, links and device members are refused (a
  failed `sources` row each); archives inside archives are not opened (a failed row says so).
- Decompression is bounded: a gzip stream (a file, a member, or the tar.gz itself) that expands
  beyond TRACELAKE_MAX_UNCOMPRESSED_BYTES (default 16 GiB), or by more than
  TRACELAKE_MAX_COMPRESSION_RATIO (default 200:1) once past 64 MiB, fails cleanly as a possible
  gzip bomb; a zip or tar member that declares more than the limit is refused before it is read.
  Memory stays bounded either way: everything is read in pieces.
- .tar and .zip members are read by random access (each one can go to its own worker); a
  compressed tar can only be read front to back, so all its members are one unit of work.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import TraceError
from .formats import ARCHIVE_SUFFIXES, GZIP_MAGIC, LOG_SUFFIXES, TRACE_SUFFIXES

try:  # isal's inflate is ~2x faster than zlib's and gives the same bytes
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover
    import zlib as _zlib

RATIO_FLOOR = 64 << 20
READ_BLOCK = 1 << 20


def max_uncompressed_bytes() -> int:
    return int(os.environ.get("TRACELAKE_MAX_UNCOMPRESSED_BYTES", 16 * 2**30))


def max_ratio() -> float:
    return float(os.environ.get("TRACELAKE_MAX_COMPRESSION_RATIO", 200))


class Inflate(io.RawIOBase):
    """The bytes of `raw` (a binary file object), gunzipped as a stream when they start with the
    gzip magic (concatenated members too). read(n) never returns more than n bytes, so memory is
    bounded by n whatever the compression ratio. Raises TraceError for corrupt gzip and for output
    beyond the limits; a stream that simply ends early sets .truncated and ends the output there.
    .in_bytes / .out_bytes count what was read and produced."""

    def __init__(self, raw, limit: int | None = None, ratio: float | None = None):
        self.raw = raw
        self.limit = max_uncompressed_bytes() if limit is None else limit
        self.ratio = max_ratio() if ratio is None else ratio
        first = raw.read(2)
        self.in_bytes = len(first)
        self.out_bytes = 0
        self.gzip = first == GZIP_MAGIC
        self.truncated = False
        self._pending = first  # input not yet given to the decompressor (or plain output)
        self._d = _zlib.decompressobj(wbits=31) if self.gzip else None
        self._started = False  # the current gzip member produced or consumed anything
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            chunks = []
            while c := self.read(READ_BLOCK):
                chunks.append(c)
            return b"".join(chunks)
        if self._eof or n == 0:
            return b""
        if not self.gzip:
            if self._pending:
                out, self._pending = self._pending[:n], self._pending[n:]
                if len(out) < n:
                    out += self.raw.read(n - len(out))
            else:
                out = self.raw.read(n)
            self.in_bytes += len(out)
            self.out_bytes += len(out)
            if not out:
                self._eof = True
            return out
        while True:
            if self._d.unconsumed_tail:
                data = self._d.unconsumed_tail
            elif self._pending:
                data, self._pending = self._pending, b""
            else:
                data = self.raw.read(READ_BLOCK)
                self.in_bytes += len(data)
                if not data:
                    if self._started and not self._d.eof:
                        self.truncated = True  # the job was killed while the file was written
                    self._eof = True
                    return b""
            try:
                out = self._d.decompress(data, n)
            except Exception as e:  # zlib/isal raise their own error types
                raise TraceError(
                    f"corrupt or truncated gzip ({str(e).strip() or type(e).__name__})"
                ) from None
            self._started = True
            if self._d.eof:  # end of a member: another may follow
                rest = self._d.unused_data
                self._d = _zlib.decompressobj(wbits=31)
                self._started = False
                if rest.strip(b"\x00"):
                    self._pending = rest
            self.out_bytes += len(out)
            if self.out_bytes > self.limit:
                raise TraceError(
                    f"gzip expands beyond {self.limit} bytes (TRACELAKE_MAX_UNCOMPRESSED_BYTES); "
                    "refusing a possible gzip bomb"
                )
            if self.out_bytes > RATIO_FLOOR and self.out_bytes > self.ratio * max(self.in_bytes, 1):
                raise TraceError(
                    f"gzip expands more than {self.ratio:g}:1 (TRACELAKE_MAX_COMPRESSION_RATIO); "
                    "refusing a possible gzip bomb"
                )
            if out:
                return out
            if self._eof:
                return b""


class Peek:
    """A reader whose first `n` bytes are also available as .head."""

    def __init__(self, read, n: int = 65536):
        chunks, got = [], 0
        while got < n:
            c = read(n - got)
            if not c:
                break
            chunks.append(c)
            got += len(c)
        self.head = b"".join(chunks)
        self._head = self.head
        self._read = read

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n is None or n < 0:
                out, self._head = self._head, b""
                return out + self._read(-1)
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._read(n)


# ------------------------------------------------------------------ inputs


def open_regular(path) -> io.BufferedReader:
    """The file at `path` opened for reading, binary. Raises TraceError("not a regular file") for a
    FIFO, device or socket without blocking: it is opened with O_NONBLOCK (a plain open() of a FIFO
    waits for a writer for ever, here while holding the lake's lock), then checked with fstat, so
    a path swapped for a FIFO after any earlier check is refused too. OSError when it cannot be
    opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError("not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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
        return self.run if self.run is not None else Path(self.path).resolve().parent.name

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
                return _Closing(z.open(self.member), z)
            except Exception:
                z.close()
                raise
        f = open_regular(self.archive)
        f.seek(self.offset)
        return _Closing(_Window(f, self.length), f)


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


def member_run_name(archive: str, member: str, below: str | None = None) -> str:
    """The run name of an archive member: its directory's path inside the archive
    ('job1/traces'), else the archive's name without its suffix; below: the path of the
    archive's directory below a directory given that was searched (as FileInput.run), put in front
    ('job7/traces' for job7/traces.tar.gz's top members), so archives with the same name in
    different jobs' directories stay apart as the same files unpacked would."""
    parent = PurePosixPath(member).parent
    if str(parent) not in ("", "."):
        name = str(parent)
    else:
        name = Path(archive).name
        for s in (".tar.gz", ".tgz", ".tar", ".zip"):
            if name.lower().endswith(s):
                name = name[: -len(s)] or name
                break
    return f"{below}/{name}" if below not in (None, "", ".") else name


class _Window(io.RawIOBase):
    def __init__(self, f, length: int):
        self.f, self.left = f, length

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.left:
            n = self.left
        out = self.f.read(n)
        self.left -= len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class _Closing:
    def __init__(self, f, *others):
        self.f, self.others = f, others

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n)

    def close(self):
        self.f.close()
        for o in self.others:
            o.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
        shared = _overlapping(infos)
        total = sum(i.file_size for i in infos if not i.is_dir() and wanted(i.filename) and i not in shared)
        size = Path(path).stat().st_size
        if total > RATIO_FLOOR and total > max_ratio() * max(size, 1):
            raise TraceError(
                f"zip declares {total} bytes uncompressed in all, more than {max_ratio():g}:1 its "
                f"{size} bytes (TRACELAKE_MAX_COMPRESSION_RATIO); refusing a possible zip bomb"
            )
        for i in infos:
            if i.is_dir() or not wanted(i.filename):
                continue
            mode = (i.external_attr >> 16) & 0o170000
            why = classify_member(i.filename) or (
                "a link member; refused" if mode and stat.S_ISLNK(mode) else None
            )
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
    try:
        with tarfile.open(path, mode="r:") as t:
            for m in t:
                if m.isdir() or not wanted(m.name):
                    continue
                why = classify_member(m.name)
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
        with t:
            while True:
                try:
                    m = t.next()
                except tarfile.TarError as e:
                    raise TraceError(f"corrupt or truncated tar.gz ({e})") from None
                if m is None:
                    break
                if m.isdir() or not wanted(m.name):
                    continue
                why = classify_member(m.name)
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
    finally:
        f.close()
