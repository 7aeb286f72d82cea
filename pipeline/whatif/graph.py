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

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import duckdb
import numpy as np
import polars as pl

from ..catalog import replay as replay_facts
from ..paths import QUERIES_DIR
from .rows import (  # noqa: F401  (WHAT and the kinds: what Graph.h_what holds, read by the other rooms)
    BLOCKING,
    DATA_LOADING,
    LAUNCH,
    NEG,
    STEP_END,
    STEP_START,
    WHAT,
    _join_index,
    gpu_rows,
    host_rows,
)

# host node kinds (Graph.h_what holds their index: rows.WHAT) and GPU categories (Graph.g_cat)
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
    g_name: np.ndarray  # int32 name_id: position in names
    g_shape: np.ndarray  # uint64 hash of the launch shape or byte count (gpu_nodes.sql; 0: none recorded)
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

    @property
    def frame(self) -> pl.DataFrame:
        """The GPU rows as a frame: rank, name_id, shape (NULL: none recorded), step (NULL: outside
        steps), made from the arrays when asked for (what --durations-from matches by)."""
        return pl.DataFrame(
            {"rank": self.g_rank, "name_id": self.g_name, "shape": self.g_shape, "step": self.g_step}
        ).with_columns(
            pl.when(pl.col("shape") != 0).then(pl.col("shape")).alias("shape"),
            pl.when(pl.col("step") >= 0).then(pl.col("step")).alias("step"),
        )


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
    variables = {
        "replay_run": run,
        "replay_blocking": facts["blocking_calls"],
        "replay_categories": list(CATEGORIES),
    }
    for k, v in variables.items():
        con.execute(f"SET VARIABLE {k} = ?", [v])
    con.execute((QUERIES_DIR / "replay" / "gpu_names.sql").read_text())
    names = [n for (n,) in con.execute("SELECT name FROM replay_names ORDER BY name_id").fetchall()]
    with _uncapped(con), ThreadPoolExecutor(max_workers=1) as pool:
        # the host rows read on a cursor of their own beside the GPU rows (DuckDB lets go of the
        # GIL while it reads); a cursor has the database's views but not the connection's variables
        cur = con.cursor()
        for k, v in variables.items():
            cur.execute(f"SET VARIABLE {k} = ?", [v])
        host_read = pool.submit(_read, cur, "host_nodes.sql")
        gpu = _read(con, "gpu_nodes.sql")
        try:
            host = host_read.result()
        except duckdb.CatalogException:  # cpu_ops or steps only on this connection (a caller's TEMP view)
            host = _read(con, "host_nodes.sql")
        cur.close()
    if gpu.height == 0:
        raise ValueError(f"run {run}: no GPU work to replay")
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


