"""The lake's rows of a timeline window as slices (pipeline/timeline/layout.py Slice), read with
SQL over a pipeline.query connection; window tests in pipeline/timeline/window.py. All times are
int64 ns on the lake's absolute clock.

Sources, one slice per row of the window:
- gpu_activities (kernels, memcpy, memset, sync): on the track of their (device, stream);
- cpu_ops (ops, annotations, runtime and driver calls, Python frames): on their thread (tid);
- annotations: GPU-side ones (with a stream, Kineto gpu_user_annotation) on their stream's
  track; host-side ones (NVTX) on their thread, except those that are also a cpu_ops row of the
  same source, rank, thread, start and end (Nsight Systems exports hold NVTX ranges in both);
- idle_gap_intervals (queries/views/48_idle_gap_intervals.sql, the gaps idle_gaps.sql counts):
  each rank's GPU idle gaps, named by cause, on its "idle" track;
- collective_calls (queries/views/40_collective_calls.sql, the matching of collective_matching):
  each call with a straggler (the last rank to arrive) gives one flow from the straggler's kernel
  to each other rank's kernel of the call (each rank's latest-starting kernel in the call).
"""

from __future__ import annotations

from .layout import Slice
from .window import Window, overlap_sql, params

# Kineto's categories for the lake's kinds, so the trace reads back as a Kineto trace
GPU_CAT = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "sync": "cuda_sync"}
CPU_CAT = {
    "op": "cpu_op",
    "annotation": "user_annotation",
    "runtime": "cuda_runtime",
    "driver": "cuda_driver",
    "python": "python_function",
}
# Chrome's reserved colour names for the idle causes (the Perfetto UI colours by name instead)
IDLE_COLOUR = {"host_wait": "terrible", "kernel_wait": "yellow", "other": "olive", "unreliable": "grey"}

_W = overlap_sql()
_GPU = f"""
SELECT rank, device, stream, kind, category, name, start_ns, end_ns, correlation, external_id, bytes,
  copy_kind, step, launch_ns, event_index, source_id
FROM gpu_activities WHERE run_id = $r AND list_contains($ranks, rank) AND {_W}"""
_CPU = f"""
SELECT rank, pid, tid, kind, category, name, start_ns, end_ns, correlation, external_id, event_index
FROM cpu_ops WHERE run_id = $r AND list_contains($ranks, rank) AND {_W}"""
_ANN = f"""
SELECT a.rank, a.kind, a.domain, a.name, a.start_ns, a.end_ns, a.device, a.stream, a.pid, a.tid
FROM annotations a
WHERE a.run_id = $r AND list_contains($ranks, a.rank) AND {overlap_sql("a.start_ns", "a.end_ns")}
  AND (a.stream IS NOT NULL OR NOT EXISTS (
    SELECT 1 FROM cpu_ops c WHERE c.run_id = a.run_id AND c.source_id = a.source_id AND c.rank = a.rank
      AND c.tid IS NOT DISTINCT FROM a.tid AND c.start_ns = a.start_ns AND c.end_ns = a.end_ns))"""
_IDLE = f"""
SELECT rank, start_ns, end_ns, cause FROM idle_gap_intervals
WHERE run_id = $r AND list_contains($ranks, rank) AND {_W}"""
_FLOWS = """
WITH calls AS (
  SELECT run_id, pg_key, call_key, op, straggler_rank FROM collective_calls
  WHERE run_id = $r AND straggler_rank IS NOT NULL
),
k AS (
  SELECT r.pg_key, r.call_key, r.rank, r.device, r.stream, r.start_ns, c.op, c.straggler_rank,
    row_number() OVER (PARTITION BY r.pg_key, r.call_key, r.rank ORDER BY r.start_ns DESC, r.end_ns DESC) AS n
  FROM collective_ranks r JOIN calls c USING (run_id, pg_key, call_key)
  WHERE r.timing_source = 'gpu_kernel' AND list_contains($ranks, r.rank)
)
SELECT pg_key, call_key, op, straggler_rank, rank, device, stream, start_ns FROM k WHERE n = 1
ORDER BY pg_key, call_key, rank"""


def count(con, w: Window) -> int:
    """How many slices the window's rows make (GPU work, host ops, annotations, idle gaps): the
    size check runs before anything is read."""
    p = params(w)
    return sum(con.execute(f"SELECT count(*) FROM ({q})", p).fetchone()[0] for q in (_GPU, _CPU, _ANN, _IDLE))


def _rows(con, sql: str, w: Window) -> list[dict]:
    cur = con.execute(sql, {k: v for k, v in params(w).items() if "$" + k in sql})
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _clean(d: dict) -> dict:
    return {k: v for k, v in d.items() if v is not None}


