"""Committing: put a worker's outcome (pipeline/ingest/prepare.py Prepared) into the lake, in
input order, in the ingesting process, under the lake's lock: skip content already there (rule 3
of pipeline/ingest/runs.py), claim the file's ranks and time window (rule 2), move its staged
parts to the run it lands in, and write its `sources` row (pipeline/lake.py Lake.commit). A row
that breaks the schema is stored as a failed source instead; nothing already in the lake changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import schema as sch
from ..lake import Lake, LakeError, one_line
from . import hold
from .prepare import Prepared, content_sha256, failed
from .runs import Done, Runs, dir_name, done_entry, held_elsewhere, run_for, skip_note


@dataclass
class FileResult:
    """What ingest says about one file, archive member or problem path."""

    path: str
    run_id: str | None
    rank: int | None
    status: str  # ok | partial | failed | skipped
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    source_id: str | None = None
    uncompressed_bytes: int = 0
    unreadable_bytes: int = 0
    # skipped: the run holding its content when that content was ingested under another run name
    # (another directory or --run), so the run this file names does not hold it; else None
    held_in: str | None = None
    # this result replaces the one reported for the same file before (a held source that its run's
    # batch could not write, pipeline/ingest/hold.py: reported ok when it joined the batch, failed
    # at the end); a caller counting results counts the earlier one no more
    again: bool = False


def commit(
    p: Prepared,
    lake: Lake,
    done: Done,
    runs: Runs,
    force: bool,
    by_time: bool = True,
    place: str | None = None,
    place_notes: list[str] | None = None,
    pending: hold.Pending | None = None,
    key: object = None,
) -> FileResult:
    """Put a worker's outcome into the lake (in input order, in this process). by_time: False when
    --run named the run (Runs.claim); content is then looked up in that run only (_is_done).
    place: the run Runs.place chose for an NCCL-family file not yet in the lake (rule 4), with
    place_notes saying why when it is not its named run. A source held in memory (hold.py) goes
    to `pending` (key: the caller's handle of its result, given back by pending.flush() when it
    cannot be written), unless the lake holds a version of it already or there is no pending:
    then it is staged as parts and committed here. A --force re-ingest that cannot replace
    the stored version (Lake.commit's OSError: a part that cannot be replaced) is reported failed,
    with one line naming the lake file, and leaves the stored version and its `sources` row as they
    were (no failed row). Raises OSError when a new source cannot be written (ingest_paths stores
    it as failed), LakeError when the lake cannot be written at all."""
    if p.status == "skipped":
        return FileResult(p.path, p.run_id, None, "skipped", None, p.notes, p.source_id, held_in=p.held_in)
    if p.oserror and not lake.writable():
        if p.staged is not None:
            lake.discard(p.staged)
        raise LakeError(f"{lake.root}: cannot write to the lake")
    if p.status == "failed":
        if p.staged is not None:
            lake.discard(p.staged)
        lake.commit(lake.stage(p.run_id, p.source_id, {}), {**p.row, "named_run_id": p.run_id})
        return FileResult(p.path, p.run_id, None, "failed", p.error, [], p.source_id, p.uncompressed_bytes)
    stored = done_entry(done, p.sha, p.run_id, by_time)
    if stored is not None and (
        not force or stored[1]
    ):  # the same content earlier in this batch (even with --force)
        lake.discard(p.staged)
        return FileResult(
            p.path,
            stored[0],
            None,
            "skipped",
            None,
            [skip_note(done, p.sha, p.run_id, by_time)],
            p.source_id,
            held_in=held_elsewhere(done, p.sha, p.run_id, by_time),
        )
    notes = list(p.notes)
    run_id = p.run_id
    t0, t1 = p.row.get("trace_start_ns"), p.row.get("trace_end_ns")
    path, named = p.row["path"], p.run_id
    if stored is not None:  # --force: re-ingested in place: its run, and the path and name it was stored with
        run_id = stored[0]
        if (run_id, p.source_id) in runs.rows:
            path, named, placed = runs.rows[(run_id, p.source_id)]
            notes += placed
    elif place is not None:
        run_id = place
        notes += place_notes or []
    elif p.rank_list:
        run_id = runs.claim(run_id, p.source_id, p.rank_list, t0, t1, notes, by_time=by_time, path=path)
    if run_id != p.run_id:
        if isinstance(p.staged, hold.Held):
            hold.retarget(p.staged, run_id)
        else:
            lake.retarget(p.staged, run_id)
    row = {**p.row, "run_id": run_id, "named_run_id": named, "path": path, "notes": notes or None}
    others = [r for r in runs.by_content.get(p.sha, []) if r != run_id]
    if others:  # e.g. ingested before under another --run, or by a tracelake that named runs differently;
        # printed, not stored: the row must not depend on what else is in the lake (forget)
        notes = notes + [
            f"the same content is already in run {others[0]}{' and others' if len(others) > 1 else ''}; "
            f"`tracelake forget --run {others[0]}` removes that copy if it is not wanted"
        ]
    try:
        if isinstance(p.staged, hold.Held):
            if pending is not None and stored is None and not hold.stored(lake, run_id, p.source_id):
                pending.add(p.staged, row, key)
            else:
                lake.commit(hold.stage(lake, p.staged), row)
        else:
            lake.commit(p.staged, row)
    except OSError as e:
        if stored is None:  # a new source: ingest_paths stores it as failed
            raise
        # --force could not replace it: the lake (its earlier version included) is as it was, and
        # no failed row may stand in for the good one
        err = one_line(
            f"cannot replace its rows in the lake ({e.filename}: {e.strerror or e}); the version already "
            "in the lake is kept as it was"
        )
        return FileResult(p.path, run_id, p.rank, "failed", err, notes, p.source_id, p.uncompressed_bytes)
    except sch.SchemaError as e:
        err = one_line(f"schema violation: {e}")
        bad = {**p.row, "named_run_id": p.run_id, "status": "failed", "error": err}
        for k in ("rank", "rank_source", "ranks", "notes", "unreadable_bytes"):
            bad.pop(k, None)
        lake.commit(lake.stage(p.run_id, p.source_id, {}), bad)
        return FileResult(p.path, p.run_id, p.rank, "failed", err, notes, p.source_id, p.uncompressed_bytes)
    runs.add(
        run_id,
        named,
        p.source_id,
        p.sha,
        p.rank_list or [],
        t0,
        t1,
        row["notes"] or [],
        path,
        row.get("format"),
        p.identity,
    )
    done[(p.sha, p.run_id)] = done[(p.sha, None)] = (run_id, True)
    return FileResult(
        p.path, run_id, p.rank, p.status, None, notes, p.source_id, p.uncompressed_bytes, p.unreadable_bytes
    )


def problem_failure(lake: Lake, path: Path, run: str | None, error: str) -> Prepared:
    display = str(Path(path).absolute())
    try:
        sha = content_sha256(Path(path))
    except (OSError, MemoryError):
        sha = None
    try:
        size = Path(path).stat().st_size
    except OSError:
        size = 0
    return failed(display, run_for(dir_name(path), run), error, sha, size)
