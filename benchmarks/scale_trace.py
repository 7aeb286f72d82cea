"""Scale a real corpus Kineto trace to N ranks x M kernels, keeping its shape.

The source trace's events are repeated R = ceil(M / kernels in the source) times, each copy shifted
by the trace's span (plus 1 ms) so copies follow one another like further profiler steps:
`ts` moves by R*span, correlation and External ids by the source's largest id + 1 per copy, flow
ids likewise, ProfilerStep#n becomes ProfilerStep#(n + copy*steps). Every rank gets the same
events (one rank's work, as in data-parallel training) with distributedInfo.rank = r and
world_size = N; the kernel mix, the CPU/GPU event ratio, the launch joins, the collectives and the
step structure stay those of the real trace.

Two outputs:
- JSON traces (`--out DIR`): rank<r>.json or .json.gz, Kineto's own layout, for ingest benchmarks;
  `--mb X` sizes one file by its uncompressed bytes instead of --kernels (a 2 GB trace: --mb 2048).
- a lake (`--lake DIR`): the source ingested once, its tables repeated the same way (start/end
  times, ids, event indexes, steps, collective seq) and written for N ranks, for analysis
  benchmarks at sizes whose JSON would take hours to write and ingest (64 ranks x 100k kernels is
  ~10 GB of JSON). `--check` compares that lake with an ingest of the JSON traces at a small size.

  python benchmarks/scale_trace.py [--source TRACE] (--out DIR | --lake DIR) --ranks N
                                   (--kernels M | --mb X) [--gz]
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import sys
import time
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CORPUS = REPO.parent / "shared" / "corpus"
# 1154 kernels (NCCL and compute), 2329 CPU ops, 1204 launches, 40 memcpy, 10 memset, 4 steps: a
# real rank of a 128-rank NCCL job (hta.md section 2)
DEFAULT_SOURCE = CORPUS / "hta" / "tests" / "data" / "trace_filter" / "sampled_rank-0.json.gz"
GPU_CATS = {"kernel", "Kernel", "mtia_ccp_events"}
_STEP = re.compile(r"^(ProfilerStep\s*#\s*)(\d+)$")


def load(source: Path) -> dict:
    raw = source.read_bytes()
    return msgspec.json.decode(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


class Shape:
    """What one copy shifts by."""

    def __init__(self, doc: dict):
        ev = doc["traceEvents"] if isinstance(doc, dict) else doc
        xs = [e for e in ev if isinstance(e.get("ts"), (int, float))]
        lo = min(float(e["ts"]) for e in xs)
        hi = max(float(e["ts"]) + float(e.get("dur") or 0) for e in xs)
        self.span_us = int(math.ceil(hi - lo)) + 1000
        ids = [0]
        for e in ev:
            a = e.get("args") or {}
            for k in ("correlation", "External id", "external id"):
                if isinstance(a.get(k), int):
                    ids.append(a[k])
            if isinstance(e.get("id"), int):
                ids.append(e["id"])
        self.id_step = max(ids) + 1
        steps = [
            int(m.group(2)) for e in ev if isinstance(e.get("name"), str) and (m := _STEP.match(e["name"]))
        ]
        self.step_step = (max(steps) - min(steps) + 1) if steps else 0
        self.kernels = sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") in GPU_CATS)
        self.events = len(ev)
        self.seq_step = 1 + max(
            [
                int(a["Seq"])
                for e in ev
                if isinstance(a := e.get("args") or {}, dict) and isinstance(a.get("Seq"), int)
            ]
            or [0]
        )


def shifted(ev: dict, k: int, shape: Shape) -> dict:
    if k == 0:
        return ev
    e = dict(ev)
    ts = e.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        e["ts"] = ts + k * shape.span_us
    elif isinstance(ts, str):
        e["ts"] = f"{float(ts) + k * shape.span_us:.3f}"
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * shape.id_step
    name = e.get("name")
    if shape.step_step and isinstance(name, str) and (m := _STEP.match(name)):
        e["name"] = f"{m.group(1)}{int(m.group(2)) + k * shape.step_step}"
    a = e.get("args")
    if isinstance(a, dict) and any(x in a for x in ("correlation", "External id", "external id", "Seq")):
        a = dict(a)
        for key in ("correlation", "External id", "external id"):
            if isinstance(a.get(key), int):
                a[key] = a[key] + k * shape.id_step
        if isinstance(a.get("Seq"), int):
            a["Seq"] = a["Seq"] + k * shape.seq_step
        e["args"] = a
    return e


def write_json(doc: dict, shape: Shape, path: Path, rank: int, world: int, copies: int, gz: bool) -> int:
    """One rank's trace; returns its uncompressed size."""
    top = {k: v for k, v in doc.items() if k not in ("traceEvents", "baseTimeNanoseconds", "traceName")}
    di = dict(top.get("distributedInfo") or {})
    di.update(rank=rank, world_size=world)
    top["distributedInfo"] = di
    enc = msgspec.json.Encoder()
    opener = (
        (lambda p: __import__("isal.igzip", fromlist=["open"]).open(p, "wb", compresslevel=1))
        if gz
        else (lambda p: open(p, "wb"))
    )
    n = 0
    with opener(path) as f:
        # `"rank": N` with the space Kineto writes: HTA finds a file's rank with the regex
        # `"rank":\s+(\d+)`, and reads every compact `"rank":N` file as rank 0 (one of N loaded)
        head = enc.encode(top)[:-1].replace(b'"rank":', b'"rank": ') + b', "traceEvents": [\n'
        f.write(head)
        n += len(head)
        first = True
        for k in range(copies):
            buf = [enc.encode(shifted(e, k, shape)) for e in doc["traceEvents"]]
            block = (b"" if first else b",\n") + b",\n".join(buf)
            first = False
            f.write(block)
            n += len(block)
        tail = {k: doc[k] for k in ("traceName", "baseTimeNanoseconds") if k in doc}
        end = b"\n]" + (b", " + enc.encode(tail)[1:] if tail else b"}") + b"\n"
        f.write(end)
        n += len(end)
    return n


