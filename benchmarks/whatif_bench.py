"""Benchmark of the what-if replay (pipeline/whatif): the dependency graph, the identity replay
with each step's critical path, and the default what-ifs, at 64 ranks x 100k kernels (target: all
of it within 10 s and 3 GB on 2 cores) and for PARAM's 8-rank DLRM job (the small-job figure).

  python benchmarks/whatif_bench.py [--workdir /tmp/whatif-bench] [--ranks 64] [--kernels 100000]
                                    [--skip-big] [--skip-dlrm] [--profile N]

The big lake is written by benchmarks/scale_trace.py (write_lake: HTA's sampled_rank-0, a real
rank of a 128-rank NCCL job with ProfilerSteps and collectives, its rows repeated) and kept under
--workdir for the next run; the DLRM job (../shared/corpus/param/et_replay/tests/inputs/dlrm_kineto)
is ingested there once. Each lake is measured in a fresh child process (its own peak RSS), timed
after imports, one stage after another:
- connect: pipeline.query.connect(Lake, runs=[run], materialize=True), as `tracelake whatif` connects;
- build: pipeline.whatif.build (the graph);
- defaults: pipeline.whatif.changes.defaults(graph);
- identity: run_replay(g, measured(g)): replay, step windows and the critical paths;
- whatif(): pipeline.whatif.whatif(con, run, defaults), the whole document (it builds the graph
  and replays the identity again, then one replay with critical paths per change);
then, in a second fresh child, what `tracelake whatif` does after its imports (connect, graph,
defaults, whatif() on that graph): the target's figure, with that process's own peak RSS (the
first child's whatif() runs after a build whose memory the allocators may still hold).
Wall and CPU seconds per stage (CPU over all threads: DuckDB's and polars' pools), the peak RSS
so far, the graph's sizes, and per replay inside whatif() its rounds (Timing.rounds) and the time
in replay() and in the critical paths (critical.paths), recorded by wrapping both in the package.
--profile N: the same child under cProfile, the top N functions by cumulative time.
Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DLRM = REPO.parent / "shared" / "corpus" / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Stage:
    """`with Stage("name"):` prints the block's wall and CPU seconds and the peak RSS so far."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c
        print(f"  {self.name:34s} {self.wall:8.2f} {self.cpu:8.2f} {rss_mb():12.0f}", flush=True)


def measure(lake_dir: str, run: str) -> None:
    import gc

    import numpy as np

    import pipeline.whatif as wi
    from pipeline.lake import Lake
    from pipeline.query import connect

    calls: list[dict] = []  # one per replay / critical-path call, in order
    import pipeline.whatif.face as face  # run_replay looks both names up there

    replay0, paths0 = face.replay, face.paths

    def replay(g, d, *a, **k):
        t = time.perf_counter()
        r = replay0(g, d, *a, **k)
        calls.append({"rounds": r.rounds, "replay_s": time.perf_counter() - t, "paths_s": 0.0})
        return r

    def paths(*a, **k):
        t = time.perf_counter()
        p = paths0(*a, **k)
        calls[-1]["paths_s"] = time.perf_counter() - t
        return p

    face.replay, face.paths = replay, paths
    print(f"  {'stage':34s} {'wall s':>8s} {'CPU s':>8s} {'peak RSS MB':>12s}")
    total = 0.0
    with Stage("connect") as s:
        con = connect(Lake(lake_dir), runs=[run], materialize=True)
    total += s.wall
    with Stage("build (graph)") as s:
        g = wi.build(con, run)
    with Stage("defaults") as s:
        chs = wi.changes.defaults(g)
    with Stage("identity replay + critical path") as s:
        ident = wi.run_replay(g, wi.measured(g))
    c = calls[-1]
    print(
        f"    replay {c['replay_s']:.2f} s ({c['rounds']} rounds), critical paths {c['paths_s']:.2f} s, "
        f"step windows {s.wall - c['replay_s'] - c['paths_s']:.2f} s"
    )
    steps = np.unique(g.g_step[g.g_step >= 0])
    print(
        f"  graph: {len(g.ranks)} ranks, {len(g.g_s):,} GPU nodes, {len(g.h_s):,} host nodes, "
        f"{len(g.c_transfer):,} matched collectives ({int((g.g_coll >= 0).sum()):,} member kernels), "
        f"{len(steps)} steps ({ident.steps.height} rank-steps replayed), "
        f"{0 if ident.path is None else ident.path.height:,} critical-path segments"
    )
    del g, ident
    gc.collect()
    calls.clear()
    with Stage(f"whatif() with {len(chs)} defaults") as s:
        doc = wi.whatif(con, run, chs)
    total += s.wall
    print(f"  {'change':34s} {'rounds':>8s} {'replay s':>8s} {'paths s':>8s} {'step ms':>9s} {'gain %':>7s}")
    rows = [{"change": "(identity)", "predicted_step_ns": doc["identity_step_ns"], "gain_pct": 0.0}]
    for ch, c in zip(rows + doc["changes"], calls):
        print(
            f"  {ch['change']:34s} {c['rounds']:8d} {c['replay_s']:8.2f} {c['paths_s']:8.2f} "
            f"{ch['predicted_step_ns'] / 1e6:9.3f} {ch['gain_pct']:7.2f}"
        )
    err = doc["identity_error_pct"]
    print(f"  baseline step {doc['baseline_step_ns'] / 1e6:.3f} ms, identity error {err} %")
    print(
        f"  connect + whatif(): {total:.2f} s wall; peak RSS {rss_mb():.0f} MB "
        f"(target: 10 s and 3072 MB at 64 ranks x 100k kernels)"
    )


