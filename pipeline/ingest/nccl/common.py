"""Shared pieces of the NCCL-family parsers (pipeline/ingest/nccl/): enum tables with their
sources, number and hash helpers, the column builder that shapes rows into schema-v2 frames (Rows,
LogParsed, finish), and infer_test, which names the nccl-tests binary of a results table for both
the text tables (log_nccl_tests.py) and the -J JSON (struct.py). The lenient JSON reader and the
restricted unpickler are in decode.py.

Format notes and sources: ../shared/reference/nccl.md (sections cited per table below).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from sys import intern

import polars as pl

from ... import catalog
from ... import schema as sch

# --- enums ---------------------------------------------------------------------------------------

#: ncclDataType_t id -> (name, bytes per element). Source: nccl.h(.in) `ncclDataType_t`, stable since
#: NCCL 2.0; bfloat16 (9) since 2.10, the two FP8 types (10, 11) since 2.24 (nccl.md section 1.7).
#: Sizes from pipeline/catalog/dtypes.toml, the one table of element sizes.
NCCL_DTYPES: dict[int, tuple[str, int]] = {
    i: (n, catalog.dtype_bytes(n))
    for i, n in enumerate(
        (
            "int8",
            "uint8",
            "int32",
            "uint32",
            "int64",
            "uint64",
            "float16",
            "float32",
            "float64",
            "bfloat16",
            "float8e4m3",
            "float8e5m2",
        )
    )
}

#: ncclRedOp_t id -> name (nccl.h `ncclRedOp_t`; avg since 2.10). Ids >= 5 are user-created
#: operators (ncclRedOpCreatePreMulSum, e.g. PyTorch's premul_sum): reported as "user".
NCCL_REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}

#: ncclResult_t (nccl.h.in; `-> N` in error chains). nccl.md section 1.2.
NCCL_RESULTS = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}

#: enum ibv_wc_status (rdma-core libibverbs/verbs.h), the `status=` of NET/IB completion errors.
IBV_WC_STATUS = {
    0: "SUCCESS",
    1: "LOC_LEN_ERR",
    2: "LOC_QP_OP_ERR",
    3: "LOC_EEC_OP_ERR",
    4: "LOC_PROT_ERR",
    5: "WR_FLUSH_ERR",
    6: "MW_BIND_ERR",
    7: "BAD_RESP_ERR",
    8: "LOC_ACCESS_ERR",
    9: "REM_INV_REQ_ERR",
    10: "REM_ACCESS_ERR",
    11: "REM_OP_ERR",
    12: "RETRY_EXC_ERR",
    13: "RNR_RETRY_EXC_ERR",
    14: "LOC_RDD_VIOL_ERR",
    15: "REM_INV_RD_REQ_ERR",
    16: "REM_ABORT_ERR",
    17: "INV_EECN_ERR",
    18: "INV_EEC_STATE_ERR",
    19: "FATAL_ERR",
    20: "RESP_TIMEOUT_ERR",
    21: "GENERAL_ERR",
}

#: Numeric algorithm / protocol ids of the 2.20-2.25 TUNING lines (nccl.md section 1.7).
NCCL_ALGOS = {
    0: "TREE",
    1: "RING",
    2: "COLLNET_DIRECT",
    3: "COLLNET_CHAIN",
    4: "NVLS",
    5: "NVLS_TREE",
    6: "PAT",
}
NCCL_PROTOS = {0: "LL", 1: "LL128", 2: "SIMPLE"}

#: Count multiplier from the API `count` to nccl-tests' message size S (nccl-tests doc/PERFORMANCE.md,
#: nccl.md sections 1.7 and 2.2): AllGather counts the send elements per rank, ReduceScatter the
#: receive elements per rank, AlltoAll the elements per peer; S is the whole buffer (x nranks).
TIMES_NRANKS_OPS = {"AllGather", "ReduceScatter", "AlltoAll", "Gather", "Scatter"}

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def findall_linear(plain: re.Pattern, at_run_start: re.Pattern, text: str) -> list[tuple]:
    """plain.findall(text) (for patterns with two or more groups) in time linear in the text.

    plain.findall tries a match at every position; a pattern that starts with a run such as
    `\\w+` then scans the rest of the run from each start inside it, which is quadratic in the
    run's length. at_run_start is the same pattern behind a lookbehind that refuses a start
    inside such a run (`(?<!\\w)`): a match from inside a run exists only if one from the run's
    start does (the run's class matches the prefix too), and findall would have found that one
    first. The exception is a run entered right where the previous match ended (`ranks 1ranks 1`):
    the plain pattern is tried there once.
    """
    out: list[tuple] = []
    pos = 0
    while pos <= len(text):
        m = plain.match(text, pos) or at_run_start.search(text, pos + 1)
        if m is None:
            break
        out.append(m.groups(default=""))
        pos = m.end() if m.end() > m.start() else m.end() + 1
    return out


def version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE -> 'X.Y.Z' (nccl.h: major*10000+minor*100+patch since 2.9,
    major*1000+minor*100+patch before)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def norm_hash(text) -> str | None:
    """A communicator hash (NCCL commId `0x49bb...`, RAS `fa93da...`, profiler CommHash decimal, int)
    as '0x' + lowercase hex without leading zeros; text that is not a number (masked '0x...') as given."""
    if text is None:
        return None
    if isinstance(text, int):
        return hex(text & (2**64 - 1))
    s = str(text).strip()
    try:
        if s.lower().startswith("0x"):
            return hex(int(s, 16))
        if s.isdigit():
            return hex(int(s))
        if re.fullmatch(r"[0-9a-fA-F]{8,16}", s):
            return hex(int(s, 16))
    except ValueError:
        pass
    return s


def pci_from_busid(text: str | None) -> str | None:
    """NCCL busId (int64 printed %lx, e.g. 'c8000' = domain 0, bus 0xc8, device 0, function 0; nccl
    src/misc/utils.cc busIdToInt64) -> 'dddd:bb:dd.f'. None when it is not hex (masked 'XXXX')."""
    if not text or not re.fullmatch(r"[0-9a-fA-F]+", text):
        return None
    v = int(text, 16)
    return f"{v >> 20:04x}:{(v >> 12) & 0xFF:02x}:{(v >> 4) & 0xFF:02x}.{v & 0xF:x}"


def to_int(s, lo_hi=INT64):
    """int(s) when it is an integer inside the range, else None."""
    try:
        v = int(s)
    except (TypeError, ValueError):
        return None
    return v if lo_hi[0] <= v <= lo_hi[1] else None


def to_float(s):
    """float(s), or None when it is not a number."""
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def dumps(obj) -> str:
    """Compact JSON text (detail columns)."""
    return json.dumps(obj, separators=(",", ":"), default=str)


# --- rows -> frames --------------------------------------------------------------------------------

_POLARS = {
    "int32": pl.Int32,
    "int64": pl.Int64,
    "uint64": pl.UInt64,
    "float64": pl.Float64,
    "string": pl.String,
    "bool": pl.Boolean,
    "list<int32>": pl.List(pl.Int32),
    "list<string>": pl.List(pl.String),
}
_RANGES = {"int32": INT32, "int64": INT64, "uint64": (0, 2**64 - 1)}


class TableFull(ValueError):
    """What a text log's parse holds to the end of the file reached MAX_HELD_BYTES (or a held
    table without a HeldBytes reached MAX_HELD_ROWS rows); the line that would add to it is kept
    as an nccl_events row of kind 'other' instead."""


#: Estimated bytes that one text log's parse may hold to the end of the file: the rows of the
#: tables that later lines still update (processes, channels, rings, net devices, nccl-tests
#: results, link rates) and the per-thread / process / device / communicator maps, nccl-tests runs
#: and tables. Counted in bytes, not rows (issue 39 item 3): a 450 MB log whose every line opens
#: a new process and communicator held 4.7 GB before a 2^20-row cap on each table and map held.
#: Measured: a results row is about 630 B, a channel row 460 B, a line that opens a process and
#: communicator 1.7 kB, which the estimate below matches within about 20 %.
MAX_HELD_BYTES = 512 << 20
HELD_ROW_BYTES = 64  # a held row's list object, besides 8 bytes a column and its values
HELD_VALUE_BYTES = 24  # a value's object (int, float) besides a string's characters
HELD_ENTRY_BYTES = 256  # one key of a held map: its key tuple, dict slot and the small object it maps to
#: Rows of a held table without a HeldBytes (the whole-file parsers: Flight Recorder, RAS, ...).
MAX_HELD_ROWS = 1 << 20
#: An append-only table's rows are built into one frame and handed to its spool
#: (pipeline/ingest/spool.py) every SPILL_ROWS rows, or sooner once they hold SPILL_BYTES (8 MiB
#: lines: 16,384 of them would be 128 GiB).
SPILL_ROWS = 1 << 14
SPILL_BYTES = 16 << 20


def held_bytes(v) -> int:
    """Estimated bytes of one value held in a row or map: HELD_VALUE_BYTES, plus a string's length
    or a list's 8 bytes an item and its items; 0 for None."""
    if v is None:
        return 0
    t = type(v)
    if t is str:
        return HELD_VALUE_BYTES + len(v)
    if t is list or t is tuple:
        return 56 + sum(8 + held_bytes(x) for x in v)
    return HELD_VALUE_BYTES


