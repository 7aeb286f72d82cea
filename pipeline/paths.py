"""Locations of the data files that ship beside the package (schemas/, queries/)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS_DIR = ROOT / "schemas"
QUERIES_DIR = ROOT / "queries"
CATALOG_DIR = Path(__file__).resolve().parent / "catalog"


def cache_dir() -> Path:
    """Where tracelake keeps files it can rebuild (the Vega bundle, the charts' templates, parsed
    TOML data files): $TRACELAKE_CACHE_DIR, else $XDG_CACHE_HOME/tracelake when that is an absolute
    path (the XDG Base Directory spec: a relative one is invalid and ignored), else
    ~/.cache/tracelake. Raises RuntimeError when there is no home to name (callers keep their files
    in memory then)."""
    if os.environ.get("TRACELAKE_CACHE_DIR"):
        return Path(os.environ["TRACELAKE_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME") or ""
    base = xdg if os.path.isabs(xdg) else str(Path.home() / ".cache")
    return Path(base) / "tracelake"
