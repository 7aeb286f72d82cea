"""Byte streams every input is read through: bounded gunzip (Inflate), a peek at the first
bytes (Peek), regular files opened without blocking on a FIFO (open_regular), and a window onto
an archive member's bytes (Window, Closing), and text in UTF-16 or UTF-32 told from UTF-8 and
decoded as it is read (text_encoding, utf8_head, utf8_reader: the one rule of every text reader,
NCCL-family logs and Kineto JSON; json_start: whether such a text starts a JSON object or array,
which tells a failed Kineto file from one of no detected format). Limits, from the environment:
TRACELAKE_MAX_UNCOMPRESSED_BYTES (default 16 GiB) on what one gzip stream may expand to, and
TRACELAKE_MAX_COMPRESSION_RATIO (default 200:1, applied once past RATIO_FLOOR, 64 MiB) on how
much it may expand (docs/usage.md; what an archive is and how its members are found:
pipeline/ingest/archive.py).
"""

from __future__ import annotations

import codecs
import io
import os
import stat

from .errors import TraceError
from .formats import GZIP_MAGIC

try:  # isal's inflate is ~2x faster than zlib's and gives the same bytes
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover
    import zlib as _zlib

RATIO_FLOOR = 64 << 20
READ_BLOCK = 1 << 20


def max_uncompressed_bytes() -> int:
    """TRACELAKE_MAX_UNCOMPRESSED_BYTES (default 16 GiB): bytes one gzip stream may expand to."""
    return int(os.environ.get("TRACELAKE_MAX_UNCOMPRESSED_BYTES", 16 * 2**30))


def max_ratio() -> float:
    """TRACELAKE_MAX_COMPRESSION_RATIO (default 200): output over input bytes a stream may reach."""
    return float(os.environ.get("TRACELAKE_MAX_COMPRESSION_RATIO", 200))


class Inflate(io.RawIOBase):
    """The bytes of `raw` (a binary file object), gunzipped as a stream when they start with the
    gzip magic (concatenated members too). read(n) never returns more than n bytes, so memory is
    bounded by n whatever the compression ratio. Raises TraceError for corrupt gzip and for output
    beyond the limits; a stream that simply ends early sets .truncated and ends the output there.
    .in_bytes / .out_bytes count what was read and produced."""

    def __init__(self, raw, limit: int | None = None, ratio: float | None = None):
        self.raw = raw
        self.limit = max_uncompressed_bytes() if limit is None else limit
        self.ratio = max_ratio() if ratio is None else ratio
        first = raw.read(2)
        self.in_bytes = len(first)
        self.out_bytes = 0
        self.gzip = first == GZIP_MAGIC
        self.truncated = False
        self._pending = first  # input not yet given to the decompressor (or plain output)
        self._d = _zlib.decompressobj(wbits=31) if self.gzip else None
        self._started = False  # the current gzip member produced or consumed anything
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            chunks = []
            while c := self.read(READ_BLOCK):
                chunks.append(c)
            return b"".join(chunks)
        if self._eof or n == 0:
            return b""
        if not self.gzip:
            if self._pending:
                out, self._pending = self._pending[:n], self._pending[n:]
                if len(out) < n:
                    out += self.raw.read(n - len(out))
            else:
                out = self.raw.read(n)
            self.in_bytes += len(out)
            self.out_bytes += len(out)
            if not out:
                self._eof = True
            return out
        while True:
            if self._d.unconsumed_tail:
                data = self._d.unconsumed_tail
            elif self._pending:
                data, self._pending = self._pending, b""
            else:
                data = self.raw.read(READ_BLOCK)
                self.in_bytes += len(data)
                if not data and not (self._started and not self._d.eof):
                    self._eof = True
                    return b""
            if not data:  # the stream ends inside a gzip member: the job was killed while the
                try:  # file was written; first the output the decompressor still holds (isal
                    out = self._d.decompress(b"", n)  # keeps up to a window back until asked)
                except Exception:
                    out = b""
                if not out:
                    self.truncated = True
                    self._eof = True
                    return b""
            else:
                try:
                    out = self._d.decompress(data, n)
                except Exception as e:  # zlib/isal raise their own error types
                    raise TraceError(
                        f"corrupt or truncated gzip ({str(e).strip() or type(e).__name__})"
                    ) from None
            self._started = True
            if self._d.eof:  # end of a member: another may follow
                rest = self._d.unused_data
                self._d = _zlib.decompressobj(wbits=31)
                self._started = False
                if rest.strip(b"\x00"):
                    self._pending = rest
            self.out_bytes += len(out)
            if self.out_bytes > self.limit:
                raise TraceError(
                    f"gzip expands beyond {self.limit} bytes (TRACELAKE_MAX_UNCOMPRESSED_BYTES); "
                    "refusing a possible gzip bomb"
                )
            if self.out_bytes > RATIO_FLOOR and self.out_bytes > self.ratio * max(self.in_bytes, 1):
                raise TraceError(
                    f"gzip expands more than {self.ratio:g}:1 (TRACELAKE_MAX_COMPRESSION_RATIO); "
                    "refusing a possible gzip bomb"
                )
            if out:
                return out
            if self._eof:
                return b""


