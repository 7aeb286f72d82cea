"""Benchmark: ingest an Nsight Systems SQLite export; kernel rows per second and peak RSS.

Prints, in one run, for the export (default: the largest SQLite under ../shared/corpus/nsys):
- the read floor: Python's sqlite3 reading every row of the tables tracelake stages (the same
  columns, in chunks), the least any ingest through sqlite3 must do;
- tracelake ingest (stage in DuckDB, map, write the Parquet lake).
Each side runs in a fresh child process (os.wait4 gives the child's own peak RSS), best of
--repeat runs; the ratio ingest / read floor is printed.

--scale K writes a K-times larger copy first (kernels, memcpy, memset, runtime and NVTX rows
repeated K times, each copy shifted by the capture length, correlation ids offset), to show that
peak RSS stays bounded as the file grows.

  python benchmarks/nsys_ingest.py [EXPORT.sqlite] [--scale K] [--repeat N]

Not a test: numbers depend on the machine; record them in docs/performance.md with this command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from ingest_vs_hta import REPO, child  # one child-process runner for every benchmark

CORPUS = REPO.parent / "shared" / "corpus" / "nsys"

INGEST = """
import sys, time
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
t = time.perf_counter()
(r,) = ingest_paths([sys.argv[1]], Lake(sys.argv[2]), run="bench")
print(time.perf_counter() - t)
assert r.status == "ok", r.error
"""
READ_FLOOR = """
import sys, time, sqlite3
from pipeline.ingest.nsys import STAGE, CHUNK_ROWS
t = time.perf_counter()
con = sqlite3.connect("file:" + sys.argv[1] + "?mode=ro&immutable=1", uri=True)
con.text_factory = lambda b: b.decode("utf-8", "replace")
tabs = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
for src, cols in STAGE.values():
    if src in tabs:
        have = {r[1] for r in con.execute(f'PRAGMA table_info("{src}")')}
        cur = con.execute("SELECT " + ", ".join(f'"{c}"' if c in have else "NULL" for c in cols) \
+ f' FROM "{src}"')
        while cur.fetchmany(CHUNK_ROWS):
            pass
print(time.perf_counter() - t)
"""


def scaled_copy(src: Path, dest: Path, k: int) -> None:
    """Copy of `src` with its event tables repeated k times (time-shifted, correlation ids offset)."""
    shutil.copy(src, dest)
    os.chmod(dest, 0o644)
    con = sqlite3.connect(dest)
    span = con.execute('SELECT max("end") - min(start) + 1 FROM CUPTI_ACTIVITY_KIND_KERNEL').fetchone()[0]
    corr = con.execute("SELECT max(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    tabs = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
        "NVTX_EVENTS",
    ):
        if t not in tabs:
            continue
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
        con.execute(f"CREATE TEMP TABLE base AS SELECT * FROM {t}")
        for i in range(1, k):
            sel = []
            for c in cols:
                if c in ("start", "end"):
                    sel.append(f'"{c}" + {i * span}')
                elif c == "correlationId":
                    sel.append(f'"{c}" + {i * corr}')
                else:
                    sel.append(f'"{c}"')
            con.execute(f"INSERT INTO {t} SELECT {', '.join(sel)} FROM base")
        con.execute("DROP TABLE base")
    con.commit()
    con.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export", nargs="?")
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    export = Path(a.export) if a.export else max(CORPUS.rglob("*.sqlite"), key=lambda p: p.stat().st_size)
    with tempfile.TemporaryDirectory() as tmp:
        if a.scale > 1:
            big = Path(tmp) / f"{export.stem}_x{a.scale}.sqlite"
            scaled_copy(export, big, a.scale)
            export = big
        con = sqlite3.connect(f"file:{export}?mode=ro&immutable=1", uri=True)
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        rows = sum(
            con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
            for (t,) in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ("
                "'CUPTI_ACTIVITY_KIND_KERNEL', "
                "'CUPTI_ACTIVITY_KIND_MEMCPY', 'CUPTI_ACTIVITY_KIND_MEMSET', 'CUPTI_ACTIVITY_KIND_RUNTIME', "
                "'CUPTI_ACTIVITY_KIND_SYNCHRONIZATION', 'NVTX_EVENTS')"
            ).fetchall()
        )
        con.close()
        print(
            f"export: {export.name} ({export.stat().st_size / 1e6:.1f} MB, "
            f"{kernels} kernels, {rows} event rows)"
        )
        res = {}
        for name, code, args in (
            ("read floor (sqlite3, same columns)", READ_FLOOR, lambda i: [str(export)]),
            (
                "tracelake ingest (stage + map + Parquet)",
                INGEST,
                lambda i: [str(export), str(Path(tmp) / f"lake{i}")],
            ),
        ):
            runs = [child(code, *args(i)) for i in range(a.repeat)]
            res[name] = (min(w for w, _ in runs), max(r for _, r in runs))
    print(f"{'':42s} {'wall s':>8s} {'kernel rows/s':>14s} {'event rows/s':>13s} {'peak RSS MB':>12s}")
    for name, (w, r) in res.items():
        print(f"{name:42s} {w:8.2f} {kernels / w:14,.0f} {rows / w:13,.0f} {r:12.0f}")
    floor, ours = res["read floor (sqlite3, same columns)"], res["tracelake ingest (stage + map + Parquet)"]
    print(
        f"\ningest time vs read floor: {ours[0] / floor[0]:.2f}x   "
        f"ingest peak RSS vs read floor: {ours[1] / floor[1]:.2f}x"
    )
    print("(times exclude interpreter start-up and imports; peak RSS is each child's whole life)")


if __name__ == "__main__":
    main()
