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
from .kinds import KINDS  # noqa: F401  (the segment kinds, defined there)
from .replay import Durations, Timing


def _path(g: Graph, d: Durations, t: Timing, pos: tuple[str, int], stop_ns: int) -> list[tuple]:
    segs: list[tuple] = []  # (kind, rank, lo, hi, node label)
    add = segs.append
    first, g_rank, h_rank, g_cat = g.g_first, g.g_rank, g.h_rank, g.g_cat
    g_start, g_end, h_start, h_end, g_x, g_last = t.g_start, t.g_end, t.h_start, t.h_end, t.g_x, t.g_last
    g_wc, g_d, g_gap, g_wl, h_b = d.g_wc, d.g_d, d.g_gap, d.g_wl, d.h_b
    g_launch, g_cross, g_wx, h_dep, h_t = g.g_launch, g.g_cross, g.g_wx, g.h_dep, g.h_t
    name_id, names = _name_ids(g), g.names
    h_codes, h_names = _host_names(g)
    on_time = d.on_time_rank
    where, k = pos
    guard = 4 * (len(g.g_s) + len(g.h_s)) + 10
    while guard > 0:
        guard -= 1
        if where == "g_end":
            x = g_x[k]
            if x != NEG and x + g_wc[k] == g_end[k] and x + g_wc[k] > g_start[k] + g_d[k]:
                add(("transfer", int(g_rank[k]), int(x), int(g_end[k]), names[name_id[k]]))
                last = int(g_last[k])
                if g_rank[k] == on_time and g_start[k] >= x:
                    last = int(k)  # the on-time rank waited for its own arrival
                where, k = "g_start", (last if last >= 0 else k)
                if g_start[k] <= stop_ns:
                    break
                continue
            add((CATEGORIES[g_cat[k]], int(g_rank[k]), int(g_start[k]), int(g_end[k]), names[name_id[k]]))
            where = "g_start"
        elif where == "g_start":
            s = g_start[k]
            if s <= stop_ns:
                break
            if not first[k] and g_end[k - 1] + g_gap[k] == s:
                add(("gpu_gap", int(g_rank[k]), int(g_end[k - 1]), int(s), ""))
                where, k = "g_end", k - 1
            elif g_launch[k] >= 0 and h_start[g_launch[k]] + g_wl[k] == s:
                li = int(g_launch[k])
                add(("launch", int(g_rank[k]), int(h_start[li]), int(s), h_names[h_codes[li]]))
                where, k = "h_start", li
            elif g_cross[k] >= 0 and g_end[g_cross[k]] + g_wx[k] == s:
                j = int(g_cross[k])
                add(("cross_stream", int(g_rank[k]), int(g_end[j]), int(s), ""))
                where, k = "g_end", j
            else:
                add(("untraced", int(g_rank[k]), int(stop_ns), int(s), ""))
                break
        elif where == "h_end":
            dep = int(h_dep[k])
            if dep >= 0 and g_end[dep] + h_t[k] == h_end[k] and g_end[dep] + h_t[k] > h_start[k] + h_b[k]:
                add(("sync", int(h_rank[k]), int(g_end[dep]), int(h_end[k]), h_names[h_codes[k]]))
                where, k = "g_end", dep
                continue
            kind = "data_loading" if g.h_what[k] == DATA_LOADING else "host"
            add((kind, int(h_rank[k]), int(h_start[k]), int(h_end[k]), h_names[h_codes[k]]))
            where = "h_start"
        else:  # h_start
            if h_start[k] <= stop_ns:
                break
            if g.h_chain_first[k]:
                add(("untraced", int(h_rank[k]), int(stop_ns), int(h_start[k]), ""))
                break
            add(("host", int(h_rank[k]), int(h_end[k - 1]), int(h_start[k]), ""))
            where, k = "h_end", k - 1
    return segs


def _name_ids(g: Graph) -> np.ndarray:
    """Per GPU node, its name's number."""
    return g.g_name


def _host_names(g: Graph) -> tuple[np.ndarray, list[str]]:
    """Per host node the number of its name, and the names."""
    if getattr(g, "_host_names", None) is None:
        names = g.h_name.cast(pl.Utf8)
        u = names.unique(maintain_order=True)
        codes = names.cast(pl.Enum(u)).to_physical().to_numpy()
        g._host_names = (codes, u.to_list())
    return g._host_names


COLUMNS = ("kind", "rank", "start_ns", "end_ns", "name")