PEEK_BYTES = 65536  # the bytes a Peek holds (the formats are told from them)


class Peek:
    """A reader whose first `n` bytes are also available as .head."""

    def __init__(self, read, n: int = PEEK_BYTES):
        chunks, got = [], 0
        while got < n:
            c = read(n - got)
            if not c:
                break
            chunks.append(c)
            got += len(c)
        self.head = b"".join(chunks)
        self._head = self.head
        self._read = read

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n is None or n < 0:
                out, self._head = self._head, b""
                return out + self._read(-1)
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._read(n)


def open_regular(path) -> io.BufferedReader:
    """The file at `path` opened for reading, binary. Raises TraceError("not a regular file") for a
    FIFO, device or socket without blocking: it is opened with O_NONBLOCK (a plain open() of a FIFO
    waits for a writer for ever, here while holding the lake's lock), then checked with fstat, so
    a path swapped for a FIFO after any earlier check is refused too. OSError when it cannot be
    opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError("not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class Window(io.RawIOBase):
    """The next `length` bytes of the binary file f (read from where it is), then EOF."""

    def __init__(self, f, length: int):
        self.f, self.left = f, length

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.left:
            n = self.left
        out = self.f.read(n)
        self.left -= len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class Closing:
    """f's reads; closing it closes f, then each of others (the archive behind a member)."""

    def __init__(self, f, *others):
        self.f, self.others = f, others

    def read(self, n: int = -1) -> bytes:
        return self.f.read(n)

    def close(self):
        self.f.close()
        for o in self.others:
            o.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# Text in a Unicode encoding other than UTF-8, for every reader of text (NCCL-family logs, Kineto
# JSON): told by its byte order mark (Unicode 15, section 23.8, table 23-4; PowerShell's `>` and
# Windows editors write UTF-16LE with one). UTF-32LE's mark starts with UTF-16LE's, so it is
# looked for first. A UTF-8 mark is left to the readers (utf8_reader drops it on request).
UNICODE_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32LE"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32BE"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16LE"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16BE"),
)
# Without a mark, by the zero bytes around ASCII characters (RFC 4627 section 3): in each group
# of 4 (UTF-32) or 2 (UTF-16) bytes, the one at `at` is an ASCII character other than NUL and the
# others are zero. UTF-32's groups hold a zero byte where UTF-16's hold a character: never both.
_UNMARKED = (
    (4, 0, "utf-32-le", "UTF-32LE"),
    (4, 3, "utf-32-be", "UTF-32BE"),
    (2, 0, "utf-16-le", "UTF-16LE"),
    (2, 1, "utf-16-be", "UTF-16BE"),
)
SIGN_BYTES = 16  # bytes told apart without a mark: 8 ASCII characters of UTF-16, 4 of UTF-32
JSON_SIGN_BYTES = 4  # a JSON text's first 2 characters are ASCII (RFC 4627 section 3)


