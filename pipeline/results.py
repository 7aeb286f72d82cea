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
import shutil
import uuid
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:  # imported where used: reading a kept result needs neither
    import polars as pl
    import pyarrow as pa

from . import objstore
from .paths import CATALOG_DIR, QUERIES_DIR, SCHEMAS_DIR

DIR = "results"
KEEP = 4  # option sets kept per run
_FORMAT = "tracelake.kept/1"  # the file's own format (a change of it is a change of the key)
FLEET_SUFFIX = ".fleet.parquet"
STATE = "_state.json"  # the keys of the lake's runs for its current listing (known_keys)
# the columns a kept fleet row has beyond pipeline/fleet.py FLEET_COLUMNS: (name, polars type
# name, doc)
FLEET_EXTRA = [
    ("key", "String", "the key of the kept result the row was made from (pipeline/results.py)"),
    ("options", "String", "the analysis options it was computed with, as a JSON object"),
    ("sources_digest", "String", "sources_digest() of the run's sources when it was computed"),
    ("computed_at_ns", "Int64", "when it was computed, ns since the Unix epoch"),
]


@cache
def code_fingerprint() -> str:
    """SHA-256 (hex) of every file that decides an analysis: the package's Python modules (its
    __init__.py holds tracelake's version) and catalog, queries/**/*.sql, schemas/*.toml (about
    190 files, 8 ms on this machine, once per process)."""
    h = hashlib.sha256(f"{_FORMAT}\0".encode())
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
    if objstore.is_url(lake_root):
        return _remote_signature(lake_root)
    h = hashlib.sha256(lake_marker(lake_root).encode())  # the schema version: an older lake is upgraded
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
    return h.hexdigest()


def _options_key(options: dict) -> str:
    return msgspec.json.encode(options, order="sorted").decode()


def known_keys(lake_root: Path, options: dict, runs: list[str] | None) -> dict[str, str] | None:
    """run id -> key of the runs (None: every run of the lake) as remember_keys() stored them for
    these options, when the lake's listing (listing_signature) and the code (code_fingerprint)
    are still those; None otherwise (the keys must be computed from the `sources` rows)."""
    try:
        state = msgspec.json.decode(_read_bytes(lake_root, STATE))
    except (OSError, msgspec.DecodeError):
        return None
    if not isinstance(state, dict) or state.get("code") != code_fingerprint():
        return None
    known = (state.get("keys") or {}).get(_options_key(options))
    if not isinstance(known, dict) or state.get("listing") != listing_signature(lake_root):
        return None
    keys = known.get("runs") or {}
    if runs is None:
        return dict(keys) if known.get("whole") else None
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
    try:
        state = msgspec.json.decode(_read_bytes(lake_root, STATE))
        if (
            not isinstance(state, dict)
            or state.get("listing") != listing
            or state.get("code") != code_fingerprint()
        ):
            state = None
    except (OSError, msgspec.DecodeError):
        state = None
    state = state or {"listing": listing, "code": code_fingerprint(), "keys": {}}
    opt = _options_key(options)
    before = state["keys"].get(opt) or {}
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


def read(lake_root: Path, run_id: str, key: str) -> dict | None:
    """The kept document of run_id under key, or None when there is none (or it cannot be read)."""
    path = _dir(lake_root, run_id) / f"{key}.json"
    try:
        data = _read_bytes(lake_root, f"{run_id}/{key}.json")
        doc = msgspec.json.decode(data)
    except (OSError, msgspec.DecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("doc"), dict):
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


def write_fleet(lake_root: Path, run_id: str, key: str, table: pa.Table) -> bool:
    """Keep the run's fleet row (pipeline/fleet.py fleet_rows, with the kept-result columns of
    FLEET_EXTRA) beside its document, as <key>.fleet.parquet (the `runs_overview` view reads
    them: pipeline/query.py). Returns whether it was kept."""
    if objstore.is_url(lake_root):
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(table, buf)
        return _remote_keep(lake_root, run_id, f"{key}{FLEET_SUFFIX}", buf.getvalue())
    d = _dir(lake_root, run_id)
    try:
        d.mkdir(parents=True, exist_ok=True)
        import pyarrow.parquet as pq

        tmp = d / f".tmp-{uuid.uuid4().hex}"
        pq.write_table(table, tmp)
        os.replace(tmp, d / f"{key}{FLEET_SUFFIX}")
        return True
    except OSError:
        return False


