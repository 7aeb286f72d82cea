"""The streaming splitter: a (large, maybe truncated) Kineto JSON read as a stream -> batches of events.

Owns: _Splitter (the traceEvents array cut into batches that msgspec decodes, every complete
event of a truncated file kept) built on _Input (the byte window over `read`) and _Skeleton (the
document around the array: the keys before and after it, and the whole-document fallback);
_ArrayEnd and _fix_utf8; JSON in another encoding than UTF-8 read through
pipeline/ingest/streams.py's utf8_reader (a byte order mark dropped, UTF-16 and UTF-32 decoded as
read: the one rule of every text reader); bytes after the end of the document
(ignored, counted in a note: _Skeleton._trailing); the size limits (BATCH_BYTES, READ_BYTES,
HEAD_LIMIT, TAIL_LIMIT, MAX_EVENT_BYTES, IN_MEMORY_LIMIT).
"""

from __future__ import annotations

import re

import msgspec

from ..errors import TraceError
from ..streams import JSON_SIGN_BYTES, utf8_reader
from .decode import _TAGGED, KEvent, KTrace, _TEv, _TSkipped, decode, document_end

# ----------------------------------------------------------------------------- streaming split
# A trace is read as a stream and its traceEvents array is decoded in batches of about
# BATCH_BYTES, so memory is bounded by the batch size, not the file size. Batch boundaries are
# found by a byte scan for the text between two events ('}' ',' '{', whitespace allowed) or at the
# end of the array ('}' ']'); the bytes up to a candidate boundary are decoded by msgspec as one
# JSON array. A candidate that lies inside an event (an args object holding a list of objects, or
# a string) cannot decode as a complete array: msgspec reports the input truncated or malformed
# at its very last byte, and the next candidate is tried. So no JSON is parsed by hand: the scan
# only proposes cut points and msgspec decides. Everything around the array (deviceProperties,
# distributedInfo, baseTimeNanoseconds, which Kineto writes after the events) is decoded as a
# skeleton: the text before the array + '[]' + the text after it.
#
# A file that ends inside the array (a job killed while the profiler wrote) keeps every event
# that is complete: the last boundary before the end that decodes is taken, and the bytes after
# it are counted as unreadable (Parsed.partial / unreadable_bytes).

BATCH_BYTES = 16 << 20
READ_BYTES = 4 << 20
HEAD_LIMIT = 64 << 20  # traceEvents must start within this many bytes
TAIL_LIMIT = 256 << 20  # text after the traceEvents array
MAX_EVENT_BYTES = 256 << 20  # one event (no boundary found within this many bytes -> error)
IN_MEMORY_LIMIT = 1 << 30  # whole-document fallback (no traceEvents array found up front)

_HEAD_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT_RE = re.compile(rb"\}\s*(?:(,)\s*\{|\])")
_END_RE = re.compile(rb"\}\s*\]")
_LAST_RE = re.compile(rb"\}(?=\s*(?:,|\]|\Z))")
_BYTE_RE = re.compile(r"\(byte (\d+)\)")
_WS = b" \t\r\n"
_NON_WS = re.compile(rb"[^ \t\r\n]")
_BATCH_FAST = msgspec.json.Decoder(list[_TAGGED])
_BATCH_GENERAL = msgspec.json.Decoder(list[KEvent])
_TOP = msgspec.json.Decoder(KTrace)


def _fix_utf8(text) -> tuple[bytes, int]:
    repl = "\ufffd".encode()
    before = bytes(text).count(repl)
    fixed = bytes(text).decode("utf-8", "replace").encode("utf-8")
    return fixed, fixed.count(repl) - before


class _ArrayEnd(Exception):
    """The decoded text held the end of the traceEvents array, `from_end` bytes before its end."""

    def __init__(self, from_end: int):
        self.from_end = from_end


class _Input:
    """The byte window over `read(n) -> bytes` (b'' at the end): `buf` holds the input from
    absolute offset `off`; read on demand, consumed from the front."""

    def __init__(self, read):
        self.read = read
        self.buf = bytearray()
        self.off = 0  # absolute offset of buf[0]
        self.eof = False

    @property
    def total_bytes(self) -> int:
        return self.off + len(self.buf)

    def _fill(self, n: int) -> None:
        while len(self.buf) < n and not self.eof:
            b = self.read(max(READ_BYTES, n - len(self.buf)))
            if not b:
                self.eof = True
            else:
                self.buf += b

    def _consume(self, k: int) -> None:
        del self.buf[:k]
        self.off += k

    def _skip_ws(self, i: int) -> int:
        while True:
            m = _NON_WS.search(self.buf, i)
            if m is not None:
                return m.start()
            i = len(self.buf)
            if self.eof:
                return i
            if i > 1 << 20:  # drop whitespace as it is skipped
                self._consume(i)
                i = 0
            self._fill(len(self.buf) + READ_BYTES)


