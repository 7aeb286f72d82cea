"""A gzip stream cut short gives every byte it holds (pipeline/ingest/streams.Inflate). isal's
decompressor, asked for at most n bytes at a time, keeps output back until it is asked again;
Inflate took the end of the input for the end of the output and lost up to a window of it (a
truncated tar.gz's last member, complete in the bytes that were there, failed; found with the
tester's third round, finding 3). The reference: Python's own zlib inflating the same cut bytes
in one call."""

from __future__ import annotations

import gzip
import io
import zlib

from pipeline.ingest.streams import Inflate


def test_a_cut_gzip_gives_all_it_holds():
    payload = b'{"ph": "X", "name": "kernel", "ts": 1}, ' * 6000 + b"\0" * 10240  # 250,240 bytes
    cut = gzip.compress(payload)[:-12]  # the trailer and the last deflate bytes gone
    want = zlib.decompressobj(31).decompress(cut)
    assert len(want) < len(payload) and payload.startswith(want)
    f = Inflate(io.BytesIO(cut))
    got = b""
    while block := f.read(10240):
        got += block
    assert got == want
    assert f.truncated


def test_a_whole_gzip_is_not_truncated():
    payload = b"x" * 100_000
    f = Inflate(io.BytesIO(gzip.compress(payload)))
    assert f.read(-1) == payload
    assert not f.truncated
