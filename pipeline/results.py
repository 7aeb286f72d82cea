"""Kept results: each run's analysis stored in the lake and read back while nothing it rests on
changed (issue 37, point 2).

Layout: <lake>/results/<run_id>/<key>.json, one file per (run, key), the run's own part of the
`tracelake.analyze/5` document (pipeline/analyze.py `run_docs`: every list of the document
restricted to the run's rows, and its notes) encoded with msgspec; beside it <key>.fleet.parquet,
the run's row of the fleet view (pipeline/fleet.py, read by the `runs_overview` view). The key
(`run_key`) is the SHA-256 of
- the run's rows of the `sources` table, every column (a source added, forgotten, re-ingested
  with --force or moved to another run changes them);
- the analysis options (window, kernel-wait threshold, top_n, MFU and model overrides, GPU-hour
  cost: everything analyze() takes but the run list and the progress callback);
- the code (`code_fingerprint`): tracelake's version and the bytes of every file of the package,
  the metric SQL and the schema (a new tracelake version, or an edited query in a checkout).
So a run is recomputed when, and only when, one of them changes; the other runs of the lake keep
theirs. A run keeps the files of its last KEEP keys (the newest by modification time), so
switching between two option sets (say `--window hta` and the default) reuses both.

Writing is atomic (a temporary file in the same directory, then os.replace): a reader sees a
whole file or none, and a kill leaves at worst a `.tmp-*` file that the next write of that run
removes. A lake that cannot be written (a read-only mount) is analysed as before, every time,
without kept results. Nothing here takes the lake's lock: two analyses of the same run write the
same bytes under the same name. `forget` of a whole run leaves its directory; `prune` removes
the directories of runs the lake no longer holds (analyze calls it after writing).

Errors: read() treats an unreadable or undecodable file as absent (it is recomputed and
rewritten); write() raises nothing for a file-system error (the result is simply not kept).

A lake at an s3:// URL (pipeline/lake_s3.py) keeps them under <url>/results/ the same way,
through its fsspec file system (pipeline/objstore.py; the `_remote_*` functions at the end): each
file one PUT (atomic per object), the listing signature from the `sources` objects' names, sizes
and ETags, KEEP by the objects' modification times (a read does not refresh one there).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import uuid
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:  # imported where used: reading a kept result needs neither
    import polars as pl

from . import objstore
from .paths import CATALOG_DIR, QUERIES_DIR, SCHEMAS_DIR

DIR = "results"
KEEP = 4  # option sets kept per run
_FORMAT = "tracelake.kept/1"  # the file's own format (a change of it is a change of the key)
# the names of the files a run's directory of kept results holds (a key is 64 hex digits)
_KEPT_NAME = re.compile(r"[0-9a-f]{64}(\.json|\.fleet\.parquet)|\.tmp-[0-9a-f]{32}")
STATE = "_state.json"  # the keys of the lake's runs for its current listing (known_keys)


@cache
def code_fingerprint() -> str:
    """SHA-256 (hex) of every file that decides an analysis: the package's Python modules (its
    __init__.py holds tracelake's version) and catalog, queries/**/*.sql, schemas/*.toml (about
    190 files, 8 ms on this machine, once per process), and the versions of DuckDB, polars,
    pyarrow and msgspec (read from their installed metadata, not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256(f"{_FORMAT}\0".encode())
    for lib in ("duckdb", "polars", "pyarrow", "msgspec"):  # the libraries the numbers come from
        try:
            h.update(f"{lib}={version(lib)}\0".encode())
        except PackageNotFoundError:
            pass
    package = Path(__file__).resolve().parent
    groups = (
        (package, ("*.py",)),
        (CATALOG_DIR, ("*.toml",)),
        (QUERIES_DIR, ("*.sql",)),
        (SCHEMAS_DIR, ("*.toml",)),
    )
    for base, patterns in groups:
        for p in sorted(q for pat in patterns for q in base.rglob(pat)):
            h.update(str(p.relative_to(base)).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def lake_marker(lake_root) -> str:
    """The lake's TRACELAKE marker (it names the schema version the lake was written with: a lake
    of an older version is upgraded when it is read, so its kept results are not those of the
    upgraded lake); "" for an object-store lake (always current) or when there is none."""
    if objstore.is_url(lake_root):
        return ""
    try:
        return (Path(lake_root) / "TRACELAKE").read_bytes()[:200].decode("utf-8", "replace")
    except OSError:
        return ""


def run_key(sources: pl.DataFrame, options: dict, marker: str = "") -> str:
    """The key of one run's kept analysis (hex SHA-256): its `sources` rows (every column, in
    source id order), the options (a dict of JSON scalars), the lake's marker (lake_marker) and
    code_fingerprint()."""
    rows = sources.sort("source_id", "path").to_dicts()
    payload = msgspec.json.encode(
        {"code": code_fingerprint(), "options": options, "sources": rows, "lake": marker}, order="sorted"
    )
    return hashlib.sha256(payload).hexdigest()


def run_keys(src: pl.DataFrame, run_ids: list[str], options: dict, marker: str = "") -> dict[str, str]:
    """run id -> run_key() for each of run_ids, from src (the lake's sources rows of those runs)
    and the lake's marker."""
    groups = {k[0]: g for k, g in src.group_by("run_id")}
    empty = src.clear()
    return {r: run_key(groups.get(r, empty), options, marker) for r in run_ids}


def listing_signature(lake_root: Path) -> str:
    """SHA-256 (hex) of the lake's TRACELAKE marker (its schema version: a lake of an older
    version is read, and so upgraded, not answered from kept results) and of the names, sizes,
    modification times and inodes of every file under <lake>/sources/ and <lake>/_compacted/
    (the `sources` parts and the compaction manifests): any commit, forget, compaction or upgrade
    that changes a `sources` row changes one of them. A directory listing and one small file read
    (5,000 sources: a few ms)."""
    return _listing(lake_root)[0]


_RUN_DIR = re.compile(r"run=(.+?)(\.json)?")


def _listing(lake_root) -> tuple[str, set[str]]:
    """(listing_signature, the run ids the listing shows: a `sources` directory run=<id> holding a
    file, or a compaction manifest run=<id>.json)."""
    if objstore.is_url(lake_root):
        return _remote_signature(lake_root)
    h = hashlib.sha256(lake_marker(lake_root).encode())
    runs: set[str] = set()
    for sub in ("sources", "_compacted"):
        h.update(f"\0{sub}\0".encode())
        stack = [Path(lake_root) / sub]
        while stack:
            d = stack.pop()
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                        continue
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                rel = os.path.relpath(e.path, lake_root)
                h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
                part = rel.split(os.sep)
                m = _RUN_DIR.fullmatch(part[1]) if len(part) >= 2 else None
                if m and not e.name.startswith("."):
                    runs.add(m.group(1))
    return h.hexdigest(), runs


def _options_key(options: dict) -> str:
    return msgspec.json.encode(options, order="sorted").decode()


def known_keys(lake_root: Path, options: dict, runs: list[str] | None) -> dict[str, str] | None:
    """run id -> key of the runs (None: every run of the lake) as remember_keys() stored them for
    these options, when the lake's listing (listing_signature) and the code (code_fingerprint)
    are still those; None otherwise (the keys must be computed from the `sources` rows)."""
    state = _decoded(lambda: _read_bytes(lake_root, STATE))
    if not isinstance(state, dict) or state.get("code") != code_fingerprint():
        return None
    keys_of = state.get("keys")
    known = keys_of.get(_options_key(options)) if isinstance(keys_of, dict) else None
    keys = known.get("runs") if isinstance(known, dict) else None
    if not isinstance(keys, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in keys.items()
    ):
        return None
    listing, present = _listing(lake_root)
    if state.get("listing") != listing:
        return None
    if runs is None:
        # every run the listing shows, no more, no fewer (a state file edited by hand is not trusted)
        return dict(keys) if known.get("whole") is True and set(keys) == present else None
    if not all(r in keys for r in runs):
        return None
    return {r: keys[r] for r in sorted(set(runs))}


def remember_keys(
    lake_root: Path, listing: str, options: dict, keys: dict[str, str], whole: bool = True
) -> None:
    """Store the keys of runs of the lake for these options (whole: every run of the lake; else
    added to those stored), computed from the `sources` rows read after the listing `listing` was
    taken (so a commit in between changes the listing and the keys are computed again next
    time). Other option sets of the same listing are kept; nothing is raised when the lake cannot
    be written."""
    path = Path(lake_root) / DIR / STATE
    state = _decoded(lambda: _read_bytes(lake_root, STATE))
    if (
        not isinstance(state, dict)
        or state.get("listing") != listing
        or state.get("code") != code_fingerprint()
        or not isinstance(state.get("keys"), dict)
    ):
        state = {"listing": listing, "code": code_fingerprint(), "keys": {}}
    opt = _options_key(options)
    before = state["keys"].get(opt)
    before = before if isinstance(before, dict) and isinstance(before.get("runs"), dict) else {}
    if whole:
        state["keys"][opt] = {"whole": True, "runs": keys}
    else:
        state["keys"][opt] = {
            "whole": bool(before.get("whole")),
            "runs": {**(before.get("runs") or {}), **keys},
        }
    try:
        if objstore.is_url(lake_root):
            return _remote_put(lake_root, STATE, msgspec.json.encode(state))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
        tmp.write_bytes(msgspec.json.encode(state))
        os.replace(tmp, path)
    except OSError:
        pass


def _dir(lake_root: Path, run_id: str) -> Path:
    return Path(lake_root) / DIR / run_id


def _decoded(read):
    """The JSON value read() gives, or None when it cannot be read or decoded (a kept file is a
    cache: a damaged one, however damaged, is computed again, never an error)."""
    try:
        return msgspec.json.decode(read())
    except (OSError, msgspec.DecodeError, RecursionError, MemoryError, ValueError):
        return None


def well_formed(doc, run_id: str) -> bool:
    """Whether doc has the shape of a run's kept document (pipeline/analyze.py run_docs): every
    list of the document's LIST_KEYS, each row a dict of this run, and the notes as strings."""
    from .analyze_doc import LIST_KEYS

    if not isinstance(doc, dict) or set(doc) != {*LIST_KEYS, "notes"}:
        return False
    for k in LIST_KEYS:
        rows = doc[k]
        if not isinstance(rows, list) or not all(
            isinstance(r, dict) and r.get("run_id") == run_id for r in rows
        ):
            return False
    return isinstance(doc["notes"], list) and all(isinstance(n, str) for n in doc["notes"])


def read(lake_root: Path, run_id: str, key: str) -> dict | None:
    """The kept document of run_id under key, or None when there is none (or it cannot be read,
    or is not a run's document: well_formed)."""
    path = _dir(lake_root, run_id) / f"{key}.json"
    doc = _decoded(lambda: _read_bytes(lake_root, f"{run_id}/{key}.json"))
    if not isinstance(doc, dict) or doc.get("key") != key or not well_formed(doc.get("doc"), run_id):
        return None
    try:
        if not objstore.is_url(lake_root):
            os.utime(path)  # the newest used is kept longest (KEEP)
    except OSError:
        pass
    return doc["doc"]


def encode(doc: dict) -> bytes:
    """doc as JSON bytes (msgspec): what write() stores and decode() reads."""
    return msgspec.json.encode(doc)


def decode(data: bytes) -> dict:
    """The document encode() wrote (lists for tuples: what a reader of a kept result gets)."""
    return msgspec.json.decode(data)


def write(lake_root: Path, run_id: str, key: str, data: bytes) -> bool:
    """Keep data (encode() of the run's document) under key; the run's older keys beyond KEEP and
    any temporary file a kill left are removed. Returns whether it was kept (False: the lake cannot
    be written here)."""
    if objstore.is_url(lake_root):
        return _remote_keep(
            lake_root, run_id, f"{key}.json", msgspec.json.encode({"key": key, "doc": msgspec.Raw(data)})
        )
    d = _dir(lake_root, run_id)
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".tmp-{uuid.uuid4().hex}"
        tmp.write_bytes(msgspec.json.encode({"key": key, "doc": msgspec.Raw(data)}))
        os.replace(tmp, d / f"{key}.json")
        _trim(d)
        return True
    except OSError:
        return False


def _trim(d: Path) -> None:
    """Remove the files of the run's keys beyond the KEEP newest (by their newest file) and
    temporary files older than an hour (another writer's are seconds old)."""
    newest: dict[str, int] = {}
    files: list[tuple[str, Path]] = []
    for p in d.iterdir():
        try:
            mtime = p.stat().st_mtime_ns
        except OSError:
            continue
        if p.name.startswith(".tmp-"):
            if mtime < (time.time() - 3600) * 1e9:
                p.unlink(missing_ok=True)
            continue
        key = p.name.split(".", 1)[0]
        files.append((key, p))
        newest[key] = max(newest.get(key, 0), mtime)
    gone = set(sorted(newest, key=newest.get, reverse=True)[KEEP:])
    for key, p in files:
        if key in gone:
            try:
                p.unlink()
            except OSError:
                pass


def prune(lake_root: Path, run_ids: set[str]) -> None:
    """Remove the kept results of runs not in run_ids (the runs the lake holds)."""
    if objstore.is_url(lake_root):
        base = _remote_key(lake_root)
        rel = [k[len(base) + 1 :].split("/") for k in _remote_find(lake_root)]
        gone = [
            f"{base}/{'/'.join(r)}" for r in rel if len(r) > 1 and r[0] not in run_ids
        ]  # run "directories"
        try:
            if gone:
                objstore.filesystem().rm(gone)
        except Exception:  # kept results are a cache: left for the next prune
            pass
        return
    base = Path(lake_root) / DIR
    if base.is_symlink():  # results/ elsewhere: not the lake's own to remove from
        return
    try:
        children = list(base.iterdir())
    except OSError:
        return
    for p in children:
        if p.name in run_ids or p.is_symlink() or not p.is_dir():
            continue
        try:
            ours = all(_KEPT_NAME.fullmatch(f.name) and not f.is_symlink() for f in p.iterdir())
        except OSError:
            continue
        if ours:  # only the files this module writes: a directory of anything else is left alone
            shutil.rmtree(p, ignore_errors=True)


# ------------------------------------------------------------------ a lake at an s3:// URL


def _remote_key(lake_root) -> str:
    return f"{objstore.key(str(lake_root))}/{DIR}"


def _read_bytes(lake_root, rel: str) -> bytes:
    """The bytes of <lake>/results/<rel> (OSError when absent or unreadable)."""
    if not objstore.is_url(lake_root):
        return (Path(lake_root) / DIR / rel).read_bytes()
    try:
        return objstore.filesystem().cat_file(f"{_remote_key(lake_root)}/{rel}")
    except Exception as e:
        raise objstore.describe(str(lake_root), e) from None


def _remote_put(lake_root, rel: str, data: bytes) -> None:
    try:
        objstore.filesystem().pipe_file(f"{_remote_key(lake_root)}/{rel}", data)
    except Exception as e:
        raise objstore.describe(str(lake_root), e) from None


def _remote_find(lake_root) -> dict[str, dict]:
    """bucket/key -> info of every object under <lake>/results/ ({} when none or unreadable)."""
    try:
        return objstore.filesystem().find(_remote_key(lake_root), detail=True, withdirs=False)
    except Exception:
        return {}


def _remote_signature(lake_root) -> tuple[str, set[str]]:
    """_listing() of a lake in a bucket: the sources objects' names, sizes and ETags."""
    h = hashlib.sha256(b"\0sources\0")
    base = f"{objstore.key(str(lake_root))}/sources"
    try:
        found = objstore.filesystem().find(base, detail=True, withdirs=False)
    except Exception:
        found = {}
    runs = set()
    for k in sorted(found):
        h.update(f"{k}\0{found[k].get('size')}\0{found[k].get('ETag')}\n".encode())
        m = _RUN_DIR.fullmatch(k[len(base) + 1 :].split("/")[0])
        if m:
            runs.add(m.group(1))
    return h.hexdigest(), runs


def _remote_keep(lake_root, run_id: str, name: str, data: bytes) -> bool:
    """write() and write_fleet() in a bucket: one PUT, then the run's keys beyond KEEP removed."""
    try:
        _remote_put(lake_root, f"{run_id}/{name}", data)
        found = objstore.filesystem().find(f"{_remote_key(lake_root)}/{run_id}", detail=True)
        newest: dict[str, float] = {}
        for k, info in found.items():
            key, t = k.rsplit("/", 1)[-1].split(".", 1)[0], info.get("LastModified")
            newest[key] = max(newest.get(key, 0.0), t.timestamp() if t else 0.0)
        gone = set(sorted(newest, key=newest.get, reverse=True)[KEEP:])
        old = [k for k in found if k.rsplit("/", 1)[-1].split(".", 1)[0] in gone]
        if old:
            objstore.filesystem().rm(old)
        return True
    except Exception:
        return False
