"""PyTorch Flight Recorder dumps (pickle, JSON, unpickled repr; nccl.md 3.4, checked against
torch/csrc/distributed/c10d/FlightRecorderDetail.hpp) -> flight_recorder (one row per entry) and
flight_recorder_groups; the torchfrtrace analyzer's text report -> flight_recorder_mismatches.
"""

from __future__ import annotations

import math
import os
import re

from ..errors import TraceError
from .common import INT32, LogParsed, Rows, TableFull, dumps, finish, to_float, to_int

_RANK_IN_NAME = re.compile(r"(\d+)$")


def rank_from_name(name: str) -> int | None:
    """Trailing number of a dump's file name without extensions (<prefix><rank>: nccl_trace_rank_3,
    trace_0.json)."""
    base = os.path.basename(name or "")
    while True:
        stem, ext = os.path.splitext(base)
        if ext.lower() in (".json", ".pkl", ".pickle", ".txt", ".gz", ".pt") and stem:
            base = stem
        else:
            break
    m = _RANK_IN_NAME.search(base)
    return to_int(m.group(1), INT32) if m else None


def _str(v) -> str | None:
    """str(v); None for None and for what str() cannot render (an int past Python's 4,300-digit
    limit, alone or inside a container)."""
    if v is None:
        return None
    try:
        return str(v)
    except ValueError:
        return None


def _ranks(text) -> list[int] | None:
    if text is None:
        return None
    if isinstance(text, (list, tuple, set, frozenset)):
        vals = [to_int(x, INT32) for x in text]
    else:
        vals = [to_int(x, INT32) for x in re.findall(r"-?\d+", _str(text) or "")]
    return [v for v in vals if v is not None]


def _numel(sizes) -> int | None:
    """The element total of a list of shapes; None unless every dimension is an int and the total
    stays under 2^63 (checked at each product: a shape of 200 20,000-bit ints would otherwise be
    multiplied out, for minutes)."""
    if not isinstance(sizes, (list, tuple)):
        return None
    total = 0
    for shape in sizes:
        if not isinstance(shape, (list, tuple)):
            return None
        n = 1
        for d in shape:
            if not isinstance(d, int) or not -(2**63) < d < 2**63:
                return None
            n *= d
            if not -(2**63) < n < 2**63:
                return None
        total += n
        if not -(2**63) < total < 2**63:
            return None
    return total if total < 2**63 else None


def _ns_from_ms(v) -> int | None:
    f = to_float(v) if not isinstance(v, bool) else None
    if f is None or not math.isfinite(f):
        return None
    ns = round(f * 1_000_000)
    return ns if abs(ns) < 2**63 else None


def _nz(v) -> int | None:
    """An epoch-ns field: None and the JSON dump's 0 (absent) become None."""
    x = to_int(v) if not isinstance(v, bool) else None
    return x if x else None


def _strlist(v) -> list[str] | None:
    if not isinstance(v, (list, tuple)):
        return None
    return [_str(x) for x in v]


def _frame_text(f) -> str | None:
    if isinstance(f, dict):
        return f"{_str(f.get('name'))} at {_str(f.get('filename'))}:{_str(f.get('line'))}"
    return _str(f)


# --- Flight Recorder -------------------------------------------------------------------------------


def flight_recorder(obj, name: str, notes: list[str], budget_bytes: int | None = None) -> LogParsed:
    """A Flight Recorder dump (dict: version, pg_config, pg_status, entries[...]; nccl.md 3.4) ->
    flight_recorder (one row per entry) and flight_recorder_groups. Raises TraceError when `obj`
    is not shaped like a dump.

    budget_bytes: the most bytes (4 a rank) that the groups' rank lists may fill, repeated on each
    entry of the group (pg_ranks; a 10 MB ranks string named by 100,000 entries would be a
    terabyte); past it pg_ranks is left null, with a note. None: no bound. An entry whose values
    cannot be read (an int past 4,300 digits in its sizes) is skipped, with a note."""
    if not isinstance(obj, dict) or not ({"entries", "pg_config", "pg_status"} & set(obj)):
        if any("truncated" in n for n in notes):
            raise TraceError("truncated JSON: no complete Flight Recorder entry")
        raise TraceError("not a Flight Recorder dump (no entries, pg_config or pg_status)")
    rank = rank_from_name(name)
    version = _str(obj.get("version"))
    pg_config = obj.get("pg_config") if isinstance(obj.get("pg_config"), dict) else {}
    pg_status = obj.get("pg_status") if isinstance(obj.get("pg_status"), dict) else {}
    entries = obj.get("entries") or []
    if not isinstance(entries, (list, tuple)):
        raise TraceError("Flight Recorder dump: 'entries' is not a list")
    fr, groups = Rows("flight_recorder"), Rows("flight_recorder_groups")
    name_of_id: dict[int, tuple] = {}
    ranks_of = _GroupRanks(pg_config, budget_bytes)
    bad = unreadable = 0
    for e in entries:
        if not isinstance(e, dict):
            bad += 1
            continue
        try:
            fr.add(**_entry_row(e, rank, version, ranks_of, name_of_id))
        except TableFull:
            raise
        except (ValueError, TypeError, OverflowError):
            unreadable += 1
    if bad:
        notes.append(f"{bad} Flight Recorder entries are not dicts and were skipped")
    if unreadable:
        notes.append(f"{unreadable} Flight Recorder entries hold values that cannot be read and were skipped")
    if ranks_of.dropped:
        notes.append(
            f"pg_ranks left null on {ranks_of.dropped} entries: the group ranks repeated on each entry "
            f"pass {budget_bytes} bytes"
        )
    _add_groups(groups, pg_config, pg_status, name_of_id, rank, version)
    versions = {"flight_recorder_version": version}
    if obj.get("comm_lib_version"):
        versions["nccl_version"] = _str(obj["comm_lib_version"])
    sizes = [len(r) for r in groups.column("ranks") if r]
    return finish(
        "flight_recorder",
        {"flight_recorder": fr, "flight_recorder_groups": groups},
        notes,
        versions,
        len(entries),
        None,
        max(sizes) if sizes else None,
    )


