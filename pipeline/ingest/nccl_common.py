"""Shared pieces of the NCCL-family parsers (pipeline/ingest/nccl*.py): enum tables with their
sources, the column builder that shapes rows into schema-v1 frames, a lenient JSON reader for
truncated or Python-literal dumps, and the restricted unpickler for Flight Recorder dumps.

Format notes and sources: ../shared/reference/nccl.md (sections cited per table below).
"""

from __future__ import annotations

import ast
import json
import pickle
import re
from dataclasses import dataclass, field

import msgspec
import polars as pl

from .. import catalog
from .. import schema as sch
from .errors import TraceError

# --- enums ---------------------------------------------------------------------------------------

#: ncclDataType_t id -> (name, bytes per element). Source: nccl.h(.in) `ncclDataType_t`, stable since
#: NCCL 2.0; bfloat16 (9) since 2.10, the two FP8 types (10, 11) since 2.24 (nccl.md section 1.7).
#: Sizes from pipeline/catalog/dtypes.toml, the one table of element sizes.
NCCL_DTYPES: dict[int, tuple[str, int]] = {
    i: (n, catalog.dtype_bytes(n)) for i, n in enumerate(
        ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
         "float8e4m3", "float8e5m2"))
}

#: ncclRedOp_t id -> name (nccl.h `ncclRedOp_t`; avg since 2.10). Ids >= 5 are user-created
#: operators (ncclRedOpCreatePreMulSum, e.g. PyTorch's premul_sum): reported as "user".
NCCL_REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}

#: ncclResult_t (nccl.h.in; `-> N` in error chains). nccl.md section 1.2.
NCCL_RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
                4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
                8: "ncclTimeout"}

#: enum ibv_wc_status (rdma-core libibverbs/verbs.h), the `status=` of NET/IB completion errors.
IBV_WC_STATUS = {0: "SUCCESS", 1: "LOC_LEN_ERR", 2: "LOC_QP_OP_ERR", 3: "LOC_EEC_OP_ERR", 4: "LOC_PROT_ERR",
                 5: "WR_FLUSH_ERR", 6: "MW_BIND_ERR", 7: "BAD_RESP_ERR", 8: "LOC_ACCESS_ERR",
                 9: "REM_INV_REQ_ERR", 10: "REM_ACCESS_ERR", 11: "REM_OP_ERR", 12: "RETRY_EXC_ERR",
                 13: "RNR_RETRY_EXC_ERR", 14: "LOC_RDD_VIOL_ERR", 15: "REM_INV_RD_REQ_ERR", 16: "REM_ABORT_ERR",
                 17: "INV_EECN_ERR", 18: "INV_EEC_STATE_ERR", 19: "FATAL_ERR", 20: "RESP_TIMEOUT_ERR",
                 21: "GENERAL_ERR"}

#: Numeric algorithm / protocol ids of the 2.20-2.25 TUNING lines (nccl.md section 1.7).
NCCL_ALGOS = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN", 4: "NVLS", 5: "NVLS_TREE", 6: "PAT"}
NCCL_PROTOS = {0: "LL", 1: "LL128", 2: "SIMPLE"}

