"""The changes a what-if applies to a run's graph (pipeline/whatif/graph.py), each one a function
of the measured durations (replay.Durations) that returns the changed ones. Every dependency is
kept; only times change.

- scale: GPU work whose name matches a glob (`kernel:flash_fwd*=0.5`) or of a category
  (`category:compute=0.8`) takes that factor of its time (a collective's kernel: its transfer);
- collectives at peak: each matched collective transfers at its link's peak bus bandwidth
  (collective_matching.sql link_peak_gbps: transfer = msg_bytes x busbw factor / peak, nccl-tests'
  definitions), never slower than measured;
- collectives overlapped: collective kernels take no time and wait for nobody (the most that
  hiding communication behind compute could win);
- rank R on time: at every matched collective rank R arrives when the last other rank does,
  whatever delayed it (the straggler's lateness removed);
- no launch gaps: the host work between consecutive launches of a step, and the launch calls,
  take no time, and work starts as soon as its stream and dependencies allow (what capturing the
  step in a CUDA graph would give);
- no data loading: DataLoader fetches take no time;
- durations from another run: every kernel, copy and memset takes the mean duration of the
  other run's activities of the same name, shape (grid and block, or bytes) and occurrence in the
  step, else of the same name and shape, else of the same name; collective kernels keep their
  transfer (their durations in the other run include waiting). With `host=True` the host's
  durations too: each host node (launch, blocking call, DataLoader fetch, step mark) takes the
  mean own time and the mean host work before it of the other run's nodes of the same name and
  occurrence in the step, else of the same name (a blocking call's own time is what it took after
  the work it waited for).
Raises ValueError for a change it cannot read.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from .graph import CATEGORIES, DATA_LOADING, LAUNCH, STEP_END, STEP_START, Graph
from .replay import Durations


@dataclass(frozen=True)
class Change:
    """One what-if: `label` says it in words, `key` in the --format json contract, `leaves_out`
    what its projection does not model (docs/whatif.md)."""

    key: str
    label: str
    apply: object  # (Graph, Durations) -> Durations
    leaves_out: str = ""
    # what the last apply() found worth saying (how much of the run the change reached), or None
    said: dict = field(default_factory=dict, compare=False)
    # (Graph) -> None: raises ValueError where the run cannot take the change (None: any run can)
    check: object = field(default=None, compare=False)

    def note(self) -> str | None:
        return self.said.get("note")


def _scaled(g: Graph, d: Durations, mask: np.ndarray, factor: float) -> Durations:
    g_d = d.g_d.copy()
    g_d[mask] = np.round(g_d[mask] * factor).astype(np.int64)
    # a collective's time after the last arrival shrinks with its transfer
    g_wc = d.g_wc.copy()
    m = mask & (g.g_coll >= 0)
    g_wc[m] = d.g_wc[m] - (d.g_d[m] - g_d[m])
    return replace(d, g_d=g_d, g_wc=g_wc)


_SCALE = re.compile(r"^(kernel|category):(.+)=([^=]+)$")
# FACTOR: a plain decimal number, with an exponent or not (0.5, .5, 2., 1e2; not 1_0, nan, inf)
_FACTOR = re.compile(r"^(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
# the most ns the scaled work of a run may add up to: 2**61 ns (73 years) keeps every replayed time
# (a sum of durations and measured gaps along the graph's edges) far inside int64
MAX_SCALED_NS = 2**61


def scale(spec: str) -> Change:
    """`kernel:GLOB=F` or `category:NAME=F`, F a decimal number >= 0 (0.5, .5, 1e2). Raises
    ValueError otherwise; the Change's check(g) raises ValueError where F would make the matched
    work of g add up to more than MAX_SCALED_NS (the CLI calls it before replaying: a usage
    error)."""
    m = _SCALE.match(spec.strip())
    f = float(m.group(3)) if m and _FACTOR.match(m.group(3).strip()) else math.nan
    if not m or not (math.isfinite(f) and f >= 0):
        raise ValueError(
            f"--scale {spec!r}: expected kernel:GLOB=FACTOR or category:NAME=FACTOR (FACTOR a number >= 0)"
        )
    what, pat = m.group(1), m.group(2)
    if what == "category" and pat not in CATEGORIES:
        raise ValueError(f"--scale {spec!r}: category is one of {', '.join(CATEGORIES)}")
    said: dict = {}

    def matched(g: Graph) -> np.ndarray:
        if what == "kernel":
            rx = re.compile(fnmatch.translate(pat))
            hit = [i for i, n in enumerate(g.names) if rx.match(n)]
            return np.isin(g.g_name, hit)
        return g.g_cat == CATEGORIES.index(pat)

    def check(g: Graph, mask: np.ndarray | None = None) -> None:
        mask = matched(g) if mask is None else mask
        total = float(g.g_d[mask].sum()) * f
        if total > MAX_SCALED_NS:
            raise ValueError(
                f"--scale {spec!r}: x{f:g} makes the matched work of run {g.run} add up to "
                f"{total / 1e9 / 86400 / 365.25:.3g} years, past what the replay's int64 ns hold "
                f"({MAX_SCALED_NS / 1e9 / 86400 / 365.25:.0f} years)"
            )

    def apply(g: Graph, d: Durations) -> Durations:
        mask = matched(g)
        check(g, mask)
        said["note"] = (
            None if mask.any() else f"no GPU work of run {g.run} matches {what}:{pat}: nothing changed"
        )
        return _scaled(g, d, mask, f)

    return Change(
        f"scale {what}:{pat}={f:g}",
        f"{'kernels ' + pat if what == 'kernel' else pat + ' work'} x{f:g}",
        apply,
        "work beside the scaled kernels keeps its time (no contention between streams modelled)",
        said,
        check,
    )


def collectives_at_peak() -> Change:
    said: dict = {}

    def apply(g: Graph, d: Durations) -> Durations:
        members = g.g_coll >= 0
        peak = np.where(members, g.c_peak_ns[np.maximum(g.g_coll, 0)] if len(g.c_peak_ns) else -1, -1)
        ok = members & (peak >= 0) & (peak < d.g_d)
        said.clear()
        if not ok.any():
            said["note"] = (
                "the run has no collective call matched across ranks: nothing changed"
                if not members.any()
                else "no matched collective call has a known link peak to run faster at: nothing changed"
            )
        g_d = d.g_d.copy()
        g_d[ok] = peak[ok]
        g_wc = d.g_wc.copy()
        g_wc[ok] = d.g_wc[ok] - (d.g_d[ok] - g_d[ok])
        return replace(d, g_d=g_d, g_wc=g_wc)

    return Change(
        "collectives at peak",
        "collectives at the link's peak bus bandwidth",
        apply,
        "the per-call latency of a real transfer; calls with no link peak keep their time",
        said,
    )


def collectives_overlapped() -> Change:
    said: dict = {}

    def apply(g: Graph, d: Durations) -> Durations:
        members = g.g_coll >= 0
        comm = members | (g.g_cat == CATEGORIES.index("communication"))
        said.clear()
        if not comm.any():
            said["note"] = "the run has no communication work: nothing changed"
        g_d = np.where(comm, 0, d.g_d)
        return replace(d, g_d=g_d, coll_free=members.copy())

    return Change(
        "collectives overlapped",
        "collectives fully overlapped (no time, no waiting)",
        apply,
        "the compute that would hide them is not slowed by sharing the GPU with them",
        said,
    )


def check_rank(g: Graph, rank: int) -> None:
    """Raises ValueError (one line) when g's run has no rank `rank` (--on-time's check)."""
    if rank not in g.ranks:
        raise ValueError(f"--on-time {rank}: the run has no rank {rank} (ranks {g.ranks[0]}..{g.ranks[-1]})")


def on_time(rank: int) -> Change:
    said: dict = {}

    def apply(g: Graph, d: Durations) -> Durations:
        check_rank(g, rank)
        said.clear()
        if not ((g.g_coll >= 0) & (g.g_rank == rank)).any():
            said["note"] = (
                f"rank {rank} takes part in no collective call matched across ranks: nothing waits "
                "for it, nothing changed"
            )
        return replace(d, on_time_rank=int(rank))

    return Change(
        f"rank {rank} on time",
        f"rank {rank} on time at every collective",
        apply,
        f"what made rank {rank} late: its own step keeps its time",
        said,
        lambda g: check_rank(g, rank),
    )


def no_launch_gaps() -> Change:
    def apply(g: Graph, d: Durations) -> Durations:
        launch = g.h_what == LAUNCH
        prev_launch = np.zeros(len(launch), dtype=bool)
        prev_launch[1:] = launch[:-1] & ~g.h_chain_first[1:]
        h_gap = np.where(launch & prev_launch, 0, d.h_gap)
        h_b = np.where(launch & (g.h_dep < 0), 0, d.h_b)
        g_wl = np.zeros_like(d.g_wl)
        return replace(d, h_gap=h_gap, h_b=h_b, g_wl=g_wl)

    return Change(
        "no launch gaps",
        "no host launch gaps (as with CUDA graphs)",
        apply,
        "host work outside the launch sequence (blocking calls, data loading) keeps its time",
    )


def no_data_loading() -> Change:
    def apply(g: Graph, d: Durations) -> Durations:
        return replace(d, h_b=np.where(g.h_what == DATA_LOADING, 0, d.h_b))

    return Change(
        "no data loading", "no data loading", apply, "the host work that uses the batch keeps its time"
    )


def _occurrence(g: Graph, d: np.ndarray) -> pl.DataFrame:
    """g's activities with their name, shape, duration and occurrence: the how-manieth activity
    of that name and shape it is in its rank's step (in stream order; -1 outside steps)."""
    names = pl.DataFrame({"name_id": np.arange(len(g.names), dtype=np.int32), "name": g.names})
    f = (
        g.frame.select("rank", "step", "name_id", "shape")
        .with_columns(pl.Series("d", d), pl.int_range(pl.len()).alias("i"))
        .join(names, on="name_id", how="left")
    )
    occ = pl.int_range(pl.len()).over("rank", "step", "name_id", "shape")
    return f.with_columns(pl.when(pl.col("step").is_not_null()).then(occ).otherwise(-1).alias("occ"))


