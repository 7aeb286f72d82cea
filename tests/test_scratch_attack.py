"""Attacks on pipeline/scratch.py's sweep (a tester's; each failed on the code it was written
against, 2e45407, and passes since 5e3a2e8)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pipeline import scratch

pytestmark = pytest.mark.skipif(not Path("/proc/self/ns/pid").exists(), reason="Linux: PID namespaces")


@pytest.mark.parametrize("pid", ["2147483648", "99999999999", "9" * 200])
def test_sweep_never_raises_on_a_pid_too_large_for_os_kill(tmp_path, pid):
    """sweep() is documented to never raise, and scratch.path() runs it before every DuckDB
    connection (query._connect) and scratch directory. But a directory in the temporary directory
    named tracelake-<kind>-<this ns>-<pid>-<hex> with a pid past a C int makes _alive's
    os.kill(pid, 0) raise OverflowError, which is not caught (only OSError is): one stray
    directory then breaks every later tracelake
    command that makes scratch under that directory. Such a name is no pid of a process here: it
    should be left alone (or swept), never raise."""
    ns = scratch._namespace()
    d = tmp_path / f"tracelake-spill-{ns}-{pid}-abcdef"
    d.mkdir()
    old = time.time() - scratch.STALE_S - 60
    os.utime(d, (old, old))
    scratch.sweep(tmp_path, force=True)  # raised OverflowError at 2e45407
    p = scratch.path("spill", tmp_path / "x")  # a fresh base, and the documented entry point
    assert p.parent == tmp_path / "x"
    scratch._SWEPT.discard(str(tmp_path))
    assert scratch.path("spill", tmp_path).parent == tmp_path
