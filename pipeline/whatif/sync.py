"""The sync edges of a run's graph (pipeline/whatif/graph.py module doc): which GPU work each
blocking host call, and each step's end mark, waited for. graph._assemble makes them in a thread
beside the launch, cross-stream and collective edges.

Owns: sync_edges() and _last_work() (each step end mark's last-ending GPU work).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .rows import BLOCKING, LAUNCH, NEG, STEP_END


def _last_work(ends, e_rank, e_step, g_rank, g_step, g_e):
    """Per step end mark (host positions ends, with their rank and step), the GPU work of that
    rank and step that ended last (the latest-placed of those that end together): (the marks that
    have one, that work, its end). By one pass of np.maximum.at over a (rank, step) index where
    that index is small, else by a polars group_by."""
    sel = np.flatnonzero(g_step >= 0)
    if not len(sel) or not len(ends):
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    r, st = g_rank[sel], g_step[sel]
    r0, s0 = int(r.min()), int(st.min())
    span = int(st.max()) - s0 + 1
    cells = (int(r.max()) - r0 + 1) * span
    if cells > 4 * len(sel) + 1024:
        last = (
            pl.DataFrame({"gi": sel, "rank": r, "step": st, "e": g_e[sel]})
            .group_by("rank", "step")
            .agg(pl.col("e").max(), pl.col("gi").filter(pl.col("e") == pl.col("e").max()).max())
        )
        mk = pl.DataFrame({"hi": ends, "rank": e_rank, "step": e_step}).join(
            last, on=["rank", "step"], how="inner"
        )
        return tuple(mk[c].to_numpy().astype(np.int64) for c in ("hi", "gi", "e"))
    cell = (r - r0) * span + (st - s0)
    e = g_e[sel]
    emax = np.full(cells, NEG, dtype=np.int64)
    np.maximum.at(emax, cell, e)
    at = e == emax[cell]
    gmax = np.full(cells, -1, dtype=np.int64)
    np.maximum.at(gmax, cell[at], sel[at])
    ok = (e_rank >= r0) & (e_rank - r0 < cells // span) & (e_step >= s0) & (e_step - s0 < span)
    hi = ends[ok]
    c = (e_rank[ok] - r0) * span + (e_step[ok] - s0)
    has = gmax[c] >= 0
    return hi[has], gmax[c][has], emax[c][has]


def sync_edges(gpu, host, spans, facts):
    """The sync edges (graph.py module doc): per host node the GPU work it waits for (h_dep, -1:
    none) and, where binding, the time from that work's end to its own (h_t; also its own time in
    h_b). A step end mark that waits gets h_gap clipped to 0. h_gap and h_b are changed in place.
    gpu: (g_launch, g_s, g_e, g_rank, g_step); host: (h_s, h_e, h_rank, h_step, what,
    is_block_name, h_gap, h_b); spans: the GPU rows' (ranks_u, rank_lo, rank_hi, chain_lo,
    chain_hi)."""
    g_launch, g_s, g_e, g_rank, g_step = gpu
    h_s, h_e, h_rank, h_step, what, is_block_name, h_gap, h_b = host
    ranks_u, rank_lo, rank_hi, chain_lo, chain_hi = spans
    # --- sync edges: a blocking node waits for work that ended inside it
    m = len(h_s)
    # a launching blocking call: its own work (the last of its activities in stream order), when
    # that ended inside it
    cand_h = np.full(m, -1, dtype=np.int64)
    lb = np.flatnonzero((what == LAUNCH) & is_block_name)  # few
    if len(lb):
        mark = np.zeros(m, dtype=bool)
        mark[lb] = True
        gi = np.flatnonzero((g_launch >= 0) & mark[np.maximum(g_launch, 0)])
        last = np.full(len(lb), -1, dtype=np.int64)
        np.maximum.at(last, np.searchsorted(lb, g_launch[gi]), gi)
        cand_h[lb] = last
        del mark, gi, last
    # a blocking call that launched nothing: per stream, the last activity launched before it;
    # the one that ended latest inside the call
    bl = np.nonzero(what == BLOCKING)[0]
    if len(bl):
        launch_abs = np.where(g_launch >= 0, h_s[np.maximum(g_launch, 0)], g_s)
        for r in np.unique(h_rank[bl]):
            nodes = bl[h_rank[bl] == r]
            best_i = np.full(len(nodes), -1, dtype=np.int64)
            best_e = np.full(len(nodes), NEG, dtype=np.int64)
            k = np.searchsorted(ranks_u, r)
            if k >= len(ranks_u) or ranks_u[k] != r:
                continue
            a, b = rank_lo[k], rank_hi[k]
            sel = (chain_lo >= a) & (chain_lo < b)
            for c0, c1 in zip(chain_lo[sel], chain_hi[sel]):
                rows = np.arange(c0, c1)
                o = rows[np.argsort(launch_abs[rows], kind="stable")]
                pos = np.searchsorted(launch_abs[o], h_s[nodes], side="left") - 1
                okp = pos >= 0
                gi = np.where(okp, o[np.maximum(pos, 0)], -1)
                e = np.where(okp, g_e[np.maximum(gi, 0)], NEG)
                inside = okp & (e <= h_e[nodes]) & (e > best_e)
                best_i = np.where(inside, gi, best_i)
                best_e = np.where(inside, e, best_e)
            cand_h[nodes] = best_i
    # a step's host window that ends right after the last GPU work launched in it (within
    # explained_gap_ns) was waiting for that work, even where the trace records no sync call:
    # its end mark waits for the work instead of keeping the host time before it
    ends = np.nonzero(what == STEP_END)[0]
    if len(ends):
        hi, gi, ge = _last_work(ends, h_rank[ends], h_step[ends], g_rank, g_step, g_e)
        waits = (ge <= h_e[hi]) & (h_e[hi] - ge <= facts["explained_gap_ns"]) & (cand_h[hi] < 0)
        cand_h[hi[waits]] = gi[waits]
        h_gap[hi[waits]] = np.minimum(h_gap[hi[waits]], 0)
        inferred_end = np.zeros(m, dtype=bool)
        inferred_end[hi[waits]] = True
    else:
        inferred_end = np.zeros(m, dtype=bool)
    # the waits that hold: the work ended inside the node (few nodes; not arrays over every node)
    idx = np.flatnonzero(cand_h >= 0)
    dep = cand_h[idx]
    dep_e = g_e[dep]
    valid = dep_e <= h_e[idx]
    idx, dep, dep_e = idx[valid], dep[valid], dep_e[valid]
    h_dep = np.full(m, -1, dtype=np.int64)
    h_dep[idx] = dep
    binding = (dep_e > h_s[idx]) | inferred_end[idx]
    bi = idx[binding]
    h_t = np.zeros(m, dtype=np.int64)
    h_t[bi] = h_e[bi] - dep_e[binding]
    h_b[bi] = h_t[bi]
    return h_dep, h_t