def _host_occurrence(g: Graph, b: np.ndarray, gap: np.ndarray) -> pl.DataFrame:
    """g's host nodes with their name, own time, the host work before them and their occurrence:
    the how-manieth node of that name it is in its rank's step (-1 outside steps)."""
    what = pl.col("what")
    f = pl.DataFrame(
        {
            "name": g.h_name.cast(pl.Utf8),
            "rank": g.h_rank,
            "mark": g.h_step,
            "what": g.h_what,
            "b": b,
            "gap": gap,
            "first": g.h_chain_first,
        }
    ).with_row_index("i")
    # a node's step: that of the last step mark before it on its rank's chain (-1 after an end)
    f = f.with_columns(
        pl.when(what == STEP_START)
        .then(pl.col("mark"))
        .when(what == STEP_END)
        .then(-1)
        .otherwise(None)
        .forward_fill()
        .over("rank")
        .fill_null(-1)
        .alias("step")
    ).with_columns(pl.when(what == STEP_END).then(pl.col("mark")).otherwise(pl.col("step")).alias("step"))
    occ = pl.int_range(pl.len()).over("rank", "step", "name")
    return f.with_columns(pl.when(pl.col("step") >= 0).then(occ).otherwise(-1).alias("occ"))


def _host_from(other: Graph):
    theirs = _host_occurrence(other, other.h_b, other.h_gap).filter(~pl.col("first"))
    by_occ = (
        theirs.filter(pl.col("occ") >= 0)
        .group_by("name", "occ")
        .agg(b_occ=pl.col("b").mean(), gap_occ=pl.col("gap").mean())
    )
    by_name = theirs.group_by("name").agg(b_name=pl.col("b").mean(), gap_name=pl.col("gap").mean())

    def apply(g: Graph, d: Durations) -> Durations:
        j = (
            _host_occurrence(g, d.h_b, d.h_gap)
            .join(by_occ, on=["name", "occ"], how="left")
            .join(by_name, on="name", how="left")
            .sort("i")
        )
        b = j.select(pl.coalesce("b_occ", "b_name", "b")).to_series().to_numpy()
        # a chain's first node has no host work before it on this rank's clock: kept
        gap = j.select(
            pl.when(pl.col("first")).then(pl.col("gap")).otherwise(pl.coalesce("gap_occ", "gap_name", "gap"))
        )
        gap = gap.to_series().to_numpy()
        return replace(d, h_b=np.round(b).astype(np.int64), h_gap=np.round(gap).astype(np.int64))

    return apply


