"""Benchmark: ingest on a Dask cluster against the process pool, per worker (issue 38 item 4:
`--jobs N` scaling at least 1.7x from 1 to 2 workers on an idle 2-core machine, "and the Dask
path the same per worker").

Inputs: `--ranks` rank files of `--mb-per-rank` MB of Kineto JSON each, gzip'd
(benchmarks/scale_trace.py, from HTA's sampled_rank-0, as scale_bench.py makes them), or the
rank files of --traces DIR. Each ingest runs in a fresh child process (`ingest_paths` as
`tracelake ingest` calls it; imports before the clock), into a fresh lake:
- `--jobs 1` (this process alone) and `--jobs 2` (a process pool of 2 workers);
- `--scheduler` on a local Dask cluster of 1, then 2 workers of one thread each (a `dask
  scheduler` and `dask worker --nthreads 1` processes started here, on 127.0.0.1), each cluster
  warmed first by the ingest of one small real trace into a lake that is then removed (a
  long-lived cluster's workers have imported tracelake already; the first task on a fresh
  worker pays the imports once).
Printed per ingest: wall seconds of the timed section, and CPU seconds of every process that
worked for it: the child with every descendant it reaped (wait4: a pool's forkserver and
workers) and, for the Dask runs, the scheduler's and workers' CPU time over the same interval
(psutil, read before and after). Then the ratios the issue asks for: 2 against 1 worker for
the pool and for Dask (target >= 1.7x on an idle machine), and Dask against the pool at the same
number of workers (the same per worker: about 1.0x).

  python benchmarks/dask_ingest.py [--ranks 8] [--mb-per-rank 50] [--traces DIR] [--work DIR]

Needs the dask extra (`pip install -e '.[dask]'`). Not a test: numbers depend on the machine;
docs/performance.md records them with this command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import scale_trace  # noqa: E402

# a small real trace the clusters are warmed with (one task per worker)
WARM = REPO.parent / "shared" / "corpus" / "hta" / "tests" / "data" / "critical_path" / "simple_add"

# the child: "RESULT <seconds>" after the ingest; every input must be ingested
INGEST = """
import sys, time
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
jobs, lake, scheduler, inputs = int(sys.argv[1]), sys.argv[2], sys.argv[3] or None, sys.argv[4:]
t = time.perf_counter()
res = ingest_paths(inputs, Lake(lake), run="bench", jobs=jobs, scheduler=scheduler)
el = time.perf_counter() - t
assert res and all(r.status == "ok" for r in res), [(r.status, r.error) for r in res if r.status != "ok"]
print("RESULT", el, len(res))
"""


def child(*args: str) -> tuple[float, int, float]:
    """(seconds of the timed section, files ingested, CPU seconds of the child and every
    descendant it reaped) of the INGEST child with `args`."""
    p = subprocess.Popen([sys.executable, "-c", INGEST, *args], cwd=REPO, stdout=subprocess.PIPE, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"ingest child failed ({status}) with {args[:3]}")
    last = out[out.rindex("RESULT ") + 7 :].split()
    return float(last[0]), int(last[1]), ru.ru_utime + ru.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds of `procs` and their live children."""
    total = 0.0
    for p in procs:
        for q in [p, *p.children(recursive=True)]:
            try:
                t = q.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
    return total


class Cluster:
    """A Dask scheduler and `workers` single-thread workers on 127.0.0.1, as processes of this
    one; stopped on exit."""

    def __init__(self, workers: int, scratch: Path):
        self.workers, self.scratch = workers, scratch
        self.address = f"tcp://127.0.0.1:{free_port()}"

    def __enter__(self) -> Cluster:
        from distributed import Client

        env = {**os.environ, "PYTHONPATH": str(REPO)}
        log = open(self.scratch / "cluster.log", "ab")
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_scheduler",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    self.address.rsplit(":", 1)[1],
                    "--no-dashboard",
                ],
                stdout=log,
                stderr=log,
                env=env,
            )
        ]
        self.procs += [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    self.address,
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                    "--local-directory",
                    str(self.scratch / f"w{i}"),
                ],
                stdout=log,
                stderr=log,
                env=env,
                cwd=REPO,
            )
            for i in range(self.workers)
        ]
        with Client(self.address, timeout="60s") as c:
            c.wait_for_workers(self.workers, timeout=120)
        self.ps = [psutil.Process(p.pid) for p in self.procs]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs[::-1]:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb-per-rank", type=float, default=50)
    ap.add_argument("--traces", type=Path, help="rank files to ingest (default: generated)")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dask-ingest-", dir=a.work))
    try:
        traces = a.traces
        if traces is None:
            traces = work / "traces"
            scale_trace.write_traces(
                scale_trace.DEFAULT_SOURCE, traces, a.ranks, None, a.mb_per_rank, gz=True
            )
        files = sorted(str(f) for f in traces.iterdir() if f.is_file())
        size = sum(os.path.getsize(f) for f in files) / 1e6
        print(
            f"{len(files)} rank files, {size:.0f} MB gzip'd; {os.cpu_count()} cores; "
            f"load average {os.getloadavg()[0]:.1f} (walls need an idle machine)\n"
        )
        print(f"{'':44s} {'wall s':>8s} {'CPU s':>8s}")
        got: dict[str, float] = {}
        for jobs in (1, 2):
            wall, n, c = child(str(jobs), str(work / f"lake-jobs{jobs}"), "", *files)
            assert n == len(files), (n, len(files))
            got[f"jobs{jobs}"] = wall
            print(f"{f'ingest --jobs {jobs}':44s} {wall:8.2f} {c:8.1f}   (with forkserver and workers)")
        for workers in (1, 2):
            with Cluster(workers, work) as cl:
                child("1", str(work / "warm"), cl.address, str(WARM))  # every worker imports tracelake
                shutil.rmtree(work / "warm", ignore_errors=True)
                before = cpu(cl.ps)
                wall, n, c = child("1", str(work / f"lake-dask{workers}"), cl.address, *files)
                assert n == len(files), (n, len(files))
                cluster_cpu = cpu(cl.ps) - before
            got[f"dask{workers}"] = wall
            print(
                f"{f'ingest --scheduler, {workers} worker(s) of 1 thread':44s} {wall:8.2f} "
                f"{c + cluster_cpu:8.1f}   ({cluster_cpu:.1f} of it in the scheduler and workers)"
            )
        print()
        print(
            f"2 workers against 1, process pool: {got['jobs1'] / got['jobs2']:.2f}x; Dask: "
            f"{got['dask1'] / got['dask2']:.2f}x   target >= 1.7x on an idle machine "
            f"(load average now {os.getloadavg()[0]:.1f})"
        )
        print(
            f"Dask against the pool, same workers: 1 worker {got['jobs1'] / got['dask1']:.2f}x, "
            f"2 workers {got['jobs2'] / got['dask2']:.2f}x the pool's speed (the same per worker: about 1.0x)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
