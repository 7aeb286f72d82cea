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
from .sync import sync_edges

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


def _read_host(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """replay/host_nodes.sql's rows, the name an Enum (a code per distinct name)."""
    host = _read(con, "host_nodes.sql")
    name = host["name"].fill_null("")
    return host.with_columns(name.cast(pl.Enum(name.unique().sort())))


def _collectives(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """The run's matched collective calls (collective_matching.sql, whether or not its view is
    bound): pg_key, call_key, consistent, transfer_ns, msg_bytes, algbw_gbps, busbw_gbps,
    link_peak_gbps."""
    from ..query import metric_sql

    return pl.from_arrow(
        con.sql(
            "SELECT pg_key, call_key, consistent, transfer_ns, msg_bytes, algbw_gbps, busbw_gbps, "
            f"link_peak_gbps FROM ({metric_sql(con, 'collective_matching').strip().rstrip(';')}) "
            "WHERE run_id = getvariable('replay_run')"
        ).to_arrow_table()
    )


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
        host_read = pool.submit(_read_host, cur)
        gpu = _read(con, "gpu_nodes.sql")
        if gpu.height:
            coll = _collectives(con)  # while the host rows are read
        try:
            host = host_read.result()
        except duckdb.CatalogException:  # cpu_ops or steps only on this connection (a caller's TEMP view)
            host = _read_host(con)
        cur.close()
    if gpu.height == 0:
        raise ValueError(f"run {run}: no GPU work to replay")
    t0 = int(min(gpu["start_ns"].min(), host["start_ns"].min() if host.height else gpu["start_ns"].min()))
    frames = [gpu, host]
    del gpu, host  # _assemble lets each frame go as soon as it has what it needs (peak memory)
    return _assemble(run, t0, frames, coll, facts, names)


def _index(a: np.ndarray, n: int) -> np.ndarray:
    """Index array a (positions below n, -1: none) as int32 where n allows (half the memory of
    the graph's four index arrays: 108 MB of 13.4 M nodes), else as it is."""
    return a.astype(np.int32) if n < 2**31 else a


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
    del g_launch0
    # the sync edges read only what the sides made and change only h_gap and h_b: made in a thread
    # beside the launch, cross-stream and collective edges (numpy lets go of the GIL)
    pool = ThreadPoolExecutor(max_workers=1)
    spans = (ranks_u, rank_lo, rank_hi, chain_lo, chain_hi)
    gpu = (g_launch, g_s, g_e, g_rank, g_step)
    host = (h_s, h_e, h_rank, h_step, what, is_block_name, h_gap, h_b)
    sync = pool.submit(sync_edges, gpu, host, spans, facts)
    del gpu, host
    pool.shutdown(wait=False)  # the thread ends with the sync edges; sync.result() below waits
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

    h_dep, h_t = sync.result()
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