def _index(a: np.ndarray, n: int) -> np.ndarray:
    """Index array a (positions below n, -1: none) as int32 where n allows (half the memory of
    the graph's four index arrays: 108 MB of 13.4 M nodes), else as it is."""
    return a.astype(np.int32) if n < 2**31 else a


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
    g_corr0 = gpu["correlation"].fill_null(-1).to_numpy().astype(np.int64)
    g_rank0 = gpu["rank"].to_numpy().astype(np.int64)
    # the host side (chain order, which calls launched work) and the GPU side (stream order,
    # cross-stream candidates) in two threads: numpy lets go of the GIL in its array passes
    gpu_box, host_box = [gpu], [host]
    del gpu, host
    with ThreadPoolExecutor(max_workers=1) as pool:
        host_side = pool.submit(host_rows, host_box, t0, facts["blocking_calls"], g_rank0, g_corr0)
        gr = gpu_rows(gpu_box, t0, g_rank0, g_corr0)
        del g_rank0, g_corr0
        hr = host_side.result()
    h_rank, h_s, h_e, what, is_block_name, h_corr = hr.rank, hr.s, hr.e, hr.what, hr.is_block_name, hr.corr
    h_step, h_name, h_first, h_gap, h_b = hr.step, hr.name, hr.first, hr.gap, hr.b
    g_launch0 = hr.g_launch0[gr.gperm] if hr.g_launch0 is not None else None
    del hr
    g_rank, g_s, g_e, g_corr, g_step, g_cat = gr.rank, gr.s, gr.e, gr.corr, gr.step, gr.cat
    graph_replay, g_name, g_shape, members, first, prev_end = (
        gr.graph_replay,
        gr.name,
        gr.shape,
        gr.members,
        gr.first,
        gr.prev_end,
    )
    ranks_u, rank_lo, rank_hi, chain_lo, chain_hi = (
        gr.ranks_u,
        gr.rank_lo,
        gr.rank_hi,
        gr.chain_lo,
        gr.chain_hi,
    )
    cand = gr.cand
    del gr
    n = len(g_s)
    g_d = g_e - g_s

    # launch: the first host node of the same rank and correlation that launched work
    if g_launch0 is not None:
        g_launch = g_launch0
    else:
        g_launch = _join_index(h_rank, h_corr, what == LAUNCH, g_rank, g_corr)
    launch_t = np.where(g_launch >= 0, h_s[np.maximum(g_launch, 0)], NEG) if len(h_s) else np.full(n, NEG)
    # a graph replay's kernels share one launch: only its first kernel is released by it
    launch_t = np.where(graph_replay & ~first & (g_launch == np.roll(g_launch, 1)), NEG, launch_t)

    # cross-stream: the latest end on another stream of the rank at or before the start (rows.py),
    # where the predecessor and the launch do not explain the start
    explained = np.maximum(prev_end, launch_t)
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
    best = np.maximum(explained, cross_t)
    fixed = best == NEG  # nothing explains the start: it stays where it was
    by_prev = ~fixed & (prev_end == best)
    by_launch = ~fixed & ~by_prev & (launch_t == best)
    by_cross = ~fixed & ~by_prev & ~by_launch & (cross_t == best)
    g_gap = np.where(by_prev, g_s - prev_end, 0)
    g_wl = np.where(by_launch, g_s - launch_t, 0)
    g_wx = np.where(by_cross, g_s - cross_t, 0)
    del by_prev, by_launch, by_cross
    g_fixed = np.where(fixed, g_s, NEG)
    no_launch = fixed & (g_step >= 0)
    for st, cnt in zip(*np.unique(g_step[no_launch], return_counts=True)):
        notes.setdefault(int(st), []).append(
            f"{cnt} activities have no recorded launch and nothing before them on their stream: "
            "they start where they started"
        )
    unlaunched = launch_t == NEG  # no launch edge (Graph.g_launch -1); the sync edges read g_launch
    # the temporaries of 6.7 M rows each let go before the sync edges make theirs (peak memory)
    del prev_end, launch_t, explained, cand, cand_end, use_cross, cross_t, best, fixed, no_launch
    del graph_replay, g_corr

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
    del cand_h, inferred_end, idx, dep, dep_e, valid, binding, bi

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
        g_launch=_index(np.where(unlaunched, -1, g_launch), len(h_s)),
        g_wl=g_wl,
        g_cross=_index(g_cross, n),
        g_wx=g_wx,
        g_coll=_index(g_coll, len(c_transfer)),
        g_wc=g_wc,
        g_step=g_step,
        g_cat=g_cat,
        g_name=g_name,
        g_shape=g_shape,
        names=names,
        h_rank=h_rank,
        h_chain_first=h_first,
        h_s=h_s,
        h_e=h_e,
        h_gap=h_gap,
        h_b=h_b,
        h_dep=_index(h_dep, n),
        h_t=h_t,
        h_what=what,
        h_step=h_step,
        h_name=h_name,
        c_key=c_key,
        c_transfer=c_transfer,
        c_peak_ns=c_peak,
        notes=notes,
    )
