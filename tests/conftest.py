"""Shared fixtures: corpus locations (../shared/corpus, CI has it too) and trace builders."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACELAKE_CORPUS", REPO.parent / "shared" / "corpus"))
KINETO_DIRS = [CORPUS / d for d in ("hta", "param", "tracelens", "kineto")]


def corpus(*parts: str) -> Path:
    p = CORPUS.joinpath(*parts)
    if not p.exists():
        pytest.fail(f"corpus file missing: {p} (tests need ../shared/corpus beside the repo, or TRACELAKE_CORPUS)")
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
