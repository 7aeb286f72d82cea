"""Steps of an Nsight Systems export that has no ProfilerStep ranges (and no --step-range), found
from the data, in this order:

1. **A repeating NVTX range** (source ``nvtx_repeat``): on one thread of a rank, ranges of one
   nesting level (the top level, or up to MAX_DEPTH - 1 levels inside it: nsightful's 'Step N to
   M' ranges inside one 'Loop'), whose names are the same once digits are taken out ("iteration
   12" and "iteration 13" are one name; PyTorch's ``aten::to, op_id = 7`` and Megatron's, NeMo's
   or a user's ``train_step``/``iteration`` ranges alike), at least MIN_STEPS of them, that
   together hold at least MIN_COVER of the rank's GPU activities (kernels, copies and memsets) and
   of their time (an activity belongs to the range whose host window holds its launch: pipit's
   saxpy ranges hold its kernels but not the copies that take three times as long). Op-level
   ranges (``aten::*``, ``FlashAttnFunc``) repeat too but hold few of the kernels (FlashAttnFunc
   holds 51 % of the kernel time of nsys-ai's mfu_2gpu_after.sqlite in 2 % of its kernels), so
   they are passed over. Among several candidates
   the one whose name says iteration/step/batch wins, then the one holding more GPU time, then
   the outermost.
   Step number: the last integer of the name when those are distinct, else the range's order.
2. **The period of the kernel sequence** (source ``kernel_period``): on the device of the rank
   with the most kernels, the kernel names in GPU start order repeat with a period of P kernels
   (the smallest P whose shifted sequence agrees with itself on at least MIN_MATCH of the
   positions, among the periods of names that occur once per period). A name that occurs once
   per period at every P-th kernel and whose every launch is known anchors the steps: step k is
   the host window from the launch of its k-th occurrence to the launch of the next one (the
   window views/25_step_window.sql stretches to the end of the GPU work launched in it), so
   kernels before the first anchor and after the last are in no step. Of the anchors, the one
   the GPU waits for longest before (median idle before it) is taken: iteration boundaries are
   where the GPU waits for the host or the input. Steps of the other ranks of the export are
   numbered by the anchor launch of the first rank nearest to theirs, so step k is the same
   repetition on every rank.

A period of the kernel sequence is a repetition of the work, which in a short window of a long
iteration can be a layer, not a training iteration: the note of the source says which kernel
anchors it and how many kernels a step holds, and the run summary says how the steps were found
(docs/usage.md, "Steps")."""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from ...kernelname import short_name
from .export import _STEP_SCHEMA, step_number

MIN_STEPS = 2  # complete steps a rule must find
MIN_COVER = 0.5  # share of the rank's kernel time the repeating ranges must hold
MIN_MATCH = 0.9  # share of positions where the kernel sequence equals itself shifted by P
MAX_DEPTH = 3  # NVTX nesting levels searched for a repeating range (a lone 'Loop' around 'Step N' ones)
ITERATION_NAME = re.compile(r"(?i)(iter|step|batch)")

_KERNELS_SQL = """
WITH launch AS (
  SELECT globalTid & ~16777215 AS gp, correlationId, min(start) AS launch_ns, min(globalTid) AS gt
  FROM runtime WHERE correlationId IS NOT NULL GROUP BY 1, 2
),
work AS (
  SELECT 'kernel' AS kind, globalPid, deviceId, start, "end", correlationId,
         coalesce(demangledName, shortName) AS name_id FROM kernel
  UNION ALL SELECT 'memcpy', globalPid, deviceId, start, "end", correlationId, NULL FROM memcpy
  UNION ALL SELECT 'memset', globalPid, deviceId, start, "end", correlationId, NULL FROM memset
)
SELECT m.rank, w.kind, w.deviceId AS device, w.start, w."end", w.name_id, l.launch_ns, l.gt
FROM work w JOIN rank_map m ON m.gp = coalesce(w.globalPid, getvariable('single_gp'))
LEFT JOIN launch l
  ON l.gp = coalesce(w.globalPid, getvariable('single_gp')) AND l.correlationId = w.correlationId
WHERE w.start IS NOT NULL AND w."end" IS NOT NULL
ORDER BY m.rank, w.start
"""

