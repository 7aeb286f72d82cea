"""Scratch directories (DuckDB's spill, the per-source step's copies, an S3 lake's local cache and
staging, an archive object fetched, an older lake's derived copies) named so that the next
tracelake process can remove those of a process that was killed.

A process removes its own scratch directories when it is done, but a `kill -9`, the kernel's
out-of-memory killer or a power cut leave them behind, and DuckDB's spill of a large analysis can
be gigabytes. So each is named tracelake-<kind>-<space>-<pid>-<random>: space a hash of the
machine's boot id and the creating process's PID namespace (`/proc/sys/kernel/random/boot_id`,
`/proc/self/ns/pid`, Linux: another machine sharing the directory, an NFS temporary directory, or
another container has another), pid the process that owns it (a pool worker's belong to the
ingest that started it, OWNER_PID: what a worker stages is handed to the ingesting process and
read there after the worker may have ended). Before the first scratch directory a process makes
under a base directory (and at each ingest), sweep(base) removes every directory there named so
with the same space whose pid no longer runs (os.kill(pid, 0) raises ProcessLookupError) and that
nothing has changed for STALE_S (a pid reused by another process keeps the directory until that
one ends too). Directories of another space and other names are never touched; elsewhere than
Linux the space reads "0" and nothing is swept.
"""

from __future__ import annotations

import hashlib
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
_NAME = re.compile(r"^tracelake-[a-z0-9]+-([0-9a-f]+)-(\d+)-[0-9a-f]+$")
_SWEPT: set[str] = set()


@lru_cache(maxsize=1)
def _namespace() -> str:
    """The space of this process's pids (module doc): 12 hex digits of the SHA-256 of the boot id
    and the PID namespace's link ('pid:[4026531836]'); '0' where either cannot be read."""
    try:
        link = os.readlink("/proc/self/ns/pid")
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return "0"
    return hashlib.sha256(f"{boot}|{link}".encode()).hexdigest()[:12]


# the process whose pid names this process's scratch directories: set in a pool worker to the
# ingesting process's (executors.init_worker); None: this process
OWNER_PID: int | None = None


def name(kind: str) -> str:
    """A fresh name tracelake-<kind>-<space>-<pid>-<random> (kind: lowercase letters and digits)."""
    return f"tracelake-{kind}-{_namespace()}-{OWNER_PID or os.getpid()}-{uuid.uuid4().hex[:16]}"


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
    """Whether pid runs; True for what is no pid here (0, past a C int: never removed)."""
    if not 0 < pid < 2**31:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # another user's process (EPERM): it runs
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
        if not m or m.group(1) != ns:
            continue
        pid = int(m.group(2))
        if pid in (os.getpid(), OWNER_PID) or _alive(pid):
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