class _GroupRanks:
    """pg_ranks of an entry by its group name: each group's ranks parsed once, and their total over
    the entries bounded by budget_bytes (4 bytes a rank; None: no bound)."""

    def __init__(self, pg_config: dict, budget_bytes: int | None):
        self.pg_config, self.budget_bytes = pg_config, budget_bytes
        self.parsed: dict[str, list[int] | None] = {}
        self.used_bytes = 0
        self.dropped = 0

    def __call__(self, pg_name: str | None) -> list[int] | None:
        if pg_name is None:
            return None
        if pg_name not in self.parsed:
            cfg = self.pg_config.get(pg_name)
            self.parsed[pg_name] = _ranks(cfg.get("ranks")) if isinstance(cfg, dict) else None
        ranks = self.parsed[pg_name]
        if ranks and self.budget_bytes is not None:
            self.used_bytes += 4 * len(ranks)
            if self.used_bytes > self.budget_bytes:
                self.dropped += 1
                return None
        return ranks


def _entry_row(e: dict, rank, version, ranks_of: _GroupRanks, name_of_id: dict) -> dict:
    """The flight_recorder row of one entry; records the entry's process group in `name_of_id`."""
    pg = e.get("process_group")
    pg_name, pg_desc = (
        (_str(pg[0]), _str(pg[1])) if isinstance(pg, (list, tuple)) and len(pg) >= 2 else (_str(pg), None)
    )
    pg_id = to_int(e.get("pg_id"))
    if pg_id is not None and pg_name is not None:
        name_of_id.setdefault(pg_id, (pg_name, pg_desc))
    pname = e.get("profiling_name")
    op = None
    if isinstance(pname, str):
        op = pname.split(":", 1)[-1].split(" ", 1)[0] or None
    frames = e.get("frames")
    return dict(
        rank=rank,
        version=version,
        record_id=to_int(e.get("record_id")),
        pg_id=pg_id,
        pg_name=pg_name,
        pg_desc=pg_desc,
        pg_ranks=ranks_of(pg_name),
        collective_seq_id=to_int(e.get("collective_seq_id")),
        p2p_seq_id=to_int(e.get("p2p_seq_id")),
        op_id=to_int(e.get("op_id")),
        profiling_name=_str(pname),
        op=op,
        is_p2p=e.get("is_p2p") if isinstance(e.get("is_p2p"), bool) else None,
        state=_str(e.get("state")),
        time_created_ns=_nz(e.get("time_created_ns")),
        time_discovered_started_ns=_nz(e.get("time_discovered_started_ns")),
        time_discovered_completed_ns=_nz(e.get("time_discovered_completed_ns")),
        duration_ns=_ns_from_ms(e.get("duration_ms")),
        retired=e.get("retired") if isinstance(e.get("retired"), bool) else None,
        timeout_ns=_ns_from_ms(e.get("timeout_ms")),
        input_sizes=dumps(e["input_sizes"]) if e.get("input_sizes") is not None else None,
        output_sizes=dumps(e["output_sizes"]) if e.get("output_sizes") is not None else None,
        input_dtypes=_strlist(e.get("input_dtypes")),
        output_dtypes=_strlist(e.get("output_dtypes")),
        input_numel=_numel(e.get("input_sizes")),
        output_numel=_numel(e.get("output_sizes")),
        frames=[_frame_text(f) for f in frames] if isinstance(frames, (list, tuple)) else None,
        thread_id=_str(e.get("thread_id")),
        thread_name=_str(e.get("thread_name")),
    )