class HeldBytes:
    """The estimated bytes one parse holds to the end of its file (MAX_HELD_BYTES, read when it is
    made), shared by its held tables and maps.

    A line is taken whole or not at all: the first charge() after begin_line() raises TableFull
    when it would pass the limit (before the line changed any held state: every row and map entry
    is charged before it is added), and the line's later charges do not raise. The bytes held can
    thus pass the limit by one line's worth at most. Once `closing` is set nothing raises: the
    end-of-file steps add at most a row per entry already counted."""

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = MAX_HELD_BYTES if limit_bytes is None else limit_bytes
        self.used_bytes = 0
        self.closing = False
        self.checked = False  # the current line passed its check

    def begin_line(self) -> None:
        self.checked = False

    def charge(self, n_bytes: int, what: str) -> None:
        if not (self.closing or self.checked):
            if self.used_bytes + n_bytes > self.limit_bytes:
                raise TableFull(f"{what}: past {self.limit_bytes} bytes held to the end of the file")
            self.checked = True
        self.used_bytes += n_bytes


class Rows:
    """Rows of one lake table (schema-v2 columns, without run_id/source_id), each a list in column
    order (a third of a dict's size: held tables keep every row to the end of the file). Missing
    columns are nulls; a column the table does not have raises KeyError when the row is added.

    Two kinds. Held (spool None): every row can be read and updated by index until the end of the
    file; each row and each value written is charged to `held` (a HeldBytes shared by the tables
    of one parse; TableFull past its limit), or without one at most MAX_HELD_ROWS rows. Spooled
    (an append-only table such as nccl_events, given a spool._Spool): every SPILL_ROWS rows, or
    SPILL_BYTES of them, are built into one typed frame and handed to the spool, which keeps
    frames in memory up to its byte budget and then on disk; only the last, unbuilt rows can be
    read by index. `track` names columns whose distinct non-null values stay known (values())
    after their rows are built.
    """

    def __init__(self, table: str, spool=None, track: tuple[str, ...] = (), held: HeldBytes | None = None):
        self.table = table
        cols = [c for c in sch.tables()[table].columns if c.name not in ("run_id", "source_id")]
        self.types = {c.name: c.type for c in cols}
        self.pos = {c: i for i, c in enumerate(self.types)}
        self.rows: list[list] = []
        self.spool = spool
        self.base = 0  # rows already built and spooled
        self.seen: dict[str, set] = {c: set() for c in track}
        self.bad: dict[str, int] = {}  # column -> integers outside its range, stored as null
        self.held = held if spool is None else None
        self.row_bytes = HELD_ROW_BYTES + 8 * len(self.pos)
        self.pending_bytes = 0  # estimated bytes of a spooled table's unbuilt rows

    @property
    def n(self) -> int:
        return self.base + len(self.rows)

    def add(self, **kw) -> int:
        """Append one row; returns its index. Raises TableFull when a held table is full (its
        HeldBytes past the limit, or MAX_HELD_ROWS rows without one); the row is then not added."""
        if self.spool is None:
            if self.held is not None:
                self.held.charge(self.row_bytes, self.table)
            elif len(self.rows) >= MAX_HELD_ROWS:
                raise TableFull(f"{self.table} holds {MAX_HELD_ROWS} rows")
            # held to the end: share the many equal short strings (host, via, ...)
            kw = {k: intern(v) if type(v) is str and len(v) <= 64 else v for k, v in kw.items()}
        row = [None] * len(self.pos)
        self._put(row, kw)
        self.rows.append(row)
        if self.spool is not None:
            self.pending_bytes += self.row_bytes
            if len(self.rows) >= SPILL_ROWS or self.pending_bytes >= SPILL_BYTES:
                self._spill()
        return self.n - 1

    def _put(self, row: list, kw: dict, only_null: bool = False) -> None:
        """Write kw's values into `row` (only_null: only where the row holds None), charging each
        new value's held_bytes to the HeldBytes, or to the unbuilt rows' bytes when spooled."""
        pos = self.pos
        todo, cost = [], 0
        for k, v in kw.items():
            i = pos.get(k)
            if i is None:
                raise KeyError(f"{self.table} has no column {k!r}")
            if not only_null or (v is not None and row[i] is None):
                if v is not None and v is not row[i]:
                    cost += held_bytes(v)
                todo.append((i, v))
        if self.held is not None:
            if cost:
                self.held.charge(cost, self.table)  # before the row changes
        elif self.spool is not None:
            self.pending_bytes += cost
        for i, v in todo:
            row[i] = v

    def _spill(self) -> None:
        frame = self._build(self.rows)
        for c, s in self.seen.items():
            s.update(frame.get_column(c).drop_nulls().unique().to_list())
        self.spool.add(frame.to_arrow())
        self.base += len(self.rows)
        self.rows = []
        self.pending_bytes = 0

    def get(self, i: int, col: str):
        return self.rows[self._at(i)][self.pos[col]]

    def set(self, i: int, **kw) -> None:
        self._put(self.rows[self._at(i)], kw)

    def fill(self, i: int, **kw) -> None:
        """Set the columns that are still null."""
        self._put(self.rows[self._at(i)], kw, only_null=True)

    def _at(self, i: int) -> int:
        if i < self.base:
            raise IndexError(f"{self.table} row {i} is already built")
        return i - self.base

    def column(self, col: str) -> list:
        """The column's values of the rows not yet built (all rows of a held table)."""
        k = self.pos[col]
        return [r[k] for r in self.rows]

    def values(self, col: str) -> set:
        """Distinct non-null values of a column over every row (a tracked column when spooled)."""
        if self.spool is not None and col not in self.seen:
            raise KeyError(f"{self.table}.{col} is not tracked")
        return self.seen.get(col, set()) | {v for v in self.column(col) if v is not None}

    def _build(self, rows: list[list]) -> pl.DataFrame:
        """Rows as a polars frame typed like the schema. Integers outside their column's range
        become null (counted in self.bad)."""
        cols = list(zip(*rows)) if rows else [()] * len(self.types)
        series = []
        for (c, t), vals in zip(self.types.items(), cols):
            try:
                series.append(pl.Series(c, vals, dtype=_POLARS[t], strict=True))
                continue
            except (OverflowError, TypeError, ValueError, pl.exceptions.PolarsError):
                pass
            lst = list(vals)
            lo, hi = _RANGES.get(t, (None, None))
            bad = 0
            if lo is not None:
                for k, v in enumerate(lst):
                    if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
                        lst[k], bad = None, bad + 1
            if bad:
                self.bad[c] = self.bad.get(c, 0) + bad
            series.append(pl.Series(c, lst, dtype=_POLARS[t], strict=False))
        return pl.DataFrame(series)

    def _notes(self, notes: list[str] | None) -> None:
        if notes is not None:
            for c, bad in self.bad.items():
                notes.append(f"{self.table}.{c}: {bad} values outside {self.types[c]} stored as null")
        self.bad = {}

    def frame(self, notes: list[str] | None = None):
        """A held table: its rows as one polars frame typed like the schema (integers outside
        their column's range become null, one note per column). A spooled table: the spool,
        after the last rows are built into it (iterate it for the frames, in order)."""
        if self.spool is not None:
            if self.rows:
                self._spill()
            self._notes(notes)
            return self.spool
        out = self._build(self.rows)
        self._notes(notes)
        return out


