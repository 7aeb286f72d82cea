"""Object storage against a local disk (issue 37 item 4): the same archive of small jobs
(benchmarks/archive_gen.py) ingested and analysed from a local directory into a local lake, and
from a bucket into a lake in a bucket, on a moto S3 server on 127.0.0.1 in a process of its own.

  python benchmarks/s3_bench.py --files 100 --ranks 4

Prints wall seconds and this process's CPU seconds per step, and the bucket's over the local
run's, measured in the same run. moto on the loopback has no network latency: a real bucket
adds its round trips (the lake's protocol makes a few requests per source: its parts, its row,
one listing of its versions and one GET of its run's compaction manifest; readers one listing per
table, one of the manifests, one GET per manifest and per part).
"""

from __future__ import annotations

import argparse
import atexit
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SERVER = """
import sys, time, logging
logging.disable(logging.WARNING)
from moto.server import ThreadedMotoServer
s = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
s.start()
print("up", flush=True)
time.sleep(86400)
"""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(label: str, fn, out: dict):
    t0, c0 = time.perf_counter(), _cpu()
    res = fn()
    out[label] = (time.perf_counter() - t0, _cpu() - c0)
    print(f"{label:28s} wall {out[label][0]:7.2f} s   cpu {out[label][1]:7.2f} s", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        os.environ.update(
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
        )
        from pipeline import objstore
        from pipeline.analyze import analyze
        from pipeline.ingest import ingest_paths
        from pipeline.lake import Lake

        tmp = Path(tempfile.mkdtemp(prefix="s3bench-"))
        atexit.register(shutil.rmtree, tmp, True)
        archive = tmp / "archive"
        subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "archive_gen.py"), str(archive)]
            + ["--files", str(args.files), "--ranks", str(args.ranks)],
            check=True,
        )
        fs = objstore.filesystem()
        fs.mkdir("traces")
        fs.mkdir("lakes")
        fs.put(str(archive) + "/", "traces/archive/", recursive=True)
        t: dict = {}
        local, bucket = Lake(tmp / "lake"), Lake("s3://lakes/bench")
        _timed("ingest local -> local", lambda: ingest_paths([archive], local, jobs=1), t)
        _timed("ingest bucket -> bucket", lambda: ingest_paths(["s3://traces/archive/"], bucket, jobs=1), t)
        _timed("analyze local", lambda: analyze(local), t)
        _timed("analyze bucket", lambda: analyze(bucket), t)
        _timed("analyze local (kept)", lambda: analyze(local), t)
        _timed("analyze bucket (kept)", lambda: analyze(bucket), t)
        print(f"{args.files} files of {args.ranks} ranks; bucket / local (wall, cpu):")
        for step in ("ingest", "analyze", "analyze (kept)"):
            a = t[f"{step.split()[0]} local" + (" -> local" if step == "ingest" else "") + step[7:]]
            b = t[f"{step.split()[0]} bucket" + (" -> bucket" if step == "ingest" else "") + step[7:]]
            print(f"  {step:16s} {b[0] / a[0]:5.2f}x  {b[1] / a[1]:5.2f}x")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
