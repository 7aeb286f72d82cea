"""The critical path of each step across ranks, read back from a replay's times.

A step of a multi-rank run ends when its last rank ends (the rank with the latest step end). From
that end the path walks back along the edge that decided each time (replay.py gives every node the
edge that reproduces it; on a tie the chain predecessor wins) until it reaches that rank's step
start. Crossing a collective it jumps to the rank that arrived last, so the path runs through the
ranks that were waited for. Each edge or node it crosses is a segment; the segments are contiguous
and their lengths add up to the step's time.

Segment kinds (`KINDS`):
- compute, communication, memory, unknown: GPU work of that category (a collective's kernel up to
  its last rank's arrival is not on the path: the path goes to that rank instead);
- transfer: a collective kernel after its last rank arrived;
- gpu_gap: between two activities of one stream (kernel-to-kernel overhead);
- launch: from the host call that launched work to its start (HTA's kernel launch delay);
- cross_stream: from the end of work on another stream to a kernel that waited for it;
- sync: from the end of the work a blocking call waited for to the call's return;
- host: host work between two recorded calls, and the calls themselves;
- data_loading: a DataLoader fetch;
- untraced: before the first node the graph can explain (no launch recorded).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .graph import CATEGORIES, DATA_LOADING, NEG, STEP_END, Graph
from .replay import Durations, Timing

KINDS = (
    "compute",
    "communication",
    "memory",
    "unknown",
    "transfer",
    "gpu_gap",
    "launch",
    "cross_stream",
    "sync",
    "host",
    "data_loading",
    "untraced",
)


def _path(
    g: Graph, d: Durations, t: Timing, pos: tuple[str, int], stop_ns: int, cats: np.ndarray
) -> list[tuple]:
    segs: list[tuple] = []  # (kind, rank, lo, hi, node label)
    first = g.g_first
    name_id = g.frame["name_id"].to_numpy()
    where, k = pos
    guard = 4 * (len(g.g_s) + len(g.h_s)) + 10
    while guard > 0:
        guard -= 1
        if where == "g_end":
            x = t.g_x[k]
            if x != NEG and x + d.g_wc[k] == t.g_end[k] and x + d.g_wc[k] > t.g_start[k] + d.g_d[k]:
                segs.append(("transfer", int(g.g_rank[k]), int(x), int(t.g_end[k]), g.names[name_id[int(k)]]))
                last = int(t.g_last[k])
                if g.g_rank[k] == d.on_time_rank and t.g_start[k] >= x:
                    last = int(k)  # the on-time rank waited for its own arrival
                where, k = "g_start", (last if last >= 0 else k)
                if t.g_start[k] <= stop_ns:
                    break
                continue
            segs.append(
                (cats[k], int(g.g_rank[k]), int(t.g_start[k]), int(t.g_end[k]), g.names[name_id[int(k)]])
            )
            where = "g_start"
        elif where == "g_start":
            s = t.g_start[k]
            if s <= stop_ns:
                break
            if not first[k] and t.g_end[k - 1] + d.g_gap[k] == s:
                segs.append(("gpu_gap", int(g.g_rank[k]), int(t.g_end[k - 1]), int(s), ""))
                where, k = "g_end", k - 1
            elif g.g_launch[k] >= 0 and t.h_start[g.g_launch[k]] + d.g_wl[k] == s:
                li = int(g.g_launch[k])
                segs.append(("launch", int(g.g_rank[k]), int(t.h_start[li]), int(s), str(g.h_name[li])))
                where, k = "h_start", li
            elif g.g_cross[k] >= 0 and t.g_end[g.g_cross[k]] + g.g_wx[k] == s:
                j = int(g.g_cross[k])
                segs.append(("cross_stream", int(g.g_rank[k]), int(t.g_end[j]), int(s), ""))
                where, k = "g_end", j
            else:
                segs.append(("untraced", int(g.g_rank[k]), int(stop_ns), int(s), ""))
                break
        elif where == "h_end":
            dep = int(g.h_dep[k])
            if (
                dep >= 0
                and t.g_end[dep] + g.h_t[k] == t.h_end[k]
                and t.g_end[dep] + g.h_t[k] > t.h_start[k] + d.h_b[k]
            ):
                segs.append(("sync", int(g.h_rank[k]), int(t.g_end[dep]), int(t.h_end[k]), str(g.h_name[k])))
                where, k = "g_end", dep
                continue
            kind = "data_loading" if g.h_what[k] == DATA_LOADING else "host"
            segs.append((kind, int(g.h_rank[k]), int(t.h_start[k]), int(t.h_end[k]), str(g.h_name[k])))
            where = "h_start"
        else:  # h_start
            if t.h_start[k] <= stop_ns:
                break
            if g.h_chain_first[k]:
                segs.append(("untraced", int(g.h_rank[k]), int(stop_ns), int(t.h_start[k]), ""))
                break
            segs.append(("host", int(g.h_rank[k]), int(t.h_end[k - 1]), int(t.h_start[k]), ""))
            where, k = "h_end", k - 1
    return segs


def _telescope(segs: list[tuple], end_ns: int, stop_ns: int) -> list[tuple]:
    """The segments as contiguous pieces from end_ns back to stop_ns: each piece ends where the
    next later one starts, none is negative, the first is cut at stop_ns; their lengths add up to
    end_ns - stop_ns."""
    out = []
    cursor = end_ns
    for kind, rank, lo, hi, label in segs:
        lo2 = max(min(lo, cursor), stop_ns)
        if cursor > lo2:
            out.append((kind, rank, lo2, cursor, label))
        cursor = min(cursor, lo2)
        if cursor <= stop_ns:
            break
    if cursor > stop_ns:
        out.append(("untraced", out[-1][1] if out else -1, stop_ns, cursor, ""))
    return out[::-1]


def paths(g: Graph, d: Durations, t: Timing, win: pl.DataFrame) -> pl.DataFrame:
    """The critical path of every step: one row per segment, in time order. Columns: step,
    end_rank (the rank whose step ended last), seq (from 0), kind (KINDS), rank (whose chain the
    segment is on), start_ns, end_ns (relative to g.t0), dur_ns, name (the kernel or call)."""
    cats = np.array(CATEGORIES, dtype=object)[g.g_cat]
    rows = []
    if win.height == 0:
        return _empty()
    last = win.sort(["end_ns", "rank"]).group_by("step", maintain_order=True).last()
    gs = pl.DataFrame({"gi": np.arange(len(g.g_s)), "rank": g.g_rank, "step": g.g_step, "e": t.g_end}).filter(
        pl.col("step") >= 0
    )
    gmax = gs.sort("e").group_by("rank", "step").last()
    hm = pl.DataFrame(
        {"hi": np.arange(len(g.h_s)), "rank": g.h_rank, "step": g.h_step, "what": g.h_what}
    ).filter(pl.col("what") == STEP_END)
    ends = last.join(gmax, on=["rank", "step"], how="left").join(hm, on=["rank", "step"], how="left")
    for r in ends.sort("step").iter_rows(named=True):
        start, end = int(r["start_ns"]), int(r["end_ns"])
        if r["e"] is not None and int(r["e"]) == end:
            pos = ("g_end", int(r["gi"]))
        elif r["hi"] is not None:
            pos = ("h_end", int(r["hi"]))
        else:
            continue
        segs = _telescope(_path(g, d, t, pos, start, cats), end, start)
        for i, (kind, rank, lo, hi, label) in enumerate(segs):
            rows.append((int(r["step"]), int(r["rank"]), i, kind, rank, lo, hi, hi - lo, label))
    if not rows:
        return _empty()
    return pl.DataFrame(
        rows,
        schema=["step", "end_rank", "seq", "kind", "rank", "start_ns", "end_ns", "dur_ns", "name"],
        orient="row",
    )


def path_in_window(g: Graph, d: Durations, t: Timing, rank: int, start_ns: int, end_ns: int) -> pl.DataFrame:
    """The critical path of one rank's window [start_ns, end_ns] (relative to g.t0), as HTA's
    CriticalPathAnalysis takes one annotation instance: from the latest end, at or before end_ns,
    of the rank's GPU work launched in the window or its host nodes starting in it, back to
    start_ns. Columns as paths() without step and end_rank. Empty when nothing is in the window."""
    cats = np.array(CATEGORIES, dtype=object)[g.g_cat]
    launch = np.where(g.g_launch >= 0, t.h_start[np.maximum(g.g_launch, 0)], t.g_start)
    gi = np.nonzero((g.g_rank == rank) & (launch >= start_ns) & (launch <= end_ns) & (t.g_end <= end_ns))[0]
    hi = np.nonzero((g.h_rank == rank) & (t.h_start >= start_ns) & (t.h_end <= end_ns))[0]
    best_g = gi[np.argmax(t.g_end[gi])] if len(gi) else -1
    best_h = hi[np.argmax(t.h_end[hi])] if len(hi) else -1
    if best_g < 0 and best_h < 0:
        return _empty().drop("step", "end_rank")
    if best_h < 0 or (best_g >= 0 and t.g_end[best_g] >= t.h_end[best_h]):
        pos, end = ("g_end", int(best_g)), int(t.g_end[best_g])
    else:
        pos, end = ("h_end", int(best_h)), int(t.h_end[best_h])
    segs = _telescope(_path(g, d, t, pos, start_ns, cats), end, start_ns)
    return pl.DataFrame(
        [(i, k, r, lo, hi, hi - lo, n) for i, (k, r, lo, hi, n) in enumerate(segs)],
        schema=["seq", "kind", "rank", "start_ns", "end_ns", "dur_ns", "name"],
        orient="row",
    )


def _empty() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            "step": pl.Int64,
            "end_rank": pl.Int64,
            "seq": pl.Int64,
            "kind": pl.String,
            "rank": pl.Int64,
            "start_ns": pl.Int64,
            "end_ns": pl.Int64,
            "dur_ns": pl.Int64,
            "name": pl.String,
        }
    )
