"""Which part of a run a timeline shows: its ranks, its steps and the time window they span.

- Ranks: `--ranks 0-3,6` (default: every rank of the run with GPU work, host ops or steps).
- Steps: `--steps 10-12` or `--steps 11` (one step or one range: a window is one span of time,
  so a list such as `1,552` is refused rather than shown as everything between); default
  DEFAULT_WINDOW: the worst step (the longest step time of any rank of the selection,
  views/25_step_window.sql step_ns; the lower step number on a tie) with the step before and
  after it when the run has them. A run without steps is shown whole (as `--all` does).
- Time: [first step_start_ns, last step_end_ns) of the selected steps over the selected ranks
  (step_window: the wall-clock windows that cover each rank's time), in ns on the lake's absolute
  clock. An event belongs to the window when it overlaps it: start < window end and (end >
  window start, or a zero-length event at or after window start); `all_steps` drops the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_WINDOW = "the worst step ± 1"


class WindowError(ValueError):
    """A selection the run cannot give (one line, for a usage error)."""


@dataclass
class Window:
    run_id: str
    ranks: list[int]
    steps: tuple[int, int] | None  # None: no step bound (whole run)
    start_ns: int | None  # None: unbounded
    end_ns: int | None
    how: str  # how the window was chosen, for the trace's otherData and messages


def ranges_text(values: list[int]) -> str:
    """Sorted integers as the --ranks syntax writes them: [0, 1, 2, 3, 5] -> '0-3, 5'."""
    out: list[str] = []
    for v in sorted(set(values)):
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


MAX_RANK = 2**31 - 1  # the lake's rank column is INTEGER
MAX_SPAN = 1_000_000  # values one range of --ranks may name


def parse_ranges(text: str, what: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]. Raises WindowError for anything else: not N, N-M or a list of
    them, a value past MAX_RANK (one the lake cannot hold), a range that decreases or names more
    than MAX_SPAN values."""
    out: set[int] = set()
    one = what[:-1] if what.endswith("s") else what
    for part in text.replace(" ", "").split(","):
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise WindowError(
                f"--{what} {text!r}: expected N, N-M or a comma-separated list of them"
            ) from None
        if max(a, b) > MAX_RANK:
            raise WindowError(
                f"--{what} {text!r}: {one} {max(a, b)} is out of range (a {one} is 0 to {MAX_RANK})"
            )
        if b < a:
            raise WindowError(f"--{what} {text!r}: {part} is not an increasing range")
        if b - a >= MAX_SPAN:
            raise WindowError(
                f"--{what} {text!r}: {part} names {b - a + 1} {what}, more than {MAX_SPAN:,} in one range"
            )
        out.update(range(a, b + 1))
    return sorted(out)


def parse_span(text: str) -> tuple[int, int]:
    """--steps: '11' -> (11, 11), '10-12' -> (10, 12). A timeline shows one span of time, so a list
    ('1,552') is refused rather than read as everything between. Raises WindowError."""
    if "," in text:
        raise WindowError(
            f"--steps {text}: give one step N or one range N-M (a timeline shows one span of "
            "time; write one file per range)"
        )
    lo, sep, hi = text.replace(" ", "").partition("-")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise WindowError(f"--steps {text!r}: expected N or N-M") from None
    if b < a:
        raise WindowError(f"--steps {text!r}: {text} is not an increasing range")
    return a, b


def _span(xs: list[int]) -> str:
    return f"{min(xs)}-{max(xs)}" if xs else "none"


def overlap_sql(start: str = "start_ns", end: str = "end_ns") -> str:
    """The window test for an event [start, end) against parameters $t0, $t1 (ns)."""
    return f"({start} < $t1 AND ({end} > $t0 OR {start} >= $t0))"


def resolve(
    con,
    run_id: str,
    ranks: str | None = None,
    steps: str | None = None,
    all_steps: bool = False,
    finding: dict | None = None,
) -> Window:
    """The window of run_id on connection con (pipeline.query.connect) for the options given;
    finding: the analysis finding of --around, whose `timeline` field gives steps and ranks
    unless --steps / --ranks say otherwise. Raises WindowError."""
    known = [
        r
        for (r,) in con.execute(
            "SELECT DISTINCT rank FROM (SELECT rank FROM gpu_activities WHERE run_id = $r UNION ALL "
            "SELECT rank FROM cpu_ops WHERE run_id = $r UNION ALL SELECT rank FROM steps WHERE run_id = $r) "
            "WHERE rank IS NOT NULL ORDER BY rank",
            {"r": run_id},
        ).fetchall()
    ]
    if not known:
        raise WindowError(f"run {run_id} has no GPU work, host ops or steps to show")
    around = (finding or {}).get("timeline") or {}
    if ranks is not None:
        chosen = parse_ranges(ranks, "ranks")
        missing = sorted(set(chosen) - set(known))
        if missing:
            raise WindowError(
                f"--ranks {ranks}: rank(s) {ranges_text(missing)} not in run {run_id} (ranks "
                f"{ranges_text(known)})"
            )
    elif around.get("ranks"):
        chosen = [r for r in around["ranks"] if r in known] or known
    else:
        chosen = known
    have = [
        s
        for (s,) in con.execute(
            "SELECT DISTINCT step FROM step_window WHERE run_id = $r AND list_contains($ranks, rank) "
            "ORDER BY step",
            {"r": run_id, "ranks": chosen},
        ).fetchall()
    ]
    if all_steps or not have:
        if steps is not None and not have:
            raise WindowError(
                f"--steps {steps}: run {run_id} has no steps (its whole trace is shown without --steps)"
            )
        how = "--all: the whole run" if all_steps else "the whole run (it has no steps)"
        return Window(run_id, chosen, None, None, None, how)
    if steps is not None:
        lo, hi = parse_span(steps)
        if not any(lo <= s <= hi for s in have):
            raise WindowError(f"--steps {steps}: no such step in run {run_id} (steps {_span(have)})")
        how = f"--steps {lo}-{hi}"
    elif around.get("steps"):
        lo, hi = around["steps"]
        how = f"--around {around.get('id')}: steps {lo}-{hi}"
    else:
        worst = con.execute(
            "SELECT step FROM step_window WHERE run_id = $r AND list_contains($ranks, rank) "
            "GROUP BY step ORDER BY max(step_ns) DESC, step LIMIT 1",
            {"r": run_id, "ranks": chosen},
        ).fetchone()[0]
        i = have.index(worst)
        lo, hi = have[max(i - 1, 0)], have[min(i + 1, len(have) - 1)]
        how = f"default: the worst step {worst} ± 1 (steps {lo}-{hi})"
    t0, t1 = con.execute(
        "SELECT min(step_start_ns), max(step_end_ns) FROM step_window WHERE run_id = $r "
        "AND list_contains($ranks, rank) AND step BETWEEN $lo AND $hi",
        {"r": run_id, "ranks": chosen, "lo": lo, "hi": hi},
    ).fetchone()
    if t0 is None:
        raise WindowError(f"steps {lo}-{hi} of run {run_id}: no step of rank(s) {_span(chosen)} in them")
    return Window(run_id, chosen, (lo, hi), int(t0), int(t1), how)


def params(w: Window) -> dict:
    """The query parameters of the window: $r run, $ranks, $t0 / $t1 (ns; the int64 range when
    unbounded)."""
    return {
        "r": w.run_id,
        "ranks": w.ranks,
        "t0": w.start_ns if w.start_ns is not None else -(2**63),
        "t1": w.end_ns if w.end_ns is not None else 2**63 - 1,
    }
