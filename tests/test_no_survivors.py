"""Nothing a pooled `tracelake ingest` starts outlives it (issue 39 item 4): run under a child
subreaper (tests/subreaper.py), every process it started that is still alive, or dead but not
reaped by the ingest's own processes, when the command exits is re-parented to the subreaper and
listed. Before the fix a pooled ingest left two (the multiprocessing forkserver and resource
tracker). Checked on success, on an error in the ingesting process, and on SIGTERM, SIGINT and
SIGHUP arriving while a worker is busy (the TRACELAKE_STALL_ON hook holds one unit in a pool
worker), sent to the ingest alone or to its whole process group; the exit code is 128 + the
signal's number, with one line, and the lake is left whole (a second run completes it)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, write_trace

from pipeline import pool_scope
from pipeline.lake import Lake

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper: Linux")

HELPER = REPO / "tests" / "subreaper.py"
# the CLI, from a -c program (a worker re-imports a main *file*, not -c), optionally with the lake's
# commit failing as a full disk or a lost mount would make it fail
CLI = textwrap.dedent(
    """
    import os, sys
    from pipeline.lake import Lake, LakeError
    if os.environ.get("TEST_COMMIT_FAILS"):
        def fail(self, staged, row):
            raise LakeError(f"{self.root}: cannot write its rows (test)")
        Lake.commit = fail
    from pipeline.cli import app
    sys.argv[0] = "tracelake"
    app()
    """
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return big_job(tmp_path_factory.mktemp("in") / "job")


def big_job(d: Path) -> Path:
    """Two ranks of one run in directory d, together above the size that takes the process pool
    (whitespace pads them: cheap to parse)."""
    for r in range(2):
        ev = [
            {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 1000 + 10 * i, "dur": 5,
             "args": {"device": 0, "stream": 7}}
            for i in range(20)
        ]  # fmt: skip
        f = write_trace(d / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 2})
        f.write_bytes(f.read_bytes()[:-1] + b" " * (pool_scope.PARALLEL_MIN_BYTES // 2 + 1) + b"}")
    assert sum(f.stat().st_size for f in d.iterdir()) >= pool_scope.PARALLEL_MIN_BYTES
    return d


@pytest.fixture(scope="module")
def two_runs(inputs, tmp_path_factory):
    """The two files as two runs of one source each (directories a and b): each is committed as
    soon as it is parsed, where the two of one run are held and written together at the end
    (pipeline/ingest/hold.py)."""
    d = tmp_path_factory.mktemp("runs")
    for r, sub in enumerate("ab"):
        (d / sub).mkdir()
        (d / sub / f"rank{r}.json").write_bytes((inputs / f"rank{r}.json").read_bytes())
    return d


def run(inputs: Path, lake: Path, *how: str, env: dict | None = None) -> dict:
    """`tracelake ingest inputs --lake lake --jobs 2` under the subreaper; how: its options."""
    cmd = [sys.executable, str(HELPER), *how, "--", sys.executable, "-c", CLI]
    cmd += ["ingest", str(inputs), "--lake", str(lake), "--jobs", "2"]
    p = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, timeout=300, check=True
    )
    return json.loads(p.stdout)


def statuses(lake: Path) -> list[tuple[str, str]]:
    src = Lake(lake).sources()
    return sorted((Path(p).name, s) for p, s in zip(src["path"], src["status"]))


def test_success_leaves_nothing(inputs, tmp_path):
    r = run(inputs, tmp_path / "lake")
    assert r["rc"] == 0, r["output"]
    assert r["left"] == []
    assert statuses(tmp_path / "lake") == [("rank0.json", "ok"), ("rank1.json", "ok")]


def test_a_worker_that_dies_leaves_nothing(inputs, tmp_path):
    """A worker killed (TRACELAKE_CRASH_ON) breaks the pool; the file runs again alone, in a pool
    of its own, and fails: neither pool leaves anything."""
    r = run(inputs, tmp_path / "lake", env={"TRACELAKE_CRASH_ON": "rank1.json"})
    assert r["rc"] == 3, r["output"]
    assert r["left"] == []
    assert statuses(tmp_path / "lake") == [("rank0.json", "ok"), ("rank1.json", "failed")]


def stalled(tmp_path) -> tuple[dict, Path]:
    mark = tmp_path / "stalled"
    return {"TRACELAKE_STALL_ON": "rank1.json", "TRACELAKE_STALL_MARK": str(mark)}, mark


def test_an_error_in_the_ingest_leaves_nothing(two_runs, tmp_path):
    """The lake cannot be written while a worker still parses the other file (rank0's run is
    committed as soon as it is parsed)."""
    env, mark = stalled(tmp_path)
    r = run(two_runs, tmp_path / "lake", env={**env, "TEST_COMMIT_FAILS": "1"})
    assert r["rc"] == 4, r["output"]
    assert r["output"].splitlines() == [f"error: {tmp_path / 'lake'}: cannot write its rows (test)"]
    assert r["left"] == []
    worker = int(mark.read_text())
    assert worker != r["pid"] and not Path(f"/proc/{worker}").exists()  # a pool worker, gone


@pytest.mark.parametrize(
    "sig, group",
    [("TERM", False), ("TERM", True), ("INT", True), ("HUP", True)],
    ids=["sigterm", "sigterm-to-group", "ctrl-c", "hang-up-to-group"],
)
def test_a_signal_mid_ingest_leaves_nothing(sig, group, inputs, tmp_path):
    env, mark = stalled(tmp_path)
    lake = tmp_path / "lake"
    r = run(inputs, lake, "--signal", sig, "--when", str(mark), *(["--group"] if group else []), env=env)
    signum = getattr(signal, "SIG" + sig)
    assert r["rc"] == 128 + signum, r["output"]
    assert r["left"] == []
    (line,) = r["output"].splitlines()
    m = re.fullmatch(
        rf"error: interrupted by SIG{sig}: what was ingested before it \((\d) file\(s\)\) stays in the "
        "lake; run the same command again to ingest the rest",
        line,
    )
    assert m, line
    worker = int(mark.read_text())
    assert worker != r["pid"] and not Path(f"/proc/{worker}").exists()
    assert ("rank1.json", "ok") not in statuses(lake)
    assert len(statuses(lake)) == int(m[1])  # rank0.json or nothing, as the line says
    if sig == "TERM" and not group:  # the lake is whole: the same ingest again completes it
        again = run(inputs, lake)
        assert again["rc"] == 0 and again["left"] == [], again["output"]
        assert statuses(lake) == [("rank0.json", "ok"), ("rank1.json", "ok")]


def _deaf_sleeper(mark: str) -> None:
    """A worker's unit that does not answer SIGTERM (as one deep in native code may not)."""
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(mark).write_text(str(os.getpid()))
    time.sleep(300)


