"""Peak memory of one rank file's ingest and of its lake's analysis, by event count (issue 40): a
Kineto trace of many small events, generated here, ingested by `tracelake ingest` in a child
process, then the lake analysed by `tracelake analyze` in another.

The trace (the shape the issue measured): one rank, STEPS ProfilerSteps of KERNELS_PER_STEP
kernels each; every kernel has its `aten::mm` cpu_op (External id), its `cudaLaunchKernel`
(correlation) and the kernel itself on stream 7, about 200 bytes an event; written as a stream
(never held in memory), gzip level 1 when the name ends in .gz. `--gb X` sizes the JSON by its
uncompressed bytes.

  python benchmarks/ingest_memory.py [--gb 1 --gb 2] [--work DIR] [--keep] [--reuse] [--skip STEP]

For each size: the JSON's bytes and events; then phase 1 alone (the Kineto decode into spooled
tables, `kineto.parse_stream` as the ingest calls it, in a child: its peak RSS and its RSS after
every BATCHES_PER_LINE batches, read by the child itself, so growth per batch is seen); then the
ingest's wall seconds and the child's peak RSS (wait4's ru_maxrss: the ingest process; with
--jobs 1 nothing else), the peak RSS per GB of JSON and per million events, and an RSS timeline
sampled every 0.5 s from /proc (the stage it is in is not known from outside: the timeline shows
where it grows); then the same for the analysis of the lake (`tracelake analyze`, with the
per-source results computed and stored by this first analysis, pipeline/local_fill.py fill), and
whether the source got those results. --reuse takes a
trace of the same size already in --work (kept by --keep) instead of writing it again; --skip
leaves a step out (phase1, ingest, analyze; analyze needs the ingest). Not a test: numbers depend
on the machine.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KERNELS_PER_STEP = 30_000
US_PER_KERNEL = 10  # each kernel 6 µs, launched 10 µs apart
BATCHES_PER_LINE = 40  # phase 1: one RSS figure every this many batches of 16 MB of JSON


def write_trace(path: Path, target_bytes: int) -> tuple[int, int]:
    """Write the trace to `path` (gzip level 1 for .gz) until about target_bytes of JSON; returns
    (bytes of JSON written, events)."""
    opener = (
        (lambda p: gzip.open(p, "wt", compresslevel=1)) if path.suffix == ".gz" else (lambda p: open(p, "w"))
    )
    head = (
        '{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, '
        '"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, '
        '"computeMinor": 0, "totalGlobalMem": 85899345920}],\n"traceEvents": [\n'
    )
    written, events, step, first = 0, 0, 0, True
    with opener(path) as f:
        f.write(head)
        written += len(head)
        t0 = 1_700_000_000_000_000
        while written < target_bytes:
            step += 1
            s0 = t0 + (step - 1) * (KERNELS_PER_STEP * US_PER_KERNEL + 1000)
            span = KERNELS_PER_STEP * US_PER_KERNEL + 500
            lines = [
                f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 10, '
                f'"tid": 10, "ts": {s0}, "dur": {span}}}'
            ]
            for k in range(KERNELS_PER_STEP):
                i = (step - 1) * KERNELS_PER_STEP + k + 1
                ts = s0 + 10 + k * US_PER_KERNEL
                lines.append(
                    f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 10, "ts": {ts}, '
                    f'"dur": 4, "args": {{"External id": {i}}}}}'
                )
                lines.append(
                    f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, '
                    f'"ts": {ts + 1}, "dur": 2, "args": {{"External id": {i}, "correlation": {i}}}}}'
                )
                lines.append(
                    f'{{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "pid": 0, '
                    f'"tid": 7, "ts": {ts + 5}, "dur": 6, "args": {{"device": 0, "stream": 7, '
                    f'"correlation": {i}, "External id": {i}, "grid": [132, 1, 1], "block": [384, 1, 1]}}}}'
                )
            chunk = ("" if first else ",\n") + ",\n".join(lines)
            first = False
            f.write(chunk)
            written += len(chunk)
            events += len(lines)
        tail = "\n]}\n"
        f.write(tail)
        written += len(tail)
    return written, events


def _rss_mb(pid: int | str = "self") -> float | None:
    """A process's resident set (VmRSS of /proc/PID/status; this process's by default), in MiB;
    None when it has none (a child that exited). OSError when /proc has no such process."""
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) / 1024
    return None


def phase1(trace: Path) -> None:
    """Run in a child (--phase1 TRACE): phase 1 of one Kineto file's ingest as prepare_kineto
    runs it (gzip inflated by streams.Inflate, kineto.parse_stream with the default batch and spool
    sizes, spilling to a temporary directory), printing 'batches events RSS-MiB' every
    BATCHES_PER_LINE batches and at the end."""
    import tempfile

    from pipeline.ingest import kineto, streams

    def report(batches: int, events: int) -> None:
        if batches % BATCHES_PER_LINE == 0:
            print(f"{batches} {events} {_rss_mb():.0f}", flush=True)

    with open(trace, "rb") as raw, tempfile.TemporaryDirectory() as tmp:
        parsed = kineto.parse_stream(streams.Inflate(raw).read, spool_dir=tmp, on_batch=report)
        print(f"end {parsed.event_count} {_rss_mb():.0f}", flush=True)
        parsed.close()


def run(*args: str, python: bool = False) -> tuple[float, float, list[tuple[float, float]], str]:
    """(wall seconds, peak RSS MB, [(seconds, RSS MB)], stdout) of `tracelake ARGS` in a child
    (python=True: of `python ARGS`)."""
    exe = sys.executable if python else shutil.which("tracelake", path=str(Path(sys.executable).parent))
    t = time.monotonic()
    p = subprocess.Popen(
        [exe or "tracelake", *args], stdout=subprocess.PIPE if python else subprocess.DEVNULL
    )
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                if (rss := _rss_mb(p.pid)) is not None:
                    samples.append((time.monotonic() - t, rss))
            except OSError:
                pass
            stop.wait(0.5)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out = p.stdout.read().decode() if python else ""
    _, status, ru = os.wait4(p.pid, 0)
    stop.set()
    th.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{exe} {' '.join(args)} failed: exit {os.waitstatus_to_exitcode(status)}")
    return time.monotonic() - t, ru.ru_maxrss / 1024, samples, out


def trace_of(work: Path, gb: float, reuse: bool) -> tuple[Path, int, int]:
    """(path, bytes of JSON, events) of the trace of `gb` GB in `work`: written, or with reuse
    the one written before (its counts kept beside it)."""
    trace = work / f"rank0_{gb:g}gb.json.gz"
    counts = trace.with_suffix(".counts")
    if reuse and trace.exists() and counts.exists():
        nbytes, events = map(int, counts.read_text().split())
        return trace, nbytes, events
    nbytes, events = write_trace(trace, int(gb * 1e9))
    counts.write_text(f"{nbytes} {events}\n")
    return trace, nbytes, events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, action="append", help="JSON size in GB (1e9 bytes); repeatable")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ingest-memory"))
    ap.add_argument("--keep", action="store_true", help="keep the traces and lakes")
    ap.add_argument("--reuse", action="store_true", help="use a trace of the same size kept in --work")
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["phase1", "ingest", "analyze"],
        help="leave a step out",
    )
    ap.add_argument("--phase1", type=Path, help=argparse.SUPPRESS)  # the child of phase 1
    a = ap.parse_args()
    if a.phase1:
        return phase1(a.phase1)
    sizes = a.gb or [1.0, 2.0]
    a.work.mkdir(parents=True, exist_ok=True)
    print(f"{'JSON GB':>8} {'events M':>9} {'step':>8} {'s':>7} {'peak MB':>8} {'MB/GB':>6} {'MB/M ev':>8}")
    for gb in sizes:
        trace, nbytes, events = trace_of(a.work, gb, a.reuse)
        lake = a.work / f"lake_{gb:g}gb"
        shutil.rmtree(lake, ignore_errors=True)
        steps = [
            ("phase1", (str(Path(__file__).resolve()), "--phase1", str(trace)), True),
            ("ingest", ("ingest", str(trace), "--lake", str(lake), "--jobs", "1"), False),
            ("analyze", ("analyze", "--lake", str(lake)), False),
        ]
        skip = set(a.skip) | ({"analyze"} if "ingest" in a.skip else set())
        for what, args, python in [st for st in steps if st[0] not in skip]:
            secs, peak, samples, out = run(*args, python=python)
            print(
                f"{nbytes / 1e9:8.2f} {events / 1e6:9.2f} {what:>8} {secs:7.1f} {peak:8.0f} "
                f"{peak / (nbytes / 1e9):6.0f} {peak / (events / 1e6):8.0f}",
                flush=True,
            )
            if python:
                lines = [ln.split() for ln in out.splitlines()]
                print(
                    "  RSS MB by batch of 16 MB: "
                    + ", ".join(f"{b} ({int(n) / 1e6:.1f} M events) {m}" for b, n, m in lines)
                )
                continue
            step = max(1, len(samples) // 20)
            print("  RSS MB over time: " + ", ".join(f"{s:.0f}s {m:.0f}" for s, m in samples[::step]))
            if what == "analyze":  # computed by the first analysis (pipeline/local_fill.py fill)
                stored = any((lake / "local_results").rglob("*.parquet"))
                full = "no (the metrics were computed in full)"
                print(f"  per-source results stored by the analysis: {'yes' if stored else full}")
        if not a.keep:
            trace.unlink()
            trace.with_suffix(".counts").unlink(missing_ok=True)
            shutil.rmtree(lake, ignore_errors=True)


if __name__ == "__main__":
    main()
