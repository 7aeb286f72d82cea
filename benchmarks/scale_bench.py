"""Benchmark at archive scale: ingest throughput and memory, analysis and report time from 8 to
512 ranks, printed in one run with ratios against HTA and the parse floor.

  python benchmarks/scale_bench.py [--source TRACE] [--ranks 8] [--mb-per-rank 50] [--big-mb 2048]
                                   [--kernels 10000] [--big-kernels 100000] [--skip-hta] [--skip-big]
                                   [--skip-ingest] [--skip-analysis] [--work DIR]

Inputs come from benchmarks/scale_trace.py (default source: HTA's sampled_rank-0, a real rank of
a 128-rank NCCL job, scaled keeping its shape):
1. ingest: `--ranks` rank files of `--mb-per-rank` MB of JSON each, gzip'd as archived traces
   are; each side in a fresh child process (os.wait4: that process's own peak RSS; a pool's
   workers are reported apart), timed after imports:
   - the parse floor: gunzip + a typed msgspec decode of every event of the same bytes (one
     process; and the same over a process pool of all cores);
   - HTA 0.5.0 TraceAnalysis(trace_dir) load of the same directory (HTA parses ranks with a
     multiprocessing pool of its own);
   - tracelake ingest with --jobs 1 and with all cores (ingest_paths, timed after imports), and
     the `tracelake ingest` command the same two ways, whole (start-up and imports included:
     the command starts its pool's forkserver before its own imports, pipeline/pool_scope.py);
   - traces -> answers, end to end: HTA's load + get_temporal_breakdown + get_comm_comp_overlap
     + get_idle_time_breakdown against tracelake's ingest (all cores) + analyze (every metric,
     the verdict and findings), each in one fresh process (--skip-answers leaves it out).
2. one uncompressed trace of `--big-mb` MB: tracelake ingest time and peak RSS (streaming: the
   target is under 3 GB for 2 GB); HTA and the floor are not run on it (each holds the whole
   file as Python objects).
3. analysis (pipeline.analyze.analyze: every metric) and report (HTML render) time for lakes of
   8, 64 and 512 ranks x `--kernels` kernels, and for 64 ranks x `--big-kernels` kernels. Those
   lakes are written by scale_trace.write_lake (the source ingested once, its rows repeated:
   the same rows as ingesting the scaled JSON, which scale_trace.py --check verifies), then
   given the per-source results a run's first analysis stores for sources of that size
   (pipeline/local_fill.py backfill; "local s": the time that takes, which the first analysis of an
   ingested lake spends in local_fill.fill). In 1., traces -> answers counts it (the analysis is the
   lake's first).
Not a test: numbers depend on the machine; record them in docs/performance.md with this command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import scale_trace  # noqa: E402

# each child prints "RESULT <seconds> <extra>" (DuckDB may print progress bars around it)
FLOOR = """
import sys, time, msgspec, os
from concurrent.futures import ProcessPoolExecutor
from isal import igzip
from pipeline.ingest.kineto import KEvent  # ph, cat, name, pid, tid; ts, dur and args as raw text
class T(msgspec.Struct):
    traceEvents: list[KEvent] = []
def one(f):
    raw = open(f, 'rb').read()
    data = igzip.decompress(raw) if raw[:2] == b'\\x1f\\x8b' else raw
    return len(msgspec.json.decode(data, type=T).traceEvents)
jobs = int(sys.argv[1]); files = sys.argv[2:]
if jobs > 1:
    with ProcessPoolExecutor(jobs) as p:
        list(p.map(one, files[:jobs]))  # start the workers before the clock
        t = time.perf_counter(); n = sum(p.map(one, files))
else:
    t = time.perf_counter(); n = sum(map(one, files))
print("RESULT", time.perf_counter() - t, n)
"""
# the imports of FLOOR and INGEST alone: their CPU is taken off the CPU ratio (LAST_CPU counts it)
IMPORTS = """
import sys
if sys.argv[1] == "floor":
    import msgspec
    from isal import igzip
    from pipeline.ingest.kineto import KEvent
