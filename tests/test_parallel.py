"""Parallel ingest (a process pool of the standard library) gives the same lake as the serial
path, table by table; a worker that dies takes only its own file down; the CLI's progress bar
shows files, MB/s and errors."""

from __future__ import annotations

import concurrent.futures as cf
import io
import shutil
import tarfile

import pytest
from conftest import corpus, lake_rows
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TextColumn

import pipeline.ingest as ingest_mod
from pipeline import pool_scope
from pipeline.cli import _RateColumn
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

DLRM = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
SAMPLED = corpus("hta", "tests", "data", "trace_filter")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """8 ranks of one run, a copy of rank 0 under another name (skipped: same content), a file
    whose rank is taken (moved to its own run), a bad file, and a tar of two more ranks."""
    d = tmp_path_factory.mktemp("in")
    job = d / "job"
    job.mkdir()
    for f in sorted(DLRM.glob("worker*.json")):
        shutil.copy(f, job / f.name)
    shutil.copy(next(DLRM.glob("worker0_*.json")), job / "zz_copy_of_worker0.json")
    shutil.copy(SAMPLED / "sampled_rank-1.json.gz", job / "zz_rank1_other.json.gz")
    (job / "bad.json").write_bytes(b"{not json")
    with tarfile.open(d / "more.tar", "w") as t:
        for f in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
            data = (SAMPLED / f).read_bytes()
            info = tarfile.TarInfo(f"other/{f}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return [job, d / "more.tar"]


def summary(res):
    return [(r.path, r.status, r.run_id, r.rank, r.error, r.notes) for r in res]


def spy_on(monkeypatch, name: str) -> list:
    """Replace the executor ingest_mod.<name> by one that records its jobs argument (returned
    list) and runs the real one."""
    used, real = [], getattr(ingest_mod, name)

    def spy(*a):
        used.append(a[-1])
        yield from real(*a)

    monkeypatch.setattr(ingest_mod, name, spy)
    return used


def test_pool_gives_the_serial_lake(inputs, tmp_path, monkeypatch):
    serial = Lake(tmp_path / "serial")
    res1 = ingest_paths(inputs, serial, jobs=1)
    monkeypatch.setattr(pool_scope, "PARALLEL_MIN_BYTES", 0)
    used = spy_on(monkeypatch, "run_pool")
    pooled = Lake(tmp_path / "pooled")
    res2 = ingest_paths(inputs, pooled, jobs=2)
    assert used == [2]
    assert summary(res1) == summary(res2)
    statuses = sorted(r.status for r in res1)
    # skipped: the copy of worker0, and more.tar's other/sampled_rank-1 (the same bytes as
    # zz_rank1_other, earlier in the batch: the same trace, whatever run its directory names)
    assert statuses == ["failed"] + ["ok"] * 10 + ["skipped"] * 2
    # a copy of a file in the same batch is named as such, the same with and without the pool
    # (the pool's workers only know the lake as it was before the batch)
    dup = [r for r in res1 if r.path.endswith("zz_copy_of_worker0.json")][0]
    assert dup.notes == ["same content as a file ingested earlier in this batch; --force re-ingests"]
    again = [r for r in ingest_paths(inputs, serial, jobs=1) if r.path.endswith("zz_copy_of_worker0.json")][0]
    assert again.notes == ["already in the lake (same content); --force re-ingests"]
    moved = [r for r in res1 if r.path.endswith("zz_rank1_other.json.gz")][0]
    assert moved.run_id.startswith("job_") and any("already held" in n for n in moved.notes)
    assert lake_rows(serial) == lake_rows(pooled)
    assert not any((pooled.root / ".tmp").iterdir())


def test_threads_give_the_serial_lake(inputs, tmp_path, monkeypatch):
    """Inputs under PARALLEL_MIN_BYTES go to threads of the ingesting process: the same results,
    notes and rows as the serial path."""
    serial = Lake(tmp_path / "serial")
    res1 = ingest_paths(inputs, serial, jobs=1)
    monkeypatch.setattr(pool_scope, "PARALLEL_MIN_BYTES", 1 << 40)
    monkeypatch.setattr(ingest_mod, "run_pool", None)  # never the pool here
    used = spy_on(monkeypatch, "run_threads")
    threaded = Lake(tmp_path / "threaded")
    res2 = ingest_paths(inputs, threaded, jobs=2)
    assert used == [2]
    assert summary(res1) == summary(res2)
    assert lake_rows(serial) == lake_rows(threaded)
    assert not any((threaded.root / ".tmp").iterdir())


def test_a_worker_that_dies_fails_only_its_file(inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(pool_scope, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TRACELAKE_CRASH_ON", "worker3_step_12.1694128201557.pt.trace.json")
    res = ingest_paths([inputs[0]], Lake(tmp_path / "lake"), jobs=2)
    by = {r.path.rsplit("/", 1)[-1]: r for r in res}
    dead = by["worker3_step_12.1694128201557.pt.trace.json"]
    assert dead.status == "failed" and "worker process died" in dead.error
    assert sorted(r.status for r in res) == ["failed", "failed"] + ["ok"] * 8 + ["skipped"]


def test_progress_shows_files_rate_and_errors():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=200)
    with Progress(
        *[
            c
            for c in (
                MofNCompleteColumn(),
                TextColumn("files"),
                _RateColumn(),
                TextColumn("{task.fields[errors]} error(s)"),
            )
        ],
        console=con,
    ) as prog:
        t = prog.add_task("ingest", total=10, mb=0.0, errors=0)
        prog.update(t, advance=3, mb=120.0, errors=1)
        task = prog.tasks[t]
        line = _RateColumn().render(task).plain
        prog.refresh()
    assert line.startswith("120.0 MB") and "MB/s" in line
    text = buf.getvalue()
    assert "3/10" in text and "files" in text and "1 error(s)" in text


def test_pool_workers_know_the_lake_given_once(inputs, tmp_path, monkeypatch):
    """The lake's content index reaches each pool worker once (executors.init_worker), not with
    every unit: a second pooled ingest of the same inputs into the same lake skips every file the
    first stored, as the serial path does, and no unit is submitted with the index."""
    monkeypatch.setattr(pool_scope, "PARALLEL_MIN_BYTES", 0)
    lake = Lake(tmp_path / "lake")
    first = ingest_paths(inputs, lake, jobs=2)
    stored = sorted(r.path for r in first if r.status == "ok")
    assert len(stored) == 10
    submitted = []
    real = cf.ProcessPoolExecutor.submit

    def submit(self, fn, *args, **kwargs):
        submitted.append(len(args))
        return real(self, fn, *args, **kwargs)

    monkeypatch.setattr(cf.ProcessPoolExecutor, "submit", submit)
    again = ingest_paths(inputs, lake, jobs=2, force=False)
    assert submitted and set(submitted) == {2}  # (unit, opts): no index
    by_path = {r.path: r for r in again}
    for p in stored:
        assert by_path[p].status == "skipped", p
        assert by_path[p].notes[0].startswith("already in the lake (same content"), p
    serial = [(r.path, r.status, r.notes) for r in ingest_paths(inputs, lake, jobs=1)]
    assert serial == [(r.path, r.status, r.notes) for r in again]


def _polars_threads(_) -> int:
    import polars as pl

    return pl.thread_pool_size()


def _blas_threads(_) -> str | None:
    import os

    return os.environ.get("OPENBLAS_NUM_THREADS")


@pytest.mark.parametrize(("cores", "user", "expected"), [(2, None, 1), (4, None, 2), (2, "3", 3)])
def test_pool_workers_size_polars_to_their_share_of_the_cores(monkeypatch, cores, user, expected):
    """A pool of 2 workers: each runs polars on cores // 2 threads (pool_scope.worker_env, set in
    the forkserver, which imports polars for its workers: polars reads POLARS_MAX_THREADS once),
    unless the user set POLARS_MAX_THREADS; the ingest's own environment is left as it was."""
    import os

    from pipeline.ingest import executors

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    if user is None:
        monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    else:
        monkeypatch.setenv("POLARS_MAX_THREADS", user)
    before = dict(os.environ)
    ctx = pool_scope.forkserver_context()
    with pool_scope.helpers_stopped():
        pool_scope.forkserver_started(pool_scope.worker_env(2))
        assert dict(os.environ) == before
        with pool_scope.process_pool(2, ctx, executors.init_worker, (2, {})) as pool:
            assert set(pool.map(_polars_threads, range(4))) == {expected}
            # OpenBLAS on one thread (pipeline/thread_env.py), unless the user chose
            blas = os.environ.get("OPENBLAS_NUM_THREADS") or "1"
            assert set(pool.map(_blas_threads, range(4))) == {blas}


def test_a_pooled_ingest_starts_its_forkserver_with_the_workers_environment(inputs, tmp_path, monkeypatch):
    from pipeline.ingest import executors

    monkeypatch.setattr(pool_scope, "PARALLEL_MIN_BYTES", 0)
    given, real = [], executors.forkserver_started
    monkeypatch.setattr(executors, "forkserver_started", lambda env: (given.append(env), real(env)))
    ingest_paths([inputs[0]], Lake(tmp_path / "lake"), jobs=2)
    assert given == [pool_scope.worker_env(2)]


def test_pool_workers_guesses_the_pool_from_the_files(tmp_path, monkeypatch):
    """pool_scope.pool_workers: the workers a pooled ingest of these paths starts, from the files'
    count and sizes alone (ingest_paths' rule: more than one job, more than one file, at least
    PARALLEL_MIN_BYTES in all), before any plan; 0 when the ingest will not use the pool."""
    monkeypatch.setattr(pool_scope, "PARALLEL_MIN_BYTES", 100)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    job = tmp_path / "job"
    (job / "deep" / "er").mkdir(parents=True)
    (job / "a.json").write_bytes(b"x" * 60)
    (job / "deep" / "er" / "b.json").write_bytes(b"x" * 40)  # 100 bytes in two files, one nested
    (job / "loop").symlink_to(job)  # a link back up is not followed
    one = tmp_path / "one.json"
    one.write_bytes(b"x" * 1000)
    assert pool_scope.pool_workers([job], 2) == 2
    assert pool_scope.pool_workers([job], 0) == 2  # 0: one per core
    assert pool_scope.pool_workers([job], 8) == 2  # no more workers than files
    assert pool_scope.pool_workers([job], 1) == 0  # one job: no pool
    assert pool_scope.pool_workers([one], 2) == 0  # one file: in this process
    assert pool_scope.pool_workers([one, job / "a.json"], 2) == 2  # files given one by one
    assert pool_scope.pool_workers([job / "deep"], 2) == 0  # one file under it
    (job / "a.json").write_bytes(b"x" * 59)
    assert pool_scope.pool_workers([job], 2) == 0  # 99 bytes: threads
    assert pool_scope.pool_workers(["s3://bucket/job", tmp_path / "missing", one, job], 4) == 3


EARLY = """
import multiprocessing.util as util, sys
spawned = []
real = util.spawnv_passfds
def spawn(path, args, passfds):
    if any(b"forkserver" in (a if isinstance(a, bytes) else a.encode()) for a in args):
        spawned.append("pipeline.ingest" in sys.modules)
    return real(path, args, passfds)
util.spawnv_passfds = spawn
import atexit
atexit.register(lambda: print("FORKSERVERS", spawned, file=sys.stderr))
from pipeline.cli import app
sys.argv[0] = "tracelake"
app()
"""


@pytest.mark.parametrize("jobs, early", [("2", [False]), ("1", [])])
def test_the_cli_starts_the_forkserver_before_its_ingest_imports(tmp_path, jobs, early):
    """`tracelake ingest --jobs 2` of inputs that take the process pool starts its one forkserver
    before the ingesting process imports the ingest package (pool_scope.early_start: the two
    imports run side by side), and the pool forks its workers from that one; with --jobs 1 none
    is started. The lake is the one the serial path writes."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    job = tmp_path / "job"
    job.mkdir()
    for f in sorted(DLRM.glob("worker[01]_*.json")):
        data = f.read_bytes()  # padded past the pool's threshold with whitespace (cheap to parse)
        (job / f.name).write_bytes(data[:-1] + b" " * (pool_scope.PARALLEL_MIN_BYTES // 2) + data[-1:])
    lake = tmp_path / "lake"
    p = subprocess.run(
        [sys.executable, "-c", EARLY, "ingest", str(job), "--lake", str(lake), "--jobs", jobs, "-q"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stderr.splitlines() if x.startswith("FORKSERVERS")]
    assert line == [f"FORKSERVERS {early}"], p.stderr
    serial = Lake(tmp_path / "serial")
    ingest_paths([job], serial, jobs=1)
    assert lake_rows(Lake(lake)) == lake_rows(serial)


def _pid(_) -> int:
    import os

    return os.getpid()


@pytest.mark.parametrize("pooled", [False, True])
def test_an_early_forkserver_no_pool_used_is_killed_not_waited_for(monkeypatch, pooled):
    """helpers_stopped() ends a forkserver that early_start started: one that forked no worker
    (the guess was wrong) is killed at once (it may still be importing its PRELOAD, 0.35-0.4 s),
    one a pool used is asked to stop and waited for; either way it is gone afterwards."""
    import os
    import signal
    from multiprocessing import forkserver

    from pipeline.ingest import executors

    kills, real_kill = [], os.kill
    monkeypatch.setattr(os, "kill", lambda pid, sig: (kills.append((pid, sig)), real_kill(pid, sig))[1])
    with pool_scope.helpers_stopped():
        assert pool_scope.early_start(2)
        pid = forkserver._forkserver._forkserver_pid
        assert not pool_scope.early_start(2)  # running: not started again
        if pooled:
            ctx = pool_scope.forkserver_context()
            with pool_scope.process_pool(2, ctx, executors.init_worker, (2, {})) as pool:
                assert len(set(pool.map(_pid, range(8)))) >= 1
    assert ((pid, signal.SIGKILL) in kills) is not pooled
    assert forkserver._forkserver._forkserver_pid is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped
