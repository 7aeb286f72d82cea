"""Make a "candidate" of a multi-rank Kineto job in which one rank's compute is slower, with the
waiting it causes on the other ranks replayed through the collectives (the regression pair of
tests/test_diff.py; reproducible: the same inputs, rank and factor give the same bytes).

    python tests/slow_rank.py SRC_DIR DST_DIR --rank R --factor F

The model, on each rank's GPU timeline (kernels, memcpy and memset events in start order;
host events are left as they are, so every launch still precedes its work):
- on rank R every compute kernel (a kernel whose name has no "nccl") lasts F times as long, and
  every GPU event after it starts that much later;
- the k-th NCCL kernel of every rank is the same collective call (the job's ranks run the same
  collectives in the same order: checked, ValueError otherwise). It cannot end before its last
  rank arrives plus its transfer time, taken from the original trace as (last end - last start)
  over the ranks; so after the shifts each rank's k-th NCCL kernel keeps its (shifted) start and
  ends at new last arrival + transfer, and each rank's later GPU events move by how much later
  that end is than its original one. That is how waiting for a late peer propagates;
- flow events ("ac2g", phase "f") that point at a moved GPU event move with it.
What it leaves out: host-side waits on the GPU (a cudaDeviceSynchronize that would now return
later) and the next step's start: the profiled step of a Kineto trace is stretched to the end of
the GPU work launched in it (views/25_step_window.sql), which is what the diff measures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _is_comm(e: dict) -> bool:
    return e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()


def slow_rank(traces: dict[int, dict], rank: int, factor: float) -> dict[int, dict]:
    """traces: rank -> Kineto document (modified in place and returned)."""
    gpu = {
        r: sorted(
            (e for e in d["traceEvents"] if e.get("cat") in GPU_CATS and e.get("ph") == "X"),
            key=lambda e: e["ts"],
        )
        for r, d in traces.items()
    }
    start0 = {r: [e["ts"] for e in evs] for r, evs in gpu.items()}  # the original starts, in order
    comm = {r: [e for e in evs if _is_comm(e)] for r, evs in gpu.items()}
    n = {len(c) for c in comm.values()}
    if len(n) != 1:
        raise ValueError(f"the ranks have different numbers of NCCL kernels: {sorted(n)}")
    calls = n.pop()
    orig = {r: [(e["ts"], e["ts"] + e["dur"]) for e in comm[r]] for r in traces}
    shift = {r: 0 for r in traces}
    pos = {r: 0 for r in traces}
    moved: dict[int, dict[int, int]] = {r: {} for r in traces}  # rank -> correlation -> shift

    def advance(r: int, until: float | None) -> None:
        """Shift (and on the slowed rank stretch) rank r's GPU events before `until` (original ts)."""
        evs = gpu[r]
        while pos[r] < len(evs) and (until is None or start0[r][pos[r]] < until):
            e = evs[pos[r]]
            pos[r] += 1
            if _is_comm(e):
                continue  # set by the collective step
            e["ts"] += shift[r]
            moved[r][e.get("args", {}).get("correlation")] = shift[r]
            if r == rank and e.get("cat") == "kernel":
                extra = round(e["dur"] * (factor - 1))
                e["dur"] += extra
                shift[r] += extra

    for k in range(calls):
        for r in traces:
            advance(r, orig[r][k][0])
        transfer = max(o[k][1] for o in orig.values()) - max(o[k][0] for o in orig.values())
        starts = {r: orig[r][k][0] + shift[r] for r in traces}
        end = max(starts.values()) + transfer
        for r in traces:
            e = comm[r][k]
            e["ts"] = starts[r]
            e["dur"] = max(end - starts[r], 0)
            moved[r][e.get("args", {}).get("correlation")] = starts[r] - orig[r][k][0]
            shift[r] = max(shift[r], end - orig[r][k][1])
    for r in traces:
        advance(r, None)
        for e in traces[r]["traceEvents"]:
            if e.get("ph") == "f" and e.get("cat") == "ac2g" and e.get("id") in moved[r]:
                e["ts"] += moved[r][e["id"]]
    return traces


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--factor", type=float, required=True)
    a = ap.parse_args(argv)
    files = sorted(a.src.glob("*.json"))
    docs = {
        json.loads(f.read_bytes())["distributedInfo"]["rank"]: (f, json.loads(f.read_bytes())) for f in files
    }
    out = slow_rank({r: d for r, (_, d) in docs.items()}, a.rank, a.factor)
    a.dst.mkdir(parents=True, exist_ok=True)
    for r, (f, _) in docs.items():
        (a.dst / f.name).write_text(json.dumps(out[r]))


if __name__ == "__main__":
    main()