_RANGES_SQL = """
SELECT m.rank, n.globalTid AS gt, coalesce(n.text, s.value) AS name, n.start, n."end"
FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215 LEFT JOIN strings s ON s.id = n.textId
WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND n."end" IS NOT NULL
  AND n."end" >= n.start AND n.globalTid IS NOT NULL AND coalesce(n.text, s.value) IS NOT NULL
  AND n.start >= 0 AND n."end" < 4611686018427387904  -- ns since the session; past 2^62 is damage
"""


def detect(con, notes: list[str]) -> pl.DataFrame:
    """Steps found from a staged export's data (module doc), in the steps table's schema with
    host times on the export's clock plus base_ns; empty when neither rule finds MIN_STEPS
    steps. Appends one note per rule that found steps."""
    kernels = pl.from_arrow(con.sql(_KERNELS_SQL).to_arrow_table())
    if kernels.height == 0:
        return pl.DataFrame(schema=_STEP_SCHEMA)
    base = con.execute("SELECT getvariable('base_ns')").fetchall()[0][0] or 0
    found = _repeating_ranges(con, kernels, notes)
    if found.height == 0:
        found = _kernel_period(con, kernels.filter(pl.col("kind") == "kernel"), notes)
    if found.height == 0:
        return pl.DataFrame(schema=_STEP_SCHEMA)
    return (
        found.with_columns(
            start_ns=pl.col("start_ns") + base,
            end_ns=pl.col("end_ns") + base,
            dur_ns=pl.col("end_ns") - pl.col("start_ns"),
        )
        .select(list(_STEP_SCHEMA))
        .cast(_STEP_SCHEMA)
    )


