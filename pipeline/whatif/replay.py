"""Re-timing a run's dependency graph (pipeline/whatif/graph.py) with some durations changed.

Every chain is a max-plus recurrence, end_k = max(end_{k-1} + c_k, A_k): c_k the time a node adds
after its predecessor on the chain (the gap before it and its own duration), A_k the latest time
its other edges allow (launch, cross-stream, sync, the collective's last arrival). With E the
chain's running sum of c, end_k = E_k + max(end_-1, max_{j<=k} (A_j - E_j)): a cumulative sum and
a cumulative maximum per chain, so a whole chain is re-timed in a few vectorized passes. The
chains are re-timed in turn (host chains, then stream chains) until no time changes: each round
settles at least one more edge between chains along every path, and the graph is acyclic, so the
rounds stop (a graph that does not settle in `max_rounds` has a cycle: ValueError). A large run
goes level by level (levels(): each level's nodes are re-timed once, from levels already settled,
so the whole run costs one pass over its nodes), or window by window (windows()) where the levels
cannot be found.

With nothing changed the replay reproduces every recorded time exactly (graph.py gives each node
the edge and weight that explain its start), so the identity replay's error measures only what
the graph leaves out (work not in the lake, such as kernels before the trace's first launch).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .graph import NEG, STEP_START, Graph


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
    """The recorded durations. They are the graph's own arrays, read-only (a change makes new
    ones: dataclasses.replace), so the measured durations of a large run cost no memory."""
    arrays = {k: getattr(g, k).view() for k in ("g_d", "g_wc", "g_wl", "g_gap", "h_b", "h_gap")}
    for a in arrays.values():
        a.flags.writeable = False
    return Durations(**arrays, coll_free=np.zeros(len(g.g_d), dtype=bool))


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


BLOCK_NODES = 200_000  # nodes (GPU + host) above which a changed replay goes window by window


def _chain_cummax(w: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative maximum of the small non-negative integers w within each chain."""
    seg = np.cumsum(first) - 1
    big = int(w.max()) + 1 if len(w) else 1
    off = seg.astype(np.int64) * big
    return np.maximum.accumulate(w + off) - off


