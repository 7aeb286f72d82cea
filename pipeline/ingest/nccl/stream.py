"""A text log read as lines, chunk by chunk, so that a log of any length is never held whole
(issue 21, point 7: a 200 MB NCCL log took 3.8 GB when read, decoded and split at once).

lines(read, notes) yields the lines of the byte stream `read` (a read(n) callable) as str, split on
b"\\n" exactly as bytes.split(b"\\n") would (a final empty piece after a trailing newline is not a
line), so line numbers are those of the file. Each chunk is decoded as UTF-8 up to its last
newline; invalid bytes are replaced (U+FFFD) with one note. A line still without its newline
after MAX_LINE_BYTES is cut there (the rest of it is skipped, one note counts such lines): no real
NCCL, nccl-tests or PyTorch line comes near it, and memory then stays bounded by the chunk and the
line cap (a line is never longer than MAX_LINE_BYTES + CHUNK_BYTES). NUL bytes are left out
(one note counts them): the padding a log gets when its writer dies, never text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

CHUNK_BYTES = 4 << 20
MAX_LINE_BYTES = 8 << 20


class _State:
    def __init__(self, notes: list[str]):
        self.notes = notes
        self.invalid = False
        self.cut = 0
        self.nul = 0  # NUL bytes left out

    def decode(self, b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            self.invalid = True
            return b.decode("utf-8", "replace")

    def close(self) -> None:
        if self.invalid:
            self.notes.append("invalid UTF-8 replaced")
        if self.cut:
            self.notes.append(f"{self.cut} lines longer than {MAX_LINE_BYTES >> 20} MB cut there")
        if self.nul:
            self.notes.append(f"{self.nul} NUL bytes left out (a log padded when its writer died?)")


def lines(read: Callable[[int], bytes], notes: list[str]) -> Iterator[str]:
    """The lines of the stream (see the module docstring); notes gets the decoding and cut notes
    once the stream is exhausted."""
    st = _State(notes)
    tail = b""  # the start of a line whose newline has not come yet
    skipping = False  # inside a line already cut at MAX_LINE_BYTES
    while True:
        chunk = read(CHUNK_BYTES)
        if not chunk:
            break
        if b"\0" in chunk:  # no text log holds NULs: padding of a file cut short (nccl._is_binary)
            n = len(chunk)
            chunk = chunk.replace(b"\0", b"")
            st.nul += n - len(chunk)
            if not chunk:
                continue
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            chunk, skipping = chunk[nl + 1 :], False
        buf = tail + chunk if tail else chunk
        nl = buf.rfind(b"\n")
        if nl < 0:
            tail = buf
        else:
            yield from st.decode(buf[:nl]).split("\n")
            tail = buf[nl + 1 :]
        if len(tail) > MAX_LINE_BYTES:
            st.cut += 1
            yield tail[:MAX_LINE_BYTES].decode("utf-8", "ignore")  # may end inside a character
            tail, skipping = b"", True
    if tail:
        yield st.decode(tail)
    st.close()
