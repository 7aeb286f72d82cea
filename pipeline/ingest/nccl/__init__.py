"""NCCL-family inputs: NCCL_DEBUG logs, nccl-tests output, PyTorch ProcessGroupNCCL watchdog
messages, Flight Recorder dumps, torchfrtrace reports, NCCL RAS reports and NCCL's example
profiler plugin output -> the nccl_* / flight_recorder* lake tables (schemas/v3.toml).

Entry points: `sniff(head, name)` says whether a file is one of ours and which; `parse(data,
name, fmt)` returns a LogParsed (tables without run_id/source_id); `streams(head, fmt)` says
whether such a file is read line by line, and `parse_stream(read, name, fmt, budget)` reads it so,
with its append-only tables in spools (memory bounded whatever the log's length). What is
extracted, the tables and the known limits: docs/nccl.md. Format notes with sources:
../shared/reference/nccl.md.

Bad input (empty, binary, a Kineto trace, truncated JSON or pickle, a refused pickle class, a
text file without any of our lines) raises pipeline.ingest.kineto.TraceError with one line.
A text log is read in one pass (parse_stream: chunk by chunk); a line that cannot be parsed is kept.

Modules: common.py (enums, row builder, LogParsed, infer_test), decode.py (lenient JSON),
unpickle.py (the restricted unpickler, its key rules and expansion budget), log.py (the text-log
parser; its line grammars in log_state.py, log_info.py, log_comm.py, log_topo.py, log_torch.py,
log_nccl_tests.py), flightrec.py (Flight Recorder dumps,
torchfrtrace reports), ras.py (RAS reports), struct.py (nccl-tests JSON, profiler plugin output),
stream.py (bytes -> lines, chunk by chunk, with the line cap).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import msgspec
import polars as pl

from ... import schema as sch
from ..errors import TraceError
from ..streams import text_encoding, utf8_head, utf8_reader

if TYPE_CHECKING:
    from .common import LogParsed

# the parsers are imported when a file of theirs is parsed, not with the package: every ingest
# imports it to sniff (discover.py), most read no NCCL file (60 ms of start-up for a small job)

__all__ = ["FORMATS", "LogParsed", "TraceError", "sniff", "parse", "streams", "parse_stream"]


def __getattr__(name: str):  # LogParsed, imported on first use (PEP 562)
    if name == "LogParsed":
        from .common import LogParsed

        return LogParsed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FORMATS = sch.NCCL_FORMATS

_SNIFF_BYTES = 65536
_NCCL_LINE = re.compile(
    rb"(?:^|[\s:>\])])[^\s:\[\]]*:\d+:\d+ (?:\[\d+\] )?(?:\S+ )*?NCCL (?:INFO|WARN|TRACE|CALL) ", re.M
)
_BARE_VERSION = re.compile(rb"NCCL version \d+\.\d+\.\d+\S*\+cuda", re.M)
_TESTS = re.compile(
    rb"^(?:\S+ ?)?#\s+(?:size\s+count\s+type|nThread \d+ nGpus|\(B\)\s+\(elements\))|# nccl-tests version",
    re.M,
)
_WATCHDOG = re.compile(
    rb"ProcessGroupNCCL|WorkNCCL\(|Watchdog caught collective operation timeout|NCCL error in:"
)
_RAS_TEXT = re.compile(
    rb"^NCCL version \S+ compiled with CUDA|^Job summary\s*\n=+|^Communicators\.\.\.", re.M
)
_FRTRACE = re.compile(rb"^\s*Not all ranks joining collective|^\s*(?:\$\s*)?torchfrtrace\b", re.M)
_TESTS_JSON_START = re.compile(
    rb'\s*\{\s*"version"\s*:\s*\d+\s*,\s*"start_time"\s*:\s*"[^"]*"\s*,\s*"args"\s*:'
)
_KINETO_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')


# control characters other than tab, newline, form feed, carriage return and escape
_CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")


_NUL_RUN = re.compile(rb"\x00{8,}")


def _is_binary(head: bytes) -> bool:
    """Whether the first bytes of a file are not text. Runs of 8 or more NUL bytes are left out
    first: a log whose writer died leaves its file padded with NULs (the file system extends it
    before the data lands), which is still a log; a lone NUL (binary data, UTF-16) is not text."""
    head = _NUL_RUN.sub(b"", head)
    if b"\x00" in head or (not head.strip() and head):
        return True
    text = head.decode("utf-8", "replace")
    if not text:
        return False
    bad = text.count("\ufffd") + len(_CONTROL.findall(text))
    return bad > max(8, len(text) // 20)


def _is_pickle(head: bytes) -> bool:
    return len(head) >= 3 and head[0] == 0x80 and 2 <= head[1] <= 5


_JSON_START = re.compile(rb"\s*(?:\{\s*[\"'}]|\[\s*[\[{\"\]]|\[\s*$)")


def _looks_json(head: bytes) -> bool:
    """A JSON (or Python-literal) document start: '{' then a key or '}', '[' then a container,
    string or ']'. Log lines starting with '[rank0]:' or '[0] ' are not."""
    return _JSON_START.match(head[:200]) is not None


def _json_kind(head: bytes) -> str | None:
    s = head.lstrip()
    if not _looks_json(head):
        return None
    if any(k in head for k in _KINETO_KEYS):
        return None
    if b'"entries"' in head or b'"pg_config"' in head or b'"pg_status"' in head:
        return "flight_recorder"
    if b'"communicators"' in head or (b'"group"' in head and b'"event"' in head and b'"peer"' in head):
        return "nccl_ras"
    if b'"results"' in head and (b'"nccl_version"' in head or b'"config"' in head or b'"devices"' in head):
        return "nccl_tests"
    if _TESTS_JSON_START.match(head):  # the environment list can push 'results' past the sniffed head
        return "nccl_tests"
    if s[:1] == b"[" and (
        b'"CommHash"' in head
        or re.search(
            rb'"cat"\s*:\s*"(?:GROUP|COLL|P2P|PROXY|NET|GPU|KERNEL_LAUNCH|COLL_API|GROUP_API|P2P_API)"', head
        )
    ):
        return "nccl_profiler"
    return None


def sniff(head: bytes, name: str) -> str | None:
    """Format of a file from its first ~64 KiB (`head`, already decompressed) and its name, or None
    when it is none of ours. One of FORMATS:
    flight_recorder (pickle protocol 2-5, or JSON/repr with entries/pg_config/pg_status), nccl_ras
    (ncclras text or JSON), nccl_tests (-J JSON, or text with a results header / '# nThread' line),
    nccl_profiler (profiler plugin event array), torchfrtrace (analyzer report), nccl_log (NCCL
    INFO/WARN/TRACE/CALL lines or a bare 'NCCL version X+cudaY' line), torch_watchdog
    (ProcessGroupNCCL / WorkNCCL messages without NCCL lines).
    None for Kineto traces (traceEvents, schemaVersion, deviceProperties), SQLite, zip, gzip,
    other binary data and text without any of those markers. UTF-16 or UTF-32 text (a byte order
    mark: PowerShell's `>` writes UTF-16LE) is sniffed as the text it holds."""
    head = utf8_head(head[:_SNIFF_BYTES])
    if not head.strip():
        return None
    if _looks_json(head) and any(k in head for k in _KINETO_KEYS):
        # a Kineto trace, whatever follows would say (the JSON start rules out the magic numbers
        # and a pickle; binary or not, a head with Kineto keys is none of ours): said before
        # _is_binary decodes the whole head (0.5 ms of every small trace's ingest)
        return None
    if head.startswith((b"SQLite format 3\x00", b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b")):
        return None
    if _is_pickle(head):
        return "flight_recorder"
    if _is_binary(head):
        return None
    kind = _json_kind(head)
    if kind:
        return kind
    if _looks_json(head):
        return None  # JSON that is not ours (Kineto, Chakra, ...)
    if _RAS_TEXT.search(head):
        return "nccl_ras"
    if _FRTRACE.search(head):
        return "torchfrtrace"
    if _TESTS.search(head):
        return "nccl_tests"
    if _NCCL_LINE.search(head) or _BARE_VERSION.search(head):
        return "nccl_log"
    if _WATCHDOG.search(head):
        return "torch_watchdog"
    return None


def _decode(data: bytes, notes: list[str]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        notes.append("invalid UTF-8 replaced")
        return data.decode("utf-8", "replace")


def parse(data: bytes, name: str, fmt: str | None = None) -> "LogParsed":
    """Parse one file of the NCCL family.

    data: the file's bytes (decompressed); name: its file name (Flight Recorder dumps take their
    rank from a trailing number); fmt: one of FORMATS, else sniffed. A text log fills every table it
    finds rows for, whatever `fmt` says (a stdout capture can hold NCCL lines, an nccl-tests table
    and watchdog messages at once). Returns LogParsed: tables keyed by lake table name, without
    run_id/source_id. Raises TraceError with a one-line message on input that is not ours or is
    unreadable (empty, binary, Kineto JSON, truncated JSON/pickle, refused pickle class).
    """
    notes: list[str] = []
    enc = text_encoding(data)
    if enc is not None:  # UTF-16 or UTF-32 text: decoded whole (these files are read whole anyway)
        data = data[enc[0] :].decode(enc[1], "replace").encode("utf-8")
        notes.append(f"{enc[2]} encoded file: decoded to UTF-8")
    else:  # a UTF-8 byte order mark is no part of the text (it would start the first host)
        data = data.removeprefix(b"\xef\xbb\xbf")
    if not data or not data.strip():
        raise TraceError("empty file")
    head = data[:_SNIFF_BYTES]
    if fmt is None:
        fmt = sniff(head, name)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"unknown NCCL format {fmt!r}")
    if fmt is None:
        if head.startswith((b"SQLite format 3\x00", b"PK\x03\x04", b"\x1f\x8b")):
            raise TraceError("binary data (SQLite, zip or gzip), not an NCCL log")
        if _is_binary(head):
            raise TraceError("binary data, not a text log")
        if _looks_json(head) and any(k in head for k in _KINETO_KEYS):
            raise TraceError("a Kineto trace (traceEvents), not an NCCL log")
        raise TraceError("no NCCL, nccl-tests, watchdog, flight-recorder or RAS lines found")
    from .common import MAX_HELD_ROWS, TableFull

    try:
        parsed = _parse(data, name, fmt, notes)
    except TraceError:
        raise
    except TableFull as e:  # a whole-file format (JSON, pickle, report) past the row cap of a table
        raise TraceError(f"more rows than one table may hold ({MAX_HELD_ROWS}): {e}") from None
    except RecursionError:
        raise TraceError("nested too deeply") from None
    except MemoryError:
        raise TraceError("does not fit in memory") from None
    for t, v in parsed.tables.items():  # spools of the text-log parser -> one frame each
        if not isinstance(v, pl.DataFrame):
            parsed.tables[t] = pl.concat(list(v))
    return parsed


def streams(head: bytes, fmt: str) -> bool:
    """Whether a file of format `fmt` (sniffed from `head`) is a text log for parse_stream: NCCL_DEBUG
    output, nccl-tests text and PyTorch watchdog messages. JSON, pickles, RAS reports and
    torchfrtrace reports are parsed whole by parse(). UTF-16 or UTF-32 text is judged as the text
    it holds (parse_stream decodes it)."""
    h = utf8_head(head[:_SNIFF_BYTES])
    return (
        fmt in ("nccl_log", "nccl_tests", "torch_watchdog")
        and bool(h.strip())
        and not _is_binary(h)
        and not _looks_json(h)
    )


def parse_stream(read, name: str, fmt: str, budget=None) -> "LogParsed":
    """Parse a text log (streams(head, fmt) true) from `read` (a read(n) callable giving the file's
    decompressed bytes from its start), line by line: the file is never held whole.

    budget: a pipeline.ingest.spool._Budget (its directory takes what does not fit); the tables
    nccl_events, nccl_coll_calls and nccl_watchdog of the result are then spools (iterate for
    polars frames, close() when done), the others polars frames. Same rows, notes and errors as
    parse() on the same bytes, except that a line still without its newline after
    stream.MAX_LINE_BYTES is cut there (a note counts them)."""
    from . import log
    from . import stream as _stream

    notes: list[str] = []
    # UTF-16 or UTF-32 decoded; a UTF-8 byte order mark dropped (it would start the first host)
    read = utf8_reader(read, notes, "log", utf8_mark=True)
    try:
        parsed, recognized = log.parse_lines(_stream.lines(read, notes), name, fmt, budget)
    except RecursionError:
        raise TraceError("nested too deeply") from None
    except MemoryError:
        raise TraceError("does not fit in memory") from None
    parsed.notes[:0] = notes
    if not recognized:
        parsed.close()
        raise TraceError("no NCCL, nccl-tests, watchdog, flight-recorder or RAS lines found")
    return parsed


def _parse(data: bytes, name: str, fmt: str, notes: list[str]) -> "LogParsed":
    from . import flightrec, log, ras, struct
    from .decode import lenient_json
    from .unpickle import expansion_budget_bytes, safe_unpickle

    if fmt == "flight_recorder":
        if _is_pickle(data[:4]):
            obj = safe_unpickle(data)
        else:
            if _is_binary(data[:_SNIFF_BYTES]):
                raise TraceError("binary data, not a Flight Recorder pickle or JSON")
            obj = lenient_json(_decode(data, notes), notes)
        return flightrec.flight_recorder(obj, name, notes, expansion_budget_bytes(len(data)))
    if _is_binary(data[:_SNIFF_BYTES]):
        raise TraceError("binary data, not a text log")
    text = _decode(data, notes)
    is_json = _looks_json(data[:_SNIFF_BYTES])
    if fmt == "nccl_profiler":
        return struct.profiler_events(lenient_json(text, notes), notes)
    if fmt == "nccl_ras":
        if is_json:
            return ras.ras_json(_json_or_lines(text, notes), notes)
        return ras.ras_text(text, notes)
    if fmt == "torchfrtrace":
        return flightrec.torchfrtrace_report(text, notes)
    if fmt == "nccl_tests" and is_json:
        return struct.nccl_tests_json(lenient_json(text, notes), notes)
    if is_json:
        raise TraceError(f"JSON, not a {fmt} text log")
    parsed, recognized = log.parse_text(text, name, fmt)
    parsed.notes[:0] = notes
    if not recognized:
        raise TraceError("no NCCL, nccl-tests, watchdog, flight-recorder or RAS lines found")
    return parsed


def _json_or_lines(text: str, notes: list[str]):
    """One JSON document, or JSON Lines (RAS monitor events)."""
    from .decode import lenient_json

    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        pass
    docs = []
    for line in text.splitlines():
        if line.strip():
            try:
                docs.append(msgspec.json.decode(line))
            except msgspec.DecodeError:
                return lenient_json(text, notes)
    return docs
