"""Finding the inputs: which files a batch holds, which `--exclude` leaves out, what format each
is (sniffed here, in one place, from its first bytes), and the units of work they make.

- discover(): the files named by the paths given; directories are searched recursively for the
  suffixes of pipeline/ingest/formats.py (text logs only when their head looks like NCCL-family
  output); an nsys parquetdir export (`*_pqtdir/`) is one input.
- sniff_path() / needs_file() / log_format(): the format of a file (Nsight Systems exports and
  archives by magic number and, for a zip, its member list), of an archive member from its first
  bytes, and of a text stream (pipeline/ingest/nccl sniff). Everything else is read as Kineto
  JSON, which says itself when it is not one.
- plan(): the units of work in input order: a file, an archive member (a zip or plain tar is
  listed here), or a whole compressed tar (read front to back by one worker). Input order is
  the files' absolute paths sorted (a zip's or tar's members by name), whatever the order the
  paths were given in, so a batch names its runs the same however it was listed (runs.py rule 2).
"""

from __future__ import annotations

import fnmatch
import os
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable

from .. import objstore
from . import archive as arc
from . import nccl, streams
from .errors import TraceError
from .formats import (
    GZIP_MAGIC,
    LOG_SUFFIXES,
    NSYS_JAX_MEMBER_SUFFIXES,
    NSYS_SUFFIXES,
    REPORT_MAGIC,
    REPORT_SUFFIXES,
    SQLITE_MAGIC,
    TRACE_SUFFIXES,
    ZIP_MAGIC,
    archive_suffix,
)

SNIFF_BYTES = 65536  # how much of a text file sniffing reads
# why a file with a log suffix found in a directory, or an archive member, is passed over
NOT_A_LOG = "not NCCL-family logs (no NCCL_DEBUG, nccl-tests or PyTorch NCCL lines in the first 64 KiB)"


@dataclass
class Problem:
    """A path that could not even be opened as a file (missing, unreadable directory, FIFO), or
    an archive whose member list cannot be read. run: the run name a healthy file in its place
    gets (archive.FileInput.run: its directory's path below the directory given that was
    searched), else None (the name of its directory)."""

    path: Path
    error: str
    run: str | None = None


@dataclass
class Unit:
    """One unit of work for a worker (pipeline/ingest/prepare.py work())."""

    kind: str  # input (a FileInput/MemberInput/ObjectInput), targz (a whole compressed tar), refused,
    # problem, object_archive (an archive in a bucket: ingest/object_archive.py)
    item: object
    size: int = 0
    below: str | None = None  # targz: the archive's directory below the directory given (member_run_name)


# ------------------------------------------------------------------ excluding


def exclude_patterns(exclude: Iterable[str] | None) -> list[str]:
    """--exclude patterns as matched: in Unicode NFC (as excluded() compares paths, so `über`
    typed decomposed matches a directory written composed, and the other way round), a leading
    './' and trailing '/' dropped. Raises ValueError for a pattern that is empty or only slashes."""
    out = []
    for pat in exclude or ():
        pat = unicodedata.normalize("NFC", pat)
        p = pat[2:] if pat.startswith("./") else pat
        p = p.rstrip("/")
        if not p:
            raise ValueError(f"--exclude {pat!r}: empty pattern")
        out.append(p)
    return out


def excluded(relpath: str, patterns: list[str] | None) -> bool:
    """True when a file, directory or archive member is left out by --exclude: the name or the
    path (relative to the directory searched, or inside the archive; '/'-separated) of it or of
    one of its directories matches one of the glob patterns (fnmatch: `*` also matches `/`), so
    `checkpoints` leaves out every checkpoints directory at any depth. Names are compared in
    Unicode NFC (patterns as exclude_patterns() gives them; run names are too: runid.py)."""
    if not patterns:
        return False
    parts = PurePosixPath(unicodedata.normalize("NFC", relpath)).parts
    for i, name in enumerate(parts):
        prefix = "/".join(parts[: i + 1])
        if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(prefix, p) for p in patterns):
            return True
    return False