def fleet_files(lake_root: Path) -> list[str]:
    """Every kept fleet row's file of the lake (sorted paths; s3:// URLs for a lake there)."""
    if objstore.is_url(lake_root):
        found = _remote_find(lake_root)
        return sorted(objstore.url_of(k) for k in found if k.endswith(FLEET_SUFFIX))
    base = Path(lake_root) / DIR
    try:
        return sorted(str(p) for p in base.glob(f"*/*{FLEET_SUFFIX}"))
    except OSError:
        return []


def sources_digest(sources: pl.DataFrame) -> str:
    """MD5 (hex) of the run's sources as `runs_overview` recomputes it in SQL to say whether a kept
    row is current: "source_id/ingested_at_ns" of each source, in source id order, joined by
    commas (md5 of DuckDB's string_agg(..., ',' ORDER BY source_id))."""
    rows = sorted(zip(sources["source_id"].to_list(), sources["ingested_at_ns"].to_list()))
    return hashlib.md5(",".join(f"{s}/{t}" for s, t in rows).encode()).hexdigest()


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
            if mtime < (_now() - 3600) * 1e9:
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


def _now() -> float:
    import time

    return time.time()


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
    try:
        children = list(base.iterdir())
    except OSError:
        return
    for p in children:
        if p.is_dir() and p.name not in run_ids:
            shutil.rmtree(p, ignore_errors=True)


def bind_overview(con, lake_root: Path) -> None:
    """Create the `runs_overview` view on a DuckDB connection whose `sources` view is bound: the
    newest kept fleet row of each run the lake holds (fleet_files), with `current` (whether the
    run's sources are still those it was computed from: sources_digest recomputed in SQL). The
    rows are read only when the view is queried; a lake without kept rows gives an empty view of
    the same columns."""
    files = fleet_files(lake_root)
    if files:
        listed = ", ".join(
            "'" + f.replace("'", "''").replace("[", "[[]").replace("*", "[*]") + "'" for f in files
        )
        con.execute(
            "CREATE VIEW internal.fleet_kept AS "
            f"SELECT * FROM read_parquet([{listed}], union_by_name = true, hive_partitioning = false)"
        )
    else:
        import polars as pl

        from .fleet import FLEET_SCHEMA  # the columns of an empty view (no kept row yet)

        extra = {n: getattr(pl, t) for n, t, _ in FLEET_EXTRA}
        empty = pl.DataFrame(schema={**FLEET_SCHEMA, **extra}).to_arrow()
        con.register("_fleet_empty", empty)
        con.execute("CREATE TABLE internal.fleet_kept AS SELECT * FROM _fleet_empty")
        con.unregister("_fleet_empty")
    con.execute(
        "CREATE VIEW runs_overview AS "
        "SELECT k.* EXCLUDE (key, sources_digest, options, computed_at_ns), "
        "k.sources_digest = d.digest AS current, k.computed_at_ns, k.options "
        "FROM internal.fleet_kept k JOIN ("
        "  SELECT run_id, md5(string_agg(source_id || '/' || CAST(ingested_at_ns AS VARCHAR), ',' "
        "  ORDER BY source_id)) AS digest FROM sources GROUP BY run_id"
        ") d USING (run_id) "
        "QUALIFY row_number() OVER (PARTITION BY k.run_id ORDER BY k.computed_at_ns DESC) = 1 "
        "ORDER BY k.run_id"
    )


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


def _remote_signature(lake_root) -> str:
    h = hashlib.sha256(b"\0sources\0")
    try:
        found = objstore.filesystem().find(
            f"{objstore.key(str(lake_root))}/sources", detail=True, withdirs=False
        )
    except Exception:
        found = {}
    for k in sorted(found):
        h.update(f"{k}\0{found[k].get('size')}\0{found[k].get('ETag')}\n".encode())
    return h.hexdigest()


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
