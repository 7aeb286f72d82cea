"""One run's dependency graph, read from the lake (queries/replay/*.sql), as numpy arrays.

The graph has two kinds of chains, each replayed in its own order:
- per rank, one **host chain**: the calls that launched GPU work, the blocking calls, DataLoader
  fetches and the step marks, in start order (the threads of a rank are replayed as one
  sequence: a rank's threads that launch work take turns, as PyTorch's main and autograd threads
  do); what the host did between two of them is kept as it was;
- per rank and stream, one **stream chain**: the kernels, copies and memsets in stream order.

Edges between chains, each with the weight that reproduces the trace exactly (the one edge that
explains a start carries the measured delay; the others are ordering constraints of weight 0):
- launch: a call -> the work it launched (correlation id);
- cross-stream: an activity on another stream of the rank -> a kernel whose start its stream
  predecessor and launch do not explain (pipeline/catalog/replay.toml; inferred, not recorded);
- sync: GPU work -> a blocking call it ended inside (replay.toml blocking_calls), and the last
  work launched in a step -> the step's host end when that end follows it within
  explained_gap_ns (a wait the trace does not record as a call);
- collective: every rank's kernel of a matched call (collective_matching.sql, consistent calls
  only) cannot end before the last rank arrives plus what it took after that arrival.

Times are int64 ns relative to `t0` (the run's first event), so that sums stay far from int64's
limits. Raises ValueError when the run has no GPU work.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from ..catalog import replay as replay_facts
from ..paths import QUERIES_DIR

NEG = np.int64(-(2**60))  # "no such edge": below every time
# host node kinds (Graph.h_what holds their index) and GPU categories (Graph.g_cat)
WHAT = ("launch", "blocking", "data_loading", "step_start", "step_end")
LAUNCH, BLOCKING, DATA_LOADING, STEP_START, STEP_END = range(len(WHAT))
CATEGORIES = ("compute", "communication", "memory", "unknown")


@dataclass
class Graph:
    """The arrays of one run's graph. GPU arrays (g_*) have one row per activity in stream order,
    host arrays (h_*) one row per host node in chain order; collective arrays (c_*) one row per
    matched call."""

    run: str
    t0: int
    ranks: list[int]
    # GPU
    g_rank: np.ndarray
    g_first: np.ndarray  # True where a stream chain starts
    g_s: np.ndarray
    g_e: np.ndarray
    g_d: np.ndarray  # duration (a collective member: the call's transfer time)
    g_gap: np.ndarray  # weight of the edge from the stream predecessor's end
    g_fixed: np.ndarray  # start that nothing explains (NEG: explained)
    g_launch: np.ndarray  # host node index of the launch (-1: none)
    g_wl: np.ndarray
    g_cross: np.ndarray  # GPU index it waited for on another stream (-1: none)
    g_wx: np.ndarray
    g_coll: np.ndarray  # collective index (-1: none)
    g_wc: np.ndarray  # end - last arrival, for collective members
    g_step: np.ndarray  # -1: outside steps
    g_cat: np.ndarray  # index into CATEGORIES
    frame: pl.DataFrame  # the GPU rows: rank, name_id, shape, step (NULL outside steps)
    names: list[str]  # name_id -> kernel name or copy label
    # host
    h_rank: np.ndarray
    h_chain_first: np.ndarray  # True where a rank's chain starts
    h_s: np.ndarray
    h_e: np.ndarray
    h_gap: np.ndarray  # start - previous node's end
    h_b: np.ndarray  # own time
    h_dep: np.ndarray  # GPU index it waits for (-1: none)
    h_t: np.ndarray  # end - that work's end, when binding
    h_what: np.ndarray  # index into WHAT
    h_step: np.ndarray
    h_name: pl.Series  # categorical
    # collectives
    c_key: list[tuple[str, int]]
    c_transfer: np.ndarray
    c_peak_ns: np.ndarray  # transfer time at the link's peak (-1: unknown)
    notes: dict[int, list[str]] = field(default_factory=dict)  # step -> why parts are not replayed
    # (GPU, host) replay windows, made by replay.windows() on a large graph's first changed replay
    windows: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    # replay levels (replay._Levels; False: none found), made on a large graph's first changed replay
    levels: object = field(default=None, repr=False)


def step_notes(g: Graph) -> list[str]:
    """g's notes of what it leaves out, a line per text: the steps that share it named together
    ("steps 1009-1014: ..."), not one line per step."""
    by_text: dict[str, list[int]] = {}
    for s, texts in sorted(g.notes.items()):
        for t in texts:
            by_text.setdefault(t, []).append(s)
    out = []
    for t, steps in by_text.items():
        runs, lo = [], steps[0]
        for a, b in zip(steps, steps[1:] + [None]):
            if b != a + 1:
                runs.append(str(lo) if lo == a else f"{lo}-{a}")
                lo = b
        out.append(f"{'step' if len(steps) == 1 else 'steps'} {', '.join(runs)}: {t}")
    return out


def _first_of_chain(chain: np.ndarray) -> np.ndarray:
    first = np.ones(len(chain), dtype=bool)
    first[1:] = chain[1:] != chain[:-1]
    return first


def _read(con: duckdb.DuckDBPyConnection, name: str) -> pl.DataFrame:
    return pl.from_arrow(con.sql((QUERIES_DIR / "replay" / name).read_text()).to_arrow_table())


@contextmanager
def _uncapped(con: duckdb.DuckDBPyConnection):
    """The graph's two reads without the connection's DuckDB memory cap (pipeline/query.py
    MEMORY_LIMIT), which is then set again: their rows go whole to Arrow, so a cap only makes
    DuckDB spill what the graph holds in memory anyway (64 x 100k: 1.4-1.7 s of the build)."""
    from ..query import MEMORY_LIMIT

    setting = "SELECT current_setting('memory_limit')"
    ((limit,),) = con.execute(setting).fetchall()
    con.execute("RESET memory_limit")
    capped = [(limit,)] != con.execute(setting).fetchall()
    try:
        yield
    finally:
        try:
            if capped:  # connect's cap (its text: the setting reads back rounded)
                con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        except duckdb.Error:  # more is held now than the cap allows: the connection stays uncapped
            pass


def build(con: duckdb.DuckDBPyConnection, run: str) -> Graph:
    """The graph of `run` from a pipeline.query connection (derived and metric views bound)."""
    facts = replay_facts()
    con.execute("SET VARIABLE replay_run = ?", [run])
    con.execute("SET VARIABLE replay_blocking = ?", [facts["blocking_calls"]])
    con.execute("SET VARIABLE replay_categories = ?", [list(CATEGORIES)])
    con.execute((QUERIES_DIR / "replay" / "gpu_names.sql").read_text())
    names = [n for (n,) in con.execute("SELECT name FROM replay_names ORDER BY name_id").fetchall()]
    with _uncapped(con):
        gpu = _read(con, "gpu_nodes.sql")
        if gpu.height == 0:
            raise ValueError(f"run {run}: no GPU work to replay")
        host = _read(con, "host_nodes.sql")
    name = host["name"].fill_null("")
    host = host.with_columns(name.cast(pl.Enum(name.unique().sort())))  # a code per distinct name
    from ..query import metric_sql  # collective_matching.sql, whether or not its view is bound

    coll = pl.from_arrow(
        con.sql(
            "SELECT pg_key, call_key, consistent, transfer_ns, msg_bytes, algbw_gbps, busbw_gbps, "
            f"link_peak_gbps FROM ({metric_sql(con, 'collective_matching').strip().rstrip(';')}) "
            "WHERE run_id = getvariable('replay_run')"
        ).to_arrow_table()
    )
    t0 = int(min(gpu["start_ns"].min(), host["start_ns"].min() if host.height else gpu["start_ns"].min()))
    frames = [gpu, host]
    del gpu, host  # _assemble lets each frame go as soon as it has what it needs (peak memory)
    return _assemble(run, t0, frames, coll, facts, names)


def _keys(rank: np.ndarray, corr: np.ndarray) -> np.ndarray | None:
    """(rank, correlation) as one int64 (rank above bit 40), or None when a value does not fit
    (then the callers join on the two columns)."""
    if len(rank) and (rank.min() < 0 or rank.max() >= (1 << 22) or corr.max() >= (1 << 40)):
        return None
    return np.where(corr >= 0, (rank.astype(np.int64) << 40) | corr, -1)


class _Links:
    """Host calls and GPU rows linked by (rank, correlation) packed in one int64 (_keys), with one
    sort of the calls' keys: which calls launched work (their key is a GPU row's), and, once the
    host rows have their chain order, each GPU row's launch (the first call of its key in that
    order). Returns None (make) where a key does not fit; then _join_index joins on the columns."""

    def __init__(self, hk: np.ndarray, gk: np.ndarray):
        self.o = np.argsort(hk, kind="stable")
        sk = hk[self.o]
        new = np.ones(len(sk), dtype=bool)
        new[1:] = sk[1:] != sk[:-1]
        self.run = np.cumsum(new) - 1  # per sorted call: the number of its key
        self.starts = np.flatnonzero(new)
        pos = np.minimum(np.searchsorted(sk, gk), max(len(sk) - 1, 0))
        self.hit = (gk >= 0) & (sk[pos] == gk) if len(sk) else np.zeros(len(gk), dtype=bool)
        self.g_run = np.where(self.hit, self.run[pos] if len(sk) else 0, -1)
        hit_run = np.zeros(len(self.starts), dtype=bool)
        hit_run[self.g_run[self.hit]] = True
        self.launched = np.zeros(len(hk), dtype=bool)
        self.launched[self.o] = hit_run[self.run] & (sk >= 0)

    @classmethod
    def make(cls, h_rank, h_corr, h_call, g_rank, g_corr) -> _Links | None:
        hk, gk = _keys(h_rank, h_corr), _keys(g_rank, g_corr)
        if hk is None or gk is None:
            return None
        return cls(np.where(h_call, hk, -1), gk)  # -1: no key (never a GPU row's)

    def launch(self, keep: np.ndarray) -> np.ndarray:
        """Per GPU row (in the rows' first order), its launch's position among the host rows that
        keep marks (the host rows are in chain order; every call of a launching key is kept): the
        first call of its key in chain order. -1: none."""
        if not len(self.starts):
            return np.full(len(self.hit), -1, dtype=np.int64)
        at = np.cumsum(keep, dtype=np.int64) - 1  # position among the kept rows
        first = at[self.o[self.starts]]  # o is a stable sort: a key's first call comes first
        return np.where(self.hit, first[np.maximum(self.g_run, 0)], -1)


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


def _assemble(run, t0, frames, coll, facts, names) -> Graph:
    notes: dict[int, list[str]] = {}
    gpu, host = frames
    frames.clear()
    # --- host rows: the calls that launched GPU work of the run (their correlation is a GPU
    # row's of the same rank), or blocking calls; DataLoader fetches; step marks
    blocking_names = set(facts["blocking_calls"])
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
    perm = _order([h_rank0, h_s0, order_of[kind0]], [-h_e0])
    h_rank, h_s, h_e, kind = h_rank0[perm], h_s0[perm], h_e0[perm], kind0[perm]
    del h_s0, h_e0, h_rank0, kind0
    codes = host["name"].to_physical().to_numpy()[perm]
    blocking = is_blocking[codes] if len(cats) else np.zeros(host.height, dtype=bool)
    call = kind == 0
    h_corr = host["correlation"].fill_null(-1).to_numpy().astype(np.int64)[perm]
    g_corr0 = gpu["correlation"].fill_null(-1).to_numpy().astype(np.int64)
    g_rank0 = gpu["rank"].to_numpy().astype(np.int64)
    # the calls that launched work: their (rank, correlation) is a GPU row's
    links = _Links.make(h_rank, h_corr, call, g_rank0, g_corr0)  # the calls' keys come nearly sorted
    if links is not None:
        launched = links.launched
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
    g_launch0 = links.launch(keep) if links is not None else None
    perm = perm[keep]
    h_rank, what, is_block_name, h_corr = h_rank[keep], what[keep], blocking[keep], h_corr[keep]
    h_s = h_s[keep] - t0
    h_e = h_e[keep] - t0
    h_step = host["step"].fill_null(-1).to_numpy().astype(np.int64)[perm]
    h_name = host["name"].gather(perm)
    del host, codes, blocking, kind, call, launched, perm, links, keep
    h_first = _first_of_chain(h_rank)
    prev_e = np.empty_like(h_e)
    prev_e[0:1] = h_s[0:1]
    prev_e[1:] = h_e[:-1]
    prev_e[h_first] = h_s[h_first]
    h_gap = h_s - prev_e
    h_b = h_e - h_s

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
    frame = gpu.select("rank", "name_id", "shape", "step")[gperm]
    n = len(gperm)
    inv = np.empty(n, dtype=np.int64)
    inv[gperm] = np.arange(n, dtype=np.int64)
    g_rank = g_rank0[gperm]
    g_stream = g_stream0[gperm]
    g_s = g_s0[gperm] - t0
    g_e = g_e0[gperm] - t0
    g_corr = g_corr0[gperm]
    if g_launch0 is not None:
        g_launch0 = g_launch0[gperm]
    del gpu, g_s0, g_e0, g_stream0, g_corr0, g_rank0, gperm
    g_step = frame["step"].fill_null(-1).to_numpy().astype(np.int64)
    gi_m = inv[mem["old"].to_numpy()]
    members = (
        mem.select("pg_key", "call_key")
        .with_columns(
            pl.Series("gi", gi_m),
            pl.Series("rank", g_rank[gi_m]),
            pl.Series("s", g_s[gi_m]),
            pl.Series("e", g_e[gi_m]),
            pl.Series("step", frame["step"].gather(gi_m)),
        )
        .sort("gi")
    )
    del inv, mem, gi_m
    g_d = g_e - g_s
    first = np.ones(n, dtype=bool)
    first[1:] = (g_rank[1:] != g_rank[:-1]) | (g_stream[1:] != g_stream[:-1])
    prev_end = np.full(n, NEG, dtype=np.int64)
    prev_end[1:] = g_e[:-1]
    prev_end[first] = NEG

    # launch: the first host node of the same rank and correlation that launched work
    if g_launch0 is not None:
        g_launch = g_launch0
    else:
        g_launch = _join_index(h_rank, h_corr, what == LAUNCH, g_rank, g_corr)
    launch_t = np.where(g_launch >= 0, h_s[np.maximum(g_launch, 0)], NEG) if len(h_s) else np.full(n, NEG)
    # a graph replay's kernels share one launch: only its first kernel is released by it
    launch_t = np.where(graph_replay & ~first & (g_launch == np.roll(g_launch, 1)), NEG, launch_t)

    # cross-stream: the latest end on another stream of the rank at or before the start
    explained = np.maximum(prev_end, launch_t)
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
    cand_end = np.where(cand >= 0, g_e[np.maximum(cand, 0)], NEG)
    use_cross = (
        (cand >= 0)
        & (g_s - explained > facts["explained_gap_ns"])
        & (g_s - cand_end <= facts["cross_stream_max_gap_ns"])
        & (cand_end > explained)
    )
    g_cross = np.where(use_cross, cand, -1)
    cross_t = np.where(use_cross, cand_end, NEG)

    # binding edge: the latest of predecessor, launch and cross; it carries the measured delay
    best = np.maximum(np.maximum(prev_end, launch_t), cross_t)
    fixed = best == NEG  # nothing explains the start: it stays where it was
    g_gap = np.where(~fixed & (prev_end == best), g_s - prev_end, 0)
    g_wl = np.where(~fixed & (launch_t == best) & (prev_end != best), g_s - launch_t, 0)
    g_wx = np.where(~fixed & (cross_t == best) & (prev_end != best) & (launch_t != best), g_s - cross_t, 0)
    g_fixed = np.where(fixed, g_s, NEG)
    no_launch = fixed & (g_step >= 0)
    for st, cnt in zip(*np.unique(g_step[no_launch], return_counts=True)):
        notes.setdefault(int(st), []).append(
            f"{cnt} activities have no recorded launch and nothing before them on their stream: "
            "they start where they started"
        )

    # collectives: consistent matched calls
    g_coll = np.full(n, -1, dtype=np.int64)
    g_wc = np.zeros(n, dtype=np.int64)
    c_key: list[tuple[str, int]] = []
    c_transfer = np.zeros(0, dtype=np.int64)
    c_peak = np.zeros(0, dtype=np.int64)
    if members.height and coll.height:
        ok = coll.filter(pl.col("consistent")).with_columns(
            pl.when((pl.col("link_peak_gbps") > 0) & (pl.col("algbw_gbps") > 0) & (pl.col("msg_bytes") > 0))
            .then(
                pl.col("msg_bytes") * (pl.col("busbw_gbps") / pl.col("algbw_gbps")) / pl.col("link_peak_gbps")
            )
            .otherwise(-1)
            .round(0)
            .cast(pl.Int64)
            .alias("peak_ns")
        )
        ok = ok.with_row_index("ci")
        m = members.join(
            ok.select("pg_key", "call_key", "ci", "peak_ns"), on=["pg_key", "call_key"], how="inner"
        )
        # one kernel per rank and call (the latest-starting, as collective_matching's wait)
        m = m.sort("s").unique(["ci", "rank"], keep="last")
        agg = m.group_by("ci").agg(
            pl.col("s").max().alias("x0"), (pl.col("e") - pl.col("s")).min().alias("t"), pl.len().alias("k")
        )
        agg = agg.filter(pl.col("k") >= 2)
        m = m.join(agg, on="ci", how="inner")
        if m.height:
            # renumber the calls that kept two or more members
            ids = agg.sort("ci").with_row_index("cj")
            m = m.join(ids.select("ci", "cj"), on="ci")
            gi = m["gi"].to_numpy().astype(np.int64)
            g_coll[gi] = m["cj"].to_numpy().astype(np.int64)
            g_wc[gi] = (m["e"] - m["x0"]).to_numpy().astype(np.int64)
            g_d[gi] = m["t"].to_numpy().astype(np.int64)
            ids = ids.join(ok.select("ci", "pg_key", "call_key", "peak_ns"), on="ci").sort("cj")
            c_key = list(zip(ids["pg_key"].to_list(), ids["call_key"].to_list()))
            c_transfer = ids["t"].to_numpy().astype(np.int64)
            c_peak = ids["peak_ns"].to_numpy().astype(np.int64)
    unmatched = members.filter(pl.Series(g_coll[members["gi"].to_numpy()] < 0))
    for st, cnt in unmatched.group_by("step").len().iter_rows():
        if st is not None:
            notes.setdefault(int(st), []).append(
                f"{cnt} collective kernels are not matched across ranks: their waiting is kept as measured"
            )

    # --- sync edges: a blocking node waits for work that ended inside it
    h_dep = np.full(len(h_s), -1, dtype=np.int64)
    h_t = np.zeros(len(h_s), dtype=np.int64)
    # a launching blocking call: its own work, when that ended inside it
    own = np.full(len(h_s), -1, dtype=np.int64)
    li = np.nonzero(g_launch >= 0)[0]
    own[g_launch[li]] = li  # the last of its activities in stream order
    cand_h = np.where((what == LAUNCH) & is_block_name & (own >= 0), own, -1)
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
        inferred_end = np.zeros(len(h_s), dtype=bool)
        inferred_end[hi[waits]] = True
    else:
        inferred_end = np.zeros(len(h_s), dtype=bool)
    dep_e = np.where(cand_h >= 0, g_e[np.maximum(cand_h, 0)], NEG)
    valid = (cand_h >= 0) & (dep_e <= h_e)
    h_dep = np.where(valid, cand_h, -1)
    binding = valid & ((dep_e > h_s) | inferred_end)
    h_t = np.where(binding, h_e - dep_e, 0)
    h_b = np.where(binding, h_t, h_b)

    return Graph(
        run=run,
        t0=t0,
        ranks=[int(r) for r in ranks_u],
        g_rank=g_rank,
        g_first=first,
        g_s=g_s,
        g_e=g_e,
        g_d=g_d,
        g_gap=g_gap,
        g_fixed=g_fixed,
        g_launch=np.where(launch_t == NEG, -1, g_launch),
        g_wl=g_wl,
        g_cross=g_cross,
        g_wx=g_wx,
        g_coll=g_coll,
        g_wc=g_wc,
        g_step=g_step,
        g_cat=g_cat,
        frame=frame,
        names=names,
        h_rank=h_rank,
        h_chain_first=h_first,
        h_s=h_s,
        h_e=h_e,
        h_gap=h_gap,
        h_b=h_b,
        h_dep=h_dep,
        h_t=h_t,
        h_what=what,
        h_step=h_step,
        h_name=h_name,
        c_key=c_key,
        c_transfer=c_transfer,
        c_peak_ns=c_peak,
        notes=notes,
    )
