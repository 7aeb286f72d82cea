"""`tracelake timeline`: one run's window as a trace file the Perfetto UI and chrome://tracing
open: the Chrome JSON trace format (`.json` or `.json.gz`; pipeline/timeline/chrome.py) or
Perfetto's protobuf format (`.pftrace`; pipeline/timeline/pftrace.py).

What it holds (docs/usage.md, "Timeline"): one process per rank with a track per CPU thread
and per GPU stream (kernels, copies, memsets, syncs, host ops, annotations: every row of the
lake in the window, pipeline/timeline/rows.py), a per-rank "idle" track of the GPU's idle gaps
by cause, flows between the kernels of each matched collective (from the last rank to arrive),
the run's findings as labelled ranges on a "findings" track, and each step's critical path
across ranks on a per-rank "critical path" track with flows where it changes rank
(pipeline/timeline/critical.py). Slices that overlap without
nesting on one track go to extra tracks (pipeline/timeline/layout.py). Which steps and ranks:
pipeline/timeline/window.py. Times are the lake's int64 ns on its absolute clock.

"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__, query
from ..lake import Lake
from . import chrome, critical, rows
from .layout import Slice, assign_lanes
from .window import DEFAULT_WINDOW, Window, WindowError, parse_ranges, ranges_text, resolve

__all__ = [
    "DEFAULT_WINDOW",
    "MAX_EVENTS",
    "SUFFIXES",
    "Timeline",
    "TimelineError",
    "build",
    "write",
    "parse_ranges",
]

# the default size limit, in slices: about 100 MB of JSON, what the Perfetto UI loads in seconds
# (chrome://tracing slows down past a few hundred thousand events)
MAX_EVENTS = 500_000
SUFFIXES = (".json", ".json.gz", ".pftrace")


class TimelineError(ValueError):
    """A selection that cannot be written (one line: the CLI's usage error)."""


@dataclass
class Timeline:
    """A placed timeline: processes (pid, name, sort index), slices with their lanes, the tid of
    each (pid, track, lane) and its name, flows (source slice, target slice, ts, ts, name)."""

    run_id: str
    window: Window
    world_size: int | None
    processes: list[tuple[int, str, int]] = field(default_factory=list)
    slices: list[Slice] = field(default_factory=list)
    tids: dict[tuple, int] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    flows: list[tuple] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return self.window.ranks

    def tid_of(self, s: Slice) -> int:
        return self.tids[(s.pid, s.track, s.lane)]

    @property
    def other_data(self) -> dict:
        w = self.window
        return {
            "producer": f"tracelake {__version__} timeline",
            "run_id": self.run_id,
            "window": w.how,
            "steps": list(w.steps) if w.steps else None,
            "ranks": w.ranks,
            "start_ns": w.start_ns,
            "end_ns": w.end_ns,
            "time_unit": "ts and dur in µs with 3 decimals: the lake's ns, absolute clock",
        }


def _track_name(track: tuple) -> str:
    if track[0] == "cpu":
        return f"thread {track[1]}"
    if track[0] == "gpu":
        return f"stream {track[2]} · GPU {track[1]}"
    return {
        "idle": "idle (GPU gaps by cause)",
        "findings": "findings",
        "critical": "critical path (each step's, across ranks)",
    }[track[0]]


def _track_order(track: tuple) -> tuple:
    kind = {"findings": 0, "critical": 1, "cpu": 2, "gpu": 3, "idle": 4}[track[0]]
    return (kind, *(-1 if x is None else x for x in track[1:]))


def finding_id(f: dict) -> str:
    return (f.get("timeline") or {}).get("id") or f["kind"]


def _findings(con, w: Window, doc: dict, lo_ns: int, hi_ns: int) -> list[Slice]:
    """The run's findings as slices on the findings track: each over its own steps (the time
    they span on the timeline's ranks) within the window, or over the whole window when it
    names none."""
    out = []
    for f in doc.get("findings", []):
        if f.get("run_id") != w.run_id:
            continue
        tl = f.get("timeline") or {}
        a, b = lo_ns, hi_ns
        if tl.get("steps"):
            a2, b2 = con.execute(
                "SELECT min(step_start_ns), max(step_end_ns) FROM step_window WHERE run_id = $r "
                "AND list_contains($ranks, rank) AND step BETWEEN $lo AND $hi",
                {"r": w.run_id, "ranks": w.ranks, "lo": tl["steps"][0], "hi": tl["steps"][1]},
            ).fetchone()
            if a2 is None:
                continue
            a, b = max(a, a2), min(b, b2)
        if a >= b:
            continue
        args = {
            "id": finding_id(f),
            "kind": f["kind"],
            "recoverable_ns": f.get("recoverable_ns"),
            "evidence": f.get("evidence"),
            "recommendation": f.get("recommendation"),
            "command": tl.get("command"),
        }
        out.append(Slice(chrome.FINDINGS_PID, ("findings",), f["title"], "finding", a, b, args))
    return out


def build(
    lake: Lake,
    run_id: str,
    ranks: str | None = None,
    steps: str | None = None,
    around: str | None = None,
    all_steps: bool = False,
    max_events: int = MAX_EVENTS,
    doc: dict | None = None,
) -> Timeline:
    """The timeline of run_id: ranks / steps as `--ranks` / `--steps` text (None: the defaults,
    window.py), around: a finding id (its `timeline.id`, else its kind), all_steps: the whole
    run; doc: the run's analysis (pipeline.analyze; computed when None) for the findings.
    Raises TimelineError when the selection cannot be given or holds more than max_events."""
    con = query.connect(lake, runs=[run_id], metric_views=())

    def analysis() -> dict:
        from ..analyze import analyze

        return doc if doc is not None else analyze(lake, runs=[run_id])

    finding = None
    if around is not None:
        doc = analysis()
        fs = [f for f in doc.get("findings", []) if f.get("run_id") == run_id]
        finding = next((f for f in fs if around in (finding_id(f), f["kind"])), None)
        if finding is None:
            known = ", ".join(finding_id(f) for f in fs) or "none"
            raise TimelineError(f"--around {around}: no such finding in run {run_id} (findings: {known})")
    try:
        w = resolve(con, run_id, ranks, steps, all_steps, finding)
    except WindowError as e:
        raise TimelineError(str(e)) from None
    n = rows.count(con, w)
    if n > max_events:
        raise TimelineError(
            f"the selection ({w.how}; ranks {ranges_text(w.ranks)}) holds {n:,} events, over the "
            f"limit of {max_events:,}: narrow it with --steps / --ranks, or raise --max-events"
        )
    world = con.execute("SELECT max(world_size) FROM sources WHERE run_id = $r", {"r": run_id}).fetchone()[0]
    tl = Timeline(run_id, w, world)
    tl.slices = rows.slices(con, w)
    lo = w.start_ns if w.start_ns is not None else min((s.start_ns for s in tl.slices), default=0)
    hi = w.end_ns if w.end_ns is not None else max((s.end_ns for s in tl.slices), default=0)
    tl.slices += _findings(con, w, analysis(), lo, hi)
    path, path_flows = critical.slices_and_flows(con, w)
    tl.slices += path
    names = rows.processes(con, w)
    tl.processes = [(chrome.FINDINGS_PID, f"run {run_id} · findings", -1)] + [
        (r, names[r], r) for r in w.ranks
    ]
    _place(tl)
    tl.flows = rows.flows(con, w, {s.key: s for s in tl.slices if s.key is not None}) + path_flows
    return tl


def _place(tl: Timeline) -> None:
    """Lanes per track (the overlap rule), then tids numbered per process in track order."""
    by_track: dict[tuple, list[Slice]] = {}
    for s in tl.slices:
        by_track.setdefault((s.pid, s.track), []).append(s)
    lanes = {k: assign_lanes(v) for k, v in by_track.items()}
    next_tid: dict[int, int] = {}
    for pid, track in sorted(lanes, key=lambda k: (k[0], _track_order(k[1]))):
        for lane in range(lanes[(pid, track)]):
            tid = next_tid[pid] = next_tid.get(pid, 0) + 1
            tl.tids[(pid, track, lane)] = tid
            name = _track_name(track)
            tl.thread_names[(pid, tid)] = name + (f" (overlap {lane})" if lane else "")


def check_output(path: Path) -> None:
    """Raises TimelineError unless path names a format this writes (.json, .json.gz, .pftrace) in
    a directory that exists, and is not itself a directory (checked before any work)."""
    if path.is_dir():
        raise TimelineError(f"-o {path}: is a directory")
    if not path.absolute().parent.is_dir():
        raise TimelineError(f"-o {path}: directory {path.absolute().parent} does not exist")
    if not path.name.lower().endswith(SUFFIXES):
        raise TimelineError(
            f"-o {path}: name it .json or .json.gz (Chrome JSON), or .pftrace (Perfetto's protobuf format)"
        )


def write(tl: Timeline, path: Path) -> int:
    """Write the timeline to path (.json, .json.gz or .pftrace); returns the bytes written. Raises
    TimelineError for a .pftrace of an event before the clock's zero (Perfetto's timestamps are
    unsigned: uint64 ns), which the Chrome JSON holds."""
    check_output(path)
    if path.name.lower().endswith(".pftrace"):
        from . import pftrace

        first = min((s.start_ns for s in tl.slices), default=0)
        if first < 0:
            raise TimelineError(
                f"-o {path}: an event starts before the clock's zero ({first} ns) and a .pftrace "
                "timestamp cannot be negative: name it .json or .json.gz (Chrome JSON)"
            )
        return pftrace.write(tl, path)
    return chrome.write(tl, path)