def _add_groups(groups: Rows, pg_config: dict, pg_status: dict, name_of_id: dict, rank, version) -> None:
    """flight_recorder_groups: a row per pg_config entry (with its pg_status), then the pg_status
    entries without a config."""
    id_of_name = {v[0]: k for k, v in name_of_id.items()}
    done_ids = set()
    for key, cfg in pg_config.items():
        cfg = cfg if isinstance(cfg, dict) else {}
        pname = _str(cfg.get("name", key))
        pid = id_of_name.get(pname)
        st = pg_status.get(str(pid)) if pid is not None else None
        if st is not None:
            done_ids.add(str(pid))
        ranks = _ranks(cfg.get("ranks"))
        groups.add(
            rank=rank,
            version=version,
            pg_id=pid,
            pg_name=pname,
            pg_desc=_str(cfg.get("desc")),
            ranks=ranks,
            group_size=len(ranks) if ranks is not None else None,
            **_status(st),
        )
    for key, st in pg_status.items():
        if _str(key) in done_ids:
            continue
        pid = to_int(key)
        nm = name_of_id.get(pid, (None, None))
        groups.add(rank=rank, version=version, pg_id=pid, pg_name=nm[0], pg_desc=nm[1], **_status(st))


def _status(st) -> dict:
    if not isinstance(st, dict):
        return {}
    return {
        k: to_int(st.get(k))
        for k in ("last_enqueued_collective", "last_started_collective", "last_completed_collective")
    }


# --- torchfrtrace report ------------------------------------------------------------------------------

FR_SEQ = re.compile(r"(?:collective|sequence number:)\s*(\d+)")
FR_ENTRY = re.compile(r"at entry (\d+)")
FR_KEY = re.compile(
    r"(?P<key>internal record id|group info|collective|missing ranks|total input numel|"
    r"total output numel|input sizes|output sizes|world size|expected ranks|collective state|"
    r"error msg|collective stack trace)\s*:\s*(?P<val>.*)$"
)


def torchfrtrace_report(text: str, notes: list[str]) -> LogParsed:
    """torchfrtrace (PyTorch flight_recorder analyzer) text output -> flight_recorder_mismatches:
    a finding starts at a non-indented line that is not 'key: value' (e.g. 'Not all ranks joining
    collective 5 at entry 4'); the known key lines and the indented stack lines that follow belong
    to it. Other lines become no rows but are counted in the notes."""
    out = Rows("flight_recorder_mismatches")
    cur = None
    in_stack = False
    other = 0
    lines = text.split("\n")
    for i, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        s = line.strip()
        if s.startswith("$") or s.startswith("torchfrtrace"):
            continue  # the command line
        if cur is not None and in_stack and line[:1].isspace():
            frames = out.get(cur, "frames")
            if frames is None:
                out.set(cur, frames=[s])
            else:
                frames.append(s)  # in place: a copy per stack line was quadratic in the lines
            continue
        mk = FR_KEY.match(s)
        if cur is not None and mk:
            key, val = mk.group("key"), mk.group("val").strip()
            in_stack = key == "collective stack trace"
            if key == "internal record id":
                out.set(cur, record_id=to_int(val))
            elif key == "group info":
                a, _, b = val.partition(":")
                out.set(cur, pg_name=a or None, pg_desc=b or None)
            elif key == "collective":
                out.set(cur, profiling_name=val)
            elif key == "missing ranks":
                out.set(cur, missing_ranks=_ranks(val))
            elif key in ("input sizes", "output sizes"):
                out.set(cur, **{key.replace(" ", "_"): val})
            elif key in ("world size", "expected ranks"):
                if re.fullmatch(r"\d+", val):
                    out.set(cur, world_size=to_int(val, INT32))
                else:
                    rk = _ranks(val)
                    out.set(cur, expected_ranks=rk)
                    if out.get(cur, "world_size") is None and rk:
                        out.set(cur, world_size=len(rk))
            elif key == "collective state":
                out.set(cur, state=val)
            elif key == "error msg":
                out.set(cur, error=val)
            elif key == "collective stack trace" and val:
                out.set(cur, frames=[val])
            continue
        if not line[:1].isspace() and s[:1].isupper() and not mk:
            ms, me = FR_SEQ.search(s), FR_ENTRY.search(s)
            cur = out.add(
                line_no=i,
                message=s,
                collective_seq_id=to_int(ms.group(1)) if ms else None,
                record_id=to_int(me.group(1)) if me else None,
            )
            in_stack = False
            continue
        other += 1
    if not out.n:
        raise TraceError("no torchfrtrace findings found")
    if other:
        notes.append(f"{other} report lines not recognized (not stored)")
    return finish("torchfrtrace", {"flight_recorder_mismatches": out}, notes, {}, len(lines))
