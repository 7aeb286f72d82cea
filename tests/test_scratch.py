"""Scratch directories a killed process leaves are removed by the next one (pipeline/scratch.py):
only those named tracelake-<kind>-<ns>-<pid>-<random> of this PID namespace whose process has
ended and that nothing changed for STALE_S; never a live process's, another namespace's, a fresh
one's or anything else under the temporary directory. A real `kill -9` of a process holding one
(DuckDB's spill directory of a connection) is cleaned up by the next process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import scratch

pytestmark = pytest.mark.skipif(not Path("/proc/self/ns/pid").exists(), reason="Linux: PID namespaces")


def _dead_pid() -> int:
    """The pid of a process that has ended (its parent reaped it)."""
    p = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(p.stdout)


def _aged(d: Path) -> Path:
    old = time.time() - scratch.STALE_S - 60
    os.utime(d, (old, old))
    return d


def test_sweep_removes_only_a_dead_process_s_old_directories(tmp_path):
    ns = scratch._namespace()
    dead, alive = _dead_pid(), os.getppid()
    made = {
        "dead": tmp_path / f"tracelake-spill-{ns}-{dead}-0123abcd",
        "dead_fresh": tmp_path / f"tracelake-local-{ns}-{dead}-4567ef01",
        "alive": tmp_path / f"tracelake-spill-{ns}-{alive}-89abcdef",
        "mine": tmp_path / f"tracelake-spill-{ns}-{os.getpid()}-0a0b0c0d",
        "other_space": tmp_path / f"tracelake-spill-{'0' if ns != '0' * 12 else '1'}{ns[1:]}-{dead}-1a2b3c4d",
        "no_pid_here": tmp_path / f"tracelake-spill-{ns}-{'9' * 40}-5a6b7c8d",
        "old_name": tmp_path / f"tracelake-spill-{dead}",
        "user": tmp_path / "my-traces",
    }
    for k, d in made.items():
        d.mkdir()
        (d / "x.tmp").write_bytes(b"spilled")
        if k != "dead_fresh":
            _aged(d)
    file_named_so = tmp_path / f"tracelake-spill-{ns}-{dead}-feedface"
    file_named_so.write_bytes(b"a file, not a directory")
    _aged(file_named_so)
    gone = scratch.sweep(tmp_path, force=True)
    assert gone == [made["dead"]]
    assert not made["dead"].exists()
    assert all(d.exists() for k, d in made.items() if k != "dead") and file_named_so.exists()
    # once per process and base: a second call without force looks at nothing
    _aged(made["dead_fresh"])
    assert scratch.sweep(tmp_path) == []
    assert scratch.sweep(tmp_path, force=True) == [made["dead_fresh"]]


def test_names_carry_the_namespace_and_pid_and_make_creates_a_private_directory(tmp_path):
    """The space is 12 hex digits of the SHA-256 of the boot id and the PID namespace (another
    machine or container: another space)."""
    import hashlib

    d = scratch.make("archive", tmp_path)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    space = hashlib.sha256(f"{boot}|{os.readlink('/proc/self/ns/pid')}".encode()).hexdigest()[:12]
    kind, got, pid, rand = d.name.split("-")[1:]
    assert (kind, got, int(pid)) == ("archive", space, os.getpid()) and len(rand) == 16
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    assert scratch.path("spill", tmp_path).parent == tmp_path and not scratch.path("spill", tmp_path).exists()
    with scratch.temporary("diff", tmp_path) as t:
        assert t.is_dir()
    assert not t.exists()


def test_a_killed_process_s_duckdb_spill_directory_is_removed_by_the_next(tmp_path):
    """A process connects to a lake (query.connect names DuckDB's temp_directory with
    scratch.path), makes DuckDB spill into it under a tiny memory cap, and is killed with SIGKILL:
    the directory and its spill files stay. Once it is STALE_S old, the next process's first
    scratch directory under the same base removes it; its own stays."""
    base = tmp_path / "systmp"
    base.mkdir()
    code = (
        "import os, signal, tempfile\n"
        f"tempfile.tempdir = {str(base)!r}\n"
        "from pipeline import query\n"
        f"from pipeline.lake import Lake\n"
        f"con = query.connect(Lake({str(tmp_path / 'lake')!r}), derived_views=False)\n"
        "con.execute(\"SET memory_limit = '32MB'; SET threads = 1\")\n"
        "con.execute('SELECT s, i FROM (SELECT range AS i, md5(range::VARCHAR) AS s FROM range(1500000)) "
        "ORDER BY s').fetchone()\n"
        "print(con.execute(\"SELECT current_setting('temp_directory')\").fetchone()[0], flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    spill = Path(p.stdout.strip())
    assert spill.parent == base and spill.is_dir() and any(spill.iterdir()), list(base.iterdir())
    _aged(spill)
    code = (
        "import tempfile\n"
        f"tempfile.tempdir = {str(base)!r}\n"
        "from pipeline import scratch\n"
        "print(scratch.make('local'))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert not spill.exists()
    assert [d.name for d in base.iterdir()] == [Path(p.stdout.strip()).name]


def _scratch_name(_) -> str:
    return scratch.name("staged")


def test_a_pool_worker_s_scratch_belongs_to_the_ingest():
    """What a pool worker stages is read by the ingesting process, maybe after the worker ended:
    its scratch directories carry the ingest's pid (executors.init_worker sets
    scratch.OWNER_PID), so no sweep takes them while the ingest runs."""
    from pipeline import pool_scope
    from pipeline.ingest import executors

    ctx = pool_scope.forkserver_context()
    with pool_scope.helpers_stopped():
        with pool_scope.process_pool(2, ctx, executors.init_worker, (2, {}, os.getpid())) as pool:
            names = list(pool.map(_scratch_name, range(2)))
    assert {int(n.split("-")[3]) for n in names} == {os.getpid()}


def test_an_ingest_sweeps_the_temporary_directory(tmp_path, monkeypatch):
    import tempfile

    from conftest import REPO

    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    base = tmp_path / "systmp"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    left = _aged(_mkdir(base / f"tracelake-local-{scratch._namespace()}-{_dead_pid()}-0a1b2c3d"))
    scratch._SWEPT.discard(str(base))
    res = ingest_paths([REPO / "sample_traces"], Lake(tmp_path / "lake"), jobs=1)
    assert {r.status for r in res} == {"ok"}
    assert not left.exists()


def _mkdir(d: Path) -> Path:
    d.mkdir()
    return d
