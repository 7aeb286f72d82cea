"""Fuzzing harness: N seeded hostile inputs per format, ingested in batches beside a good file.

  python -m tests.fuzz.run [--format kineto|nccl|nsys|archive|pickle|all] [--n 1000] [--seed 1]
                           [--batch 10] [--timeout 300] [--rss-limit-gb 4] [--keep DIR]

Each batch (up to --batch inputs from tests/fuzz/mutators.py plus one good trace) is ingested by
pipeline.ingest.ingest_paths in a fresh child process, one file at a time (jobs=1). A batch is
bad when the child runs past --timeout (a hang), exits with a code other than 0 (ingest_paths
raised), prints a Python traceback, peaks above --rss-limit-gb (os.wait4: the child's own peak
RSS), leaves a file without a `sources` row (every file accounted for), or fails the good file.
Files that failed with an unexpected exception ("could not ingest (...); please report this
file") are counted too, and printed with their message: each is an input whose message should
name what is wrong. Prints the figures per format and exits 1 when any batch was bad; --keep
keeps the inputs of bad batches and of batches with such a file.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.fuzz.mutators import FORMATS, mutate  # noqa: E402

GOOD = REPO / "sample_traces" / "hta_trace_filter" / "sampled_rank-0.json.gz"


CHILD = """
import json, sys
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
res = ingest_paths(sys.argv[2:], Lake(sys.argv[1]), jobs=1)
print(json.dumps([[r.path, r.status, r.error, r.source_id] for r in res]))
"""


def run_batch(files: list[Path], work: Path, timeout: float) -> dict:
    """Ingest `files` (plus the good trace) into a fresh lake in a child; the batch's figures."""
    import json

    lake = work / "lake"
    cmd = [sys.executable, "-c", CHILD, str(lake), *map(str, files), str(GOOD)]
    t = time.monotonic()
    # output to files and the child reaped with os.wait4 (its own peak RSS), polled against the
    # timeout: no pipe can fill up, and nothing else reaps it first
    with open(work / "out", "wb") as o, open(work / "err", "wb") as e:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=o, stderr=e)
    hang, status, rss_gb = False, 0, 0.0
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            rss_gb = ru.ru_maxrss / 2**20  # KiB -> GiB
            break
        if time.monotonic() - t > timeout:
            hang = True
            p.kill()
            _, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.05)
    p.returncode = code = os.waitstatus_to_exitcode(status)
    out, err = (work / "out").read_bytes(), (work / "err").read_bytes()
    res = {"hang": hang, "code": code, "seconds": time.monotonic() - t, "rss_gb": rss_gb,
           "traceback": b"Traceback (most recent call last)" in err, "unexpected": 0, "missing": [],
           "good_ok": False}  # fmt: skip
    if hang or p.returncode != 0:
        return res
    results = json.loads(out.decode().strip().splitlines()[-1])
    from pipeline.lake import Lake

    stored = set(Lake(lake).sources()["source_id"].to_list())
    res["unexpected"] = sum("please report this file" in (e or "") for _, _, e, _ in results)
    # every file accounted for: at least one result of its own (an archive: one per member, or one
    # for itself), and every result that is not a skip has its sources row in the lake
    reported = {Path(path.split("!")[0]).name for path, _, _, _ in results}
    res["missing"] = [f.name for f in files if f.name not in reported]
    res["missing"] += [path for path, st, _, sid in results if st != "skipped" and sid not in stored]
    res["good_ok"] = any(Path(path).name == GOOD.name and st == "ok" for path, st, _, _ in results)
    # for the report of a bad batch: what went wrong with which file
    res["odd"] = [
        (Path(path).name, st, e)
        for path, st, e, _ in results
        if "please report this file" in (e or "") or (Path(path).name == GOOD.name and st != "ok")
    ]
    return res


def _sha(f: Path) -> str:
    import hashlib

    return hashlib.sha256(f.read_bytes()).hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="all", choices=("all", *FORMATS))
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--rss-limit-gb", type=float, default=4.0)
    ap.add_argument("--keep")
    a = ap.parse_args(argv)
    formats = FORMATS if a.format == "all" else (a.format,)
    bad_total = 0
    print(f"{'format':8s} {'inputs':>6s} {'batches':>7s} {'hangs':>5s} {'tracebacks':>10s} {'>RSS':>5s} "
          f"{'missing':>7s} {'good lost':>9s} {'unexpected':>10s} {'max s':>6s} {'max GB':>6s}")  # fmt: skip
    for fmt in formats:
        rng = random.Random(f"{a.seed}:{fmt}")
        stats = dict(inputs=0, batches=0, hangs=0, tracebacks=0, rss=0, missing=0, good=0, unexpected=0,
                     max_s=0.0, max_gb=0.0)  # fmt: skip
        done = 0
        while done < a.n:
            k = min(a.batch, a.n - done)
            with tempfile.TemporaryDirectory() as d:
                work = Path(d)
                (work / "in").mkdir()
                files = []
                for i in range(k):
                    name, data = mutate(fmt, rng)
                    f = work / "in" / f"{done + i:05d}_{name}"
                    f.write_bytes(data)
                    files.append(f)
                r = run_batch(files, work, a.timeout)
                crashed = r["code"] != 0 or r["traceback"]
                too_big = r["rss_gb"] > a.rss_limit_gb
                bad = r["hang"] or crashed or too_big or r["missing"] or not r["good_ok"]
                stats["inputs"] += k
                stats["batches"] += 1
                stats["hangs"] += r["hang"]
                stats["tracebacks"] += r["traceback"] or (r["code"] != 0 and not r["hang"])
                stats["rss"] += r["rss_gb"] > a.rss_limit_gb
                stats["missing"] += len(r["missing"])
                stats["good"] += not r["good_ok"] and not r["hang"]
                stats["unexpected"] += r["unexpected"]
                stats["max_s"] = max(stats["max_s"], r["seconds"])
                stats["max_gb"] = max(stats["max_gb"], r["rss_gb"])
                if r["unexpected"] and not bad:  # not a failure, but each one is a message to fix
                    for name, _, e in r.get("odd", []):
                        print(f"  unexpected ({fmt}, batch {stats['batches']}): {name}: {e}", file=sys.stderr)
                if bad or r["unexpected"]:
                    bad_total += bool(bad)
                    if bad:
                        print(f"  bad batch {stats['batches']} ({fmt}): {r}", file=sys.stderr)
                    if a.keep:
                        shutil.copytree(
                            work / "in", Path(a.keep) / f"{fmt}_{stats['batches']}", dirs_exist_ok=True
                        )
            done += k
        s = stats
        cols = [s["inputs"], s["batches"], s["hangs"], s["tracebacks"], s["rss"], s["missing"], s["good"],
                s["unexpected"]]  # fmt: skip
        widths = [6, 7, 5, 10, 5, 7, 9, 10]
        print(f"{fmt:8s} " + " ".join(f"{v:{w}d}" for v, w in zip(cols, widths))
              + f" {s['max_s']:6.1f} {s['max_gb']:6.2f}")  # fmt: skip
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
