"""Compaction in a bucket (pipeline/lake_s3.py's module doc, "Compaction"): the same files, sort
and manifest as a local lake's (pipeline/lake_compact.py, pipeline/lake_manifest.py), written with
uploads instead of renames. Called with the lake's lock held, through S3Lake.compact(), commit()
and forget(); `lake` is an S3Lake (duck-typed, so this module does not import lake_s3.py).

The steps, each safe to kill (TRACELAKE_CRASH_AT points compact-written, compact-switched,
compact-clean, as on a local disk):
1. the inputs (the run's generation's files, the small sources' live parts) are fetched to local
   copies (S3Files.local_parts), merged by lake_compact.write_groups into a local directory, and
   the new files c-<gen>-<k>.parquet uploaded into their run's prefixes: no manifest names them;
2. the switch: the run's manifest is PUT (one object, whole or not at all; deleted when no
   source is left in the generation);
3. the superseded objects are deleted: the old generation's files, and the merged sources' own
   parts and `sources` rows (now held by the manifest, so read by no one).
A kill before 2 leaves files no manifest names, after it objects the manifest supersedes:
S3Lake.recover() deletes both. Errors: ObjectStoreError (an OSError naming the object) from the
bucket, pyarrow's errors from reading a part.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path

from . import lake_compact as compaction
from . import lake_journal as journal
from . import lake_manifest as manifest
from . import objstore, scratch
from . import schema as sch
from .lake_base import LakeError
from .lake_s3_files import RemoteView, split_stem


def small_sources(view: RemoteView, run_dir: str) -> dict[str, dict[str, tuple[str, int]]]:
    """source id -> {table: (stem, bytes)} of the run's sources read from parts of their own whose
    live parts add up to less than lake_compact.SMALL_SOURCE_BYTES."""
    out: dict[str, dict[str, tuple[str, int]]] = {}
    for (t, r, stem), n in view.parts.items():
        sid = split_stem(stem)[0]
        if r == run_dir and (r, sid) in view.singles and view.live.get((r, sid)) == stem:
            out.setdefault(sid, {})[t] = (stem, n)
    return {s: p for s, p in out.items() if sum(n for _, n in p.values()) < compaction.SMALL_SOURCE_BYTES}


def compact(lake, runs: Iterable[str] | None, min_sources: int) -> list[tuple[str, int, int]]:
    """S3Lake.compact: compact_run() for each run id of `runs` (None: every run with parts of its
    own); (run id, parts before, files after) per run compacted."""
    try:
        view = lake.committed()
    except LakeError as e:
        raise OSError(str(e)) from None
    dirs = {r for r, _ in view.singles} if runs is None else {f"run={r}" for r in runs}
    return compaction.each_run(lake, dirs, view, min_sources, compact_run)


def compact_run(lake, run_dir: str, view: RemoteView, min_sources: int) -> tuple[int, int] | None:
    """Merge the run's small sources with its generation (module doc); None when it holds fewer
    than min_sources small sources (its generation counting as one), else (parts before, files
    after)."""
    small = small_sources(view, run_dir)
    old = view.manifests.get(run_dir)
    if not small or len(small) + (old is not None) < max(min_sources, 2):
        return None
    gen = uuid.uuid4().hex[:16]
    inputs: dict[str, list[str]] = {}
    for t in sch.tables():
        names = list(old.files.get(t, ())) if old else []
        names += [f"{small[s][t][0]}.parquet" for s in sorted(small) if t in small[s]]
        inputs[t] = [f"{lake.url}/{t}/{run_dir}/{n}" for n in names]
    sources = dict(old.sources) if old else {}
    sources.update({s: sorted(p) for s, p in small.items()})
    new = _write(lake, run_dir, gen, inputs, None, sources)
    journal.crash_point("compact-written")
    _switch(lake, run_dir, new)
    garbage = [lake._key(t, run_dir, n) for t, ns in (old.files.items() if old else ()) for n in ns]
    own = [(t, stem) for s in small.values() for t, (stem, _) in s.items()]
    garbage += [
        lake._key(t, run_dir, f"{stem}.parquet") for t, stem in sorted(own, key=lambda x: x[0] == "sources")
    ]
    _remove(lake, garbage)
    return sum(len(v) for v in inputs.values()), sum(len(n) for n in new.files.values())


def drop(lake, run_dir: str, old: manifest.Manifest, sids: set[str]) -> None:
    """Take sources out of the run's generation (forget, or a --force commit whose new version is
    already up): its files rewritten without their rows and switched to as a compaction is."""
    sids = sids & old.sources.keys()
    if not sids:
        return
    inputs = {t: [f"{lake.url}/{t}/{run_dir}/{n}" for n in names] for t, names in old.files.items()}
    sources = {s: v for s, v in old.sources.items() if s not in sids}
    new = _write(lake, run_dir, uuid.uuid4().hex[:16], inputs, sids, sources) if sources else None
    journal.crash_point("compact-written")
    _switch(lake, run_dir, new)
    _remove(lake, [lake._key(t, run_dir, n) for t, ns in old.files.items() for n in ns])


def forget_held(lake, sources: list[tuple[str, str]]) -> int:
    """S3Lake.forget's part for the sources held by their run's generation (drop); how many were."""
    held: dict[str, set[str]] = {}
    for run_id, source_id in sources:
        held.setdefault(f"run={run_id}", set()).add(source_id)
    n = 0
    for d, sids in held.items():
        m = lake.manifest_of(d)
        if m is not None and sids & m.sources.keys():
            n += len(sids & m.sources.keys())
            drop(lake, d, m, sids)
    return n


def _write(lake, run_dir, gen, inputs: dict[str, list[str]], skip, sources) -> manifest.Manifest:
    """The new generation's files (lake_compact.write_groups of local copies of `inputs`, leaving
    out the rows of the source ids in `skip`) uploaded into the run's prefixes; its manifest."""
    files: dict[str, list[str]] = {}
    with scratch.temporary("s3compact") as tmp:
        for t, urls in inputs.items():
            if not urls:
                continue
            local = [(Path(p), skip) for p in lake.local_parts(urls)]
            names = compaction.write_groups(t, local, Path(tmp) / t, gen)
            if names:
                try:
                    lake.filesystem.put(
                        [str(Path(tmp) / t / n) for n in names], [lake._key(t, run_dir, n) for n in names]
                    )
                except Exception as e:
                    raise objstore.describe(f"{lake.url}/{t}/{run_dir}", e) from None
                files[t] = names
    return manifest.Manifest(gen, files, sources)


def _switch(lake, run_dir: str, new: manifest.Manifest | None) -> None:
    """Make `new` the run's live generation in one PUT (None: delete the manifest)."""
    k = lake._key(manifest.MANIFEST_DIR, f"{run_dir}.json")
    try:
        if new is None:
            lake._rm([k])
        else:
            lake.filesystem.pipe_file(k, manifest.encode(new))
    except OSError:
        raise
    except Exception as e:
        raise objstore.describe(objstore.url_of(k), e) from None
    journal.crash_point("compact-switched")


def _remove(lake, keys: list[str]) -> None:
    """Delete objects no reader sees any more; one that cannot be deleted is left to recover()."""
    for k in keys:
        try:
            lake._rm([k])
        except OSError:
            continue
        journal.crash_point("compact-clean")
