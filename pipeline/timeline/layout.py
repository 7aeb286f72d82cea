"""Tracks of a timeline and the overlap rule: the slices of one track (a CPU thread, a GPU stream,
a rank's idle track, the run's findings) placed on lanes so that on each lane any two slices are
either disjoint or nested, as the Chrome JSON trace format and the Perfetto UI require of complete
("X") events on one thread (a slice that overlaps another without nesting is dropped or
mis-drawn by viewers).

Rule: slices are taken by start, longest first (a parent before its children), and each goes on
the first lane where it nests inside the innermost slice still open there (or where nothing is
open); else on a new lane. Lane 0 is the track itself; lane i > 0 is an extra track named
"<track> (overlap i)". No slice is ever left out. Times are int64 ns on the lake's absolute clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Slice:
    """One complete event: [start_ns, end_ns) on `track` of process `pid` (ns, absolute clock).
    key: an identity other parts refer to (flows bind to the slice of a collective's kernel)."""

    pid: int
    track: tuple
    name: str
    cat: str
    start_ns: int
    end_ns: int
    args: dict = field(default_factory=dict)
    cname: str | None = None
    key: tuple | None = None
    lane: int = 0


def assign_lanes(slices: list[Slice]) -> int:
    """Set each slice's lane (all slices of one track); returns the number of lanes used."""
    order = sorted(range(len(slices)), key=lambda i: (slices[i].start_ns, -slices[i].end_ns, i))
    stacks: list[list[int]] = []  # per lane: the end_ns of the slices still open, innermost last
    for i in order:
        s = slices[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s.start_ns:
                stack.pop()
            if not stack or s.end_ns <= stack[-1]:
                stack.append(s.end_ns)
                s.lane = lane
                break
        else:
            stacks.append([s.end_ns])
            s.lane = len(stacks) - 1
    return len(stacks)


def proper(slices: list[Slice]) -> bool:
    """Whether the slices (of one lane) are pairwise disjoint or nested: the check tests apply."""
    ordered = sorted(slices, key=lambda s: (s.start_ns, -s.end_ns))
    open_ends: list[int] = []
    for s in ordered:
        while open_ends and open_ends[-1] <= s.start_ns:
            open_ends.pop()
        if open_ends and s.end_ns > open_ends[-1]:
            return False
        open_ends.append(s.end_ns)
    return True