def text_encoding(head: bytes, sign_bytes: int = SIGN_BYTES) -> tuple[int, str, str] | None:
    """(bytes of the byte order mark, Python codec, its name in a note) of UTF-16 or UTF-32 text:
    one starting with that byte order mark (UNICODE_BOMS), or, without one, whose first
    `sign_bytes` bytes (a multiple of 4; head must hold them) are ASCII characters with the zero
    bytes of UTF-32 or UTF-16 around them (_UNMARKED: RFC 4627 section 3's rule for JSON, over 8
    characters of UTF-16 rather than 2 by default, so a log padded with NULs when its writer died
    is not taken for it; JSON_SIGN_BYTES for JSON, whose first 2 characters are always ASCII).
    None for anything else (UTF-8, binary data)."""
    for bom, codec, name in UNICODE_BOMS:
        if head.startswith(bom):
            return len(bom), codec, name
    h = head[:sign_bytes]
    if len(h) == sign_bytes:
        for width, at, codec, name in _UNMARKED:
            chars = h[at::width]
            if all(0 < b < 0x80 for b in chars) and h.count(0) == sign_bytes - len(chars):
                return 0, codec, name
    return None


def utf8_head(head: bytes) -> bytes:
    """The first bytes of a text as UTF-8: head decoded when it is UTF-16 or UTF-32 (text_encoding;
    a character cut off at its end dropped), else head itself."""
    enc = text_encoding(head)
    if enc is None:
        return head
    return codecs.getincrementaldecoder(enc[1])("replace").decode(head[enc[0] :]).encode("utf-8")


def json_start(head: bytes) -> bool:
    """Whether the first bytes of a file (decompressed: Peek.head) start a JSON object or array,
    as a Kineto trace does: UTF-16/32 told as the JSON reader tells them (text_encoding with
    JSON_SIGN_BYTES) and decoded, a UTF-8 byte order mark and white space (RFC 8259 section 2)
    skipped; a head of PEEK_BYTES that is white space to its end cannot tell, so it counts as a
    start. A failed file that does not (empty, blank, binary, not JSON, a JSON scalar, a gzip
    stream that yields nothing) has format `unknown`, "when detection failed" (schemas/v3.toml,
    sources.format), not kineto_json."""
    enc = text_encoding(head, JSON_SIGN_BYTES)
    text = (
        head
        if enc is None
        else codecs.getincrementaldecoder(enc[1])("replace").decode(head[enc[0] :]).encode()
    )
    if text.startswith(codecs.BOM_UTF8):
        text = text[len(codecs.BOM_UTF8) :]
    rest = text.lstrip(b" \t\r\n")
    return rest[:1] in (b"{", b"[") or (not rest and len(head) >= PEEK_BYTES)


def utf8_reader(
    read, notes: list[str], what: str = "text", sign_bytes: int = SIGN_BYTES, utf8_mark: bool = False
):
    """read(n) -> bytes as a read(n) of UTF-8 (b'' at its end): a stream of UTF-16 or UTF-32 text
    (text_encoding of its first sign_bytes bytes) is decoded as it is read, in pieces of n bytes
    (memory stays bounded; what cannot be decoded, a lone surrogate or a cut-off last character,
    is U+FFFD), and notes gets `<encoding> encoded <what>: decoded to UTF-8 as it was read`; any
    other stream is read as it is (utf8_mark: its UTF-8 byte order mark dropped), its bytes
    passed through untouched."""
    first = b""
    while len(first) < sign_bytes and (b := read(sign_bytes - len(first))):
        first += b
    enc = text_encoding(first, sign_bytes)
    if enc is None:
        pending = [first[3:] if utf8_mark and first.startswith(codecs.BOM_UTF8) else first]

        def plain(n: int = -1) -> bytes:
            return pending.pop() if pending and pending[0] else read(n)

        return plain
    pending = [first[enc[0] :]]
    notes.append(f"{enc[2]} encoded {what}: decoded to UTF-8 as it was read")
    decoder = codecs.getincrementaldecoder(enc[1])("replace")
    done = [False]

    def decoded(n: int = -1) -> bytes:
        while not done[0]:
            raw = pending.pop() if pending and pending[0] else read(max(n, 4) if n and n > 0 else -1)
            done[0] = not raw
            text = decoder.decode(raw, final=done[0])
            if text:
                return text.encode("utf-8")
        return b""

    return decoded
