"""Attack 7: failing tests for the early forkserver of `tracelake ingest` (c12960f,
pipeline/pool_scope.py early_start, pipeline/cli/ingest_cmd.py _ingest).

1. The forkserver (and the resource tracker) are now started right after the arguments are
   checked, but the command's SIGINT/SIGTERM/SIGHUP handlers (cli/interrupt.py
   signals_interrupt) are installed only around ingest_paths, after the ingest package's imports,
   discover and the Lake. A SIGTERM or SIGHUP in between (the first ~0.2-0.7 s of the command: a
   CI job cancelled, `timeout`, a terminal closed right after Enter) ends the ingest by the
   default action (exit -15 / -1, no line), and the forkserver and resource tracker it started
   outlive it, re-parented to init (or the subreaper). Before c12960f a signal in that window
   ended a process that had started nothing.
2. A Ctrl-C in the same window (SIGINT to the whole process group, as a terminal sends it) reaches
   the forkserver while it is still starting and importing its PRELOAD (multiprocessing ignores
   SIGINT in it only once it enters its loop): it dies with a KeyboardInterrupt traceback (or
   "Fatal Python error: init_import_site") on the command's stderr. (The window existed before
   c12960f too, while run_pool started the forkserver; it is now the command's first second.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO
from subreaper import children
from test_no_survivors import CLI, HELPER, big_job

from pipeline import pool_scope

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper: Linux")


@pytest.fixture(scope="module")
def big_inputs(tmp_path_factory):
    """Two ranks of one run above PARALLEL_MIN_BYTES (whitespace-padded): pool_workers guesses a
    pool, so the command starts the forkserver early."""
    d = big_job(tmp_path_factory.mktemp("in7") / "job")
    assert pool_scope.pool_workers([d], 2) == 2
    return d


def _mark_when_forkserver_starts(
    reaper: subprocess.Popen, mark: Path, stop: threading.Event, after: float
) -> None:
    """Create `mark` `after` seconds after the command (the subreaper's child) has a forkserver
    child."""
    while not stop.is_set() and reaper.poll() is None:
        for cmd_pid, _, _ in children(reaper.pid):
            if any("multiprocessing.forkserver" in c for _, _, c in children(cmd_pid)):
                time.sleep(after)
                mark.write_text(str(cmd_pid))
                return
        time.sleep(0.002)


def signalled_at_forkserver_start(
    inputs: Path, lake: Path, sig: str, group: bool, tmp_path: Path, after: float = 0.0
) -> dict:
    """`tracelake ingest inputs --lake lake --jobs 2` under tests/subreaper.py, sent SIG`sig` (to
    its process group with `group`) `after` seconds after its early forkserver appears (it then
    imports PRELOAD for 0.35-0.4 s while the command imports the ingest package)."""
    mark = tmp_path / f"forkserver-{sig}"
    cmd = [sys.executable, str(HELPER), "--signal", sig, "--when", str(mark), *(["--group"] if group else [])]
    cmd += ["--", sys.executable, "-c", CLI, "ingest", str(inputs), "--lake", str(lake), "--jobs", "2", "-q"]
    reaper = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stop = threading.Event()
    watcher = threading.Thread(
        target=_mark_when_forkserver_starts, args=(reaper, mark, stop, after), daemon=True
    )
    watcher.start()
    try:
        out, errs = reaper.communicate(timeout=120)
    finally:
        stop.set()
        watcher.join()
    assert reaper.returncode == 0, errs
    assert mark.exists(), "the command started no forkserver"
    return json.loads(out)


@pytest.mark.parametrize("sig, group", [("TERM", False), ("HUP", True)], ids=["sigterm", "hang-up-to-group"])
def test_a_signal_while_the_early_forkserver_imports_leaves_nothing(sig, group, big_inputs, tmp_path):
    r = signalled_at_forkserver_start(big_inputs, tmp_path / "lake", sig, group, tmp_path)
    # the forkserver and the resource tracker were left behind (re-parented to the subreaper)
    assert r["left"] == [], r
    signum = getattr(signal, "SIG" + sig)
    assert r["rc"] == 128 + signum, r  # was -signum: the default action, no line
    assert r["output"].startswith(f"error: interrupted by SIG{sig}"), r["output"]


def test_ctrl_c_while_the_early_forkserver_imports_prints_no_traceback(big_inputs, tmp_path):
    r = signalled_at_forkserver_start(big_inputs, tmp_path / "lake", "INT", True, tmp_path, after=0.1)
    # the forkserver's KeyboardInterrupt traceback (from its PRELOAD imports) on the command's stderr
    assert "Traceback" not in r["output"] and "Fatal Python error" not in r["output"], r["output"][-1500:]
    assert r["left"] == [], r
    assert r["rc"] == 130, r
