"""The lake's commit journal (pipeline/lake.py, module doc "Crash safety"): carrying out a
decided commit (apply), undoing one that cannot be carried out (undo), and what recover() does
with a staging directory a killed ingest left holding a journal (recover). Every step is
idempotent, so a kill at any moment is finished or undone by running the same function again.

A staging directory <lake>/.tmp/<id>/ being committed holds: COMMIT (the journal: run id, source
id, the tables with a new part), the new parts <table>.parquet and sources.parquet until each is
renamed into the lake, old/<table>.parquet for the parts of the earlier version of the same
source moved out of the lake, and UNDO once the commit is being undone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from . import schema as sch

# ------------------------------------------------------------------ test hook
# TRACELAKE_CRASH_AT="<point>:<n>" sends SIGKILL to this process the n-th time it passes <point>
# (journal: a COMMIT journal was written; rename: a part was renamed into the lake; commit: a
# source was committed; undo: a part of a source's earlier version was put back by undo();
# forget: a source's `sources` row was removed by forget()). Used by tests/test_crash_safety.py
# and tests/test_lake_replace.py to kill a real ingest at exact moments.
_crash_counts: dict[str, int] = {}


def crash_point(point: str) -> None:
    spec = os.environ.get("TRACELAKE_CRASH_AT")
    if not spec:
        return
    want, _, n = spec.partition(":")
    if want != point:
        return
    _crash_counts[point] = _crash_counts.get(point, 0) + 1
    if _crash_counts[point] == int(n or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def read(d: Path) -> tuple[str, str, set[str]]:
    """(run id, source id, tables with a new part) of the COMMIT journal in staging directory d."""
    j = json.loads((d / "COMMIT").read_text())
    return j["run_id"], j["source_id"], set(j["tables"])


def apply(lake, d: Path) -> None:
    """Carry out the commit in staging directory d: the earlier version of the source moves out
    of the lake into d/old/, its sources row first (readers stop seeing it at once), then the new
    parts go in and the new sources row last; d is removed. A table whose new part is in place
    already (a replay) is left as it is. OSError naming the lake file that could not be moved or
    replaced (the caller undoes the commit)."""
    run_id, source_id, new = read(d)
    src_staged = d / "sources.parquet"
    if src_staged.exists():  # else the last step (the sources row) was done already
        for t in ["sources", *(t for t in sch.tables() if t != "sources")]:
            if t != "sources" and t in new and not (d / f"{t}.parquet").exists():
                continue
            part = lake.part_path(t, run_id, source_id)
            if part.exists():
                (d / "old").mkdir(exist_ok=True)
                _move(part, d / "old" / f"{t}.parquet", part)
        for t in sorted(new):
            f = d / f"{t}.parquet"
            if f.exists():
                dest = lake.part_path(t, run_id, source_id)
                _mkdir(dest.parent)
                _move(f, dest, dest)
                crash_point("rename")
        dest = lake.part_path("sources", run_id, source_id)
        _mkdir(dest.parent)
        _move(src_staged, dest, dest)
        crash_point("rename")
    shutil.rmtree(d, ignore_errors=True)


def undo(lake, d: Path) -> None:
    """Undo the commit in staging directory d: mark it (UNDO), take the new parts in place back
    into d, put the earlier version's parts and then its sources row back where they were, and
    remove d; the lake is then as it was before the commit. OSError when a step fails (d stays,
    for recover())."""
    run_id, source_id, new = read(d)
    if not (d / "UNDO").exists():
        (d / "UNDO.part").write_text("")
        os.replace(d / "UNDO.part", d / "UNDO")
    for t in sorted(new):
        if not (d / f"{t}.parquet").exists():
            part = lake.part_path(t, run_id, source_id)
            if part.exists():
                _move(part, d / f"{t}.parquet", part)
    for t in [t for t in sch.tables() if t != "sources"] + ["sources"]:
        f = d / "old" / f"{t}.parquet"
        if f.exists():
            part = lake.part_path(t, run_id, source_id)
            _move(f, part, part)
            crash_point("undo")
    (d / "COMMIT").unlink(missing_ok=True)  # from here on d is an uncommitted staging directory
    shutil.rmtree(d, ignore_errors=True)


def recover(lake, d: Path) -> str:
    """What recover() does with staging directory d holding a COMMIT journal: undo it when it was
    being undone, else finish it, or undo it when it cannot be finished (a part that cannot be
    replaced); a damaged journal is removed; when neither step can be done, d is left for the
    next recover() (its old/ may hold the only copy of a source's earlier version). The line that
    says what was done."""
    try:
        if (d / "UNDO").exists():
            undo(lake, d)
            return f"undid a commit that could not be finished ({d.name})"
        try:
            apply(lake, d)
            return f"finished an interrupted commit ({d.name})"
        except OSError:
            undo(lake, d)
            return f"undid an interrupted commit that cannot be finished ({d.name})"
    except (ValueError, KeyError):
        shutil.rmtree(d, ignore_errors=True)
        return f"removed a damaged commit journal ({d.name})"
    except OSError as e:
        return f"could not finish or undo an interrupted commit ({d.name}: {e.filename}: {e.strerror}); left"


def _move(src: Path, dst: Path, name: Path) -> None:
    """os.replace(src, dst); its OSError names `name` (the lake file concerned)."""
    try:
        os.replace(src, dst)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(name)) from None


def _mkdir(d: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(d)) from None