def gpu_track(device, stream) -> tuple:
    return ("gpu", -1 if device is None else device, -1 if stream is None else stream)


def slices(con, w: Window) -> list[Slice]:
    """Every slice of the window (GPU work, host ops, annotations, idle gaps), unplaced."""
    out: list[Slice] = []
    for r in _rows(con, _GPU, w):
        args = _clean(
            {
                "device": r["device"],
                "stream": r["stream"],
                "correlation": r["correlation"],
                "External id": r["external_id"],
                "bytes": r["bytes"],
                "copy_kind": r["copy_kind"],
                "category": r["category"],
                "step": r["step"],
                "launch_ns": r["launch_ns"],
            }
        )
        out.append(
            Slice(
                r["rank"],
                gpu_track(r["device"], r["stream"]),
                r["name"],
                GPU_CAT.get(r["kind"], r["kind"]),
                r["start_ns"],
                r["end_ns"],
                args,
                key=("gpu", r["rank"], r["device"], r["stream"], r["start_ns"]),
            )
        )
    for r in _rows(con, _CPU, w):
        args = _clean(
            {
                "kind": r["kind"],
                "category": r["category"],
                "correlation": r["correlation"],
                "External id": r["external_id"],
                "os_pid": r["pid"],
                "os_tid": r["tid"],
            }
        )
        cat = CPU_CAT.get(r["kind"], r["kind"])
        out.append(Slice(r["rank"], ("cpu", r["tid"]), r["name"], cat, r["start_ns"], r["end_ns"], args))
    for r in _rows(con, _ANN, w):
        args = _clean(
            {"kind": r["kind"], "domain": r["domain"], "device": r["device"], "stream": r["stream"]}
        )
        if r["stream"] is not None:
            track, cat = gpu_track(r["device"], r["stream"]), "gpu_user_annotation"
        else:
            track, cat = ("cpu", r["tid"]), "nvtx"
        out.append(Slice(r["rank"], track, r["name"], cat, r["start_ns"], r["end_ns"], args))
    for r in _rows(con, _IDLE, w):
        out.append(
            Slice(
                r["rank"],
                ("idle",),
                r["cause"],
                "idle",
                r["start_ns"],
                r["end_ns"],
                {"cause": r["cause"], "gap_ns": r["end_ns"] - r["start_ns"]},
                cname=IDLE_COLOUR.get(r["cause"]),
            )
        )
    return out


def flows(con, w: Window, by_key: dict) -> list[tuple]:
    """(source slice, target slice, source ts, target ts, name) for each matched collective with
    a straggler whose kernels are both in the window: from the straggler's kernel (at its start)
    to each other rank's (at the straggler's start, clamped into the target kernel)."""
    calls: dict[tuple, list[dict]] = {}
    for r in _rows(con, _FLOWS, w):
        calls.setdefault((r["pg_key"], r["call_key"]), []).append(r)
    out = []
    for (pg, call), ranks in calls.items():
        last = next((r for r in ranks if r["rank"] == r["straggler_rank"]), None)
        if last is None:
            continue
        src = by_key.get(("gpu", last["rank"], last["device"], last["stream"], last["start_ns"]))
        if src is None:
            continue
        for r in ranks:
            dst = by_key.get(("gpu", r["rank"], r["device"], r["stream"], r["start_ns"]))
            if r is last or dst is None:
                continue
            ts = min(max(src.start_ns, dst.start_ns), dst.end_ns)
            out.append((src, dst, src.start_ns, ts, f"{r['op']} {pg} #{call}: rank {last['rank']} last"))
    return out


def processes(con, w: Window) -> dict[int, str]:
    """rank -> 'rank N · host · GPU' (host and GPU name left out when the lake lacks them)."""
    p = params(w)
    host = dict(
        con.execute(
            "SELECT r, any_value(host) FROM (SELECT rank AS r, host FROM sources WHERE rank IS NOT NULL "
            "AND run_id = $r UNION ALL SELECT unnest(ranks) AS r, host FROM sources WHERE rank IS NULL "
            "AND run_id = $r) WHERE host IS NOT NULL AND host <> '' GROUP BY r",
            {"r": p["r"]},
        ).fetchall()
    )
    dev = dict(
        con.execute(
            "SELECT rank, device_name FROM rank_device WHERE run_id = $r AND device_name IS NOT NULL",
            {"r": p["r"]},
        ).fetchall()
    )
    return {r: " · ".join(x for x in (f"rank {r}", host.get(r), dev.get(r)) if x) for r in w.ranks}