@dataclass
class LogParsed:
    """Result of pipeline.ingest.nccl.parse: lake tables (without run_id/source_id), file facts, notes."""

    format: str
    tables: dict[str, object]  # pl.DataFrame, or a spool of them (Rows.frame) from parse_stream
    host: str | None = None
    world_size: int | None = None
    tool_versions: dict = field(default_factory=dict)
    event_count: int = 0
    notes: list[str] = field(default_factory=list)

    def close(self) -> None:
        """Release the spools among the tables (their files in the spool directory)."""
        for v in self.tables.values():
            if not isinstance(v, pl.DataFrame):
                v.close()


def finish(
    fmt: str,
    rows: dict[str, Rows],
    notes: list[str],
    tool_versions: dict,
    event_count: int,
    hosts: set | None = None,
    world_size: int | None = None,
) -> LogParsed:
    """Frames of the non-empty tables, and the single host when exactly one was seen."""
    tables = {name: r.frame(notes) for name, r in rows.items() if r.n}
    hs = {h for h in (hosts or ()) if h}
    ws = world_size if world_size is not None and 0 < world_size < 2**31 else None
    return LogParsed(
        fmt,
        tables,
        next(iter(hs)) if len(hs) == 1 else None,
        ws,
        {k: v for k, v in tool_versions.items() if v is not None},
        event_count,
        notes,
    )