def write_traces(
    source: Path, out: Path, ranks: int, kernels: int | None, mb: float | None, gz: bool
) -> list[Path]:
    doc = load(source)
    shape = Shape(doc)
    if mb is not None:
        one = len(msgspec.json.encode(doc["traceEvents"]))
        copies = max(1, round(mb * 1e6 / one))
    else:
        copies = max(1, math.ceil(kernels / max(shape.kernels, 1)))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(ranks):
        p = out / f"rank{r}.json{'.gz' if gz else ''}"
        write_json(doc, shape, p, r, ranks, copies, gz)
        paths.append(p)
    return paths


# ------------------------------------------------------------------ lake


def write_lake(source: Path, lake_dir: Path, ranks: int, kernels: int, run: str = "scaled") -> dict:
    """The source ingested once and its tables repeated (as write_json would) for `ranks` ranks.
    Returns {"copies", "kernels_per_rank", "rows_per_rank"}."""
    import tempfile

    import polars as pl

    from pipeline import local_fill
    from pipeline import schema as sch
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    doc = load(source)
    shape = Shape(doc)
    copies = max(1, math.ceil(kernels / max(shape.kernels, 1)))
    with tempfile.TemporaryDirectory() as tmp:
        one = Lake(Path(tmp) / "one")
        (res,) = ingest_paths([source], one, run="one", rank=0)
        assert res.status == "ok", res.error
        tables = {}
        for t in sch.tables():
            if t.startswith("local_"):  # per-source results: computed below for each written rank
                continue
            files = one.table_files(t)
            if files:
                tables[t] = pl.concat([pl.read_parquet(f) for f in files], how="vertical_relaxed")
    src_row = tables.pop("sources").to_dicts()[0]
    for c in ("input_dims", "input_types"):  # JSON text as the JSON writer re-encodes it (compact)
        if "cpu_ops" in tables and c in tables["cpu_ops"].columns:
            tables["cpu_ops"] = tables["cpu_ops"].with_columns(
                pl.col(c).map_elements(
                    lambda x: msgspec.json.encode(msgspec.json.decode(x)).decode(), return_dtype=pl.String
                )
            )
    span_ns, ids, nev = shape.span_us * 1000, shape.id_step, shape.events
    rep = {}
    for t, df in tables.items():
        if t in ("devices", "process_groups"):
            rep[t] = df
            continue
        parts = []
        for k in range(copies):
            cols = []
            for c in df.columns:
                if c.endswith("start_ns") or c.endswith("end_ns") or c == "ts_ns":
                    cols.append(pl.col(c) + k * span_ns)
                elif c in ("correlation", "external_id"):
                    cols.append(pl.col(c) + k * ids)
                elif c == "event_index":
                    cols.append(pl.col(c) + k * nev)
                elif c == "seq" and t == "collectives":
                    cols.append(pl.col(c) + k * shape.seq_step)
                elif c == "step" and t == "steps":
                    cols.append(pl.col(c) + k * shape.step_step)
            d = df.with_columns(cols) if cols else df
            if (
                shape.step_step and "name" in d.columns
            ):  # ProfilerStep#n -> #(n + k*steps), wherever it is a name
                n = pl.col("name").str.extract(r"^ProfilerStep\s*#\s*(\d+)$").cast(pl.Int64)
                d = d.with_columns(
                    name=pl.when(n.is_not_null())
                    .then(pl.col("name").str.replace(r"\d+$", "") + (n + k * shape.step_step).cast(pl.String))
                    .otherwise(pl.col("name"))
                )
            parts.append(d)
        rep[t] = pl.concat(parts)
    lake = Lake(lake_dir)
    lake.ensure()
    rows = 0
    with lake.lock():
        for r in range(ranks):
            sid = f"{r:016x}"
            out = {}
            for t, df in rep.items():
                d = df.with_columns(run_id=pl.lit(run), source_id=pl.lit(sid))
                if "rank" in d.columns:
                    d = d.with_columns(rank=pl.lit(r, dtype=pl.Int32))
                out[t] = d.to_arrow()
                rows += d.height if r == 0 else 0
            row = {
                **src_row,
                "source_id": sid,
                "run_id": run,
                "rank": r,
                "ranks": [r],
                "world_size": ranks,
                "rank_source": "distributed_info",
                "content_sha256": f"{r:064x}",
                "path": f"{source}#rank{r}",
                "event_count": src_row["event_count"] * copies,
                "trace_end_ns": src_row["trace_end_ns"] + (copies - 1) * span_ns,
            }
            lake.write_source(run, sid, out, row)
    # what ingest stores with each source of that size (pipeline/local.py), timed apart: ingest
    # computes it in the worker that reads the file
    t = time.perf_counter()
    with_local = local_fill.backfill(lake)
    return {
        "copies": copies,
        "kernels_per_rank": shape.kernels * copies,
        "rows_per_rank": rows,
        "local_sources": with_local,
        "local_s": time.perf_counter() - t,
    }


