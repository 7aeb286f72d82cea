"""Benchmark: ingest the largest corpus Kineto trace with tracelake and load it with HTA.

Prints, in one run, uncompressed MB/s and peak RSS of each side and their ratios. Each side runs
in a fresh child process (os.wait4 gives that child's own peak RSS), best of --repeat runs.

  python benchmarks/ingest_vs_hta.py [TRACE] [--repeat N]

Default TRACE: the largest Kineto trace under ../shared/corpus (by uncompressed size).
Not a test: numbers depend on the machine; record them in docs/performance.md with this command.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpus"

# Each child prints the seconds of its timed section (after imports) on its last stdout line.
TRACELAKE = """
import sys, time
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
t = time.perf_counter()
(r,) = ingest_paths([sys.argv[1]], Lake(sys.argv[2]), run="bench")
print(time.perf_counter() - t)
assert r.status == "ok", r.error
"""
TRACELAKE_PARSE = """
import sys, time
from pipeline.ingest import read_bytes
from pipeline.ingest.kineto import parse
from pathlib import Path
t = time.perf_counter()
parse(read_bytes(Path(sys.argv[1]))[1])
print(time.perf_counter() - t)
"""
HTA = """
import sys, time, logging, warnings
warnings.filterwarnings("ignore")
from hta.configs.config import logger
logger.setLevel(logging.ERROR)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
print(time.perf_counter() - t)
"""
# The parse floor: read + gunzip + a typed decode of every event (msgspec Struct with the Chrome
# trace fields, args left undecoded) - the least any ingest of these bytes must do.
PARSE_FLOOR = """
import sys, time, msgspec
from isal import igzip
from pipeline.ingest.kineto import KEvent  # ph, cat, name, pid, tid; ts, dur and args as raw text
class T(msgspec.Struct):
    traceEvents: list[KEvent] = []
t = time.perf_counter()
raw = open(sys.argv[1], 'rb').read()
data = igzip.decompress(raw) if raw[:2] == b'\\x1f\\x8b' else raw
msgspec.json.decode(data, type=T)
print(time.perf_counter() - t)
"""


def child(code: str, *args: str) -> tuple[float, float]:
    """(seconds of the timed section, peak RSS MB of the whole child) of `python -c code args`."""
    p = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        raise SystemExit(f"child failed: {code.splitlines()[1]} ...")
    return float(out.decode().split()[-1]), ru.ru_maxrss / 1024


def largest_trace() -> Path:
    best, size = None, -1
    for d in ("hta", "param", "tracelens", "kineto"):
        for f in (CORPUS / d).rglob("*.json*"):
            raw = f.read_bytes()
            n = len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)
            if (
                n > size
                and b"traceEvents" in (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)[:400_000]
            ):
                best, size = f, n
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", nargs="?")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    trace = Path(a.trace) if a.trace else largest_trace()
    raw = trace.read_bytes()
    mb = (len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)) / 1e6
    print(f"trace: {trace} ({mb:.1f} MB uncompressed)")
    with tempfile.TemporaryDirectory() as tmp:
        hta_dir = Path(tmp) / "hta"
        hta_dir.mkdir()
        (hta_dir / trace.name).symlink_to(trace.resolve())
        rows = {}
        for name, code, args in (
            ("parse floor (gunzip + typed decode)", PARSE_FLOOR, lambda i: [str(trace)]),
            ("tracelake parse (tables in memory)", TRACELAKE_PARSE, lambda i: [str(trace)]),
            (
                "tracelake ingest (parse + Parquet lake)",
                TRACELAKE,
                lambda i: [str(trace), str(Path(tmp) / f"lake{i}")],
            ),
            ("HTA TraceAnalysis load", HTA, lambda i: [str(hta_dir)]),
        ):
            runs = [child(code, *args(i)) for i in range(a.repeat)]
            rows[name] = (min(w for w, _ in runs), max(r for _, r in runs))
    print(f"{'':42s} {'wall s':>8s} {'MB/s':>8s} {'peak RSS MB':>12s}")
    for name, (w, r) in rows.items():
        print(f"{name:42s} {w:8.2f} {mb / w:8.1f} {r:12.0f}")
    ours, hta, floor = (
        rows["tracelake ingest (parse + Parquet lake)"],
        rows["HTA TraceAnalysis load"],
        rows["parse floor (gunzip + typed decode)"],
    )
    parse_only = rows["tracelake parse (tables in memory)"]
    print(
        f"\ningest speed-up vs HTA load: {hta[0] / ours[0]:.1f}x   "
        f"parse-only speed-up vs HTA load: {hta[0] / parse_only[0]:.1f}x"
    )
    print(
        f"ingest peak RSS vs HTA: {ours[1] / hta[1]:.2f}x   "
        f"ingest time vs parse floor: {ours[0] / floor[0]:.2f}x"
    )
    print("(times exclude interpreter start-up and imports; peak RSS is each child's whole life)")


if __name__ == "__main__":
    main()