# --- nccl-tests --------------------------------------------------------------------------------------

REDUCTIONS = {"sum", "prod", "max", "min", "avg", "premulsum", "mulsum"}


def infer_test(rows: list[tuple], n: int | None, has_redop: bool, has_root: bool) -> str | None:
    """nccl-tests binary from a table without a 'Collective test starting' line, by the size
    definitions of doc/PERFORMANCE.md (nccl.md 2.2): S = count x typesize for all_reduce, broadcast,
    reduce and sendrecv; S = count x typesize x n for reduce_scatter (and for all_gather/alltoall/
    gather/scatter, which this cannot tell apart: None). rows: (size, count, dtype_bytes, redop, root)."""
    ratios = {size / (count * tb) for size, count, tb, _, _ in rows if count and tb}
    if len(ratios) != 1:
        return None
    ratio = ratios.pop()
    redops = {r for _, _, _, r, _ in rows}
    roots = {r for _, _, _, _, r in rows}
    reduces = bool(redops) and all(r in REDUCTIONS for r in redops)
    if ratio == 1:
        if reduces and has_redop:
            return (
                "reduce_perf"
                if has_root and all(r is not None and r >= 0 for r in roots)
                else "all_reduce_perf"
            )
        if has_root and roots and all(r is not None and r >= 0 for r in roots):
            return "broadcast_perf"
        if has_root and roots == {-1} and not has_redop:
            return None
        if redops <= {"none", None} and roots <= {-1, None} and has_redop:
            return "sendrecv_perf"
        return None
    if n and n > 1 and ratio == n and reduces and has_redop:
        return "reduce_scatter_perf"
    return None