class _Skeleton(_Input):
    """The document around the traceEvents array: the keys before and after it decoded as a
    KTrace without events (`top`), or the whole document when no array is found up front; the
    state a split leaves (`notes`, `utf8_fixed`, `truncated`, `tail_lost`, `unreadable_bytes`)."""

    def __init__(self, read):
        self.notes: list[str] = []
        # JSON in another encoding than UTF-8 (RFC 8259 section 8.1 requires UTF-8): a UTF-8 byte
        # order mark dropped, UTF-16 and UTF-32 decoded as read, so memory stays bounded as for UTF-8
        super().__init__(utf8_reader(read, self.notes, "JSON", JSON_SIGN_BYTES, utf8_mark=True))
        self.top: KTrace | None = None
        self.utf8_fixed = 0
        self.truncated = False
        self.tail_lost = False
        self.unreadable_bytes = 0

    def _decode_top(self, text: bytes) -> KTrace:
        try:
            return _TOP.decode(text)
        except msgspec.DecodeError as e:
            if "UTF-8" not in str(e):
                raise
            text, n = _fix_utf8(text)
            self.utf8_fixed += n
            return _TOP.decode(text)

    def _tail(self, head: bytes | None, at: int) -> None:
        """Decode the text after the array (Kineto writes baseTimeNanoseconds there). Bytes after
        the end of the JSON document are ignored, counted in a note (_trailing)."""
        self._fill(at + TAIL_LIMIT + 1)
        tail = bytes(self.buf[at : at + TAIL_LIMIT + 1])
        if head is None:  # bare event array
            m = _NON_WS.search(tail)
            if m is not None:
                self._trailing(at + m.start())
            self.top = KTrace()
            return
        end = _document_end(head, tail)
        if end is not None:
            self._trailing(at + end)
            tail = tail[:end]
        elif len(tail) > TAIL_LIMIT:
            raise TraceError(f"more than {TAIL_LIMIT >> 20} MB of JSON after the traceEvents array")
        try:
            self.top = self._decode_top(head + b"[]" + tail)
            return
        except msgspec.ValidationError as e:
            raise TraceError(f"not a Kineto trace: wrong JSON shape ({e})") from None
        except msgspec.DecodeError as e:
            msg = str(e)
            b = _BYTE_RE.search(msg)
            if not (
                "truncated" in msg or (b and int(b.group(1)) >= len(head) + 2 + len(tail.rstrip(_WS)) - 1)
            ):
                raise TraceError(
                    f"not valid JSON: {_BYTE_RE.sub('', msg).strip()} after the traceEvents array"
                ) from None
        # the file ends inside the trailing keys: keep the complete ones
        self.truncated = self.tail_lost = True
        cuts = [k for k in range(len(tail)) if tail[k] == ord(",")][-32:]
        for k in reversed(cuts):
            try:
                self.top = self._decode_top(head + b"[]" + tail[:k] + b"}")
                self.unreadable_bytes = len(tail) - k
                return
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        self.unreadable_bytes = len(tail)  # self.top stays what the head said

    def _trailing(self, i: int) -> None:
        """The JSON document ended before buf[i], which is not white space: count the bytes from
        there to the end of the input (read and dropped) in a note; the trace is kept."""
        start = self.off + i
        while not self.eof:
            self._consume(len(self.buf))
            self._fill(READ_BYTES)
        n = self.total_bytes - start
        self.notes.append(f"{n} trailing bytes after the JSON document (from byte {start}) were ignored")

    def _whole(self):
        """No traceEvents array up front: read and decode the document whole (bounded)."""
        while not self.eof:
            if len(self.buf) > IN_MEMORY_LIMIT:
                raise TraceError(
                    f"no traceEvents array in the first {HEAD_LIMIT >> 20} MB and the file is larger than "
                    f"{IN_MEMORY_LIMIT >> 20} MB; not a Kineto trace?"
                )
            self._fill(len(self.buf) + (16 << 20))
        doc, notes = decode(bytes(self.buf))
        self.notes += notes
        self._consume(len(self.buf))
        if isinstance(doc, list):
            events, self.top = doc, KTrace()
        else:
            events, self.top = doc.trace_events, doc
            doc.trace_events = None
        if not all(isinstance(e, (KEvent, _TEv, _TSkipped)) for e in events[:1]):
            raise TraceError("not a Kineto trace: traceEvents is not a list of events")
        step = 250_000
        for k in range(0, len(events), step):
            yield events[k : k + step]


