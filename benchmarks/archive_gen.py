"""Generator: an archive of many small jobs (issue 37), from real small Kineto traces of the corpus.

Each job (a directory job-NNNN/, one run) takes one of TEMPLATES, real traces of HTA's test data
(300-320 kB of JSON each, 140-560 GPU activities), and writes one file per rank: the template
with distributedInfo.rank and world_size set and every event's ts (and baseTimeNanoseconds)
shifted by the job's own offset (job index x 1 hour), so that jobs are distinct runs with
distinct contents and the ranks of a job share one profiling window. Files are gzipped
(rank<r>.json.gz, 25-45 kB each).

  python benchmarks/archive_gen.py OUT --files 5000 --ranks 25

Not a test: the inputs of benchmarks/archive_bench.py.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import msgspec

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "hta" / "tests" / "data"
TEMPLATES = [
    CORPUS / "critical_path" / "simple_add" / "benchmark_result_493459_1694039959_trace.json.gz",
    CORPUS / "critical_path" / "alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz",
    CORPUS / "with_gpu_user_annotation" / "step_based_trace_2543932.json.gz",
]
HOUR_US = 3600 * 10**6


def shifted(doc: dict, rank: int, world: int, offset_us: int) -> bytes:
    """The template document as rank `rank` of `world`, every event `offset_us` later."""
    out = dict(doc)
    out["distributedInfo"] = {**(doc.get("distributedInfo") or {}), "rank": rank, "world_size": world}
    if "baseTimeNanoseconds" in doc:
        out["baseTimeNanoseconds"] = int(doc["baseTimeNanoseconds"]) + offset_us * 1000
    events = []
    for e in doc.get("traceEvents", ()):
        if isinstance(e.get("ts"), (int, float)):
            e = {**e, "ts": e["ts"] + offset_us}
        events.append(e)
    out["traceEvents"] = events
    return msgspec.json.encode(out)


def generate(out: Path, files: int, ranks: int) -> int:
    """Write `files` rank files in jobs of `ranks` ranks under out; returns the number of jobs."""
    docs = [msgspec.json.decode(gzip.decompress(t.read_bytes())) for t in TEMPLATES]
    jobs = (files + ranks - 1) // ranks
    n = 0
    for j in range(jobs):
        d = out / f"job-{j:04d}"
        d.mkdir(parents=True, exist_ok=True)
        world = min(ranks, files - n)
        for r in range(world):
            data = shifted(docs[j % len(docs)], r, world, (j + 1) * HOUR_US)
            (d / f"rank{r}.json.gz").write_bytes(gzip.compress(data, compresslevel=6))
            n += 1
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--ranks", type=int, default=25, help="ranks (files) per job")
    a = ap.parse_args()
    jobs = generate(a.out, a.files, a.ranks)
    print(f"{a.files} files in {jobs} jobs under {a.out}")


if __name__ == "__main__":
    main()