def check(source: Path, tmp: Path) -> list[str]:
    """The lake writer against an ingest of the JSON traces (2 ranks, 3 copies): the same rows in
    every table, apart from the identity columns. Returns the differences (none when equal)."""
    import polars as pl

    from pipeline import schema as sch
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    shape = Shape(load(source))
    paths = write_traces(source, tmp / "json", 2, shape.kernels * 3, None, gz=False)
    a = Lake(tmp / "from_json")
    res = ingest_paths(paths, a, run="scaled")
    assert all(r.status == "ok" for r in res), [r.error for r in res]
    b = Lake(tmp / "from_lake")
    write_lake(source, b.root, 2, shape.kernels * 3)
    diffs = []
    skip = {"source_id", "run_id"}
    for t in sch.tables():
        if t == "sources":
            continue
        fa, fb = a.table_files(t), b.table_files(t)
        if not fa and not fb:
            continue
        da = pl.concat([pl.read_parquet(f) for f in fa], how="vertical_relaxed") if fa else pl.DataFrame()
        db = pl.concat([pl.read_parquet(f) for f in fb], how="vertical_relaxed") if fb else pl.DataFrame()
        cols = [c for c in da.columns if c not in skip and c != "run"]
        da, db = da.select(cols), db.select(cols)
        key = [c for c in cols if da.schema[c] != pl.List]
        if da.sort(key, nulls_last=True).equals(db.sort(key, nulls_last=True)) is False:
            diffs.append(f"{t}: {da.height} rows from JSON, {db.height} from the lake writer")
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--lake", type=Path)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--kernels", type=int)
    ap.add_argument("--mb", type=float)
    ap.add_argument("--gz", action="store_true")
    ap.add_argument(
        "--check", type=Path, help="a scratch directory: compare the lake writer with ingested JSON"
    )
    a = ap.parse_args()
    if a.check:
        d = check(a.source, a.check)
        print("check: " + ("lake writer == ingest of the JSON traces" if not d else "; ".join(d)))
        raise SystemExit(1 if d else 0)
    if a.out:
        paths = write_traces(a.source, a.out, a.ranks, a.kernels, a.mb, a.gz)
        print(f"wrote {len(paths)} traces to {a.out}")
    if a.lake:
        info = write_lake(a.source, a.lake, a.ranks, a.kernels or 0)
        print(f"wrote a lake of {a.ranks} ranks x {info['kernels_per_rank']} kernels to {a.lake}")


if __name__ == "__main__":
    main()