def _document_end(head: bytes, tail: bytes) -> int | None:
    """Where the JSON document head + '[]' + tail ends inside tail when bytes other than white
    space follow it (decode.document_end), else None."""
    text = head + b"[]" + tail
    end = document_end(text)
    return None if end is None or end < len(text) - len(tail) else end - (len(text) - len(tail))


class _Splitter(_Skeleton):
    """Batches of decoded events from `read(n) -> bytes` (b'' at the end); afterwards `top` (the
    KTrace without events), `notes`, `truncated`, `unreadable_bytes`, `total_bytes`."""

    def __init__(self, read, batch_bytes: int = BATCH_BYTES):
        super().__init__(read)
        self.batch = max(1024, int(batch_bytes))

    def batches(self):
        i = self._skip_ws(0)
        if i >= len(self.buf):
            raise TraceError("empty file")
        self._fill(1 << 16)
        c = self.buf[i]
        head = None
        if c == ord("["):
            pos = i + 1
        elif c == ord("{"):
            m = _HEAD_RE.search(self.buf, i)
            while m is None and not self.eof and len(self.buf) < HEAD_LIMIT:
                n = len(self.buf)
                self._fill(n + READ_BYTES)
                m = _HEAD_RE.search(self.buf, max(i, n - 64))
            if m is not None:
                head = bytes(self.buf[i : m.end() - 1])
                try:
                    self.top = self._decode_top(head + b"[]}")
                except (msgspec.DecodeError, msgspec.ValidationError):
                    m = None  # "traceEvents" was not a top-level key: read it whole
            if m is None:
                yield from self._whole()
                return
            pos = m.end()
        else:
            yield from self._whole()
            return
        self._consume(pos)
        pos = 0
        while True:
            pos = self._skip_ws(pos)
            if pos >= len(self.buf):  # the file ends between events
                self.truncated = True
                self.unreadable_bytes = 0
                return
            if self.buf[pos] == ord("]"):  # empty array
                self._tail(head, pos + 1)
                return
            if self.buf[pos] != ord("{"):
                raise TraceError(
                    "not a Kineto trace: wrong JSON shape "
                    f"(traceEvents element at byte {self.off + pos} is not an object)"
                )
            self._fill(pos + self.batch + READ_BYTES)
            if self.eof and len(self.buf) - pos <= self.batch:
                evs = self._rest(pos, head)
                if evs:
                    yield evs
                return
            search, tries = pos + self.batch, 0
            while True:
                m = _CUT_RE.search(self.buf, search)
                if m is None:
                    self._check_event_size(pos, len(self.buf))
                    n = len(self.buf)
                    self._fill(n + READ_BYTES)
                    if len(self.buf) == n:  # end of input inside the array
                        evs = self._rest(pos, head)
                        if evs:
                            yield evs
                        return
                    search = max(search, n - 64)
                    continue
                r = self._try(pos, m.start() + 1)
                if r is not None:
                    break
                # the candidate lies inside an event: look further (geometrically after a few misses)
                tries += 1
                search = m.end() if tries < 4 else pos + 2 * (m.end() - pos)
                self._check_event_size(pos, search)
                self._fill(search + READ_BYTES)
            evs, tail_at = r
            yield evs
            del evs, r  # the caller dropped the batch: its objects go before the next is decoded
            if tail_at is not None:  # the array ended before the candidate
                self._tail(head, tail_at)
                return
            if m.group(1):
                self._consume(m.end() - 1)
                pos = 0
            else:
                self._tail(head, m.end())
                return

    def _check_event_size(self, pos: int, upto: int) -> None:
        """TraceError once the batch starting at `pos` has been searched to `upto` without an end:
        a batch holds whole events up to self.batch bytes plus the one event that crosses it, and
        no event may pass MAX_EVENT_BYTES (a 1 GiB string in one event would otherwise be read
        whole, at several times its size in memory)."""
        if upto - pos > self.batch + MAX_EVENT_BYTES + READ_BYTES:
            at = self._event_start(pos)
            where = f"at byte {self.off + at}" if at is not None else f"after byte {self.off + pos}"
            raise TraceError(
                f"an event longer than {MAX_EVENT_BYTES >> 20} MB (or no end of an event) {where}: "
                "events are capped at that size; not a trace?"
            )

    def _event_start(self, pos: int, tries: int = 16) -> int | None:
        """Where the event that crosses the end of the batch starting at `pos` begins (its '{'):
        just after the last cut between events in buf[pos : pos + batch] that decodes as a
        complete array, else at pos when none does (the batch's first event); None when `tries`
        candidate cuts lie inside events (a string of '},{' texts): then it is not known."""
        end = pos + self.batch  # the first cut tried was at or after it (batches)
        cuts = [m for m in _CUT_RE.finditer(self.buf, pos, end + 4096) if m.group(1) and m.start() < end]
        for m in reversed(cuts[-tries:]):
            try:
                if self._try(pos, m.start() + 1) is not None:
                    return m.end() - 1
            except TraceError:
                return None
        return pos if len(cuts) <= tries else None

    def _try(self, pos: int, end: int):
        """(events, None) for buf[pos:end] decoded as one JSON array; (events, i) when the array
        closes before `end`, with i just after its ']'; None when the text is not a complete array
        (the cut lies inside an event). TraceError when it is not valid JSON."""
        try:
            evs = self._decode(pos, end)
            return None if evs is None else (evs, None)
        except _ArrayEnd as e:
            bracket = end + 1 - e.from_end
            evs = (
                self._decode(pos, bracket) if pos <= bracket < end and self.buf[bracket] == ord("]") else None
            )
            if evs is None:
                raise TraceError(f"not valid JSON at byte {self.off + bracket}") from None
            return evs, bracket + 1

    def _decode(self, pos: int, end: int):
        text = b"".join(
            (b"[", memoryview(self.buf)[pos:end], b"]")
        )  # one copy (msgspec.Raw values refer to it)
        fixed = 0
        general = False
        while True:
            try:
                evs = (_BATCH_GENERAL if general else _BATCH_FAST).decode(text)
                self.utf8_fixed += fixed
                return evs
            except msgspec.ValidationError as e:
                if general:
                    raise TraceError(f"not a Kineto trace: wrong JSON shape ({e})") from None
                general = True  # an odd event (unknown phase, args not an object): the general decoder
            except msgspec.DecodeError as e:
                msg = str(e)
                if "UTF-8" in msg and not fixed:
                    text, fixed = _fix_utf8(text)
                    continue
                b = _BYTE_RE.search(msg)
                k = int(b.group(1)) if b else None
                if "trailing characters" in msg and k is not None:
                    j = k - 2  # msgspec reports the byte after the first trailing one
                    while j > 0 and text[j] in _WS:
                        j -= 1
                    raise _ArrayEnd(
                        len(text) - j
                    )  # counted from the end: replacing invalid UTF-8 moves the start
                if "truncated" in msg or (k is not None and k >= len(text) - 1):
                    return None
                where = f" at byte {self.off + pos + k - 1}" if k is not None and not fixed else ""
                raise TraceError(f"not valid JSON: {_BYTE_RE.sub('', msg).strip()}{where}") from None

    def _last_end(self, pos: int) -> int | None:
        """Just after the '}' of the last '}' ']' (whitespace between allowed) in buf[pos:]."""
        buf, i = self.buf, len(self.buf)
        for _ in range(64):
            i = buf.rfind(b"]", pos, i)
            if i < 0:
                return None
            j = i - 1
            while j >= pos and buf[j] in _WS:
                j -= 1
            if j >= pos and buf[j] == ord("}"):
                return j + 1
        return None

    def _rest(self, pos: int, head) -> list:
        """All the rest of the input from pos is in buf: the events up to the end of the array,
        or, when the input ends inside it, every complete event."""
        # Usually the array closes at the last '}' ']' of the input (Kineto writes only scalars
        # after it): try that cut first, so the events are decoded once. A cut that decodes as a
        # complete array is the end of the array (a '}' ']' inside it cannot be: ']' would close
        # the array there); one past the end reports where the array ended (_try).
        end = self._last_end(pos)
        if end is not None:
            try:
                r = self._try(pos, end)
            except TraceError:
                r = None  # decided below, the general way
            if r is not None:
                evs, tail_at = r
                self._tail(head, tail_at if tail_at is not None else _END_RE.match(self.buf, end - 1).end())
                return evs
        r = self._try(pos, len(self.buf))
        if r is not None:
            evs, tail_at = r
            if tail_at is not None:
                self._tail(head, tail_at)
            else:  # every event complete, but neither the array nor the document is closed
                self.truncated = self.tail_lost = True
            return evs
        self.truncated = True
        cands = [m.start() for m in _LAST_RE.finditer(self.buf, pos)]
        for k in reversed(cands[-16:]):
            r = self._try(pos, k + 1)
            if r is not None:
                self.unreadable_bytes = len(self.buf) - (k + 1)
                return r[0]
        self.unreadable_bytes = len(self.buf) - pos
        return []
