"""Locations of the data files that ship beside the package (schemas/, queries/)."""

from __future__ import annotations

import os
import uuid
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


def keep(path: Path, text: str) -> bool:
    """Write text (UTF-8) to the cache file path whole or not at all: under a temporary name beside
    it, then renamed, so a reader never sees a half-written file. False when it cannot be written
    (a read-only or full cache: the caller then works without it); nothing is left behind then."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False
