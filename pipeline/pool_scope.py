"""Lifetimes of the processes a pooled ingest starts (executors.run_pool): none outlives it.

A pooled ingest starts, besides its pool's workers, two helpers of the standard library's
multiprocessing: the forkserver (it forks the workers; the workers are its children) and the
resource tracker. Left to themselves they end only after the ingest has exited (the forkserver
when the pipe the ingest holds closes, the tracker when the last holder of its pipe closes): for
a moment they are orphans re-parented to init (or to a child subreaper), and their CPU time is no
longer the command's. So:

- process_pool(): a ProcessPoolExecutor whose workers are stopped and waited for however the block
  ends. Normally (every unit done) it is shut down and joined. On an exception (KeyboardInterrupt,
  a SIGTERM turned into one, an error in the ingesting process, the caller closing the results
  generator) the units not started are cancelled and each worker gets SIGTERM (a worker unwinds
  the unit in hand: executors.init_worker), then SIGKILL after STOP_GRACE_S, and is waited for.
- helpers_stopped(): stops and waits for the forkserver and the resource tracker when this block
  started them (one it finds already running belongs to someone else and is left be). It starts
  the tracker itself, with SIGHUP blocked: a hang-up sent to the whole process group (a terminal
  closed) would otherwise end it under the pool, and multiprocessing would start another with a
  warning and tracebacks (the forkserver is made deaf to it by forkserver_preload.py). The
  tracker is stopped only when no semaphore of this process still needs it (its finalizer would
  start a new tracker); the pool's are released by its shutdown.
- forkserver_started(env): starts the forkserver (when not running yet) with `env` added to the
  environment it inherits, then puts the ingest's own environment back: thread-pool sizes such
  as POLARS_MAX_THREADS, which polars reads once, when the forkserver imports it for its workers.
- signals_deferred(): while the above run in the main thread, SIGINT, SIGTERM and SIGHUP are held
  back (a second Ctrl-C must not cut the shutdown short, leaving processes behind); one that came
  meanwhile is delivered afterwards, unless the block is already unwinding from an exception.
- pool_workers(paths, jobs) and early_start(workers): the `ingest` command's forkserver started
  before the command's own imports, when its inputs will go to a pool (below).

Start-up: the forkserver imports polars, pyarrow and the Kineto reader (PRELOAD) before it forks
the first worker, 0.35-0.4 s on the project machine, and the ingesting process imports the same
before it plans the units and starts the pool. Started one after the other, the first worker began
0.7 s into an 8 x 50 MB ingest with `--jobs 2`. early_start starts the forkserver right after the
command's arguments are checked, so the two imports run side by side on two cores; run_pool then
finds it running (forkserver_started leaves it be) and the helpers_stopped() around the command
stops it. This module imports only the standard library, so the command can call it before the
ingest package's imports.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import os
import signal
import threading
import time
from contextlib import contextmanager

STOP_GRACE_S = 5.0  # how long a worker has to unwind after SIGTERM before it gets SIGKILL
# below this much input a process pool costs more than it saves: threads (pipeline/ingest/__init__.py)
PARALLEL_MIN_BYTES = 16 << 20
# what the forkserver imports before it forks a worker; the first arms it to die with the ingest
# (pipeline/ingest/forkserver_preload.py)
PRELOAD = ("pipeline.ingest.forkserver_preload", "pipeline.ingest.executors")
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_POOLS = [0]  # process pools started in this process (helpers_stopped: was the forkserver used?)


def forkserver_context():
    """multiprocessing's forkserver context with PRELOAD set (executors.run_pool's workers)."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def worker_env(jobs: int) -> dict[str, str]:
    """Environment of the pool's workers (set in the forkserver, which imports polars for them):
    polars' thread pool sized to a worker's share of the cores, as init_worker sizes DuckDB's.
    `jobs` workers already keep that many cores busy; polars' own pool of one thread per core in
    each of them only contends: 1,000 small traces, 2 workers on 2 cores, three rounds alternated,
    16.3-18.6 against 16.9-19.0 ms CPU a file (noisy); 8 ranks x 50 MB with --jobs 2 no slower
    (docs/performance.md, Small job, "Second round"). A POLARS_MAX_THREADS already set is kept.
    OpenBLAS on one thread too, unless the user chose (pipeline/thread_env.py: numpy's import
    otherwise starts a spinning thread per core in the forkserver)."""
    from . import thread_env

    polars = {"POLARS_MAX_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, jobs)))}
    return {**polars, **thread_env.one_blas_thread_env()}


def pool_workers(paths, jobs: int) -> int:
    """How many pool workers an ingest of the local files under `paths` (files and directories;
    anything else, such as an s3:// URL, is not counted) with `jobs` (0: one per core) will
    start, judged from the files' count and sizes before the ingest plans its units: 0 when it
    will not use a process pool (one job, one file, or under PARALLEL_MIN_BYTES in all: the
    rule of pipeline/ingest/__init__.py ingest_paths). Only a guess: the plan may skip files
    already in the lake, or leave out those that are not traces; the walk stops once it has
    found the threshold's bytes in `jobs` files. Symbolic links to directories are not followed."""
    jobs = jobs or os.cpu_count() or 1
    if jobs < 2:
        return 0
    files = size = 0
    for p in paths:
        if not isinstance(p, (str, os.PathLike)) or "://" in str(p):
            continue
        todo = [os.fspath(p)]
        while todo:
            try:
                with os.scandir(todo.pop()) as it:
                    entries = list(it)
            except NotADirectoryError:
                try:
                    files, size = files + 1, size + os.path.getsize(p)
                except OSError:
                    pass
                break
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    elif e.is_file():
                        files, size = files + 1, size + e.stat().st_size
                except OSError:
                    continue
                if files >= jobs and size >= PARALLEL_MIN_BYTES:  # no need to look further
                    return jobs
    return min(jobs, files) if files > 1 and size >= PARALLEL_MIN_BYTES else 0


def early_start(workers: int) -> bool:
    """Start the forkserver (PRELOAD, worker_env(workers)) now, when an ingest will use a pool of
    `workers` workers (pool_workers; 0: nothing is started), so that its imports run beside the
    caller's (module doc). Call inside helpers_stopped(), which stops it. Returns whether it was
    started here (False: none wanted, or one already running)."""
    if not workers:
        return False
    forkserver_context()  # sets PRELOAD, which ensure_running hands the new forkserver
    return forkserver_started(worker_env(workers))


@contextmanager
def process_pool(jobs: int, ctx, initializer, initargs):
    """A ProcessPoolExecutor of `jobs` workers (mp_context ctx); on leaving the block every worker
    has ended and been waited for (module doc). Its submit() holds stopping signals back while it
    runs (signals_deferred): it may start a worker, and a signal raised half-way through (the
    forkserver has forked the worker, the pool has not yet recorded it) left a worker no one
    stopped, which kept the forkserver, and the ingest waiting for it, alive."""

    class Pool(cf.ProcessPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            with signals_deferred():
                return super().submit(fn, *args, **kwargs)

    _POOLS[0] += 1
    pool = Pool(max_workers=jobs, mp_context=ctx, initializer=initializer, initargs=initargs)
    try:
        yield pool
    except BaseException:
        with signals_deferred(unwinding=True):
            stop_workers(pool)
        raise
    with signals_deferred():
        pool.shutdown(wait=True)


def stop_workers(pool: cf.ProcessPoolExecutor, grace: float | None = None) -> None:
    """Cancel the pool's units not started, end its workers (SIGTERM; SIGKILL for those still
    running `grace` seconds later, default STOP_GRACE_S), wait for them and for the pool's
    management thread."""
    grace = STOP_GRACE_S if grace is None else grace
    procs = list((getattr(pool, "_processes", None) or {}).values())
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() forgets it
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        try:
            p.terminate()
        except (OSError, ValueError, AttributeError):  # already gone
            pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                p.kill()
                p.join()
        except (OSError, ValueError, AttributeError):
            pass
    if manager is not None:  # it lets go of the pool's queues (and their semaphores) as it ends
        manager.join()
    pool.shutdown(wait=True)


def forkserver_started(env: dict[str, str]) -> bool:
    """Start multiprocessing's forkserver, if it is not running, with `env` set in the environment
    it inherits (a variable the user has set is left as it is) and TRACELAKE_FORKSERVER_PARENT
    (this process's pid); os.environ is then as before. It starts with SIGINT, SIGTERM and SIGHUP
    blocked, which pipeline/ingest/forkserver_preload.py unblocks once it ignores them (one that
    reaches this process meanwhile waits, and comes after). Call with the forkserver's preload
    already set (forkserver_context), inside helpers_stopped() so that it is stopped with the
    pool. Returns whether it started one."""
    from multiprocessing import forkserver

    from .thread_env import user_set

    if getattr(forkserver._forkserver, "_forkserver_pid", None) is not None:
        return False
    added = {k: v for k, v in env.items() if not user_set(k)}
    added["TRACELAKE_FORKSERVER_PARENT"] = str(os.getpid())
    before = {k: os.environ[k] for k in added if k in os.environ}
    os.environ.update(added)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        for k in added:
            if k in before:
                os.environ[k] = before[k]
            else:
                os.environ.pop(k, None)
    return True


@contextmanager
def helpers_stopped():
    """Run the block; then stop and wait for the multiprocessing forkserver and resource tracker if
    they were started during it (module doc). A forkserver no process pool used (early_start's
    guess was wrong: every file already in the lake, say) is killed rather than waited for: it may
    still be importing its PRELOAD, and it forked nothing."""
    from multiprocessing import forkserver, resource_tracker

    fs, rt = forkserver._forkserver, resource_tracker._resource_tracker
    pools = _POOLS[0]
    fs_before = getattr(fs, "_forkserver_pid", None) is not None
    rt_before = getattr(rt, "_fd", None) is not None
    try:
        if not rt_before:  # started now, deaf to SIGHUP (it ignores SIGINT and SIGTERM itself)
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
            try:
                resource_tracker.ensure_running()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        yield
    except BaseException:
        with signals_deferred(unwinding=True):
            _stop_helpers(fs, rt, fs_before, rt_before, _POOLS[0] == pools)
        raise
    with signals_deferred():
        _stop_helpers(fs, rt, fs_before, rt_before, _POOLS[0] == pools)


def _stop_helpers(fs, rt, fs_before: bool, rt_before: bool, unused: bool = False) -> None:
    if not fs_before and (pid := getattr(fs, "_forkserver_pid", None)) is not None:
        if unused:
            _kill(pid)
        # a worker it forked that is still alive (one no pool recorded) holds its pipe open, and the
        # wait would never end: after STOP_GRACE_S the forkserver is killed, and such a worker
        # with it (init_worker's PR_SET_PDEATHSIG)
        guard = threading.Timer(STOP_GRACE_S, _kill, (pid,))
        guard.start()
        try:
            fs._stop()  # closes the pipe it waits on, then waits for it
        except (OSError, AttributeError):  # already reaped, or a Python without _stop
            pass
        finally:
            guard.cancel()
    if not rt_before and getattr(rt, "_fd", None) is not None:
        if _semaphores_alive():
            gc.collect()
        if not _semaphores_alive():
            try:
                rt._stop()
            except (OSError, AttributeError):
                pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:  # already gone
        pass


def _semaphores_alive() -> bool:
    """Whether a multiprocessing semaphore of this process is still registered with the resource
    tracker (its finalizer will tell the tracker, starting a new one if it was stopped)."""
    from multiprocessing import util
    from multiprocessing.synchronize import SemLock

    return any(
        getattr(f, "_callback", None) is SemLock._cleanup for f in list(util._finalizer_registry.values())
    )


@contextmanager
def signals_deferred(unwinding: bool = False):
    """Hold SIGINT, SIGTERM and SIGHUP back during the block (main thread only; elsewhere the
    block just runs). One that arrives is re-sent to this process afterwards, with its handler
    back in place, unless unwinding (the block runs because of an exception already)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {}
    for sig in _HELD:
        prev = signal.getsignal(sig)
        if prev is None:  # a handler set outside Python: cannot be put back, so leave it
            continue
        old[sig] = prev
        signal.signal(sig, lambda s, _f: caught.append(s))
    try:
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)
        if caught and not unwinding:
            signal.raise_signal(caught[0])