def _repeating_ranges(con, kernels: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    ranges = pl.from_arrow(con.sql(_RANGES_SQL).to_arrow_table())
    if ranges.height == 0:
        return pl.DataFrame()
    # nesting levels, peeled from the outside: the top level of a thread's ranges is those that
    # start at or after the end of every range before them (sorted by start, the longer first at
    # equal starts, as NVTX push/pop nests); the next level is the top level of the rest
    rest = ranges.sort("gt", "start", "end", descending=[False, False, True]).with_row_index("rid")
    levels = []
    for depth in range(MAX_DEPTH):
        top = rest.with_columns(prev_end=pl.col("end").cum_max().shift(1).over("gt")).filter(
            pl.col("prev_end").is_null() | (pl.col("start") >= pl.col("prev_end"))
        )
        if top.height == 0:
            break
        levels.append(top.drop("prev_end").with_columns(depth=pl.lit(depth)))
        rest = rest.join(top.select("rid"), on="rid", how="anti")
    ranges = pl.concat(levels).with_columns(key=pl.col("name").str.replace_all(r"\d+", "#"))
    cands = ranges.group_by("rank", "gt", "depth", "key").agg(n=pl.len()).filter(pl.col("n") >= MIN_STEPS)
    if cands.height == 0:
        return pl.DataFrame()
    launched = (
        kernels.filter(pl.col("launch_ns").is_not_null())
        .with_columns(dur=pl.col("end") - pl.col("start"))
        .sort("launch_ns")
    )
    total = kernels.group_by("rank").agg(total=(pl.col("end") - pl.col("start")).sum(), n=pl.len())
    # the ranges of one thread and level do not overlap: one as-of join per (rank, thread, level)
    # gives every launch the range of that level around it, and so each candidate's share at once
    held = []
    for (rank, gt, depth), rs in ranges.group_by(["rank", "gt", "depth"]):
        win = rs.sort("start").select(r_start="start", r_end="end", key="key")
        ks = launched.filter(pl.col("rank") == rank)
        h = ks.join_asof(win, left_on="launch_ns", right_on="r_start", strategy="backward")
        held.append(
            h.filter(pl.col("launch_ns") < pl.col("r_end"))
            .group_by("key")
            .agg(held_n=pl.len(), held_ns=pl.col("dur").sum())
            .with_columns(rank=pl.lit(rank), gt=pl.lit(gt), depth=pl.lit(depth))
        )
    cover_of = {
        (r["rank"], r["gt"], r["depth"], r["key"]): (r["held_n"], r["held_ns"])
        for r in pl.concat(held, how="diagonal_relaxed").iter_rows(named=True)
    }
    best: dict[int, tuple] = {}
    for c in cands.iter_rows(named=True):
        held_n, held_ns = cover_of.get((c["rank"], c["gt"], c["depth"], c["key"]), (0, 0))
        tot = total.filter(pl.col("rank") == c["rank"])
        cover = held_ns / tot["total"].sum() if tot["total"].sum() else 0.0
        if cover < MIN_COVER or held_n < MIN_COVER * tot["n"].sum():
            continue
        rs = ranges.filter(
            (pl.col("gt") == c["gt"]) & (pl.col("depth") == c["depth"]) & (pl.col("key") == c["key"])
        ).sort("start")
        score = (bool(ITERATION_NAME.search(c["key"])), cover, -c["depth"])
        if c["rank"] not in best or score > best[c["rank"]][0]:
            best[c["rank"]] = (score, c, rs)
    rows = []
    for rank, (score, c, rs) in sorted(best.items()):
        nums = [step_number(n) for n in rs["name"]]
        numbered = None not in nums and len(set(nums)) == len(nums)
        for i, r in enumerate(rs.iter_rows(named=True)):
            rows.append(
                {
                    "rank": rank,
                    "step": nums[i] if numbered else i,
                    "name": r["name"],
                    "start_ns": r["start"],
                    "end_ns": r["end"],
                    "source": "nvtx_repeat",
                    "pid": (c["gt"] >> 24) & 16777215,
                    "tid": c["gt"] & 16777215,
                }
            )
        notes.append(
            f"steps of rank {rank}: {rs.height} repeating NVTX ranges {c['key']!r} "
            + ("at the top level" if c["depth"] == 0 else f"{c['depth']} level(s) inside the top one")
            + f" (holding {100 * score[1]:.0f} % of its GPU time; no ProfilerStep range)"
        )
    return pl.DataFrame(rows) if rows else pl.DataFrame()


def _gaps(codes: np.ndarray) -> pl.DataFrame:
    """(code, pos, gap): each position of a code and its distance to the code's previous position
    (null at its first), sorted by code then position; vectorized (one argsort)."""
    order = np.argsort(codes, kind="stable")
    sc = codes[order]
    gap = np.diff(order, prepend=0).astype(np.int64)
    first = np.ones(len(sc), dtype=bool)
    first[1:] = sc[1:] != sc[:-1]
    return pl.DataFrame({"code": sc, "pos": order, "gap": gap}).with_columns(
        gap=pl.when(pl.Series(first)).then(None).otherwise(pl.col("gap"))
    )


def period(codes: np.ndarray) -> tuple[int, float] | None:
    """(P, agreement) for a sequence of integer codes: the smallest period P >= 2 of a code that
    occurs at every P-th position (its most common gap, on at least 80 % of its gaps, and at
    least MIN_STEPS + 1 times) whose shifted sequence agrees with itself on at least MIN_MATCH
    of the positions, taking the best agreement found less 0.01 as the bar (a multiple of the
    period agrees as well as the period); None when no period holds."""
    n = len(codes)
    if n < 2 * (MIN_STEPS + 1):
        return None
    gaps = _gaps(codes)  # one row per consecutive pair of positions of one code
    per_gap = gaps.group_by("code", "gap").agg(k=pl.len())
    per_code = (
        per_gap.sort("k", "gap", descending=[True, False])
        .group_by("code")
        .agg(gap=pl.col("gap").first(), k=pl.col("k").first(), total=pl.col("k").sum())
        .filter(
            (pl.col("total") >= MIN_STEPS)
            & (pl.col("gap") >= 2)
            & (pl.col("k") >= 0.8 * pl.col("total"))
            & (n // pl.col("gap") >= MIN_STEPS + 1)
        )
    )
    periods = sorted(set(per_code["gap"].to_list()))
    scored = [(p, float(np.mean(codes[:-p] == codes[p:]))) for p in periods[:500]]
    scored = [s for s in scored if s[1] >= MIN_MATCH]
    if not scored:
        return None
    bar = max(s[1] for s in scored) - 0.01
    return next(s for s in scored if s[1] >= bar)


def _kernel_period(con, kernels: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    per_rank = []
    for (rank,), k in kernels.group_by(["rank"], maintain_order=True):
        dev = k.group_by("device").len().sort("len", "device", descending=[True, False])["device"][0]
        k = k.filter(pl.col("device") == dev).sort("start")
        codes = k["name_id"].fill_null(-1).to_numpy()
        found = period(codes)
        if found is None:
            continue
        p, match = found
        start, end = k["start"].to_numpy(), k["end"].to_numpy()
        idle_before = np.zeros(len(k))
        idle_before[1:] = np.maximum(start[1:] - np.maximum.accumulate(end)[:-1], 0)
        launch = k["launch_ns"]
        # anchors: codes found at every P-th position and nowhere else, every launch known; the one
        # the GPU idles longest before (median)
        g = _gaps(codes)
        at_pos = g["pos"].to_numpy()
        g = g.with_columns(idle=idle_before[at_pos], no_launch=launch.is_null().to_numpy()[at_pos])
        anchors = (
            g.group_by("code")
            .agg(
                n=pl.len(),
                steady=(pl.col("gap").drop_nulls() == p).all(),
                missing=pl.col("no_launch").any(),
                idle=pl.col("idle").median(),
            )
            .filter((pl.col("n") >= MIN_STEPS + 1) & pl.col("steady") & ~pl.col("missing"))
            .sort("idle", "code", descending=[True, False])
        )
        if anchors.height == 0:
            continue
        code = anchors["code"][0]
        pos = np.flatnonzero(codes == code)
        at = launch.gather(pos).to_numpy()
        gt = k["gt"].gather(pos).to_list()
        per_rank.append((rank, p, match, code, at, gt))
    if not per_rank:
        return pl.DataFrame()
    ref = max(per_rank, key=lambda r: (len(r[4]), -r[0]))[4]
    rows = []
    for rank, p, match, code, at, gt in per_rank:
        offset = int(np.abs(ref - at[0]).argmin()) if len(ref) else 0
        for i in range(len(at) - 1):
            rows.append(
                {
                    "rank": rank,
                    "step": offset + i,
                    "name": f"kernel period #{offset + i}",
                    "start_ns": int(at[i]),
                    "end_ns": int(at[i + 1]),
                    "source": "kernel_period",
                    "pid": (gt[i] >> 24) & 16777215 if gt[i] is not None else None,
                    "tid": gt[i] & 16777215 if gt[i] is not None else None,
                }
            )
        named = con.execute("SELECT any_value(value) FROM strings WHERE id = ?", [int(code)]).fetchall()[0]
        anchor = short_name(named[0]) if named and named[0] else f"kernel name id {code}"
        notes.append(
            f"steps of rank {rank}: {len(at) - 1} repetitions of its kernel sequence ({p} kernels each, "
            f"{100 * match:.0f} % of the sequence repeats; each starts at the launch of "
            f"{anchor!r}); no ProfilerStep or "
            "repeating NVTX range, so a step may be a layer rather than a training iteration"
        )
    return pl.DataFrame(rows)
