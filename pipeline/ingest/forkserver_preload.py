"""Imported only by the forkserver of ingest's process pool (executors.run_pool names it in
set_forkserver_preload, before pipeline.ingest.executors): it makes the forkserver die with the
ingesting process that started it.

Pool workers already die with their parent (executors.init_worker sets PR_SET_PDEATHSIG), but
their parent is the forkserver, not the ingest: after a `kill -9` of the ingest the forkserver
lived on, so did its workers (about 0.6 GB) and the resource tracker, which waits for every
holder of its pipe to exit. With the forkserver armed the same way, killing the ingest takes the
forkserver, then its workers, then (its pipe closed) the resource tracker with it. Linux only;
elsewhere importing this does nothing. Never import it from the ingesting process: it would then
die with its own parent (the shell).

It also makes the forkserver ignore SIGTERM, SIGHUP and SIGINT: a signal sent to the whole
process group (a CI job cancelled, a terminal closed, a Ctrl-C) must not end it before the ingest
has stopped the workers it forked, which would leave them orphans; the ingest stops it once they
are gone (pool_scope.helpers_stopped), and its death still ends it. multiprocessing has it ignore
SIGINT only after its preload, so a Ctrl-C while it imported printed its KeyboardInterrupt
traceback on the command's stderr: the ingest starts it with the three signals blocked
(pool_scope.forkserver_started), and they are unblocked here, once ignored.

The ingest's pid comes in TRACELAKE_FORKSERVER_PARENT: a forkserver whose parent is another
process by the time it arms (the ingest died first, and it was re-parented to init or to a child
subreaper) exits at once.
"""

from __future__ import annotations

import os
import signal
import sys


def _arm() -> None:
    if "multiprocessing.forkserver" not in sys.modules:  # not a forkserver: leave this process be
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    parent = os.environ.get("TRACELAKE_FORKSERVER_PARENT", "")
    if os.getppid() == 1 or parent.isdigit() and os.getppid() != int(parent):  # the ingest died first
        os._exit(0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})


_arm()