def _telescope(segs: list[tuple], end_ns: int, stop_ns: int) -> dict[str, list]:
    """The segments as contiguous pieces from end_ns back to stop_ns, in time order, as columns
    (COLUMNS): each piece ends where the next later one starts, none is negative, the first is cut
    at stop_ns; their lengths add up to end_ns - stop_ns. (The cursor after a segment is its start
    clipped to [stop_ns, cursor]: a running minimum of the starts, so the list is cut in a few
    vectorized passes.)"""
    kind, rank, lo, hi, label = (list(c) for c in zip(*segs)) if segs else ([], [], [], [], [])
    lo = np.asarray(lo, dtype=np.int64)
    cur = np.maximum(np.minimum(np.minimum.accumulate(lo), end_ns), stop_ns)  # cursor after each
    before = np.empty_like(cur)
    before[:1] = end_ns
    before[1:] = cur[:-1]
    live = before > stop_ns  # segments reached before the cursor got to stop_ns
    keep = np.nonzero(live & (before > cur))[0][::-1]
    out = {
        "kind": [kind[i] for i in keep],
        "rank": [rank[i] for i in keep],
        "start_ns": cur[keep].tolist(),
        "end_ns": before[keep].tolist(),
        "name": [label[i] for i in keep],
    }
    last = int(cur[live][-1]) if live.any() else end_ns
    if last > stop_ns:
        for k, v in zip(COLUMNS, ("untraced", out["rank"][0] if keep.size else -1, stop_ns, last, "")):
            out[k].insert(0, v)
    return out


def paths(g: Graph, d: Durations, t: Timing, win: pl.DataFrame) -> pl.DataFrame:
    """The critical path of every step: one row per segment, in time order. Columns: step,
    end_rank (the rank whose step ended last), seq (from 0), kind (KINDS), rank (whose chain the
    segment is on), start_ns, end_ns (relative to g.t0), dur_ns, name (the kernel or call)."""
    if win.height == 0:
        return _empty()
    last = win.sort(["end_ns", "rank"]).group_by("step", maintain_order=True).last()
    # the last-ending activity (the latest node of equal ends) of each step's last rank, within
    # that rank's rows (the GPU rows are in rank order): only the steps' last ranks are read
    gi, ge = [], []
    for rank, step in last.select("rank", "step").iter_rows():
        lo, hi = np.searchsorted(g.g_rank, rank, "left"), np.searchsorted(g.g_rank, rank, "right")
        m = np.flatnonzero(g.g_step[lo:hi] == step)
        e = t.g_end[lo:hi][m]
        gi.append(int(lo + m[e == e.max()].max()) if len(m) else None)
        ge.append(int(e.max()) if len(m) else None)
    gmax = last.select("rank", "step").with_columns(
        pl.Series("gi", gi, dtype=pl.Int64), pl.Series("e", ge, dtype=pl.Int64)
    )
    ends_h = np.flatnonzero(g.h_what == STEP_END)
    hm = pl.DataFrame({"hi": ends_h, "rank": g.h_rank[ends_h], "step": g.h_step[ends_h]})
    ends = last.join(gmax, on=["rank", "step"], how="left").join(hm, on=["rank", "step"], how="left")
    cols: dict[str, list] = {k: [] for k in ("step", "end_rank", "seq", *COLUMNS)}
    for r in ends.sort("step").iter_rows(named=True):
        start, end = int(r["start_ns"]), int(r["end_ns"])
        if r["e"] is not None and int(r["e"]) == end:
            pos = ("g_end", int(r["gi"]))
        elif r["hi"] is not None:
            pos = ("h_end", int(r["hi"]))
        else:
            continue
        segs = _telescope(_path(g, d, t, pos, start), end, start)
        n = len(segs["kind"])
        cols["step"] += [int(r["step"])] * n
        cols["end_rank"] += [int(r["rank"])] * n
        cols["seq"] += range(n)
        for k in COLUMNS:
            cols[k] += segs[k]
    if not cols["step"]:
        return _empty()
    f = pl.DataFrame(cols, schema=_empty().drop("dur_ns").schema)
    return f.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).select(_empty().columns)


def path_in_window(g: Graph, d: Durations, t: Timing, rank: int, start_ns: int, end_ns: int) -> pl.DataFrame:
    """The critical path of one rank's window [start_ns, end_ns] (relative to g.t0), as HTA's
    CriticalPathAnalysis takes one annotation instance: from the latest end, at or before end_ns,
    of the rank's GPU work launched in the window or its host nodes starting in it, back to
    start_ns. Columns as paths() without step and end_rank. Empty when nothing is in the window."""
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
    segs = _telescope(_path(g, d, t, pos, start_ns), end, start_ns)
    shape = _empty().drop("step", "end_rank")
    f = pl.DataFrame({"seq": range(len(segs["kind"])), **segs}, schema=shape.drop("dur_ns").schema)
    return f.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")).select(shape.columns)


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
