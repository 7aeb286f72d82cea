"""Re-timing a run's dependency graph (pipeline/whatif/graph.py) with some durations changed.

Every chain is a max-plus recurrence, end_k = max(end_{k-1} + c_k, A_k): c_k the time a node adds
after its predecessor on the chain (the gap before it and its own duration), A_k the latest time
its other edges allow (launch, cross-stream, sync, the collective's last arrival). With E the
chain's running sum of c, end_k = E_k + max(end_-1, max_{j<=k} (A_j - E_j)): a cumulative sum and
a cumulative maximum per chain, so a whole chain is re-timed in a few vectorized passes. The
chains are re-timed in turn (host chains, then stream chains) until no time changes: each round
settles at least one more edge between chains along every path, and the graph is acyclic, so the
rounds stop (a graph that does not settle in `max_rounds` has a cycle: ValueError).

With nothing changed the replay reproduces every recorded time exactly (graph.py gives each node
the edge and weight that explain its start), so the identity replay's error measures only what
the graph leaves out (work not in the lake, such as kernels before the trace's first launch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .graph import NEG, Graph


@dataclass
class Durations:
    """What a change alters: each GPU node's duration and the time it adds after the last arrival
    of its collective, the host nodes' own time and gap, the launch edges' weight, and which
    rank's arrivals are not waited for (-1: none)."""

    g_d: np.ndarray
    g_wc: np.ndarray
    g_wl: np.ndarray
    g_gap: np.ndarray
    h_b: np.ndarray
    h_gap: np.ndarray
    coll_free: np.ndarray  # bool per GPU node: its collective waits for nobody
    on_time_rank: int = -1


def measured(g: Graph) -> Durations:
    return Durations(
        g_d=g.g_d.copy(),
        g_wc=g.g_wc.copy(),
        g_wl=g.g_wl.copy(),
        g_gap=g.g_gap.copy(),
        h_b=g.h_b.copy(),
        h_gap=g.h_gap.copy(),
        coll_free=np.zeros(len(g.g_d), dtype=bool),
    )


@dataclass
class Timing:
    """A replay's times (relative to Graph.t0) and, per node, which edge decided its end."""

    g_start: np.ndarray
    g_end: np.ndarray
    h_start: np.ndarray
    h_end: np.ndarray
    g_x: np.ndarray  # per GPU node: its collective's last arrival (NEG: none)
    g_last: np.ndarray  # per GPU node: the member that arrived last (-1: none)
    rounds: int


def _seg_cumsum(c: np.ndarray, first: np.ndarray) -> np.ndarray:
    cs = np.cumsum(c)
    starts = np.nonzero(first)[0]
    base = np.repeat(cs[starts] - c[starts], np.diff(np.append(starts, len(c))))
    return cs - base