def windows(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """A window per GPU and host node such that every edge of g points to the same or a later
    window: each node starts in its step's (0 before a rank's first step), then the windows are
    raised along the edges (chain order, launch, cross-stream, sync; all members of a collective
    share their call's latest) until none changes. Windows are non-decreasing along every chain,
    so a window's nodes are chain-contiguous ranges, and once the windows before it are settled a
    window settles by itself. Returns (GPU windows, host windows)."""
    gw = np.maximum(g.g_step, 0).astype(np.int64)
    hw = np.where(g.h_what == STEP_START, np.maximum(g.h_step, 0), 0).astype(np.int64)
    gl, gx, hd, gc = g.g_launch, g.g_cross, g.h_dep, g.g_coll
    has_l, has_x, has_d, has_c = gl >= 0, gx >= 0, hd >= 0, gc >= 0
    ncoll = len(g.c_transfer)
    while True:
        hw2 = _chain_cummax(hw, g.h_chain_first) if len(hw) else hw
        if has_d.any():
            hw2[has_d] = np.maximum(hw2[has_d], gw[hd[has_d]])
            hw2 = _chain_cummax(hw2, g.h_chain_first)
        gw2 = gw.copy()
        if has_l.any():
            gw2[has_l] = np.maximum(gw2[has_l], hw2[gl[has_l]])
        if has_x.any():
            gw2[has_x] = np.maximum(gw2[has_x], gw[gx[has_x]])
        if ncoll and has_c.any():
            cw = np.zeros(ncoll, dtype=np.int64)
            np.maximum.at(cw, gc[has_c], gw2[has_c])
            gw2[has_c] = cw[gc[has_c]]
        gw2 = _chain_cummax(gw2, g.g_first)
        if np.array_equal(gw2, gw) and np.array_equal(hw2, hw):
            return gw, hw
        gw, hw = gw2, hw2


LEVEL_SPAN = 1 << 20  # a step's levels start at step x LEVEL_SPAN (a lower bound, not a limit)
MAX_LEVEL_PASSES = 64  # passes of levels() before it gives up (the replay goes window by window)


def _raise_at(a: np.ndarray, idx: np.ndarray, cand: np.ndarray) -> bool:
    """a[idx] raised to cand where cand is higher (levels only rise); whether any was."""
    up = cand > a[idx]
    if not up.any():
        return False
    a[idx[up]] = cand[up]
    return True


def levels(g: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """A level per GPU and host node such that re-timing the levels in ascending order, each once
    (host nodes, then GPU nodes), gives every node its final time: every edge that round order
    cannot satisfy within a level points to a strictly later level. Per edge (u -> v), L(v) >= L(u)
    for chain order, launch (the host is re-timed before the GPU) and collective membership (all
    members of a call share a level); L(v) >= L(u) + 1 for a cross-stream edge, for the chain edge
    into a collective member (so that every member starts a range of its level and its start is
    known before its call's last arrival is taken), and from the work a host node waits for to the
    host node after it (the waiting node's own end is completed in the level of that work, after
    its GPU nodes: _Levels). Nodes start at their step x LEVEL_SPAN and are raised along the edges
    until none changes. Returns (GPU levels, host levels), or None when that does not settle in
    MAX_LEVEL_PASSES passes (matched collectives that contradict the ranks' own order)."""
    gw = np.maximum(g.g_step, 0).astype(np.int64) * LEVEL_SPAN
    hw = np.where(g.h_what == STEP_START, np.maximum(g.h_step, 0), 0).astype(np.int64) * LEVEL_SPAN
    if not len(gw):
        return None
    gl, gx, hd, gc = g.g_launch, g.g_cross, g.h_dep, g.g_coll
    xi, ci = np.nonzero(gx >= 0)[0], np.nonzero(gc >= 0)[0]
    mi = ci[~g.g_first[ci]]  # members with a stream predecessor
    waiting = np.nonzero(hd >= 0)[0]
    nxt = waiting + 1  # the host node after a waiting one, on the same chain
    keep = nxt < len(hw)
    keep[keep] = ~g.h_chain_first[nxt[keep]]
    waiting, nxt = waiting[keep], nxt[keep]
    ncoll = len(g.c_transfer)
    # per-chain cumulative maxima with the chains shifted apart by one bound on every level (a
    # level is a seed plus at most one per node along a path): the levels are raised in that
    # shifted space (G = level + the chain's shift), so a chain's cumulative maximum is one
    # in-place pass, and each edge's shift difference is added once, before the passes
    bound = int(max(gw.max(initial=0), hw.max(initial=0))) + len(gw) + len(hw) + 2
    g_off, h_off = _shifts(g.g_first, bound), _shifts(g.h_chain_first, bound)
    if g_off is None or h_off is None:
        return None
    G, H = gw + g_off, hw + h_off
    np.maximum.accumulate(H, out=H)
    xsrc, wsrc, csrc = gx[xi], hd[waiting], gc[ci]
    # launch: L(v) >= L(u), over every GPU node at once (nearly all have a launch; the others get
    # a source whose shifted level, less 2**62, is below every node's)
    lsrc = np.maximum(gl, 0).astype(np.int32 if len(H) < 2**31 else np.int64)
    dl = g_off - h_off[lsrc] if len(H) else np.zeros(len(G), dtype=np.int64)
    dl[gl < 0] = -(2**62)
    lsrc = lsrc if len(H) else None
    dx = g_off[xi] - g_off[xsrc] + 1  # cross-stream: L(v) >= L(u) + 1
    dw = h_off[nxt] - g_off[wsrc] + 1  # awaited work -> the host node after the waiting one
    c_off = g_off[ci]
    del gw, hw, g_off, h_off  # made again at the end (memory: the passes run beside the identity replay)
    tmp = np.empty_like(G)
    up_all = np.empty(len(G), dtype=bool)
    for _ in range(MAX_LEVEL_PASSES):
        # each update records whether it raised a level (levels only rise), so a pass that raises
        # none ends the passes; a chain's cumulative maximum is taken again only after a raise
        changed = dirty = False
        old_x = G[xsrc]  # the cross-stream edges read the levels the pass started with
        if len(nxt) and _raise_at(H, nxt, G[wsrc] + dw):
            changed = True
            np.maximum.accumulate(H, out=H)
        if lsrc is not None:
            np.take(H, lsrc, out=tmp)
            tmp += dl
            np.greater(tmp, G, out=up_all)
            if up_all.any():
                changed = dirty = True
                np.maximum(G, tmp, out=G)
        if _raise_at(G, xi, old_x + dx):
            changed = dirty = True
        if dirty:
            np.maximum.accumulate(G, out=G)
            dirty = False
        if ncoll and len(ci):
            if _raise_at(G, mi, G[mi - 1] + 1):  # the same chain: the same shift
                changed = dirty = True
            cw = np.zeros(ncoll, dtype=np.int64)
            np.maximum.at(cw, csrc, G[ci] - c_off)
            cand = cw[csrc] + c_off
            if (cand > G[ci]).any():
                changed = dirty = True
                G[ci] = cand
            if dirty:
                np.maximum.accumulate(G, out=G)
        if not changed:
            G -= _shifts(g.g_first, bound)
            H -= _shifts(g.h_chain_first, bound)
            return G, H
    return None


def _shifts(first: np.ndarray, bound: int) -> np.ndarray | None:
    """Per node, its chain's number times bound (None: that would not fit in int64)."""
    chains = int(first.sum())
    if chains * bound >= 2**62:
        return None
    off = np.cumsum(first, dtype=np.int64)
    off -= 1
    off *= bound
    return off


class _Levels:
    """The levels of a graph (levels()) as what each level's round needs: its GPU and host nodes
    in chain order with their range starts, its collective members (each starts a range), and the
    waiting host nodes whose end is completed there (their awaited work is in the level)."""

    def __init__(self, g: Graph, gl: np.ndarray, hl: np.ndarray):
        gb = {w: (i, f) for w, i, f in _by_window(gl, g.g_first)}
        hb = {w: (i, f) for w, i, f in _by_window(hl, g.h_chain_first)}
        wait = np.nonzero(g.h_dep >= 0)[0]
        wait = wait[hl[wait] <= gl[g.h_dep[wait]]]  # settled before the node's own round otherwise
        wl = gl[g.h_dep[wait]]
        o = np.argsort(wl, kind="stable")
        wait, wl = wait[o], wl[o]
        cuts = np.searchsorted(wl, sorted(set(gb) | set(hb)), side="left")
        cuts_hi = np.searchsorted(wl, sorted(set(gb) | set(hb)), side="right")
        e64, eb = np.zeros(0, np.int64), np.zeros(0, bool)
        self.rounds = []
        for w, a, b in zip(sorted(set(gb) | set(hb)), cuts, cuts_hi):
            gi, gf = gb.get(w, (e64, eb))
            hi, hf = hb.get(w, (e64, eb))
            mpos = np.nonzero(g.g_coll[gi] >= 0)[0]
            self.rounds.append((gi, gf, hi, hf, mpos, wait[a:b]))


def _by_window(w: np.ndarray, first: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per window (ascending), its nodes in chain order and the starts of their chain ranges."""
    if not len(w):
        return []
    order = np.argsort(w, kind="stable")
    ws = w[order]
    chain = np.cumsum(first) - 1
    rf = np.ones(len(order), dtype=bool)
    rf[1:] = (chain[order][1:] != chain[order][:-1]) | (ws[1:] != ws[:-1])
    cuts = np.nonzero(np.append(True, ws[1:] != ws[:-1]))[0]
    bounds = np.append(cuts, len(order))
    return [(int(ws[a]), order[a:b], rf[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


class _State:
    """The times being replayed, and the settled parts of one replay (replay())."""

    def __init__(self, g: Graph, dur: Durations, shared: bool = False):
        self.g, self.d = g, dur
        n = len(g.g_s)
        # shared (the identity replay's check): the times are the graph's recorded arrays, read
        # only, until a round changes one (_own copies them then); a check that changes nothing
        # returns them as they are (no copies of 13 M times held beside the graph)
        self.shared = shared
        if shared:
            self.g_start, self.g_end, self.h_start, self.h_end = (
                _read_only(a) for a in (g.g_s, g.g_e, g.h_s, g.h_e)
            )
        else:
            self.g_start, self.g_end = g.g_s.copy(), g.g_e.copy()
            self.h_start, self.h_end = g.h_s.copy(), g.h_e.copy()
        self.g_first = g.g_first
        members = g.g_coll >= 0
        self.waited = members & ~dur.coll_free
        self.on_time = members & (g.g_rank == dur.on_time_rank) & ~dur.coll_free
        self.g_x = np.full(n, NEG, dtype=np.int64)
        self.is_arriver = self.waited & ~self.on_time  # whose arrival others wait for
        self.arrivers = np.nonzero(self.is_arriver)[0]

    def _own(self) -> None:
        """Copy the shared times before the first write."""
        if self.shared:
            self.shared = False
            self.g_start, self.g_end = self.g_start.copy(), self.g_end.copy()
            self.h_start, self.h_end = self.h_start.copy(), self.h_end.copy()

    def arrivers_in(self, gi: np.ndarray) -> np.ndarray:
        """The arrivers (whose arrival others wait for) among the GPU nodes gi."""
        mask = np.zeros(len(self.waited), dtype=bool)
        mask[gi] = True
        return self.arrivers[mask[self.arrivers]]

    def round(
        self,
        gi: np.ndarray,
        gfirst: np.ndarray,
        hi: np.ndarray,
        hfirst: np.ndarray,
        arrivers: np.ndarray | None = None,
        members: np.ndarray | None = None,
        finish: np.ndarray | None = None,
    ) -> bool:
        """Re-time the host nodes hi, then the GPU nodes gi (each chain-contiguous ranges whose
        starts gfirst / hfirst mark; a range continues from its chain predecessor's current time).
        arrivers: the arrivers whose calls gi's members are in (default: all). A level's round
        (_Levels) also gives members, the positions in gi of its collective members (each starts a
        range: their starts are set before their calls' last arrivals are taken), and finish, the
        waiting host nodes whose end is completed after gi. True when a time changed."""
        g, d = self.g, self.d
        changed = False
        if len(hi):
            dep = g.h_dep[hi]
            a = np.where(dep >= 0, self.g_end[np.maximum(dep, 0)] + g.h_t[hi], NEG)
            rs = np.flatnonzero(hfirst)  # range starts: each continues from its chain predecessor
            hs = hi[rs]
            b0 = np.where(g.h_chain_first[hs], g.h_s[hs], self.h_end[np.maximum(hs - 1, 0)])
            base = np.repeat(b0, np.diff(np.append(rs, len(hi))))
            end = _scan(d.h_gap[hi] + d.h_b[hi], a, hfirst, base)
            prev = np.empty_like(end)
            prev[1:] = end[:-1]
            prev[hfirst] = base[hfirst]
            start = prev + d.h_gap[hi]
            changed = not (np.array_equal(end, self.h_end[hi]) and np.array_equal(start, self.h_start[hi]))
            if changed:
                self._own()
                self.h_end[hi], self.h_start[hi] = end, start
        if len(gi):
            launch, cross = g.g_launch[gi], g.g_cross[gi]
            rel = (
                np.where(launch >= 0, self.h_start[np.maximum(launch, 0)] + d.g_wl[gi], NEG)
                if len(self.h_start)
                else np.full(len(gi), NEG, dtype=np.int64)
            )
            rel = np.maximum(rel, np.where(cross >= 0, self.g_end[np.maximum(cross, 0)] + g.g_wx[gi], NEG))
            rel = np.maximum(rel, g.g_fixed[gi])
            cterm = np.full(len(gi), NEG, dtype=np.int64)
            if members is not None and len(members):
                mg = gi[members]
                pe = np.where(self.g_first[mg], NEG, self.g_end[np.maximum(mg - 1, 0)])
                self._own()
                self.g_start[mg] = np.maximum(np.where(pe == NEG, NEG, pe + d.g_gap[mg]), rel[members])
                arrivers = mg[self.is_arriver[mg]]
            if len(g.c_transfer) and self.waited[gi].any():
                # the last arrival of each call; the others do not wait for a rank that is "on
                # time" (its own kernel still cannot end before it arrived itself)
                arr = self.arrivers if arrivers is None else arrivers
                x = np.full(len(g.c_transfer), NEG, dtype=np.int64)
                np.maximum.at(x, g.g_coll[arr], self.g_start[arr])
                wi = self.waited[gi]
                gx = np.where(wi, x[np.maximum(g.g_coll[gi], 0)], NEG)
                gx = np.where(self.on_time[gi], np.maximum(gx, self.g_start[gi]), gx)
                self.g_x[gi] = gx
                cterm = np.where(wi, gx + d.g_wc[gi], NEG)
            dd = d.g_d[gi]
            a = np.where(rel == NEG, cterm, np.maximum(rel + dd, cterm))
            c = d.g_gap[gi] + dd
            rs = np.flatnonzero(gfirst)  # range starts: each continues from its chain predecessor
            gs = gi[rs]
            pe0 = np.where(self.g_first[gs], NEG, self.g_end[np.maximum(gs - 1, 0)])
            e = _seg_cumsum(c, gfirst)
            v = a - e
            base = np.repeat(np.where(pe0 != NEG, pe0, v[rs]), np.diff(np.append(rs, len(gi))))
            end = e + _seg_cummax(v, gfirst, base)
            prev = np.empty_like(end)
            prev[1:] = end[:-1]
            prev[gfirst] = pe0
            start = np.maximum(np.where(prev == NEG, NEG, prev + d.g_gap[gi]), rel)
            if not (np.array_equal(end, self.g_end[gi]) and np.array_equal(start, self.g_start[gi])):
                changed = True
                self._own()
                self.g_end[gi], self.g_start[gi] = end, start
        if finish is not None and len(finish):
            # end = max(start + own time, awaited work's end + time after it), as the host scan
            a = self.g_end[g.h_dep[finish]] + g.h_t[finish]
            self._own()
            self.h_end[finish] = np.maximum(self.h_start[finish] + d.h_b[finish], a)
        return changed


def _read_only(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


def _cycle(g: Graph, max_rounds: int) -> ValueError:
    return ValueError(
        f"run {g.run}: the replay did not settle in {max_rounds} rounds (the graph has a cycle)"
    )


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """a equals b: at once where a is a view of all of b (measured()), else value by value."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.strides == b.strides
    ) or np.array_equal(a, b)


def _unchanged(g: Graph, d: Durations) -> bool:
    return (
        d.on_time_rank == -1
        and not d.coll_free.any()
        and all(_same(getattr(d, k), getattr(g, k)) for k in ("g_d", "g_wc", "g_wl", "g_gap", "h_b", "h_gap"))
    )


def large(g: Graph) -> bool:
    """Whether a changed replay of g goes level by level (more than BLOCK_NODES nodes)."""
    return len(g.g_s) + len(g.h_s) > BLOCK_NODES


_PREPARING = threading.Lock()  # one prepare() at a time: a second caller waits for the levels


def prepare(g: Graph) -> None:
    """Find g's levels for its changed replays (g.levels: False where none settle), once. It
    only reads g's arrays, so it may run in a thread beside the identity replay and another
    change's replay (whatif()); a replay that needs the levels while they are being found waits
    for them instead of finding them again."""
    with _PREPARING:
        if g.levels is None:
            lv = levels(g)
            g.levels = _Levels(g, *lv) if lv is not None else False


CHECK_BLOCK_NODES = 400_000  # nodes per block of ranks in the identity replay's check


def _rank_blocks(g: Graph, g_first: np.ndarray):
    """Whole ranks, in order, as blocks of about CHECK_BLOCK_NODES nodes: (GPU nodes, their range
    starts, host nodes, theirs). GPU and host nodes are in rank order, so a block is two slices."""

    def firsts(r: np.ndarray) -> np.ndarray:  # the ranks of a rank-sorted array
        return r[np.r_[0, np.flatnonzero(np.diff(r)) + 1]] if len(r) else r

    ranks = np.union1d(firsts(g.g_rank), firsts(g.h_rank))
    g_cut = np.searchsorted(g.g_rank, ranks)
    h_cut = np.searchsorted(g.h_rank, ranks)
    g_lo = h_lo = 0
    for i in range(len(ranks)):
        g_hi = g_cut[i + 1] if i + 1 < len(ranks) else len(g.g_rank)
        h_hi = h_cut[i + 1] if i + 1 < len(ranks) else len(g.h_rank)
        if (g_hi - g_lo) + (h_hi - h_lo) >= CHECK_BLOCK_NODES or i + 1 == len(ranks):
            gi, hi = np.arange(g_lo, g_hi, dtype=np.int64), np.arange(h_lo, h_hi, dtype=np.int64)
            yield gi, g_first[g_lo:g_hi], hi, g.h_chain_first[h_lo:h_hi]
            g_lo, h_lo = g_hi, h_hi


def replay(g: Graph, dur: Durations, max_rounds: int = 100_000) -> Timing:
    """Re-time g with durations dur. A graph of at most BLOCK_NODES nodes is re-timed by rounds
    over every node until none changes (with nothing changed, the first round moves nothing). A
    larger one is re-timed level by level (levels(): one round per level, no round over the whole
    run), after one round over every node when nothing was changed (the identity replay's check);
    where the levels cannot be found, window by window (windows(): every edge points to the same
    or a later window), each window's rounds touching only its nodes, so a window settled stays
    settled. Raises ValueError when it does not settle in max_rounds rounds (a cycle)."""
    n, m = len(g.g_s), len(g.h_s)
    big = large(g)
    st = _State(g, dur, shared=big and _unchanged(g, dur))

    def every_node() -> bool:  # a round over every node
        return st.round(
            np.arange(n, dtype=np.int64), st.g_first, np.arange(m, dtype=np.int64), g.h_chain_first
        )

    rounds = 0
    changed = True
    if not big:
        rounds = 1
        changed = every_node()  # nothing changes in the identity replay
    elif _unchanged(g, dur):
        # the identity replay's check, a block of ranks at a time (temporaries that stay in the
        # cache); where the recorded times are the fixed point no block changes them
        rounds = 1
        changed = False
        for gi, gf, hi, hf in _rank_blocks(g, st.g_first):
            changed = st.round(gi, gf, hi, hf) or changed
    if changed and big:
        prepare(g)
        if g.levels:
            for gi, gf, hi, hf, mpos, fin in g.levels.rounds:
                st.round(gi, gf, hi, hf, members=mpos, finish=fin)
            rounds += len(g.levels.rounds)
        else:
            with _PREPARING:  # once, as the levels (whatif() replays two changes at a time)
                if g.windows is None:
                    g.windows = windows(g)
            gw, hw = g.windows
            hb = {w: (i, f) for w, i, f in _by_window(hw, g.h_chain_first)}
            gb = {w: (i, f) for w, i, f in _by_window(gw, st.g_first)}
            empty = (np.zeros(0, np.int64), np.zeros(0, bool))
            for w in sorted(set(hb) | set(gb)):
                (gi, gf), (hi, hf) = gb.get(w, empty), hb.get(w, empty)
                arr = st.arrivers_in(gi)
                while st.round(gi, gf, hi, hf, arr):
                    rounds += 1
                    if rounds > max_rounds:
                        raise _cycle(g, max_rounds)
        changed = False
    # a round over every node relaxes every edge once, so a graph without a cycle settles within
    # one round more than its nodes (Bellman-Ford's bound): past that it has one, found in
    # seconds instead of max_rounds rounds (20 s for a rank of 3,500 nodes)
    limit = min(max_rounds, n + m + 2)
    while changed:
        rounds += 1
        changed = every_node()
        if changed and rounds > limit:
            raise _cycle(g, limit)
    g_start, g_end, h_start, h_end, g_x = st.g_start, st.g_end, st.h_start, st.h_end, st.g_x
    coll, ncoll = g.g_coll, len(g.c_transfer)
    waited, on_time = st.waited, st.on_time
    last = np.full(n, -1, dtype=np.int64)
    if ncoll and waited.any():
        idx = np.nonzero(waited)[0]
        key = np.where(on_time[idx], NEG, g_start[idx])
        order = idx[np.lexsort((key, coll[idx]))]
        # the member with the latest arrival of each call (the last in (call, arrival) order)
        lastpos = np.nonzero(np.append(coll[order][1:] != coll[order][:-1], True))[0]
        last_of = np.full(ncoll, -1, dtype=np.int64)
        last_of[coll[order][lastpos]] = order[lastpos]
        last = np.where(waited, last_of[np.maximum(coll, 0)], -1)
    return Timing(
        g_start=g_start, g_end=g_end, h_start=h_start, h_end=h_end, g_x=g_x, g_last=last, rounds=rounds
    )
