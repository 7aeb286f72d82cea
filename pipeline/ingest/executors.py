"""Executors: where the units of work run — in this process (jobs=1), in threads of this process
(jobs>1 and a small input: a process pool's start-up, imports included, would cost more than the
work), in a process pool of the standard library (jobs>1), or on an existing Dask cluster
(scheduler=ADDRESS; the lake and the inputs must then be on a file system the workers share).
Each yields (unit, [Prepared]) in input order, so the lake is the same whatever the parallelism
(pipeline/ingest/commit.py commits them).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import zipfile
import zlib

from ..lake import Lake, one_line
from ..pool_scope import forkserver_context, forkserver_started, helpers_stopped, process_pool, worker_env
from .discover import Unit
from .prepare import prepare
from .rows import Options, Prepared, apply_env, failed, sha_or_none, unit_failure
from .runs import run_for
from .targz import work_targz


def work(unit: Unit, opts: Options, done, own_process: bool = True) -> list[Prepared]:
    """Parse and stage one unit (in a worker). Never raises for a bad input. own_process=False: a
    thread of the ingesting process, whose environment is already the options' (apply_env would
    rewrite os.environ under the other threads)."""
    if own_process:
        apply_env(opts.env)
    lake = Lake(opts.lake)
    if unit.kind == "targz":
        return work_targz(unit.item, opts, done, lake, unit.below)
    if unit.kind == "object_archive":  # an archive in a bucket: fetched, then read here (ingest/objects.py)
        from .object_archive import work_archive

        return work_archive(work, unit, opts, done, own_process)
    inp = unit.item
    # test hook: this worker dies (tests/test_parallel.py)
    if os.environ.get("TRACELAKE_CRASH_ON") == inp.name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    # test hook: the unit of this name stops here for good, once it has written this process's
    # pid to the file TRACELAKE_STALL_MARK (tests/test_no_survivors.py signals the ingest then)
    if os.environ.get("TRACELAKE_STALL_ON") == inp.name:
        import time

        with open(os.environ["TRACELAKE_STALL_MARK"] + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.environ["TRACELAKE_STALL_MARK"] + ".part", os.environ["TRACELAKE_STALL_MARK"])
        while True:
            time.sleep(60)
    try:
        return [prepare(inp, opts, done, lake)]
    except MemoryError:
        err, ose = "out of memory while ingesting this file", False
    except OSError as e:
        err, ose = f"cannot read: {e.strerror or e}", True
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # a zip member's bytes are damaged
        err, ose = f"corrupt archive member ({type(e).__name__}: {one_line(str(e))[:200]})", False
    except NotImplementedError as e:  # zipfile: a compression method or flag it cannot read
        err, ose = f"unsupported archive member ({one_line(str(e))[:200]})", False
    except Exception as e:  # never let one file stop the batch; say what happened
        err, ose = (
            f"could not ingest ({type(e).__name__}: {one_line(str(e))[:200]}); please report this file",
            False,
        )
    sha = sha_or_none(inp)
    try:
        size = inp.size()
    except OSError:
        size = 0
    return [failed(inp.display, run_for(inp.run_name, opts.run), err, sha, size, oserror=ose)]


# the lake's content index a pool worker reads (run_pool's `done`), handed to each worker once by
# init_worker instead of pickled with every unit (a lake of 5,000 sources: 15,000 entries, 0.6 MB,
# 6.5 ms of CPU per file to pickle and unpickle, growing with the lake)
_DONE: dict | None = None


def init_worker(jobs: int = 1, done: dict | None = None, owner: int | None = None) -> None:
    """Pool worker set-up: die with the ingesting process (Linux), so a killed ingest leaves no
    worker writing into the lake's staging area; leave SIGINT and SIGHUP to the ingesting process
    (a Ctrl-C at a terminal reaches the whole process group: the ingest stops its workers itself,
    see pool_scope.stop_workers); end on SIGTERM, unwinding the unit in hand first (its staging directory
    removed, an `nsys export` it runs killed: _on_sigterm); and size the per-source metric queries
    a worker runs for a lake in a bucket (pipeline/local.py THREADS, set by prepare.with_local) to
    its share of the cores: `jobs` workers already keep that many cores busy, so a worker's DuckDB
    threads beyond its share only contend (8 rank files of 50 MB, 2 workers on 2 cores: 7.4-7.7 s
    with 2 threads each, 6.8-7.1 s with one). done: the lake's content index, which pool_work
    reads. owner: the ingesting process's pid, which names the worker's scratch directories
    (pipeline/scratch.py: what it stages is read by the ingest after it may have ended)."""
    import signal

    from . import prepare as prep

    global _DONE
    _DONE = done
    if owner is not None:
        from .. import scratch

        scratch.OWNER_PID = owner

    prep.LOCAL_THREADS = max(1, (os.cpu_count() or 1) // max(1, jobs))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover  (not Linux)
        pass


_IN_WORK = False  # a pool worker is running a unit (pool_work)


def _on_sigterm(signum, frame) -> None:
    """A pool worker's SIGTERM: inside a unit, SystemExit unwinds it (pool_work then ends the
    worker); between units, the worker ends at once."""
    if _IN_WORK:
        raise SystemExit(128 + signum)
    os._exit(128 + signum)


def pool_work(unit: Unit, opts: Options) -> list[Prepared]:
    """work() in a pool worker, with the index init_worker was given; a SIGTERM while it
    runs ends the worker once the unit has unwound (the executor would otherwise report the
    SystemExit as the unit's result and wait for more)."""
    global _IN_WORK
    _IN_WORK = True
    try:
        return work(unit, opts, _DONE)
    except SystemExit as e:
        os._exit(e.code if isinstance(e.code, int) else 1)
    finally:
        _IN_WORK = False


def run_serial(units, opts, done):
    for u in units:
        yield u, work(u, opts, done)


def run_threads(units, opts, done, jobs: int):
    """Results in input order from `jobs` threads of this process (at most 2*jobs units in
    flight). For small inputs: the parse is partly Python (holding the GIL) but polars, pyarrow's
    Parquet writes and DuckDB release it, so two threads ingest PARAM's 8-rank DLRM job (7 MB) in
    about 0.65 s instead of 0.87 s on 2 cores, where a process pool would first spend about a
    second importing the package in each worker. `done` is read as it was when the batch started
    (as for run_pool); commit.py catches duplicates within the batch. Stopped early (closed, or an
    exception such as KeyboardInterrupt), the units not yet started are cancelled and the ones
    running are waited for."""
    frozen = dict(done)
    pool = cf.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="tracelake-ingest")
    try:
        window: list = []
        i = 0
        while i < len(units) or window:
            while len(window) < 2 * jobs and i < len(units):
                window.append((units[i], pool.submit(work, units[i], opts, frozen, False)))
                i += 1
            u, fut = window.pop(0)
            yield u, fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_pool(units, opts, done, jobs: int):
    """Results in input order from a process pool (at most 2*jobs units in flight). A worker that
    dies (out of memory, killed) breaks the pool: the units in flight then run again one at a time,
    so only the one that kills its worker fails.

    Nothing it starts outlives it (pipeline/pool_scope.py): however it ends (exhausted, closed by the
    caller, an exception such as KeyboardInterrupt), its workers are stopped and waited for, and
    so are multiprocessing's forkserver and resource tracker when this call started them."""
    ctx = forkserver_context()
    # a forkserver the command started early (pool_scope.early_start) is used, and stopped by the
    # command's own helpers_stopped()
    with helpers_stopped():
        forkserver_started(worker_env(jobs))
        yield from _pooled(units, opts, done, jobs, ctx)