def test_a_worker_deaf_to_sigterm_is_killed_and_waited_for(tmp_path, monkeypatch):
    """process_pool() left by an exception: a worker still running after the grace period gets
    SIGKILL and is waited for; helpers_stopped() then stops the forkserver it started."""
    import concurrent.futures as cf
    import multiprocessing
    import time
    from multiprocessing import forkserver

    monkeypatch.setattr(pool_scope, "STOP_GRACE_S", 0.5)
    ctx = multiprocessing.get_context("forkserver")
    mark = tmp_path / "running"
    with pool_scope.helpers_stopped():
        with pytest.raises(KeyboardInterrupt):
            with pool_scope.process_pool(1, ctx, None, ()) as pool:
                fut = pool.submit(_deaf_sleeper, str(mark))
                while not mark.exists() and not fut.done():
                    time.sleep(0.01)
                procs = list(pool._processes.values())
                raise KeyboardInterrupt
        server = forkserver._forkserver._forkserver_pid
        assert server is not None
    # ended (SIGTERM alone would not end it) and reaped; the exit status itself is -9, or 255 when
    # the pool's own thread read it first (multiprocessing's forkserver reports it once)
    assert [p.exitcode in (-signal.SIGKILL, 255) for p in procs] == [True]
    assert not Path(f"/proc/{procs[0].pid}").exists()
    assert isinstance(fut.exception(), cf.process.BrokenProcessPool)
    assert forkserver._forkserver._forkserver_pid is None and not Path(f"/proc/{server}").exists()


