"""Benchmark: a job whose ranks wait for a peer at every collective, analysed from per-source
results against the full metric files on the same lake.

The per-source path (pipeline/local.py, queries/local/*.sql) splits exposed communication into
waiting and transfer at analysis: it measures each wait-only segment against the compute that
lies under communication (local_comm_cover, stored per source). Those are two sets of disjoint
intervals per rank; comparing every segment with every piece made the three metrics quadratic
(a rank of 400k compute kernels and 20k late collectives: 3.3-3.8 CPU-s each, against 0.2-0.3
when each segment finds its pieces by ASOF joins; and computing local_comm_cover itself compared
every compute piece of a rank with every communication piece). This prints, per metric, the
seconds of the per-source path and of the full file (queries/<metric>.sql on a connection that
never reads per-source results) and checks that their rows are equal.

The job: two ranks (tests/test_interval_property.py collective_lake: compute kernels on one
stream, all-reduces of one process group on another), N compute kernels of 5 us every 10 us and
M all-reduces; rank 1 reaches every all-reduce 10 us after rank 0, so rank 0 waits 10 us at each
(its kernel runs 30 us, rank 1's 20 us), and 10 step windows. Per-source results are computed
first (local_fill.backfill; printed: the time the first analysis of such a run spends on them).

  python benchmarks/wait_bench.py [--kernels 400000] [--collectives 20000] [--work DIR]

Needs the test extra (the lake is written by the tests' helper). Not a test: numbers depend on
the machine; docs/performance.md records them with this command.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from test_interval_property import collective_lake  # noqa: E402

from pipeline import local_fill, query  # noqa: E402

METRICS = ("breakdown", "step_time", "phases", "collective_exposure")


def job(n: int, m: int) -> tuple[dict[int, list], dict[int, list]]:
    """(rank -> activities as collective_lake takes them, rank -> step windows)."""
    ranks = {}
    gap = n * 10_000 // m
    for r in (0, 1):
        acts = [(i * 10_000, 5_000, False, 0) for i in range(n)]
        late, dur = (2_000, 30_000) if r == 0 else (12_000, 20_000)
        acts += [(j * gap + late, dur, True, 0) for j in range(m)]
        ranks[r] = acts
    span = n * 10_000
    return ranks, {r: [(k * span // 10, (k + 1) * span // 10) for k in range(10)] for r in ranks}


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=400_000)
    ap.add_argument("--collectives", type=int, default=20_000)
    ap.add_argument("--work", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.work) as d:
        ranks, steps = job(a.kernels, a.collectives)
        lake, w, _ = timed(lambda: collective_lake(d, ranks, steps))
        shape = f"2 ranks x ({a.kernels:,} compute kernels + {a.collectives:,} all-reduces)"
        print(f"job: {shape}; lake written in {w:.1f} s")
        n, w, c = timed(lambda: local_fill.backfill(lake, min_rows=0))
        print(f"per-source results of {n} sources: {w:.2f} s, {c:.2f} CPU-s")
        local, full = query.connect(lake), query.connect(lake, local_results=False)
        used = local.execute("SELECT getvariable('use_local')").fetchall()[0][0]
        assert used, "per-source results not used"
        (waits,) = local.execute("SELECT count(*) FROM wait_only WHERE level = 'rank'").fetchall()[0]
        print(f"wait-only segments (level rank): {waits:,}")
        head = ("metric", "per-source s", "CPU-s", "full s", "CPU-s", "ratio")
        print("{:22s} {:>12s} {:>7s} {:>8s} {:>7s} {:>6s}".format(*head))
        for name in METRICS:
            got, lw, lc = timed(lambda: query.run(local, name))
            ref, fw, fc = timed(lambda: query.run(full, name))
            assert got.equals(ref), f"{name}: per-source rows differ from the full file's"
            print(f"{name:22s} {lw:12.2f} {lc:7.2f} {fw:8.2f} {fc:7.2f} {fw / lw:5.1f}x")


if __name__ == "__main__":
    main()
