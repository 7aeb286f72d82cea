"""Scratch directories (DuckDB's spill, the per-source step's copies, an S3 lake's local cache and
staging, an archive object fetched, an older lake's derived copies) named so that the next
tracelake process can remove those of a process that was killed.

A process removes its own scratch directories when it is done, but a `kill -9`, the kernel's
out-of-memory killer or a power cut leave them behind, and DuckDB's spill of a large analysis can
be gigabytes. So each is named tracelake-<kind>-<ns>-<pid>-<random>: ns the inode of the creating
process's PID namespace (`/proc/self/ns/pid`, Linux), pid its process id. Before the first
scratch directory a process makes under a base directory, sweep(base) removes every directory
there named so with the same PID namespace whose pid no longer runs (os.kill(pid, 0) raises
ProcessLookupError) and that nothing has changed for STALE_S (a worker's staged source handed to
the ingesting process outlives its worker for a moment; a pid reused by another process keeps the
directory until that one ends too). Directories of another PID namespace (another container
sharing the temporary directory: its pids mean nothing here) and other names are never touched.
Elsewhere than Linux the namespace reads "0" and nothing is swept.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

# a dead process's scratch directory is removed once nothing changed in it for this long
STALE_S = 600.0
_NAME = re.compile(r"^tracelake-[a-z0-9]+-(\d+)-(\d+)-[0-9a-f]+$")
_SWEPT: set[str] = set()


@lru_cache(maxsize=1)
def _namespace() -> str:
    """The inode of this process's PID namespace as text ('0' where it cannot be read)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # 'pid:[4026531836]'
    except OSError:
        return "0"
    m = re.search(r"\[(\d+)\]", link)
    return m.group(1) if m else "0"


def name(kind: str) -> str:
    """A fresh name tracelake-<kind>-<ns>-<pid>-<random> (kind: lowercase letters and digits)."""
    return f"tracelake-{kind}-{_namespace()}-{os.getpid()}-{uuid.uuid4().hex[:16]}"


def path(kind: str, base: str | Path | None = None) -> Path:
    """A fresh scratch path under base (None: the system's temporary directory), not created (for
    DuckDB's temp_directory, which DuckDB creates when it first spills); what killed processes
    left there is swept first (module doc)."""
    base = Path(base) if base is not None else Path(tempfile.gettempdir())
    sweep(base)
    return base / name(kind)


def make(kind: str, base: str | Path | None = None) -> Path:
    """path(kind, base), created (mode 0700, as tempfile.mkdtemp makes its directories). Raises
    OSError when it cannot be."""
    p = path(kind, base)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.mkdir(mode=0o700)
    return p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): it runs
        return True
    return True


def sweep(base: str | Path, force: bool = False) -> list[Path]:
    """Remove the scratch directories under base that processes of this PID namespace left when
    they ended (module doc); once per process and base unless force. Returns those removed; never
    raises (what cannot be listed or removed is left)."""
    key = str(base)
    if (key in _SWEPT and not force) or _namespace() == "0":
        return []
    _SWEPT.add(key)
    ns, now, gone = _namespace(), time.time(), []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    for e in entries:
        m = _NAME.match(e.name)
        if not m or m.group(1) != ns or int(m.group(2)) == os.getpid() or _alive(int(m.group(2))):
            continue
        try:
            if not e.is_dir(follow_symlinks=False) or now - e.stat(follow_symlinks=False).st_mtime < STALE_S:
                continue
        except OSError:
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        if not os.path.lexists(e.path):
            gone.append(Path(e.path))
    return gone


@contextmanager
def temporary(kind: str, base: str | Path | None = None):
    """make(kind, base) for the block, removed after it (tempfile.TemporaryDirectory's use, with a
    name sweep() recognises should the process be killed inside the block)."""
    d = make(kind, base)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
