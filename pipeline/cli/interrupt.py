"""Signals that stop a command cleanly: within signals_interrupt(), SIGINT, SIGTERM and SIGHUP
raise Interrupted in the main thread, so the command unwinds (an ingest stops and waits for the
processes it started: pipeline/pool_scope.py) and exits with 128 + the signal's number,
the code a shell reports for a process the signal ended (130, 143, 129)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stopping signal arrived (a KeyboardInterrupt, so code that cleans up after one does so)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum


def _raise(signum, _frame) -> None:
    raise Interrupted(signum)


@contextmanager
def signals_interrupt():
    """During the block, SIGINT, SIGTERM and SIGHUP raise Interrupted (main thread only: elsewhere
    the block runs with the handlers as they are); the previous handlers are restored after. A
    signal ignored on entry (SIG_IGN, e.g. SIGHUP under nohup) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}
    for sig in SIGNALS:
        prev = signal.getsignal(sig)
        if prev is None or prev == signal.SIG_IGN:
            continue
        old[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, prev in old.items():
            signal.signal(sig, prev)