else:
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake
print("RESULT", 0, 0)
"""
INGEST = """
import os, sys, time, threading
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
peak, stop = [0], threading.Event()
def workers():  # the pool's workers' own peak RSS (VmHWM), sampled: they are not our children to wait for
    while not stop.wait(0.05):
        kids, me = {}, os.getpid()
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    kids[int(p)] = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        mine, grew = {me}, True
        while grew:
            new = {p for p, pp in kids.items() if pp in mine and p not in mine}
            grew, mine = bool(new), mine | new
        for p in mine - {me}:
            try:
                hwm = [l for l in open(f"/proc/{p}/status") if l.startswith("VmHWM")]
                peak[0] = max(peak[0], int(hwm[0].split()[1]) // 1024)
            except (OSError, IndexError):
                pass
th = threading.Thread(target=workers, daemon=True); th.start()
t = time.perf_counter()
res = ingest_paths(sys.argv[3:], Lake(sys.argv[2]), run="bench", jobs=int(sys.argv[1]))
el = time.perf_counter() - t
stop.set(); th.join()
assert all(r.status == "ok" for r in res), [r.error for r in res if r.status != "ok"]
print("RESULT", el, peak[0])
"""
# the `tracelake ingest` command, whole: its process and every one it starts (wait4 counts them)
COMMAND = """
import subprocess, sys, time
t = time.perf_counter()
subprocess.run([sys.executable, "-m", "pipeline.cli", *sys.argv[1:]], check=True, stdout=subprocess.DEVNULL)
print("RESULT", time.perf_counter() - t, 0)
"""
HTA = """
import sys, time, logging, warnings
warnings.filterwarnings("ignore")
from hta.configs.config import logger
logger.setLevel(logging.ERROR)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
if sys.argv[2:] == ["answers"]:  # the four calls for "where did the time go" (small_job.py's)
    a.get_temporal_breakdown(visualize=False)
    a.get_comm_comp_overlap(visualize=False)
    a.get_idle_time_breakdown(ranks=sorted(a.t.traces), visualize=False)
print("RESULT", time.perf_counter() - t, len(a.t.traces))
"""
ANSWERS = """
import sys, time
from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
t = time.perf_counter()
lake = Lake(sys.argv[2])
res = ingest_paths([sys.argv[3]], lake, run="bench", jobs=int(sys.argv[1]))
assert all(r.status == "ok" for r in res), [r.error for r in res if r.status != "ok"]
doc = analyze(lake)
print("RESULT", time.perf_counter() - t, len(doc["ranks"]))
"""
ANALYZE = """
import sys, time
from pipeline.analyze import analyze
from pipeline.lake import Lake
from pipeline.report.html import render
t = time.perf_counter()
res = analyze(Lake(sys.argv[1]))
a = time.perf_counter() - t
t = time.perf_counter()
html = render(res)
print("RESULT", a, time.perf_counter() - t)
"""


# CPU seconds (user + system) of the last child() run, imports included, with every descendant it
# reaped (a pool's workers and forkserver: wait4's rusage counts them; issue 38 asks for it)
LAST_CPU = [0.0]


def child(code: str, *args: str, timeout: float | None = None):
    """(seconds of the timed section, the rest of its last line, peak RSS MB of the child
    process itself) of `python -c code args`; None when it ran past `timeout` seconds (killed).
    Its CPU seconds go to LAST_CPU."""
    p = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(p.stdout.read()), daemon=True)
    reader.start()
    start = time.monotonic()
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)  # wait4: this child's own rusage
        if pid:
            break
        if timeout is not None and time.monotonic() - start > timeout:
            p.kill()
            os.wait4(p.pid, 0)
            p.returncode = -9
            return None
        time.sleep(0.05)
    p.returncode = status
    LAST_CPU[0] = ru.ru_utime + ru.ru_stime
    reader.join()
    if status != 0:
        raise SystemExit(f"child failed ({status}): {code.strip().splitlines()[0]} ...")
    text = b"".join(chunks).decode(errors="replace")
    last = text[text.rindex("RESULT ") + 7 :].splitlines()[0].split()
    return float(last[0]), " ".join(last[1:]), ru.ru_maxrss / 1024


def uncompressed_mb(files) -> float:
    from isal import igzip

    n = 0
    for f in files:
        with igzip.open(f) if str(f).endswith(".gz") else open(f, "rb") as fh:
            while b := fh.read(1 << 24):
                n += len(b)
    return n / 1e6


def line(name, secs, mb, rss, extra=""):
    print(f"{name:52s} {secs:8.2f} {mb / secs:8.1f} {rss:10.0f}  {extra}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=scale_trace.DEFAULT_SOURCE)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb-per-rank", type=float, default=50)
    ap.add_argument("--big-mb", type=float, default=2048)
    ap.add_argument("--kernels", type=int, default=2_000)
    ap.add_argument("--big-kernels", type=int, default=100_000)
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--skip-answers", action="store_true", help="leave out traces -> answers (1.)")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-ingest", action="store_true", help="only the analysis part (3.)")
    ap.add_argument("--skip-analysis", action="store_true", help="only the ingest parts (1. and 2.)")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    ap.add_argument(
        "--timeout", type=float, default=900, help="seconds an analysis may take before it is stopped"
    )
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(dir=a.work))
    try:
        print(
            f"source: {a.source}; {cores} cores; load average {os.getloadavg()[0]:.1f} "
            "(wall figures need a quiet machine)\n"
        )
        # ---------------------------------------------------------------- 1. ingest
        if a.skip_ingest:
            a.skip_big = True
        traces = work / "traces"
        t = time.perf_counter()
        files = (
            []
            if a.skip_ingest
            else scale_trace.write_traces(a.source, traces, a.ranks, None, a.mb_per_rank, gz=True)
        )
        if not a.skip_ingest:
            mb = uncompressed_mb(files)
            print(
                f"1. ingest {len(files)} rank files, {mb:.0f} MB of JSON "
                f"({sum(f.stat().st_size for f in files) / 1e6:.0f} MB gzip'd; "
                f"generated in {time.perf_counter() - t:.0f} s)"
            )
            print(f"{'':52s} {'wall s':>8s} {'MB/s':>8s} {'peak RSS MB':>10s}")
            fs = [str(f) for f in files]
            floor1, n_ev, floor1_rss = child(FLOOR, "1", *fs)
            floor1_cpu = LAST_CPU[0]
            line(
                "parse floor (gunzip + typed decode), 1 process",
                floor1,
                mb,
                floor1_rss,
                f"{n_ev} events, {floor1_cpu:.1f} CPU-s",
            )
            floorn, _, floorn_rss = child(FLOOR, str(cores), *fs)
            line(f"parse floor, {cores} processes", floorn, mb, floorn_rss, "(parent only)")
            ing1, _, ing1_rss = child(INGEST, "1", str(work / "lake1"), str(traces))
            ing1_cpu = LAST_CPU[0]
            line("tracelake ingest --jobs 1", ing1, mb, ing1_rss, f"{ing1_cpu:.1f} CPU-s")
            ingn, wrss, ingn_rss = child(INGEST, str(cores), str(work / "lakeN"), str(traces))
            line(
                f"tracelake ingest --jobs {cores}",
                ingn,
                mb,
                ingn_rss,
                f"(workers: {wrss} MB each at most), {LAST_CPU[0]:.1f} CPU-s with workers and forkserver",
            )
            cmd = {}
            for n in ("1", str(cores)):
                lk = str(work / f"lakeC{n}")
                cmd[n] = child(COMMAND, "ingest", str(traces), "-l", lk, "--run", "bench", "--jobs", n, "-q")[
                    0
                ]
                line(
                    f"`tracelake ingest --jobs {n}` (the command, whole)",
                    cmd[n],
                    mb,
                    float("nan"),
                    f"{LAST_CPU[0]:.1f} CPU-s",
                )
            hta = None
            if not a.skip_hta:
                hta, hta_ranks, hta_rss = child(HTA, str(traces))
                if int(hta_ranks) != a.ranks:  # the same work on both sides, or no comparison
                    raise SystemExit(f"HTA loaded {hta_ranks} of the {a.ranks} ranks: not the same work")
                line("HTA 0.5.0 TraceAnalysis load (its own process pool)", hta, mb, hta_rss, "(parent only)")
            print()
            if hta:
                print(
                    f"ingest vs HTA load: {hta / ingn:.1f}x faster (all cores; --jobs 1: {hta / ing1:.1f}x)"
                )
            imp = {}
            for side in ("floor", "ingest"):
                child(IMPORTS, side)
                imp[side] = LAST_CPU[0]
            print(
                f"ingest vs parse floor: {ing1 / floor1:.2f}x the floor's time on 1 core, "
                f"{ingn / floorn:.2f}x on {cores}   target <= 6x per core (issue 38); in CPU seconds "
                f"after imports (--jobs 1; less sensitive to load than walls): "
                f"{(ing1_cpu - imp['ingest']) / (floor1_cpu - imp['floor']):.2f}x"
            )
            print(
                f"--jobs {cores} against --jobs 1: {ing1 / ingn:.2f}x after imports, "
                f"{cmd['1'] / cmd[str(cores)]:.2f}x the command whole   target >= 1.7x from 1 to 2 "
                f"workers on an idle machine (load average now {os.getloadavg()[0]:.1f})"
            )
            if not a.skip_hta and not a.skip_answers:
                print(f"\n{'traces -> answers':52s} {'wall s':>8s} {'MB/s':>8s} {'peak RSS MB':>10s}")
                ours, n_ours, ours_rss = child(ANSWERS, str(cores), str(work / "lakeA"), str(traces))
                line(f"tracelake ingest --jobs {cores} + analyze", ours, mb, ours_rss, f"({n_ours} ranks)")
                theirs, n_theirs, theirs_rss = child(HTA, str(traces), "answers")
                if int(n_theirs) != int(n_ours):
                    raise SystemExit(f"HTA loaded {n_theirs} ranks, tracelake {n_ours}: not the same work")
                line("HTA load + temporal + overlap + idle", theirs, mb, theirs_rss, "(parent only)")
                print(
                    f"traces -> answers: tracelake {theirs / ours:.1f}x faster than HTA   target >= 5x "
                    f"(issue 38; load average now {os.getloadavg()[0]:.1f})"
                )
        # ---------------------------------------------------------------- 2. one big trace
        if not a.skip_big:
            big = work / "big"
            t = time.perf_counter()
            (bf,) = scale_trace.write_traces(a.source, big, 1, None, a.big_mb, gz=False)
            bmb = bf.stat().st_size / 1e6
            print(
                f"\n2. one uncompressed trace of {bmb:.0f} MB (generated in {time.perf_counter() - t:.0f} s)"
            )
            secs, _, rss = child(INGEST, "1", str(work / "lakebig"), str(bf))
            line("tracelake ingest (streamed)", secs, bmb, rss)
            print(f"peak RSS {rss / 1024:.2f} GB for {bmb / 1024:.2f} GB of JSON   target < 3 GB for 2 GB")
            shutil.rmtree(big)
        shutil.rmtree(traces, ignore_errors=True)
        # ---------------------------------------------------------------- 3. analysis
        if a.skip_analysis:
            return
        print("\n3. analysis (every metric) and report (HTML) of lakes of N ranks x K kernels")
        print(
            f"{'':30s} {'rows':>12s} {'write s':>8s} {'local s':>8s} "
            f"{'analysis s':>11s} {'report s':>9s} {'peak RSS MB':>12s}"
        )
        times = {}
        for ranks, kernels in ((8, a.kernels), (64, a.kernels), (512, a.kernels), (64, a.big_kernels)):
            d = work / f"lake_{ranks}x{kernels}"
            t = time.perf_counter()
            info = scale_trace.write_lake(a.source, d, ranks, kernels)
            w = time.perf_counter() - t - info["local_s"]
            r = child(ANALYZE, str(d), timeout=a.timeout)
            label = f"{ranks} ranks x {info['kernels_per_rank']} kernels"
            if r is None:
                times[(ranks, kernels)] = float("inf")
                print(
                    f"{label:30s} {info['rows_per_rank'] * ranks:12,d} {w:8.1f} {info['local_s']:8.1f}  "
                    f"not finished in {a.timeout:.0f} s (stopped)"
                )
            else:
                an, rep, rss = r
                rep = float(rep)
                times[(ranks, kernels)] = an + rep
                print(
                    f"{label:30s} {info['rows_per_rank'] * ranks:12,d} {w:8.1f} {info['local_s']:8.1f} "
                    f"{an:11.2f} {rep:9.2f} {rss:12.0f}"
                )
            shutil.rmtree(d)
        k = a.kernels
        growth = times[(512, k)] / times[(8, k)]
        print(
            f"\ncost 8 -> 512 ranks (analysis + report): {growth:.1f}x for 64x the ranks = "
            f"{growth / 64:.2f}x linear   target <= 1.2x"
        )
        g2 = times[(512, k)] / times[(64, k)]
        print(
            f"cost 64 -> 512 ranks: {g2:.1f}x for 8x the ranks = {g2 / 8:.2f}x linear "
            "(less fixed cost in the ratio)"
        )
        big = times[(64, a.big_kernels)]
        print(
            f"64 ranks x {a.big_kernels} kernels, all metrics + report: {big:.1f} s   "
            "target < 10 s on 2 cores"
        )
        print("(times exclude interpreter start-up and imports; peak RSS is each child's own)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
