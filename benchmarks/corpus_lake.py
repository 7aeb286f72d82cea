"""Benchmark: the whole corpus in one lake, analysed whole, against each half of its runs.

A team's lake holds many runs, and `tracelake analyze`, `runs` and `report` of the whole lake
analyse them in one pass. That pass must cost what its runs cost apart, not more: a step that
reads a whole-lake view once per run grows with the square of the run count (the NCCL
findings did: 36 runs, 28 of them NCCL logs, analysed in 25 s, 7.8 s once their views were
computed once: pipeline/diagnosis/nccl_findings.py PER_RUN_VIEWS).

Every folder of ../shared/corpus is ingested into one lake (as a user would point tracelake at
it; files that fail are skipped, as ingest does), then pipeline.analyze.analyze computes,
without reading or keeping results (keep=False): the first half of the runs (sorted by id), the
second half, and every run. Printed: each one's wall and CPU seconds and whole / (first +
second), which stays near or under 1 when the whole pass is linear in its runs (one connection
for all of them costs less than two); the two halves' documents must equal the whole's run by
run (checked).

  python benchmarks/corpus_lake.py [--work DIR]

Not a test: numbers depend on the machine; docs/performance.md records them with this command.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CORPUS = REPO.parent / "shared" / "corpus"

from pipeline.analyze import analyze  # noqa: E402
from pipeline.ingest import ingest_paths  # noqa: E402
from pipeline.lake import Lake  # noqa: E402


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def by_run(doc: dict) -> dict[str, dict]:
    """run id -> its verdict and findings (the parts of the document that are the run's own)."""
    out = {}
    for v in doc["verdicts"]:
        out[v["run_id"]] = {
            "verdict": v,
            "findings": [f for f in doc["findings"] if f["run_id"] == v["run_id"]],
        }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.work) as d:
        lake = Lake(Path(d) / "lake")
        res, w, c = timed(lambda: ingest_paths(sorted(CORPUS.iterdir()), lake, jobs=1))
        ok = sum(r.status == "ok" for r in res)
        runs = sorted(set(lake.sources()["run_id"].to_list()))
        print(f"corpus: {len(res)} files ({ok} ok) ingested in {w:.1f} s into {len(runs)} runs")
        half = len(runs) // 2
        parts = {"first half": runs[:half], "second half": runs[half:], "every run": runs}
        got = {}
        for name, ids in parts.items():
            doc, w, c = timed(lambda: analyze(lake, runs=ids, keep=False, recompute=True))
            got[name] = (doc, w, c)
            print(f"{name:12s} {len(ids):3d} runs: {w:6.2f} s, {c:6.2f} CPU-s")
        whole = by_run(got["every run"][0])
        apart = {**by_run(got["first half"][0]), **by_run(got["second half"][0])}
        assert whole == apart, "a run's verdict or findings differ between the whole pass and the halves"
        w_ratio = got["every run"][1] / (got["first half"][1] + got["second half"][1])
        c_ratio = got["every run"][2] / (got["first half"][2] + got["second half"][2])
        print(
            f"whole / (first + second): {w_ratio:.2f} (wall), {c_ratio:.2f} (CPU); near or under 1 is linear"
        )


if __name__ == "__main__":
    main()