def _seg_cummax(v: np.ndarray, first: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Cumulative maximum of v within each chain, never below the chain's floor (one value per
    node, constant on a chain). Chains are shifted apart so one pass serves them all."""
    v = np.maximum(v, floor)
    rel = v - floor
    seg = np.cumsum(first) - 1
    big = int(rel.max()) + 1 if len(rel) else 1
    off = seg.astype(np.int64) * big
    return np.maximum.accumulate(rel + off) - off + floor


def _scan(c: np.ndarray, a: np.ndarray, first: np.ndarray, base: np.ndarray | None) -> np.ndarray:
    """end_k = max(end_{k-1} + c_k, a_k) per chain, end_-1 = base (one value per node; None: no
    base, the chain's first node has a finite a)."""
    e = _seg_cumsum(c, first)
    v = a - e
    if base is None:
        starts = np.nonzero(first)[0]
        base = np.repeat(v[starts], np.diff(np.append(starts, len(v))))
    return e + _seg_cummax(v, first, base)


def replay(g: Graph, dur: Durations, max_rounds: int = 100_000) -> Timing:
    n, m = len(g.g_s), len(g.h_s)
    g_first = np.ones(n, dtype=bool)
    g_first[1:] = g.g_chain[1:] != g.g_chain[:-1]
    h_first = g.h_chain_first
    h_base = (
        np.repeat(g.h_s[h_first], np.diff(np.append(np.nonzero(h_first)[0], m)))
        if m
        else np.zeros(0, np.int64)
    )

    g_end = g.g_e.copy()
    g_start = g.g_s.copy()
    h_end = g.h_e.copy()
    h_start = g.h_s.copy()
    coll = g.g_coll
    members = coll >= 0
    ncoll = len(g.c_transfer)
    has_launch = g.g_launch >= 0
    has_cross = g.g_cross >= 0
    has_dep = g.h_dep >= 0
    on_time = members & (g.g_rank == dur.on_time_rank) & ~dur.coll_free
    waited = members & ~dur.coll_free
    g_x = np.full(n, NEG, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    for rounds in range(1, max_rounds + 1):
        # host chains
        if m:
            dep_end = np.where(has_dep, g_end[np.maximum(g.h_dep, 0)], NEG)
            a = np.where(has_dep, dep_end + g.h_t, NEG)
            new_h_end = _scan(dur.h_gap + dur.h_b, a, h_first, h_base)
            prev = np.empty_like(new_h_end)
            prev[1:] = new_h_end[:-1]
            prev[h_first] = h_base[h_first]
            new_h_start = prev + dur.h_gap
        else:
            new_h_end, new_h_start = h_end, h_start
        # stream chains
        rel = (
            np.where(has_launch, new_h_start[np.maximum(g.g_launch, 0)] + dur.g_wl, NEG)
            if m
            else np.full(n, NEG)
        )
        rel = np.maximum(rel, np.where(has_cross, g_end[np.maximum(g.g_cross, 0)] + g.g_wx, NEG))
        rel = np.maximum(rel, g.g_fixed)
        if ncoll:
            # the last arrival of each call; the others do not wait for a rank that is "on time"
            # (its own kernel still cannot end before it arrived itself)
            arr = np.where(waited & ~on_time, g_start, NEG)
            x = np.full(ncoll, NEG, dtype=np.int64)
            np.maximum.at(x, coll[waited], arr[waited])
            g_x = np.where(waited, x[np.maximum(coll, 0)], NEG)
            g_x = np.where(on_time, np.maximum(g_x, g_start), g_x)
            cterm = np.where(waited, g_x + dur.g_wc, NEG)
        else:
            cterm = np.full(n, NEG, dtype=np.int64)
        a = np.where(rel == NEG, cterm, np.maximum(rel + dur.g_d, cterm))
        new_g_end = _scan(dur.g_gap + dur.g_d, a, g_first, None)
        prev = np.empty_like(new_g_end)
        prev[1:] = new_g_end[:-1]
        prev[g_first] = NEG
        pterm = np.where(g_first, NEG, prev + dur.g_gap)
        new_g_start = np.maximum(pterm, rel)
        done = (
            np.array_equal(new_g_end, g_end)
            and np.array_equal(new_h_end, h_end)
            and np.array_equal(new_g_start, g_start)
            and np.array_equal(new_h_start, h_start)
        )
        g_end, g_start, h_end, h_start = new_g_end, new_g_start, new_h_end, new_h_start
        if done:
            break
    else:
        raise ValueError(
            f"run {g.run}: the replay did not settle in {max_rounds} rounds (the graph has a cycle)"
        )
    if ncoll and waited.any():
        key = np.where(waited & ~on_time, g_start, NEG)
        order = np.lexsort((key, coll))
        order = order[waited[order]]
        # the member with the latest arrival of each call (the last in (call, arrival) order)
        lastpos = np.nonzero(np.append(coll[order][1:] != coll[order][:-1], True))[0]
        last_of = np.full(ncoll, -1, dtype=np.int64)
        last_of[coll[order][lastpos]] = order[lastpos]
        last = np.where(waited, last_of[np.maximum(coll, 0)], -1)
    return Timing(
        g_start=g_start, g_end=g_end, h_start=h_start, h_end=h_end, g_x=g_x, g_last=last, rounds=rounds
    )
