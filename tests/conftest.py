"""Shared fixtures: corpus locations (../shared/corpus, CI has it too) and trace builders."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACELAKE_CORPUS", REPO.parent / "shared" / "corpus"))
KINETO_DIRS = [CORPUS / d for d in ("hta", "param", "tracelens", "kineto")]


def corpus(*parts: str) -> Path:
    p = CORPUS.joinpath(*parts)
    if not p.exists():
        pytest.fail(
            f"corpus file missing: {p} (tests need ../shared/corpus beside the repo, or TRACELAKE_CORPUS)"
        )
    return p


def write_trace(path: Path, events: list[dict], gz: bool = False, **top) -> Path:
    """Write a Kineto-shaped trace file: {"schemaVersion": 1, **top, "traceEvents": events}."""
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    data = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def X(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def raw_gpu_events(path: Path) -> int:
    """Kernels, copies and memsets of a gzip'd Kineto file, counted in its raw JSON (complete
    events of category kernel, gpu_memcpy, gpu_memset): what gpu_activities holds for a trace
    without syncs."""
    doc = json.load(gzip.open(path))
    return sum(
        e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        for e in doc["traceEvents"]
    )


def union_ns(intervals) -> int:
    """Brute-force reference: total length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def lake_rows(lake) -> dict[str, list[str]]:
    """Every table of a lake as sorted row texts (sources without its ingest time): two lakes
    holding the same data compare equal whatever their file names or write order."""
    import pyarrow.parquet as pq

    from pipeline import schema as sch

    out = {}
    for t in sch.tables():
        rows = []
        for f in sorted((lake.root / t).glob("run=*/*.parquet")):
            tbl = pq.read_table(f)
            rows += [repr(r) for r in (tbl.drop(["ingested_at_ns"]) if t == "sources" else tbl).to_pylist()]
        out[t] = sorted(rows)
    return out


LAUNCH_CALL = re.compile(r"(LaunchKernel|MemcpyAsync|MemsetAsync|GraphLaunch|ModuleLaunch|runFunction)")
GPU_RECORD_CATS = {
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "mtia_ccp_events",
    "cuda_sync",
}


def raw_step_counts(source) -> dict[int, tuple[int, int, set, int]]:
    """Brute-force reference for step completeness, from a Kineto trace's raw JSON (a path, or the
    decoded document): per host ProfilerStep#N (a user_annotation or cpu_op event), N ->
    (launch calls starting in its window, those without a GPU record of the same correlation,
    their names, those of them after the last launch call that has a GPU record)."""
    if isinstance(source, dict):
        doc = source
    else:
        raw = Path(source).read_bytes()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = {
        int(m.group(1)): (e["ts"], e["ts"] + e["dur"])
        for e in ev
        if e.get("cat") in ("user_annotation", "cpu_op")
        for m in [re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))]
        if m
    }
    with_gpu = {
        e["args"]["correlation"]
        for e in ev
        if e.get("cat") in GPU_RECORD_CATS and "correlation" in e.get("args", {})
    }
    launches = [
        (e["ts"], e["name"], e["args"]["correlation"])
        for e in ev
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and "correlation" in e.get("args", {})
        and LAUNCH_CALL.search(e["name"])
    ]
    last_good = max((t for t, _, c in launches if c in with_gpu), default=None)
    out = {}
    for n, (s, e) in steps.items():
        inside = [(t, name, c) for t, name, c in launches if s <= t < e]
        missing = [(t, name) for t, name, c in inside if c not in with_gpu]
        out[n] = (
            len(inside),
            len(missing),
            {name for _, name in missing},
            sum(1 for t, _ in missing if last_good is None or t > last_good),
        )
    return out


def assert_recoverable_within_step_time(res: dict) -> int:
    """docs/report.md, "Never counted twice": for every run of an analysis, the timed findings'
    recoverable_ns add up to at most the run's time per analysed rank (the steps' windows summed
    per rank, all steps, averaged over the ranks the verdict analysed, i.e. with a step not left
    out as incomplete; the GPU span per rank on the whole-trace basis). The bound is computed
    here from the step_time / ranks rows, not from the findings code. Returns how many runs had
    timed findings (so a caller can assert the check was not vacuous)."""
    checked = 0
    for v in res["verdicts"]:
        rid = v["run_id"]
        timed = [
            f["recoverable_ns"]
            for f in res["findings"]
            if f["run_id"] == rid and f["recoverable_ns"] is not None
        ]
        if v["basis"] == "steps":
            rows = [s for s in res["step_time"] if s["run_id"] == rid]
            cut = {(e["rank"], e["step"]) for e in v["excluded_steps"] if e["why"] == "incomplete"}
            analysed = {s["rank"] for s in rows if (s["rank"], s["step"]) not in cut}
            per_rank: dict = {}
            for s in rows:
                if s["rank"] in analysed:
                    per_rank[s["rank"]] = per_rank.get(s["rank"], 0) + s["step_ns"]
        else:
            per_rank = {r["rank"]: r["span_ns"] for r in res["ranks"] if r["run_id"] == rid}
        bound = sum(per_rank.values()) / len(per_rank) if per_rank else 0
        assert all(t >= 0 for t in timed), (rid, timed)
        assert sum(timed) <= bound + len(timed), (
            rid,
            sum(timed),
            bound,
            [f["kind"] for f in res["findings"] if f["run_id"] == rid],
        )
        checked += bool(timed)
    return checked


CHROMIUM = os.environ.get("TRACELAKE_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium for the report's browser tests, one per test process: defined here once
    (a session fixture imported into two test modules is two fixtures, and a second
    sync_playwright() in the same process fails: "Sync API inside the asyncio loop")."""
    from playwright.sync_api import sync_playwright

    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} not found: run `bash scripts/install-browser.sh` (Debian's chromium package), "
            "or set TRACELAKE_CHROMIUM"
        )
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield b
        b.close()


# HTA's simple_add trace (139 kernels a rank) made into FEW ranks of one run, `job`: the inputs of
# the per-source results' tests (test_local_fill.py, test_local_fill_crash.py)
SIMPLE_ADD = corpus(
    "hta", "tests", "data", "critical_path", "simple_add", "benchmark_result_493459_1694039959_trace.json.gz"
)
FEW = 3


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    """A directory `job` of FEW rank files: the same events with distributedInfo.rank 0..FEW-1."""
    import msgspec

    d = tmp_path_factory.mktemp("in") / "job"
    d.mkdir()
    doc = msgspec.json.decode(gzip.decompress(SIMPLE_ADD.read_bytes()))
    for r in range(FEW):
        doc["distributedInfo"] = {"rank": r, "world_size": FEW, "backend": "nccl"}
        (d / f"rank{r}.json").write_bytes(msgspec.json.encode(doc))
    return d


def parquet_rows(lake, table: str) -> list[str]:
    """The table's rows read from every Parquet file under the lake's run directories (pyarrow: no
    listing or manifest of the code under test), each as its repr, sorted."""
    import pyarrow.parquet as pq

    rows = []
    for f in sorted((lake.root / table).glob("run=*/*.parquet")):
        rows += [repr(r) for r in pq.read_table(f).to_pylist()]
    return sorted(rows)