def durations_from(other: Graph, host: bool = False) -> Change:
    """Every activity takes the mean duration of `other`'s activities of its name, shape and
    occurrence in the step, else of its name and shape, else of its name; with `host`, every host
    node also takes `other`'s own time and host work before it (by name and occurrence in the
    step, else by name)."""
    theirs = _occurrence(other, other.g_e - other.g_s)
    by_occ = theirs.filter(pl.col("occ") >= 0).group_by("name", "shape", "occ").agg(d_occ=pl.col("d").mean())
    by_shape = theirs.group_by("name", "shape").agg(d_shape=pl.col("d").mean())
    by_name = theirs.group_by("name").agg(d_name=pl.col("d").mean())

    def apply(g: Graph, d: Durations) -> Durations:
        mine = _occurrence(g, d.g_d)
        j = (
            mine.join(by_occ, on=["name", "shape", "occ"], how="left", nulls_equal=True)
            .join(by_shape, on=["name", "shape"], how="left", nulls_equal=True)
            .join(by_name, on="name", how="left")
            .sort("i")
        )
        new = j.select(pl.coalesce("d_occ", "d_shape", "d_name")).to_series().to_numpy().astype(float)
        ok = ~np.isnan(new) & (g.g_coll < 0)
        g_d = d.g_d.copy()
        g_d[ok] = np.round(new[ok]).astype(np.int64)
        # how much of the run found its kernel in the other (a run of another model finds little)
        own = g.g_coll < 0
        total = int(d.g_d[own].sum())
        pct = 100 * int(d.g_d[ok].sum()) / total if total else 0.0
        said["note"] = (
            f"{int(ok.sum()):,} of {int(own.sum()):,} activities ({pct:.1f} % of their time) found "
            f"their name in run {other.run}; the others keep their time"
        )
        return replace(d, g_d=g_d)

    said: dict = {}
    if not host:
        return Change(
            f"durations from {other.run}",
            f"kernel durations of run {other.run}",
            apply,
            f"host time: this run's as recorded (--host-durations takes run {other.run}'s); work that "
            f"exists only in run {other.run} is not added",
            said,
        )
    host_apply = _host_from(other)
    return Change(
        f"durations from {other.run} with host",
        f"kernel and host durations of run {other.run}",
        lambda g, d: host_apply(g, apply(g, d)),
        f"work that exists only in run {other.run} is not added; this run's dependencies (syncs, "
        "collectives) are kept",
        said,
    )


