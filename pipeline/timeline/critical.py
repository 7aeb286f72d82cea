"""Each step's critical path across ranks on the timeline (docs/whatif.md): a "critical path"
track per rank with the path's segments on that rank (named by kind: compute, host, transfer,
...), and a flow wherever the path passes from one rank to another (at a collective, to the rank
that arrived last), as HTA's overlaid critical-path trace marks its path with flows."""

from __future__ import annotations

from .layout import Slice
from .window import Window

TRACK = ("critical",)
CAT = "critical_path"


def slices_and_flows(con, w: Window) -> tuple[list[Slice], list[tuple]]:
    """The path's segments in the window on the window's ranks, and the rank-to-rank flows
    between consecutive segments of a step's path (source segment, target segment, source ts,
    target ts, name). Nothing for a run that cannot be replayed (no GPU work, no steps)."""
    from ..whatif import critical_path

    try:
        p = critical_path(con, w.run_id)
    except ValueError:
        return [], []
    if p.height == 0:
        return [], []
    lo = w.start_ns if w.start_ns is not None else -(2**62)
    hi = w.end_ns if w.end_ns is not None else 2**62
    ranks = set(w.ranks)
    out: list[Slice] = []
    flows: list[tuple] = []
    prev: Slice | None = None
    prev_step = None
    for r in p.sort("step", "seq").iter_rows(named=True):
        a, b = r["start_ns"], r["end_ns"]
        if b <= lo or a >= hi or r["rank"] not in ranks:
            prev = None
            continue
        args = {"step": r["step"], "end_rank": r["end_rank"], "dur_ns": r["dur_ns"]}
        if r["name"]:
            args["node"] = r["name"]
        s = Slice(r["rank"], TRACK, r["kind"], CAT, a, b, args)
        out.append(s)
        if prev is not None and prev_step == r["step"] and prev.pid != s.pid:
            flows.append(
                (prev, s, prev.end_ns, s.start_ns, f"critical path: rank {prev.pid} -> rank {s.pid}")
            )
        prev, prev_step = s, r["step"]
    return out, flows
