"""Hand-made Nsight Systems exports of one process on one GPU whose iterations are known by
construction (tests/test_nsys_steps.py, tests/test_diff.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

GP = 100 << 24  # globalPid of process 100 (nsys: pid << 24)
TID = GP | 101  # globalTid of its thread 101
MS = 1_000_000
NAMES = {1: "A", 2: "B", 3: "C", 4: "D"}
LOOP = (1, 2, 3, 2, 4)  # kernels A B C B D


def export(
    path: Path,
    iterations: int,
    nvtx: list[tuple[int, int, str]] = (),
    period_ns: int | None = 10 * MS,
    dur_ns: dict[str, int] | None = None,
    idle_ns=lambda k: 2 * MS,
) -> None:
    """Each iteration k waits idle_ns(k) (data loading) and then runs kernels A B C B D back to
    back (dur_ns[name], default 1 ms each), each launched 10 us before it starts
    (cudaLaunchKernel rows with the kernel's correlation id). With period_ns iteration k starts at
    k * period_ns (then idle, then kernels); with period_ns None each iteration starts where the
    previous one's last kernel ended (a GPU-bound loop). nvtx: extra NVTX push/pop ranges
    (start, end, text) on the launching thread."""
    dur_ns = dur_ns or {}
    c = sqlite3.connect(path)
    c.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, "end" INT, deviceId INT, contextId INT,
          streamId INT, correlationId INT, globalPid INT, shortName INT, demangledName INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, "end" INT, eventClass INT, globalTid INT,
          correlationId INT, nameId INT);
        CREATE TABLE NVTX_EVENTS (start INT, "end" INT, eventType INT, text TEXT, textId INT,
          globalTid INT, domainId INT);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.25.0');
        INSERT INTO StringIds VALUES (1, 'A'), (2, 'B'), (3, 'C'), (4, 'D'), (9, 'cudaLaunchKernel_v7000');
        """
    )
    corr, t_end = 0, 0
    for k in range(iterations):
        t = (k * period_ns if period_ns is not None else t_end) + idle_ns(k)
        for name in LOOP:
            corr += 1
            d = dur_ns.get(NAMES[name], MS)
            c.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 9)",
                (t - 10_000, t - 5_000, TID, corr),
            )
            c.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, 7, ?, ?, ?, ?)",
                (t, t + d, corr, GP, name, name),
            )
            t += d
        t_end = t
    for s, e, text in nvtx:
        c.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, NULL, ?, 0)", (s, e, text, TID))
    c.commit()
    c.close()
