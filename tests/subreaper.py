"""Run a command as a child of a child subreaper and report what it left behind (Linux).

    python tests/subreaper.py [--signal NAME --when FILE [--group]] -- COMMAND...

This process makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so every process the
command starts that outlives its own parent is re-parented here, not to init. It runs COMMAND,
sends it the signal NAME (TERM, INT, HUP) once FILE exists (with --signal; --group: to its whole
process group, as a Ctrl-C at a terminal or a cancelled CI job does), waits for it, and then
lists the processes whose parent is this process: anything the command started that was still
alive, or dead but not yet reaped by anyone of the command's own processes, when it exited.
Those are killed and reaped before this process exits. Prints one JSON object: {"pid": the
command's pid, "rc": its return code (negative: the signal that ended it), "output": its stdout
and stderr, "left": [[pid, state, cmdline], ...]}.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command line) of the processes whose parent is pid, from /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append((int(d), fields[0], cmd))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--signal")
    ap.add_argument("--when")
    ap.add_argument("--group", action="store_true")
    ap.add_argument("command", nargs="+")
    a = ap.parse_args()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    p = subprocess.Popen(a.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0)
    if a.signal:
        deadline = time.monotonic() + 120
        while not os.path.exists(a.when) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if p.poll() is None:
            sig = getattr(signal, "SIG" + a.signal)
            os.killpg(p.pid, sig) if a.group else p.send_signal(sig)
    out, _ = p.communicate(timeout=300)
    left = children(os.getpid())
    while True:  # kill and reap them all, and whatever they leave in turn
        for pid, _, _ in children(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    json.dump(
        {"pid": p.pid, "rc": p.returncode, "output": out.decode(errors="replace"), "left": left}, sys.stdout
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
