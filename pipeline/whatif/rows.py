"""The graph's rows (pipeline/whatif/graph.py assembles the edges between them): the host rows in
chain order with the calls that launched work linked to their GPU rows, and the GPU rows in
stream order with each one's cross-stream candidate. graph.build() makes the two sides in two
threads (numpy lets go of the GIL in its array passes), so they share the machine's cores.

Owns: host_rows() (HostRows), gpu_rows() (GpuRows), the (rank, correlation) lookup (_keys,
_Links, _join_index) and the chain order (_order).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

NEG = np.int64(-(2**60))  # "no such time": below every time
# host node kinds (Graph.h_what holds their index)
WHAT = ("launch", "blocking", "data_loading", "step_start", "step_end")
LAUNCH, BLOCKING, DATA_LOADING, STEP_START, STEP_END = range(len(WHAT))


def _first_of_chain(chain: np.ndarray) -> np.ndarray:
    first = np.ones(len(chain), dtype=bool)
    first[1:] = chain[1:] != chain[:-1]
    return first


def _keys(rank: np.ndarray, corr: np.ndarray, call: np.ndarray | None = None) -> np.ndarray | None:
    """(rank, correlation) as one int64 (rank above bit 40; -1 where the correlation is negative,
    or where call is given and False), or None when a value does not fit (then the callers join on
    the two columns). Made in place in one new array (6.7 M rows: 54 MB, not four)."""
    if len(rank) and (rank.min() < 0 or rank.max() >= (1 << 22) or corr.max() >= (1 << 40)):
        return None
    key = rank.astype(np.int64)
    key <<= 40
    key |= corr
    key[corr < 0] = -1
    if call is not None:
        key[~call] = -1
    return key


class _Links:
    """Host calls and GPU rows linked by (rank, correlation) packed in one int64 (_keys), with one
    sort of the calls' keys: which calls launched work (their key is a GPU row's), and, once the
    host rows have their chain order, each GPU row's launch (the first call of its key in that
    order). Made on the host rows' first order, so that host_rows() makes it in a thread beside
    the chain order. Returns None (make) where a key does not fit; then _join_index joins on the
    columns."""

    def __init__(self, hk: np.ndarray, gk: np.ndarray):
        self.o = np.argsort(hk, kind="stable")
        sk = hk[self.o]
        del hk
        new = np.ones(len(sk), dtype=bool)
        new[1:] = sk[1:] != sk[:-1]
        run = np.cumsum(new, dtype=np.int64) - 1  # per sorted call: the number of its key
        self.starts = np.flatnonzero(new)
        del new
        pos = np.minimum(np.searchsorted(sk, gk), max(len(sk) - 1, 0))
        self.hit = (gk >= 0) & (sk[pos] == gk) if len(sk) else np.zeros(len(gk), dtype=bool)
        self.g_run = np.where(self.hit, run[pos] if len(sk) else 0, -1)
        del pos
        hit_run = np.zeros(len(self.starts), dtype=bool)
        hit_run[self.g_run[self.hit]] = True
        self.launched = np.zeros(len(sk), dtype=bool)
        self.launched[self.o] = hit_run[run] & (sk >= 0)

    @classmethod
    def make(cls, h_rank, h_corr, h_call, g_rank, g_corr) -> _Links | None:
        hk = _keys(h_rank, h_corr, h_call)  # -1: no key (never a GPU row's)
        gk = _keys(g_rank, g_corr) if hk is not None else None
        if hk is None or gk is None:
            return None
        return cls(hk, gk)

    def launch(self, keep: np.ndarray, perm: np.ndarray) -> np.ndarray:
        """Per GPU row (in the rows' first order), its launch's position among the host rows that
        keep marks: the first call of its key in chain order. The links were made on the host
        rows' first order; perm gives the chain order (chain position -> first-order row) and keep
        is in chain order (every call of a launching key is kept). -1: none."""
        if not len(self.starts):
            return np.full(len(self.hit), -1, dtype=np.int64)
        chain_at = np.empty(len(perm), dtype=np.int64)  # first-order row -> chain position
        chain_at[perm] = np.arange(len(perm), dtype=np.int64)
        first = np.minimum.reduceat(chain_at[self.o], self.starts)  # per key: its first call in chain order
        at = np.cumsum(keep, dtype=np.int64) - 1  # chain position -> position among the kept rows
        return np.where(self.hit, at[first][np.maximum(self.g_run, 0)], -1)


def _order(parts: list[np.ndarray], ties: list[np.ndarray]) -> np.ndarray:
    """The row order np.lexsort gives by the integer columns `parts` (most significant first),
    then `ties` (most significant first), then position: one stable argsort of `parts` packed in
    one int64 (numpy's stable sort is a timsort, so rows that come nearly in order, as a trace's
    do, cost little: 0.07 s for 6.7 M GPU rows, where np.lexsort of five keys took 0.45 s), the
    rare rows that tie on all parts then ordered by `ties`. Falls back to np.lexsort where the
    parts' ranges do not fit in 63 bits together."""
    n = len(parts[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lo = [int(p.min()) for p in parts]
    bits = [(int(p.max()) - m).bit_length() for p, m in zip(parts, lo)]
    if sum(bits) > 63:
        return np.lexsort(tuple(reversed(ties)) + tuple(reversed(parts)))
    key = np.zeros(n, dtype=np.int64)
    for p, m, b in zip(parts, lo, bits):
        key <<= b
        key |= p - m if m else p
    o = np.argsort(key, kind="stable")
    if ties:
        ks = key[o]
        tie = ks[1:] == ks[:-1]
        if tie.any():
            at = np.zeros(n, dtype=bool)
            at[1:] = tie
            at[:-1] |= tie
            idx = np.flatnonzero(at)  # the tied rows' places; ks is sorted, so each group stays put
            sub = o[idx]
            o[idx] = sub[np.lexsort(tuple(t[sub] for t in reversed(ties)) + (ks[idx],))]
    return o


def _join_index(h_rank, h_corr, h_call, g_rank, g_corr) -> np.ndarray:
    """Per GPU row, the first host call (in the host rows' order) of its rank and correlation
    (-1: none); h_call marks the host rows that are calls. A join on the two columns: what
    _Links does where a key does not fit in one integer."""
    h = pl.DataFrame({"rank": h_rank, "correlation": h_corr, "hi": np.arange(len(h_rank))}).filter(
        pl.Series(h_call)
    )
    first = h.group_by("rank", "correlation").agg(pl.col("hi").min())
    g = pl.DataFrame({"rank": g_rank, "correlation": g_corr})
    j = g.join(first, on=["rank", "correlation"], how="left", maintain_order="left")
    return np.where(g_corr >= 0, j["hi"].fill_null(-1).to_numpy(), -1)


@dataclass
class HostRows:
    """The kept host rows in chain order (graph.Graph's h_* arrays before the sync edges), and per
    GPU row in its first order, the position of its launch among them (-1: none; None: found by
    a join once the GPU rows have their order, where the keys do not fit in one integer)."""

    rank: np.ndarray
    s: np.ndarray
    e: np.ndarray
    what: np.ndarray
    is_block_name: np.ndarray
    corr: np.ndarray
    step: np.ndarray
    name: pl.Series
    first: np.ndarray
    gap: np.ndarray
    b: np.ndarray
    g_launch0: np.ndarray | None


def host_rows(
    box: list[pl.DataFrame], t0: int, blocking_calls, g_rank0: np.ndarray, g_corr0: np.ndarray
) -> HostRows:
    """The host rows of replay/host_nodes.sql (its name column an Enum; the frame in box, which is
    emptied so that its columns go as soon as they are read) kept and in chain order, times
    relative to t0; g_rank0 and g_corr0: the GPU rows' rank and correlation (first order)."""
    host = box.pop()
    height = host.height
    step0, name0 = host["step"], host["name"]
    # --- host rows: the calls that launched GPU work of the run (their correlation is a GPU
    # row's of the same rank), or blocking calls; DataLoader fetches; step marks
    blocking_names = set(blocking_calls)
    cats = host.schema["name"].categories.to_list()
    is_blocking = np.array([c in blocking_names for c in cats], dtype=bool)
    # chain order (of every row; the ones not kept are dropped below): rank, start; a step's end
    # mark before the next step's start mark at one instant; the longer of two events that start
    # together first
    kind0 = host["what"].to_numpy()  # host_nodes.sql's code: 0 call, 1 data_loading, 2 step_start, 3 step_end
    order_of = np.array([1, 1, 2, 0], dtype=np.int8)  # by kind
    h_s0 = host["start_ns"].to_numpy().astype(np.int64)
    h_e0 = host["end_ns"].to_numpy().astype(np.int64)
    h_rank0 = host["rank"].to_numpy().astype(np.int64)
    h_corr0 = host["correlation"].fill_null(-1).to_numpy().astype(np.int64)
    call0 = kind0 == 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        # the calls that launched work (their (rank, correlation) is a GPU row's), found on the
        # rows' first order in a thread beside the chain order (numpy lets go of the GIL in its
        # sorts and searches; docs/whatif.md "Speed" has what the threads together gave)
        linking = pool.submit(_Links.make, h_rank0, h_corr0, call0, g_rank0, g_corr0)
        perm = _order([h_rank0, h_s0, order_of[kind0]], [-h_e0])
        h_rank, h_s, h_e, kind = h_rank0[perm], h_s0[perm], h_e0[perm], kind0[perm]
        del h_s0, h_e0
        codes = host["name"].to_physical().to_numpy()[perm]
        blocking = is_blocking[codes] if len(cats) else np.zeros(height, dtype=bool)
        call = kind == 0
        h_corr = h_corr0[perm]
        h_step = step0.fill_null(-1).to_numpy().astype(np.int64)[perm]
        h_name = name0.gather(perm)
        del host, step0, name0, codes
        links = linking.result()
    del h_rank0, kind0, h_corr0, call0
    if links is not None:
        launched = links.launched[perm]
    else:
        launched = call & (h_corr >= 0)
        if launched.any():
            hit = _join_index(g_rank0, g_corr0, np.ones(len(g_rank0), dtype=bool), h_rank, h_corr)
            launched &= hit >= 0
    what = np.select(
        [launched, call & blocking, kind == 1, kind == 2, kind == 3],
        [LAUNCH, BLOCKING, DATA_LOADING, STEP_START, STEP_END],
        -1,
    ).astype(np.int8)
    keep = what >= 0
    g_launch0 = links.launch(keep, perm) if links is not None else None
    h_rank, what, is_block_name, h_corr = h_rank[keep], what[keep], blocking[keep], h_corr[keep]
    h_s = h_s[keep]
    h_s -= t0
    h_e = h_e[keep]
    h_e -= t0
    h_step = h_step[keep]
    h_name = h_name.filter(pl.Series(keep))
    del blocking, kind, call, launched, perm, links, keep
    h_first = _first_of_chain(h_rank)
    prev_e = np.empty_like(h_e)
    prev_e[0:1] = h_s[0:1]
    prev_e[1:] = h_e[:-1]
    prev_e[h_first] = h_s[h_first]
    h_gap = h_s - prev_e
    h_b = h_e - h_s

    return HostRows(
        h_rank, h_s, h_e, what, is_block_name, h_corr, h_step, h_name, h_first, h_gap, h_b, g_launch0
    )


@dataclass
class GpuRows:
    """The GPU rows in stream order (graph.Graph's g_* arrays before the edges, name and shape its
    g_name and g_shape), gperm (their first order's positions), the collectives' kernels (pg_key,
    call_key, gi, rank, s, e, step), where each rank's and chain's rows lie, and per row the
    latest end on another stream of its rank at or before its start (cand, -1: none)."""

    rank: np.ndarray
    s: np.ndarray
    e: np.ndarray
    corr: np.ndarray
    step: np.ndarray
    cat: np.ndarray
    graph_replay: np.ndarray
    name: np.ndarray
    shape: np.ndarray
    members: pl.DataFrame
    first: np.ndarray
    prev_end: np.ndarray
    gperm: np.ndarray
    ranks_u: np.ndarray
    rank_lo: np.ndarray
    rank_hi: np.ndarray
    chain_lo: np.ndarray
    chain_hi: np.ndarray
    cand: np.ndarray


def gpu_rows(box: list[pl.DataFrame], t0: int, g_rank0: np.ndarray, g_corr0: np.ndarray) -> GpuRows:
    """The GPU rows of replay/gpu_nodes.sql in stream order, times relative to t0 (the frame in
    box, which is emptied so that its columns go as soon as they are read; g_rank0, g_corr0: its
    rank and correlation columns as int64)."""
    gpu = box.pop()
    # --- GPU chains: rank, stream, start (then end, then file order)
    g_stream0 = gpu["stream"].to_numpy().astype(np.int64)
    g_s0 = gpu["start_ns"].to_numpy().astype(np.int64)
    g_e0 = gpu["end_ns"].to_numpy().astype(np.int64)
    gperm = _order([g_rank0, g_stream0, g_s0], [g_e0, gpu["event_index"].to_numpy()])
    g_cat = gpu["category_id"].to_numpy()[gperm]
    graph_replay = gpu["graph_replay"].to_numpy()[gperm]
    # the collectives' kernels (few): found in the first order, given their place in stream order
    mem = gpu.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("old"), "pg_key", "call_key").filter(
        pl.col("pg_key").is_not_null()
    )
    g_name = gpu["name_id"].to_numpy()[gperm]
    g_shape = gpu["shape"].fill_null(0).to_numpy()[gperm]  # 0: none recorded (Graph.frame: NULL)
    g_step = gpu["step"].fill_null(-1).to_numpy().astype(np.int64)[gperm]
    del gpu
    n = len(gperm)
    g_rank = g_rank0[gperm]
    g_stream = g_stream0[gperm]
    del g_stream0
    g_s = g_s0[gperm]
    del g_s0
    g_s -= t0
    g_e = g_e0[gperm]
    del g_e0
    g_e -= t0
    g_corr = g_corr0[gperm]
    # the members' places in stream order (ascending), and their rows of mem (whose "old" ascends)
    is_m = np.zeros(n, dtype=bool)
    old = mem["old"].to_numpy()
    is_m[old] = True
    gi_m = np.flatnonzero(is_m[gperm])
    at = np.searchsorted(old, gperm[gi_m])
    del is_m, old
    members = (
        mem.select("pg_key", "call_key")[at]
        .with_columns(
            pl.Series("gi", gi_m),
            pl.Series("rank", g_rank[gi_m]),
            pl.Series("s", g_s[gi_m]),
            pl.Series("e", g_e[gi_m]),
            pl.Series("step", g_step[gi_m]),
        )
        .with_columns(pl.when(pl.col("step") >= 0).then(pl.col("step")).alias("step"))
    )
    del mem, gi_m, at
    first = np.ones(n, dtype=bool)
    first[1:] = (g_rank[1:] != g_rank[:-1]) | (g_stream[1:] != g_stream[:-1])
    prev_end = np.full(n, NEG, dtype=np.int64)
    prev_end[1:] = g_e[:-1]
    prev_end[first] = NEG

    # cross-stream: the latest end on another stream of the rank at or before the start
    cand = np.full(n, -1, dtype=np.int64)
    by_end = _order([g_rank, g_e], [])
    # the GPU rows are in (rank, stream, start) order, so a rank's and a chain's rows are slices
    rank_lo = np.flatnonzero(np.r_[True, g_rank[1:] != g_rank[:-1]]) if n else np.zeros(0, dtype=np.int64)
    ranks_u = g_rank[rank_lo]
    rank_hi = np.append(rank_lo[1:], n)
    chain_lo = np.nonzero(first)[0]
    chain_hi = np.append(chain_lo[1:], n)
    for r, a, b in zip(ranks_u, rank_lo, rank_hi):
        rows = by_end[a:b]  # by_end is in (rank, end) order: the same slice holds rank r
        for c0, c1 in zip(
            chain_lo[(chain_lo >= a) & (chain_lo < b)], chain_hi[(chain_lo >= a) & (chain_lo < b)]
        ):
            other = rows[g_stream[rows] != g_stream[c0]]
            if len(other) == 0:
                continue
            pos = np.searchsorted(g_e[other], g_s[c0:c1], side="right") - 1
            ok = pos >= 0
            cand[c0:c1][ok] = other[pos[ok]]
    return GpuRows(
        g_rank,
        g_s,
        g_e,
        g_corr,
        g_step,
        g_cat,
        graph_replay,
        g_name,
        g_shape,
        members,
        first,
        prev_end,
        gperm,
        ranks_u,
        rank_lo,
        rank_hi,
        chain_lo,
        chain_hi,
        cand,
    )