#: Count multiplier from the API `count` to nccl-tests' message size S (nccl-tests doc/PERFORMANCE.md,
#: nccl.md sections 1.7 and 2.2): AllGather counts the send elements per rank, ReduceScatter the
#: receive elements per rank, AlltoAll the elements per peer; S is the whole buffer (x nranks).
TIMES_NRANKS_OPS = {"AllGather", "ReduceScatter", "AlltoAll", "Gather", "Scatter"}

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE -> 'X.Y.Z' (nccl.h: major*10000+minor*100+patch since 2.9, major*1000+minor*100+patch before)."""
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
    return f"{v >> 20:04x}:{(v >> 12) & 0xff:02x}:{(v >> 4) & 0xff:02x}.{v & 0xf:x}"


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

_POLARS = {"int32": pl.Int32, "int64": pl.Int64, "uint64": pl.UInt64, "float64": pl.Float64, "string": pl.String,
           "bool": pl.Boolean, "list<int32>": pl.List(pl.Int32), "list<string>": pl.List(pl.String)}
_RANGES = {"int32": INT32, "int64": INT64, "uint64": (0, 2**64 - 1)}


class Rows:
    """Rows of one lake table (dicts keyed by the table's schema-v1 columns, without run_id/source_id).
    Missing keys are nulls; a key that is not a column raises KeyError when the frame is built."""

    def __init__(self, table: str):
        self.table = table
        cols = [c for c in sch.tables()[table].columns if c.name not in ("run_id", "source_id")]
        self.types = {c.name: c.type for c in cols}
        self.rows: list[dict] = []

    @property
    def n(self) -> int:
        return len(self.rows)

    def add(self, **kw) -> int:
        """Append one row; returns its index."""
        self.rows.append(kw)
        return len(self.rows) - 1

    def get(self, i: int, col: str):
        return self.rows[i].get(col)

    def set(self, i: int, **kw) -> None:
        self.rows[i].update(kw)

    def fill(self, i: int, **kw) -> None:
        """Set the columns that are still null."""
        row = self.rows[i]
        for k, v in kw.items():
            if v is not None and row.get(k) is None:
                row[k] = v

    def column(self, col: str) -> list:
        return [r.get(col) for r in self.rows]

    def frame(self, notes: list[str] | None = None) -> pl.DataFrame:
        """The rows as a polars frame typed like the schema. Integers outside their column's range
        become null (one note per column)."""
        extra = set().union(*self.rows) - set(self.types) if self.rows else set()
        if extra:
            raise KeyError(f"{self.table} has no column(s) {sorted(extra)}")
        schema = {c: _POLARS[t] for c, t in self.types.items()}
        try:
            return pl.from_dicts(self.rows, schema=schema, strict=True) if self.rows else pl.DataFrame(schema=schema)
        except (OverflowError, TypeError, ValueError, pl.exceptions.PolarsError):
            pass
        series = []
        for c, t in self.types.items():
            lst = self.column(c)
            lo, hi = _RANGES.get(t, (None, None))
            bad = 0
            if lo is not None:
                for k, v in enumerate(lst):
                    if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
                        lst[k], bad = None, bad + 1
            if notes is not None and bad:
                notes.append(f"{self.table}.{c}: {bad} values outside {t} stored as null")
            series.append(pl.Series(c, lst, dtype=_POLARS[t], strict=False))
        return pl.DataFrame(series)


@dataclass
class LogParsed:
    """Result of pipeline.ingest.nccl.parse: lake tables (without run_id/source_id), file facts, notes."""
    format: str
    tables: dict[str, pl.DataFrame]
    host: str | None = None
    world_size: int | None = None
    tool_versions: dict = field(default_factory=dict)
    event_count: int = 0
    notes: list[str] = field(default_factory=list)


def finish(fmt: str, rows: dict[str, Rows], notes: list[str], tool_versions: dict, event_count: int,
           hosts: set | None = None, world_size: int | None = None) -> LogParsed:
    """Frames of the non-empty tables, and the single host when exactly one was seen."""
    tables = {name: r.frame(notes) for name, r in rows.items() if r.n}
    hs = {h for h in (hosts or ()) if h}
    ws = world_size if world_size is not None and 0 < world_size < 2**31 else None
    return LogParsed(fmt, tables, next(iter(hs)) if len(hs) == 1 else None, ws,
                     {k: v for k, v in tool_versions.items() if v is not None}, event_count, notes)


# --- lenient JSON --------------------------------------------------------------------------------

_TOK = re.compile(r"""\s*(?:
    (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<sstr>'(?:[^'\\\n]|\\.)*')
  | (?P<hex>0[xX][0-9a-fA-F]+\b)
  | (?P<num>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<punct>[{}\[\](),:])
  | (?P<ell>\.\.\.|…)
  | (?P<word>[A-Za-z_][\w.+-]*)
)""", re.VERBOSE)
_WORDS = {"true": "true", "false": "false", "null": "null", "True": "true", "False": "false", "None": "null",
          "NaN": "null", "nan": "null", "Infinity": "null", "-Infinity": "null"}


def lenient_json(text: str, notes: list[str]):
    """Decode JSON, or the near-JSON NCCL/PyTorch tools write, into Python objects.

    Strict JSON goes through msgspec. Otherwise the text is re-tokenized: Python tuples `( )`
    become arrays, single-quoted strings, True/False/None and bare words (2.28-2.29 profiler
    plugin's `ncclFloat32`, `0x5020...`) become JSON values, `...` elisions and trailing commas are
    dropped, and a truncated document is cut after its last complete element (of a top-level
    array, of an array that is a member of the top-level object such as a dump's entries, or a
    top-level member) and closed. Each repair adds a note.
    Raises TraceError (one line) when nothing usable remains.
    """
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        pass
    out: list[str] = []
    stack: list[str] = []  # '{' or '['
    expect_key: list[bool] = []
    safe = None  # (len(out), stack copy, expect copy)
    repairs: set[str] = set()
    pos, n = 0, len(text)
    truncated = False

    def value_done():
        nonlocal safe
        if stack and stack[-1] == "{":
            expect_key[-1] = True
        # a safe cut: after an element of an array at depth <= 2 (a top-level event list, a dump's
        # entries) or after a member of the top-level object - never inside a half-read element
        if len(stack) == 1 or (len(stack) == 2 and stack[-1] == "["):
            safe = (len(out), list(stack), list(expect_key))

    while pos < n:
        m = _TOK.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            if text[pos:].lstrip()[:1] in ("\"", "'"):
                truncated = True  # unterminated string at the end
                break
            raise TraceError(f"not valid JSON (unexpected {text[pos:].lstrip()[:20]!r} at offset {pos})")
        pos = m.end()
        kind = m.lastgroup
        tok = m.group(kind)
        if kind == "punct":
            if tok in "{[(":
                out.append("{" if tok == "{" else "[")
                stack.append("{" if tok == "{" else "[")
                expect_key.append(tok == "{")
                if tok == "(":
                    repairs.add("Python tuples read as arrays")
            elif tok in "}])":
                if not stack:
                    raise TraceError(f"not valid JSON (unbalanced {tok!r} at offset {m.start(kind)})")
                while out and out[-1] == ",":
                    out.pop()
                    repairs.add("trailing commas dropped")
                out.append("}" if stack[-1] == "{" else "]")
                stack.pop()
                expect_key.pop()
                value_done()
            elif tok == ",":
                if out and out[-1] not in (",", "[", "{"):
                    out.append(",")
            else:  # ':'
                out.append(":")
                if expect_key:
                    expect_key[-1] = False
            continue
        if kind == "ell":
            repairs.add("'...' elisions dropped")
            continue
        if kind == "str":
            out.append(tok)
        elif kind == "sstr":
            try:
                out.append(json.dumps(ast.literal_eval(tok)))
            except (ValueError, SyntaxError):
                out.append(json.dumps(tok[1:-1]))
            repairs.add("single-quoted strings read")
        elif kind == "num":
            out.append(tok)
        elif kind == "hex":
            out.append(json.dumps(tok))
            repairs.add("bare words read as strings")
        else:
            if tok in _WORDS:
                out.append(_WORDS[tok])
                if tok not in ("true", "false", "null"):
                    repairs.add("Python literals read as JSON")
            else:
                out.append(json.dumps(tok))
                repairs.add("bare words read as strings")
        if stack and stack[-1] == "{" and expect_key[-1]:
            continue  # a key: the pair completes with its value
        value_done()
    if stack or truncated:
        if safe is None:
            raise TraceError("truncated JSON: no complete element")
        k, st, _ = safe
        del out[k:]
        while out and out[-1] in (",", ":"):
            out.pop()
        if out and st and st[-1] == "{" and out[-1].startswith('"') and (len(out) < 2 or out[-2] in ("{", ",")):
            out.pop()  # a dangling key
            while out and out[-1] == ",":
                out.pop()
        for s in reversed(st):
            out.append("}" if s == "{" else "]")
        repairs.add("truncated: cut after the last complete element")
    try:
        obj = msgspec.json.decode("".join(out))
    except msgspec.DecodeError as e:
        raise TraceError(f"not valid JSON ({e})") from None
    if repairs:
        notes.append("lenient JSON: " + "; ".join(sorted(repairs)))
    return obj


# --- restricted unpickling ------------------------------------------------------------------------

def _plain_list(*args):
    return list(args[0]) if args else []


#: The only globals a Flight Recorder pickle may name. torch's C++ pickler writes generic dicts,
#: lists, tuples, strings, ints, floats, bools and None with opcodes only; typed int/float/bool
#: lists go through torch.jit._pickle.build_* helpers, mapped here to a plain list. Anything else
#: (os.system, builtins.eval, torch tensors, ...) is refused before it is constructed.
PICKLE_ALLOW = {
    ("builtins", "dict"): dict, ("builtins", "list"): list, ("builtins", "tuple"): tuple,
    ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "str"): str,
    ("builtins", "int"): int, ("builtins", "float"): float, ("builtins", "bool"): bool,
    ("builtins", "bytes"): bytes, ("builtins", "bytearray"): bytearray, ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): dict,
    ("torch.jit._pickle", "build_intlist"): _plain_list, ("torch.jit._pickle", "build_doublelist"): _plain_list,
    ("torch.jit._pickle", "build_boollist"): _plain_list,
}


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler whose find_class resolves only PICKLE_ALLOW; persistent ids are refused."""

    def find_class(self, module, name):
        if module == "__builtin__":  # protocol <= 2 spelling of builtins
            module = "builtins"
        f = PICKLE_ALLOW.get((module, name))
        if f is None:
            raise pickle.UnpicklingError(f"refused to load {module}.{name} (not on the allow-list)")
        return f

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent id (tensor storage)")


def safe_unpickle(data: bytes):
    """Unpickle `data` with RestrictedUnpickler. Raises TraceError (one line) for a refused class,
    a truncated or corrupt pickle."""
    import io

    try:
        return RestrictedUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        msg = str(e)
        if msg.startswith("refused"):
            raise TraceError(f"unsafe pickle: {msg}") from None
        if "truncated" in msg:
            raise TraceError("truncated pickle") from None
        raise TraceError(f"corrupt pickle ({msg})") from None
    except EOFError:
        raise TraceError("truncated pickle") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError, OverflowError,
            MemoryError, RecursionError) as e:
        raise TraceError(f"corrupt pickle ({type(e).__name__}: {str(e)[:80]})") from None