# ------------------------------------------------------------------ sniffing


def is_parquetdir(path: Path) -> bool:
    """An Nsight Systems parquetdir export (`nsys export --type parquetdir`): a directory named
    `*_pqtdir` or holding its kernel or string table."""
    return path.is_dir() and (
        path.name.endswith("_pqtdir")
        or (path / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").is_file()
        or (path / "StringIds.parquet").is_file()
    )


def sniff_path(path: Path) -> str | None:
    """The format of a path that must be read as a file, not a stream: nsys_parquetdir,
    nsys_sqlite, nsys_rep, nsys_jax (pipeline/ingest/nsys), or an archive: zip, tar, tar.gz
    (pipeline/ingest/archive.py). None for everything else (a Kineto trace or an NCCL-family
    log, told apart by log_format()), for special files and for paths that cannot be read.

    A zip is an archive of traces when it holds a member with a trace or log suffix and none that
    marks an nsys-jax archive; any other zip (also one that cannot be listed) goes to the nsys-jax
    reader, which names what is wrong with it. A gzip stream is a tar.gz when it inflates to a tar
    header, else a compressed trace or log."""
    if path.is_dir():
        return "nsys_parquetdir" if is_parquetdir(path) else None
    try:
        with streams.open_regular(path) as f:
            head = f.read(512)
    except (OSError, TraceError):  # unreadable, or not a regular file (a FIFO: never blocks)
        return None
    if head.startswith(SQLITE_MAGIC):
        return "nsys_sqlite"
    if head[:4] in ZIP_MAGIC:
        try:
            with zipfile.ZipFile(path) as z:
                names = [i.filename.lower() for i in z.infolist() if not i.is_dir()]
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            return "nsys_jax"
        if not names:  # an empty zip: no nsys-jax archive either (list_members says so)
            return "zip"
        if any(n.endswith(NSYS_JAX_MEMBER_SUFFIXES) for n in names):
            return "nsys_jax"
        return "zip" if any(n.endswith(TRACE_SUFFIXES + LOG_SUFFIXES) for n in names) else "nsys_jax"
    if head[:2] == GZIP_MAGIC:
        try:
            with streams.open_regular(path) as f:
                block = streams.Inflate(f, limit=1 << 20).read(512)
        except (TraceError, OSError):
            return None
        if len(block) == 512 and (arc.is_tar_header(block) or _empty_tar(block, path, (".tar.gz", ".tgz"))):
            return "tar.gz"
        return None
    if len(head) == 512 and (arc.is_tar_header(head) or _empty_tar(head, path, (".tar",))):
        return "tar"
    if head.startswith(REPORT_MAGIC) or path.suffix.lower() in REPORT_SUFFIXES:
        return "nsys_rep"
    return None


def _empty_tar(block: bytes, path: Path, suffixes: tuple) -> bool:
    """Whether a file named like a tar starts with a zero block: a tar's end-of-archive marker
    (POSIX ustar: two zero blocks), so an empty tar (tarfile.open(..., "w").close(): 10240 zero
    bytes) is listed as one and said to hold no files, not read as a trace."""
    return path.name.lower().endswith(suffixes) and not any(block)


def needs_file(head: bytes, name: str) -> bool:
    """Whether an archive member (its first bytes and name) is in a format that must be copied to
    a real file first (Nsight Systems exports and reports, nsys-jax zips)."""
    return head.startswith(SQLITE_MAGIC) or head[:4] in ZIP_MAGIC or name.lower().endswith(NSYS_SUFFIXES)


def log_format(head: bytes, name: str) -> str | None:
    """The NCCL-family format of a text stream from its first bytes (pipeline/ingest/nccl sniff),
    else None (then it is read as Kineto JSON)."""
    return nccl.sniff(head, name)


def _looks_like_log(f: Path) -> bool:
    try:
        with streams.open_regular(f) as fh:
            head = fh.read(SNIFF_BYTES)
    except (OSError, TraceError):
        return True  # let ingest report why it cannot be read
    return log_format(head, f.name) is not None


def _member_looks_like_log(m) -> bool:
    try:
        with m.open() as raw:
            head = streams.Peek(streams.Inflate(raw).read).head
    except Exception:
        return True  # let ingest say why it cannot be read
    return log_format(head, m.name) is not None


# ------------------------------------------------------------------ finding


def discover(
    paths: Iterable[str | Path],
    problems: list | None = None,
    exclude: Iterable[str] | None = None,
    left_out: list | None = None,
    roots: dict | None = None,
    not_logs: list | None = None,
) -> list[Path]:
    """Files named by `paths`, minus those `exclude` leaves out (see excluded(): files and
    directories found below a directory given, and files given by their name; a directory given
    is always searched), appended to `left_out` when given: files as given, directories searched
    recursively for the TRACE_SUFFIXES of pipeline/ingest/formats.py, and LOG_SUFFIXES files
    that look like NCCL-family output (symbolic links to directories are followed, each directory
    searched once however many links lead to it: walk); an nsys
    parquetdir export (`*_pqtdir/`) is one input, given or found. Archives are listed as files
    (plan() opens them). Paths that do not exist, are not regular files or directories, or
    cannot be listed go to `problems` (a list of Problem) when given; otherwise the first raises
    FileNotFoundError. roots, when given, maps each file found by searching a directory given (by
    its resolved path) to (that directory, resolved; the path of the file's directory below it:
    its run name, archive.FileInput); of two directories given that both hold it, the outer one,
    whatever their order. not_logs, when given, gets the files found by searching a directory
    that have a log suffix but do not look like NCCL-family output (passed over: NOT_A_LOG)."""
    out: list[Path] = []

    def problem(p: Path, msg: str, rel: Path | None = None):
        if problems is None:
            raise FileNotFoundError(f"{p}: {msg}")
        problems.append(Problem(p, msg, _below(rel)))

    exclude = exclude_patterns(exclude)

    def root_of(f: Path, top: Path, rel: Path) -> None:
        if roots is not None:
            key = f.resolve()
            old = roots.get(key)
            if old is None or old[0].is_relative_to(top):
                roots[key] = (top, rel.as_posix())

    def leave(f: Path, rel: str) -> bool:
        if excluded(rel, exclude):
            if left_out is not None:
                left_out.append(f)
            return True
        return False

    def not_utf8(f: Path, rel: Path | None = None) -> bool:
        """f's path holds bytes that are not UTF-8 (a name written in another encoding): one
        problem naming it, with those bytes escaped, and the file is left out (the lake stores
        paths and run names as UTF-8 text)."""
        shown = arc.escaped_name(str(f))
        if shown is None:
            return False
        problem(Path(shown), "its path is not UTF-8 text (a name in another encoding): rename it", rel)
        return True

    def walk(p: Path) -> None:
        """Search p; symbolic links to directories are followed, each directory searched once
        (by its real path: a link loop, or two links to one directory, end there). A directory
        inside the inputs (a directory given) is named by its own path: a link to it is not
        followed (inside_inputs), so adding a link never renames it or splits its run; a link to
        a directory outside them is followed, named by the link's path (the first in sorted
        order of those leading there), as a file through a link is (runs.dir_name)."""
        top = p.resolve()
        onerror = lambda e: problem(Path(e.filename), f"cannot list directory: {e.strerror}")  # noqa: E731
        searched: set[str] = set()
        for root, dirs, files in os.walk(p, onerror=onerror, followlinks=True):
            real = os.path.realpath(root)
            if real in searched:  # reached again through a link: a loop, or a second way in
                dirs[:] = []
                continue
            searched.add(real)
            rel = Path(root).relative_to(p)
            dirs[:] = sorted(
                d
                for d in dirs
                if not leave(Path(root) / d, (rel / d).as_posix()) and not inside_inputs(Path(root) / d)
            )
            for d in [d for d in dirs if d.endswith("_pqtdir")]:
                dirs.remove(d)
                if not not_utf8(Path(root) / d, rel):
                    out.append(Path(root) / d)
                    root_of(out[-1], top, rel)
            for name in sorted(files):
                f = Path(root) / name
                if leave(f, (rel / name).as_posix()):
                    continue
                low = name.lower()
                if not low.endswith(TRACE_SUFFIXES + LOG_SUFFIXES):
                    continue  # not an input: never resolved (a link into /proc or a link loop)
                if not_utf8(f, rel):
                    continue
                try:
                    f.resolve()
                except (RuntimeError, OSError) as e:  # a symbolic link loop, a link we may not follow
                    problem(
                        f, "symbolic link loop" if isinstance(e, RuntimeError) else f"cannot follow: {e}", rel
                    )
                    continue
                root_of(f, top, rel)
                if low.endswith(TRACE_SUFFIXES) and f.is_file():
                    out.append(f)
                elif low.endswith(TRACE_SUFFIXES) and f.is_symlink() and not f.exists():
                    problem(f, "broken symbolic link", rel)
                elif low.endswith(LOG_SUFFIXES) and f.is_file():
                    if _looks_like_log(f):
                        out.append(f)
                    elif not_logs is not None:
                        not_logs.append(f)
                elif f.exists() and not f.is_dir():  # a FIFO, a device, a socket (or a link to one)
                    problem(f, _special(f), rel)

    paths = [Path(p) for p in paths]
    tops = [p.resolve() for p in paths if p.is_dir()]

    def inside_inputs(d: Path) -> bool:
        """d is a symbolic link to a directory inside a directory given (searched by its own path
        there: walk)."""
        if not d.is_symlink():
            return False
        try:
            real = d.resolve()
        except (RuntimeError, OSError):
            return False  # a loop: os.walk lists it and the searched set ends it
        return any(real.is_relative_to(t) for t in tops)

    for p in paths:
        if not p.is_dir() and leave(p, p.name):
            continue
        if not p.is_dir() and not_utf8(p):
            continue
        if is_parquetdir(p):
            out.append(p)
        elif p.is_dir():
            walk(p)
        elif p.is_file():
            out.append(p)
        elif p.exists() or p.is_symlink():
            problem(p, "not a regular file or directory" if p.exists() else "broken symbolic link")
        else:
            problem(p, "no such file or directory")
    seen, uniq = set(), []
    for f in out:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            uniq.append(f)
    return uniq


def _special(f: Path) -> str:
    """The one-line problem of a file found in a directory that is no regular file (never opened:
    reading a FIFO or a terminal would wait for a writer)."""
    import stat

    try:
        mode = f.stat().st_mode
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    what = (
        "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a character device"
        if stat.S_ISCHR(mode)
        else "a block device"
        if stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "no regular file"
    )
    via = f"a symbolic link to {what}" if f.is_symlink() else what
    return f"not a regular file ({via})"


def _below(rel) -> str | None:
    """The run name a file's directory `rel` below the directory searched gives (FileInput.run),
    None for the directory itself or a file given by name (its directory's name)."""
    rel = None if rel is None else Path(rel).as_posix()
    return rel if rel not in (None, "", ".") else None


# ------------------------------------------------------------------ planning


def _size(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size
    except OSError:
        return 0


def _not_an_archive(path: Path) -> str | None:
    """The one-line error of a file named like an archive (`.zip`, `.tar`, `.tar.gz`, `.tgz`) whose
    first bytes sniff_path() found no archive in (a truncated download, another file renamed):
    a corrupt archive, which reading it as a trace would call "not a trace". None for other
    names, and for a `.tar.gz` that is gzip data (read as a gzipped trace or log, as before)."""
    suffix = archive_suffix(path.name)
    if suffix is None:
        return None
    kind = suffix[1:]
    try:
        with streams.open_regular(path) as f:
            head = f.read(512)
    except (OSError, TraceError):
        return None  # unreadable: prepare says why
    if kind in ("tar.gz", "tgz") and head[:2] == GZIP_MAGIC:
        return None
    what = {"zip": "zip", "tar.gz": "tar.gz", "tgz": "tar.gz", "tar": "tar"}[kind]
    start = {"zip": "a zip signature (PK)", "tar": "a tar header"}.get(what, "gzip's magic number (1f 8b)")
    if not head:
        return f"corrupt {what} archive: the file is empty"
    return f"corrupt {what} archive: it does not start with {start} (truncated, or another file renamed)"


def plan(
    paths: Iterable[str | Path], exclude: list[str] | None = None, not_logs: list | None = None
) -> tuple[list[Unit], list[Problem]]:
    """The units of work for `paths` in input order (module doc: sorted by path; archives opened
    into their members, sorted by name; object URLs first, in their listing's order), minus
    the files and members `exclude` (patterns as exclude_patterns() returns them) leaves out.
    not_logs, when given, gets the paths of the files (found in a directory) and zip or tar
    members (`archive!member`) with a log suffix that are passed over as NOT_A_LOG."""
    problems: list[Problem] = []
    roots: dict = {}
    paths = list(paths)
    urls = [p for p in paths if objstore.is_url(p)]  # s3://bucket/prefix/: pipeline/ingest/objects.py
    files = discover([p for p in paths if p not in urls], problems, exclude, roots=roots, not_logs=not_logs)
    # one order whatever the order the paths were given in: which of two windows of one name
    # holds it (pipeline/ingest/runs.py rule 2) must not depend on how the shell listed them
    files.sort(key=lambda f: os.path.abspath(f))
    units: list[Unit] = [Unit("problem", p) for p in problems]
    if urls:
        from .objects import plan_urls

        units += [Unit(kind, item, size) for kind, item, size in plan_urls(urls, excluded, exclude, not_logs)]
    for f in files:
        found = roots.get(f.resolve())
        below = found[1] if found else None
        try:
            kind = sniff_path(f)
        except Exception as e:  # one file never stops the batch, whatever its bytes
            why = f"cannot tell its format ({type(e).__name__}: {e})"[:300]
            units.append(Unit("problem", Problem(f, why, _below(below))))
            continue
        why = _not_an_archive(f) if kind is None else None
        if why is not None:  # named like an archive, not one: never read as a trace
            units.append(Unit("problem", Problem(f, why, _below(below))))
            continue
        if kind in ("zip", "tar"):
            try:
                members = arc.list_members(f, kind)
            except TraceError as e:
                units.append(Unit("problem", Problem(f, str(e), _below(below))))
                continue
            except Exception as e:  # a corrupt archive the zip/tar readers do not expect
                why = f"corrupt archive: its member list cannot be read ({type(e).__name__}: {e})"
                units.append(Unit("problem", Problem(f, why[:300], _below(below))))
                continue
            for m in sorted(members, key=lambda m: m.member):  # by name, as files are
                if excluded(m.member, exclude):
                    continue
                m.below = below
                if isinstance(m, arc.Refused):
                    units.append(Unit("refused", m))
                elif m.name.lower().endswith(LOG_SUFFIXES) and not _member_looks_like_log(m):
                    if not_logs is not None:
                        not_logs.append(m.display)
                    continue
                else:
                    units.append(Unit("input", m, m.length))
        elif kind == "tar.gz":
            units.append(Unit("targz", str(f), _size(f), below))
        else:
            units.append(Unit("input", arc.FileInput(str(f), _below(below), fmt=kind or "stream"), _size(f)))
    return units, problems
