"""TOML data files (schemas/v3.toml, pipeline/catalog/*.toml) read through a JSON copy kept in the
cache directory (paths.cache_dir() / "toml" / <SHA-256 of the file's bytes>.json).

Python's tomllib is pure Python: parsing schemas/v3.toml took 36 ms at the start of every process
that touches the lake (2 % of PARAM's 8-rank DLRM job's `tracelake run`, paid again by each of
`ingest` and `analyze`), where json.loads of the same data takes under 1 ms. The copy is named by
the file's own content, so an edited file is parsed again and two installations sharing one cache
never read each other's. A copy that cannot be read, written or decoded costs only the parse;
a file holding values JSON lacks (TOML's dates and times) is parsed every time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .paths import cache_dir, keep


def _parse(data: bytes) -> dict:
    # imported here: tomllib compiles its regular expressions at import (14-20 ms, every process
    # that touches the lake), and a kept copy needs none of it
    import tomllib

    return tomllib.loads(data.decode("utf-8"))


def load(path: Path) -> dict:
    """The TOML document at path, as tomllib.load gives it. Raises OSError when the file cannot be
    read, tomllib.TOMLDecodeError (a ValueError) when it is not TOML."""
    data = Path(path).read_bytes()
    try:
        kept = cache_dir() / "toml" / f"{hashlib.sha256(data).hexdigest()}.json"
    except RuntimeError:  # no home directory to name: parse every time
        return _parse(data)
    try:
        doc = json.loads(kept.read_bytes())
        if isinstance(doc, dict):
            return doc
    except (OSError, ValueError):  # not kept yet, or cut or garbled: parsed and kept again below
        pass
    doc = _parse(data)
    try:
        text = json.dumps(doc)
    except TypeError:  # a date or time: JSON has no such value
        return doc
    keep(kept, text)  # whole or absent: a reader never sees a half-written copy
    return doc