def _pooled(units, opts, done, jobs: int, ctx):
    frozen = dict(done)
    i = 0
    while i < len(units):
        window: list = []
        broken = False
        # the index once a worker, and the pid that owns its scratch directories (init_worker)
        with process_pool(jobs, ctx, init_worker, (jobs, frozen, os.getpid())) as pool:
            while i < len(units) or window:
                try:
                    while len(window) < 2 * jobs and i < len(units):
                        window.append((units[i], pool.submit(pool_work, units[i], opts)))
                        i += 1
                    u, fut = window[0]
                    res = fut.result()
                except cf.process.BrokenProcessPool:
                    broken = True
                    break
                window.pop(0)
                yield u, res
        if broken:  # keep what finished; run the rest again, one at a time
            for u, fut in window:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    yield u, fut.result()
                else:
                    yield u, retry_alone(u, opts, frozen, ctx)


def retry_alone(u: Unit, opts: Options, done, ctx) -> list[Prepared]:
    with process_pool(1, ctx, init_worker, (1, done, os.getpid())) as pool:  # the index once, as _pooled's
        try:
            return pool.submit(pool_work, u, opts).result()
        except cf.process.BrokenProcessPool:
            return unit_failure(u, opts, "the worker process died while ingesting this file (out of memory?)")


def run_dask(units, opts, done, scheduler: str):
    import functools

    from .. import objstore
    from ..cluster import client as dask_client
    from .objects import published

    with dask_client(scheduler) as client:  # SchedulerError (one line) when it cannot be reached
        nthreads = max(1, sum(client.nthreads().values()))
        [frozen] = client.scatter([dict(done)], broadcast=True)  # once to every worker, not per task
        task = work  # a lake in a bucket: workers publish what they stage there (ingest/objects.py)
        if objstore.is_url(opts.lake):
            task = functools.partial(published, work)
        window: list = []
        i = 0
        while i < len(units) or window:
            while len(window) < 2 * nthreads and i < len(units):
                window.append((units[i], client.submit(task, units[i], opts, frozen, pure=False)))
                i += 1
            u, fut = window.pop(0)
            try:
                res = fut.result()
            except Exception as e:  # a worker died or the task could not run
                res = unit_failure(
                    u, opts, f"the Dask task failed ({type(e).__name__}: {one_line(str(e))[:200]})"
                )
            yield u, res