def _hold(_) -> int:
    return os.getpid()


def test_a_signal_while_a_worker_starts_waits_until_the_pool_knows_it(monkeypatch):
    """A stopping signal that comes while submit() starts a worker (the forkserver has forked it,
    the pool has not recorded it yet) is held back until submit() returns: the pool then knows
    every worker and stops them all. Before, the signal's exception left that worker unknown,
    alive and holding the forkserver's pipe open, and helpers_stopped() waited for the forkserver
    for ever (attack 7's Ctrl-C test hung one run in three)."""
    import multiprocessing
    from multiprocessing import context, forkserver

    from pipeline.cli.interrupt import Interrupted, signals_interrupt

    started, known = [], []
    real_start, real_stop = context.ForkServerProcess.start, pool_scope.stop_workers

    def start_then_signal(self):
        real_start(self)  # forked; the pool records it after start() returns
        started.append(self.pid)
        signal.raise_signal(signal.SIGTERM)

    def stop_workers(pool, grace=None):
        known.extend(pool._processes)
        real_stop(pool, grace)

    monkeypatch.setattr(context.ForkServerProcess, "start", start_then_signal)
    monkeypatch.setattr(pool_scope, "stop_workers", stop_workers)
    ctx = multiprocessing.get_context("forkserver")
    with pool_scope.helpers_stopped():
        with signals_interrupt(), pytest.raises(Interrupted):
            with pool_scope.process_pool(1, ctx, None, ()) as pool:
                pool.submit(_hold, 0)
        server = forkserver._forkserver._forkserver_pid
    assert started and set(started) <= set(known)  # every worker it forked was stopped by the pool
    assert not any(Path(f"/proc/{p}").exists() for p in started)
    assert forkserver._forkserver._forkserver_pid is None and not Path(f"/proc/{server}").exists()


def test_a_worker_no_pool_knows_cannot_hold_the_forkserver_for_ever(tmp_path, monkeypatch):
    """helpers_stopped() waits STOP_GRACE_S at most for a forkserver that a live process keeps
    open (one it forked that no pool stops), then kills it, and that process with it (a pool
    worker dies with the forkserver: init_worker's PR_SET_PDEATHSIG)."""
    import time
    from multiprocessing import forkserver

    monkeypatch.setattr(pool_scope, "STOP_GRACE_S", 0.5)
    ctx = pool_scope.forkserver_context()
    armed = tmp_path / "armed"
    with pool_scope.helpers_stopped():
        with pool_scope.process_pool(1, ctx, None, ()) as pool:  # the forkserver served a pool
            assert pool.submit(_hold, 0).result() > 0
        server = forkserver._forkserver._forkserver_pid
        stray = ctx.Process(target=_worker_then_sleep, args=(str(armed),))
        stray.start()
        deadline = time.monotonic() + 30
        while not armed.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert armed.exists()
        started = time.monotonic()
    assert time.monotonic() - started < 20  # cut short, not for ever
    assert not Path(f"/proc/{server}").exists()
    stray.join(10)
    # its status is 255: the forkserver that would have reported it is gone
    assert stray.exitcode in (-signal.SIGKILL, 255)
    deadline = time.monotonic() + 10
    while _alive(stray.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(stray.pid)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead and not yet reaped by init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _worker_then_sleep(armed: str) -> None:
    """A process forked as the pool's workers are (init_worker), that nothing stops."""
    import time

    from pipeline.ingest import executors

    executors.init_worker(1, {})
    Path(armed).write_text(str(os.getpid()))
    time.sleep(120)