def measure_fresh(lake_dir: str, run: str) -> None:
    """What `tracelake whatif --lake L --run R` does after its imports, alone in a fresh process:
    connect, build the graph, its default changes, whatif() on that graph. Its wall, CPU and the
    process's peak RSS (no earlier build's memory in the allocators, as in measure())."""
    import pipeline.whatif as wi
    from pipeline.lake import Lake
    from pipeline.query import connect

    with Stage("connect + build + defaults + whatif()") as s:
        con = connect(Lake(lake_dir), runs=[run], materialize=True, metric_views=())
        g = wi.build(con, run)
        doc = wi.whatif(con, run, wi.changes.defaults(g), graph=g)
    gains = ", ".join(f"{c['label']} {c['predicted_step_ns'] / 1e6:.3f} ms" for c in doc["changes"])
    print(f"  measured {doc['baseline_step_ns'] / 1e6:.3f} ms; {gains}")
    print(
        f"  as `tracelake whatif` (fresh process, after imports): {s.wall:.2f} s wall, {s.cpu:.2f} CPU-s, "
        f"peak RSS {rss_mb():.0f} MB (target: 10 s and 3072 MB at 64 ranks x 100k kernels)"
    )


def child(lake: Path, run: str, profile: int, fresh: bool = False) -> None:
    args = [sys.executable, __file__, "--fresh" if fresh else "--measure", str(lake), "--run", run]
    subprocess.run(args + (["--profile", str(profile)] if profile else []), check=True, cwd=REPO)


def big_lake(work: Path, ranks: int, kernels: int) -> Path:
    """The scale_trace.py lake, written once (a done.json marks a complete one)."""
    d = work / f"lake_{ranks}x{kernels}"
    if (d / "done.json").exists():
        print(f"reusing {d}: {(d / 'done.json').read_text().strip()}")
        return d
    shutil.rmtree(d, ignore_errors=True)
    t = time.perf_counter()
    sys.path.insert(0, str(REPO / "benchmarks"))
    import scale_trace

    info = scale_trace.write_lake(scale_trace.DEFAULT_SOURCE, d, ranks, kernels)
    (d / "done.json").write_text(json.dumps(info) + "\n")
    print(f"wrote {d} in {time.perf_counter() - t:.0f} s: {info}")
    return d


def dlrm_lake(work: Path) -> Path:
    d = work / "lake_dlrm"
    if not (d / "done.json").exists():
        from pipeline.ingest import ingest_paths
        from pipeline.lake import Lake

        shutil.rmtree(d, ignore_errors=True)
        res = ingest_paths([DLRM], Lake(d), run="dlrm")
        assert all(r.status == "ok" for r in res), [r.error for r in res if r.status != "ok"]
        (d / "done.json").write_text(json.dumps({"sources": len(res)}) + "\n")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/whatif-bench"))
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--kernels", type=int, default=100_000)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--skip-dlrm", action="store_true")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the measurement: top N by cumtime")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # the child: a lake directory
    ap.add_argument("--fresh", help=argparse.SUPPRESS)  # the child as the CLI: a lake directory
    ap.add_argument("--run", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.fresh:
        return measure_fresh(a.fresh, a.run)
    if a.measure:
        if not a.profile:
            return measure(a.measure, a.run)
        import cProfile
        import pstats

        with cProfile.Profile() as p:
            measure(a.measure, a.run)
        pstats.Stats(p).sort_stats("cumulative").print_stats(a.profile)
        return
    a.workdir.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores; lakes under {a.workdir}\n")
    if not a.skip_big:
        lake = big_lake(a.workdir, a.ranks, a.kernels)
        print(f"\n{a.ranks} ranks x {a.kernels} kernels (run 'scaled')")
        child(lake, "scaled", a.profile)
        child(lake, "scaled", 0, fresh=True)
    if not a.skip_dlrm:
        print("\nPARAM DLRM, 8 ranks (run 'dlrm')")
        child(dlrm_lake(a.workdir), "dlrm", a.profile)
        child(dlrm_lake(a.workdir), "dlrm", 0, fresh=True)


if __name__ == "__main__":
    main()
