"""Compacted parts and the manifest that makes them live: the reading side (pipeline/lake.py
module doc, "Compaction"; the writing side is pipeline/lake_compact.py).

A run's compacted generation is a set of files `<lake>/<table>/run=<run_id>/c-<gen>-<k>.parquet`
(gen: 16 hex digits, k: 0, 1, ... per table) holding the rows of many sources, and one manifest
`<lake>/_compacted/run=<run_id>.json` naming the generation, its files per table and the sources
it holds with the tables each has rows in. The manifest is replaced in one os.replace (or
removed in one unlink), which is the moment a compaction takes effect. A part is live when:
- c-<gen>-<k>.parquet: the run's manifest names it (files of any other generation are a
  compaction not yet switched, or one switched away from, and are removed by recover());
- <source_id>.parquet: the source's `sources` part exists and the run's manifest does not hold
  that source (a source moved into a generation stops being read as its own parts at the switch,
  before they are removed).
Source ids are hex digits (pipeline/ingest/rows.py), so no source's part is named c-....

View (the result of LakeFiles.committed()) is one consistent snapshot of that: the sources
listing first, the manifests after it (a listing made before a switch shows the old parts, which
are removed only after it; the files of the new generation come from its manifest, not from the
listing). Errors: ManifestError (one line naming the file) for a manifest that cannot be read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import polars as pl

MANIFEST_DIR = "_compacted"
COMPACTED = re.compile(r"c-([0-9a-f]{16})-(\d+)")


class ManifestError(ValueError):
    pass


class Manifest(msgspec.Struct, forbid_unknown_fields=False):
    """One run's live generation: gen (16 hex digits), files (table -> file names under
    <table>/run=<run_id>/, sources included), sources (source id -> the tables it has rows in,
    `sources` included)."""

    gen: str
    files: dict[str, list[str]]
    sources: dict[str, list[str]]


def is_compacted(stem: str) -> bool:
    """Whether a part's file stem names a compacted file (c-<gen>-<k>)."""
    return stem.startswith("c-")


def path(root: Path, run_dir: str) -> Path:
    """The manifest of run directory run_dir ('run=<run_id>')."""
    return root / MANIFEST_DIR / f"{run_dir}.json"


def read_one(root: Path, run_dir: str) -> Manifest | None:
    """The run's manifest, None when the run has no compacted generation."""
    p = path(root, run_dir)
    try:
        data = p.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise ManifestError(f"{p}: cannot read the compaction manifest ({e.strerror or e})") from None
    try:
        return msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as e:
        raise ManifestError(f"{p}: damaged compaction manifest ({e})") from None


def read_all(root: Path) -> dict[str, Manifest]:
    """run directory -> manifest, for every run with a compacted generation."""
    try:
        names = [e.name for e in os.scandir(root / MANIFEST_DIR) if e.name.endswith(".json")]
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out = {}
    for n in names:
        m = read_one(root, n[:-5])
        if m is not None:
            out[n[:-5]] = m
    return out


def encode(m: Manifest) -> bytes:
    return msgspec.json.encode(m)


@dataclass
class View:
    """Which parts are live at one moment. singles: (run directory, source id) of the sources
    committed as their own parts (a `sources` part, not held by the run's generation); manifests:
    run directory -> its live generation. `(run_dir, source_id) in view` asks about singles only."""

    singles: set[tuple[str, str]] = field(default_factory=set)
    manifests: dict[str, Manifest] = field(default_factory=dict)

    def __contains__(self, key) -> bool:
        return key in self.singles

    def gens(self) -> dict[str, str]:
        return {r: m.gen for r, m in self.manifests.items()}

    def files(self, table: str, run_dirs: set[str] | None = None) -> list[tuple[str, str]]:
        """(run directory, file stem) of the table's live compacted files."""
        return [
            (r, n[:-8])
            for r, m in sorted(self.manifests.items())
            if run_dirs is None or r in run_dirs
            for n in m.files.get(table, ())
        ]

    def holders(self, table: str, run_dirs: set[str] | None = None) -> set[tuple[str, str]]:
        """(run directory, source id) of the sources held by a live generation with rows in table."""
        return {
            (r, s)
            for r, m in self.manifests.items()
            if run_dirs is None or r in run_dirs
            for s, tables in m.sources.items()
            if table in tables
        }


def view(listing: list[tuple[str, str]], manifests: dict[str, Manifest]) -> View:
    """The View of a `sources` listing ((run directory, stem) pairs) and the manifests read after it."""
    singles = set()
    for r, s in listing:
        if is_compacted(s):
            continue
        m = manifests.get(r)
        if m is None or s not in m.sources:
            singles.add((r, s))
    return View(singles, manifests)


def read_source(root: Path, table: str, run_dir: str, source_id: str, columns: list[str] | None = None):
    """One committed source's rows of `table` as a polars frame (columns: those of these the part
    has; None: all), from its own part or from its run's generation; None when it has none there."""
    m = read_one(root, run_dir)
    if m is not None and source_id in m.sources:
        if table not in m.sources[source_id]:
            return None
        files = [root / table / run_dir / n for n in m.files.get(table, ())]
        keep = pl.col("source_id") == source_id
    else:
        files, keep = [root / table / run_dir / f"{source_id}.parquet"], pl.lit(True)
    frames = []
    for f in files:
        try:
            cols = [c for c in pl.read_parquet_schema(f) if columns is None or c in columns]
            frames.append(pl.scan_parquet(f).filter(keep).select(cols).collect())
        except (FileNotFoundError, OSError):
            continue
    return pl.concat(frames) if frames else None