def straggler_rank(g: Graph, t_start: np.ndarray) -> int | None:
    """The rank that arrives last at the most matched collectives (ties: the lowest rank), or None
    when no call has a single last rank."""
    members = g.g_coll >= 0
    if not members.any():
        return None
    f = pl.DataFrame({"c": g.g_coll[members], "rank": g.g_rank[members], "s": t_start[members]})
    last = f.filter(pl.col("s") == pl.col("s").max().over("c")).filter(pl.len().over("c") == 1)
    if last.height == 0:
        return None
    counts = last.group_by("rank").len().sort(["len", "rank"], descending=[True, False])
    return int(counts["rank"][0])


def defaults(g: Graph) -> list[Change]:
    """The what-ifs worth asking of any run: the straggler on time (when there is one), collectives
    at peak and overlapped (when there are any), no launch gaps, and no data loading (when the
    host fetched data)."""
    out: list[Change] = []
    r = straggler_rank(g, g.g_s)
    if r is not None and len(g.ranks) > 1:
        out.append(on_time(r))
    if (g.g_coll >= 0).any() or (g.g_cat == CATEGORIES.index("communication")).any():
        if (g.c_peak_ns >= 0).any():
            out.append(collectives_at_peak())
        out.append(collectives_overlapped())
    out.append(no_launch_gaps())
    if (g.h_what == DATA_LOADING).any():
        out.append(no_data_loading())
    return out


def collectives(value: str) -> Change:
    """The change of `--collectives VALUE`: peak (collectives_at_peak) or overlap
    (collectives_overlapped). Raises ValueError for anything else."""
    if value not in ("peak", "overlap"):
        raise ValueError(f"--collectives {value!r}: peak or overlap")
    return collectives_at_peak() if value == "peak" else collectives_overlapped()


def check(g: Graph, changes: list[Change]) -> None:
    """Raises ValueError for the first change the run of g cannot take (Change.check: a rank it
    does not have), as `tracelake whatif` and the Python API refuse it before replaying."""
    for ch in changes:
        if ch.check is not None:
            ch.check(g)


# from_text: the `tracelake whatif` options a change is written as, and their changes
_OPTIONS = {
    "--scale": scale,
    "--collectives": collectives,
    "--on-time": lambda v: on_time(int(v)),
    "--no-launch-gaps": no_launch_gaps,
    "--no-data-loading": no_data_loading,
}


def from_text(text: str) -> Change:
    """The change `tracelake whatif` makes of one option written as text, for the Python API:
    '--scale kernel:gemm*=0.5' (or the spec alone, 'kernel:gemm*=0.5'), '--collectives peak' or
    'overlap', '--on-time 7', '--no-launch-gaps', '--no-data-loading'. Raises ValueError naming
    the text for anything else."""
    parts = text.strip().split(None, 1)
    name, value = (parts + ["", ""])[:2]
    value = value.strip()
    if name.startswith("--") and "=" in name and not value:  # --on-time=7, as the shell allows
        name, value = name.split("=", 1)
    if name not in _OPTIONS and not name.startswith("--") and ":" in text:  # a scale spec alone
        name, value = "--scale", text.strip()  # (its glob may hold spaces)
    make = _OPTIONS.get(name)
    takes_value = name in ("--scale", "--collectives", "--on-time")
    if make is None or takes_value != bool(value):
        raise ValueError(
            f"change {text!r}: give one of '--scale kernel:GLOB=F' (or category:NAME=F), "
            "'--collectives peak|overlap', '--on-time RANK', '--no-launch-gaps', '--no-data-loading', "
            "or a pipeline.whatif.changes object"
        )
    try:
        return make(value) if takes_value else make()
    except ValueError as e:
        raise ValueError(f"change {text!r}: {e}") from None
