"""Benchmark: tracelake over an archive of many small jobs (issue 37 item 1), before and after
compaction.

Inputs: a directory made by benchmarks/archive_gen.py (job-NNNN/ directories of small real
Kineto traces). For each lake size (--sizes, in files: the first jobs of the archive), in a
fresh lake:
0. `tracelake ingest JOB_DIR... --lake L -q` (the command itself, start-up and imports included;
   compaction on: the runs' small sources are held in memory and written into each run's
   compacted generation, pipeline/ingest/hold.py): its CPU, the pool's workers and forkserver
   included (getrusage RUSAGE_CHILDREN after the child is reaped, which counts every descendant
   reaped below it), per file; then that lake is removed (--held-only: only this);
1. ingest with compaction off (every source written as parts of its own, the path of every
   ingest before hold.py), the same way;
2. parts in the lake, `tracelake sql "select 1"` and `tracelake analyze --run <first job>
   --recompute` (wall seconds of the whole command) on the uncompacted lake;
3. `tracelake compact`: its CPU, so ingest + compaction per file is what an ingest that compacts
   on its own costs;
4. parts, `select 1`, one run's analyze and the whole lake's analyze (--recompute, CPU seconds of
   the command) on the compacted lake.

  python benchmarks/archive_bench.py ARCHIVE [--sizes 1000 5000] [--ingest-only | --held-only]

Not a test: numbers depend on the machine; docs/performance.md ("Archives") records them.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRACELAKE = [sys.executable, "-m", "pipeline.cli"]
INGEST = """
import sys
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
res = ingest_paths(sys.argv[3:], Lake(sys.argv[2]), jobs=0, compact=sys.argv[1] == "compact")
bad = [r for r in res if r.status != "ok"]
assert not bad, [(r.path, r.status, r.error) for r in bad[:3]]
"""


def child(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of it and every descendant) of a command run to its end."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:6])}...: exit {p.returncode}\n{p.stderr[-2000:]}")
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def parts(lake: Path) -> int:
    return sum(1 for _ in lake.glob("*/run=*/*.parquet"))


def measure(
    archive: Path, files: int, work: Path, ingest_only: bool = False, held_only: bool = False
) -> dict:
    jobs = sorted(p for p in archive.iterdir() if p.is_dir())
    chosen, n = [], 0
    for j in jobs:
        if n >= files:
            break
        chosen.append(j)
        n += sum(1 for _ in j.iterdir())
    lake = work / f"lake{files}"
    shutil.rmtree(lake, ignore_errors=True)
    out: dict = {"files": n, "runs": len(chosen)}
    held = work / f"held{files}"
    shutil.rmtree(held, ignore_errors=True)
    _, out["held_cpu_s"] = child([*TRACELAKE, "ingest", *map(str, chosen), "--lake", str(held), "-q"])
    out["held_parts"] = parts(held)
    shutil.rmtree(held, ignore_errors=True)
    if held_only:
        return out
    _, out["ingest_cpu_s"] = child([sys.executable, "-c", INGEST, "parts", str(lake), *map(str, chosen)])
    out["parts_before"] = parts(lake)
    if ingest_only:
        _, out["compact_cpu_s"] = child([*TRACELAKE, "compact", "--lake", str(lake)])
        return out
    sql = [*TRACELAKE, "sql", "select 1", "--lake", str(lake)]
    one = [*TRACELAKE, "analyze", "--lake", str(lake), "--run", chosen[0].name, "--json", "--recompute"]
    out["select1_before_s"] = min(child(sql)[0] for _ in range(3))
    out["analyze_one_before_s"] = min(child(one)[0] for _ in range(2))
    _, out["compact_cpu_s"] = child([*TRACELAKE, "compact", "--lake", str(lake)])
    out["parts_after"] = parts(lake)
    out["select1_after_s"] = min(child(sql)[0] for _ in range(3))
    out["analyze_one_after_s"] = min(child(one)[0] for _ in range(2))
    out["analyze_all_after_s"], out["analyze_all_after_cpu_s"] = child(
        [*TRACELAKE, "analyze", "--lake", str(lake), "--json", "--recompute"]
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive", type=Path)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument(
        "--ingest-only", action="store_true", help="only the two ingests and the compaction (no queries)"
    )
    ap.add_argument("--held-only", action="store_true", help="only `tracelake ingest` (step 0)")
    ap.add_argument(
        "--work", type=Path, default=None, help="where the lakes go (default: a temporary directory)"
    )
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="archive-bench-"))
    rows = []
    for size in a.sizes:
        r = measure(a.archive, size, work, a.ingest_only, a.held_only)
        rows.append(r)
        f, ms = r["files"], lambda k: 1000 * r[k] / r["files"]
        if a.held_only:
            print(
                f"{f} files, {r['runs']} runs: `tracelake ingest` {ms('held_cpu_s'):.1f} ms CPU/file "
                f"(every process, imports included), {r['held_parts']} parts (target: under 15 ms)",
                flush=True,
            )
            continue
        print(
            f"{f} files, {r['runs']} runs: `tracelake ingest` as it is (compaction on, small sources held "
            f"and written into each run's generation) {ms('held_cpu_s'):.1f} ms CPU/file, {r['held_parts']} "
            f"parts; as parts, then compacted: {ms('ingest_cpu_s'):.1f} + {ms('compact_cpu_s'):.1f} = "
            f"{ms('ingest_cpu_s') + ms('compact_cpu_s'):.1f} ms CPU/file (x"
            f"{(r['ingest_cpu_s'] + r['compact_cpu_s']) / r['held_cpu_s']:.2f})",
            flush=True,
        )
        if a.ingest_only:
            continue
        print(
            f"{f} files, {r['runs']} runs: ingest {ms('ingest_cpu_s'):.1f} ms CPU/file + compact "
            f"{ms('compact_cpu_s'):.1f} = {ms('ingest_cpu_s') + ms('compact_cpu_s'):.1f} ms CPU/file (all "
            f"processes); parts {r['parts_before']} -> {r['parts_after']}; select 1 "
            f"{r['select1_before_s']:.2f} -> {r['select1_after_s']:.2f} s; analyze one run "
            f"{r['analyze_one_before_s']:.2f} -> {r['analyze_one_after_s']:.2f} s; whole lake analyze "
            f"{r['analyze_all_after_s']:.1f} s wall, {r['analyze_all_after_cpu_s']:.1f} CPU s",
            flush=True,
        )
    if len(rows) > 1 and not a.ingest_only:
        a0, a1 = rows[0], rows[-1]
        c0, c1 = a0["analyze_all_after_cpu_s"], a1["analyze_all_after_cpu_s"]
        print(
            f"whole-lake analyze CPU: {1000 * c0 / a0['files']:.2f} ms a file at {a0['files']} files, "
            f"{1000 * c1 / a1['files']:.2f} at {a1['files']} (totals x{c1 / c0:.2f} for x"
            f"{a1['files'] / a0['files']:.1f} the files)"
        )
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
