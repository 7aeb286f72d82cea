"""Benchmark: ingest of large NCCL_DEBUG text logs; time and peak RSS against the file's size.

Builds two logs of --mb MB from the corpus (../shared/corpus/nccl), both of real lines:
- "mixed": every corpus .log file, concatenated and repeated (init, channel, ring, net, tuning,
  COLL, nccl-tests and watchdog lines; the tables still open to later lines, such as
  nccl_channels, get about half of the rows);
- "coll": torchtitan's COLL-line log repeated (what NCCL_DEBUG_SUBSYS=COLL prints for a long run:
  almost every line an nccl_coll_calls row).
For each, in fresh child processes (os.wait4: the child's own peak RSS), after imports:
- the read floor: Python reading the file whole, decoding it and splitting its lines (what a
  parser that holds the file must do at least; tracelake did this before issue 21);
- tracelake ingest of the file into an empty lake (pipeline.ingest.ingest_paths, jobs=1).
Prints MB, seconds, peak RSS, RSS per MB of log, and the ratios ingest / floor.

  python benchmarks/nccl_log.py [--mb 100] [--keep DIR]

Not a test: numbers depend on the machine; record them in docs/performance.md with this command.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from ingest_vs_hta import REPO, child

CORPUS = REPO.parent / "shared" / "corpus" / "nccl"

FLOOR = """
import sys, time
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    lines = f.read().decode("utf-8", "replace").split("\\n")
print(len(lines), time.perf_counter() - t)
"""
INGEST = """
import sys, time
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
t = time.perf_counter()
(r,) = ingest_paths([sys.argv[1]], Lake(sys.argv[2]), jobs=1)
assert r.status == "ok", r.error
print(time.perf_counter() - t)
"""


def build(kind: str, mb: int, dest: Path) -> Path:
    """A log of about `mb` MB of real corpus lines (see the module docstring)."""
    if kind == "mixed":
        parts = [p.read_bytes() for p in sorted(CORPUS.glob("*.log"))]
    else:
        parts = [(CORPUS / "torchtitan-issue-1369-coll-allgather-reducescatter-tp2.log").read_bytes()]
    blob = b"".join(x if x.endswith(b"\n") else x + b"\n" for x in parts)
    out = dest / f"{kind}.log"
    with open(out, "wb") as f:
        for _ in range((mb << 20) // len(blob) + 1):
            f.write(blob)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--keep", help="write the logs and lakes here and keep them")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="nccl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        print(f"{'log':6} {'MB':>6} {'side':7} {'s':>7} {'RSS MB':>8} {'RSS/MB':>7}")
        for kind in ("mixed", "coll"):
            log = build(kind, a.mb, work)
            size = log.stat().st_size / 2**20
            fs, frss = child(FLOOR, str(log))
            lake = work / f"lake-{kind}"
            shutil.rmtree(lake, ignore_errors=True)
            s, rss = child(INGEST, str(log), str(lake))
            for side, t, r in (("floor", fs, frss), ("ingest", s, rss)):
                print(f"{kind:6} {size:6.0f} {side:7} {t:7.1f} {r:8.0f} {r / size:7.2f}")
            print(f"{kind:6} ingest / floor: {s / fs:.1f}x the time, {rss / frss:.2f}x the peak RSS")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
