"""What-if: a run's dependency graph across ranks, its critical path, and replays with changes.

Rooms: graph.py (the graph from the lake, queries/replay/*.sql; its host and GPU rows made by
rows.py), replay.py (re-timing it),
steps.py (step windows of a replay), critical.py (each step's critical path), changes.py (the
changes a what-if applies). `whatif()` is the face: the measured baseline, the identity replay's
error and, per change, the predicted step time with the new critical path's top segments
(docs/whatif.md, `tracelake.whatif/1`).

The package imports its rooms on first use of a name (PEP 562 __getattr__): reading KINDS (the
report's chart) imports neither polars nor DuckDB. `pipeline.whatif.replay` is the module;
its function is `pipeline.whatif.replay.replay`.
"""

from __future__ import annotations

import importlib

# name -> the room that defines it
_WHERE = {
    "CONTRACT": "face",
    "TOP_SEGMENTS": "face",
    "Replayed": "face",
    "critical_path": "face",
    "register": "face",
    "run_replay": "face",
    "summary": "face",
    "whatif": "face",
    "KINDS": "kinds",
    "Change": "changes",
    "Graph": "graph",
    "build": "graph",
    "Durations": "replay",
    "Timing": "replay",
    "measured": "replay",
    "paths": "critical",
}


def __getattr__(name: str):
    if name in ("changes", "graph", "rows", "replay", "critical", "steps", "analysis", "face", "kinds"):
        return importlib.import_module(f"{__name__}.{name}")
    room = _WHERE.get(name)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{room}"), name)


__all__ = sorted(_WHERE) + ["changes"]
