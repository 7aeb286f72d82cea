"""NCCL logs in UTF-16 or UTF-32 (the tester's finding 12: a UTF-16 log was passed over as "not
an NCCL-family log"). A real log of the corpus, re-encoded here, is read as the text it holds:
sniffed, streamed and parsed whole, with a note naming the encoding. Expected values read by
hand from the file: 8 lines of node01, pid 2017630, ranks 2, 6, 4, 0, 1, 5 of 16, communicator
0x49bbd7790311d5eb on the five ncclCommInitRank lines (rank 2's only line is its Init timings)."""

from __future__ import annotations

import codecs

import pytest
from conftest import corpus

from pipeline.ingest import nccl
from pipeline.ingest.discover import discover
from pipeline.ingest.streams import text_encoding

LOG = corpus("nccl", "nccl-issue-1412-init-complete-and-init-timings-16rank.log")
TEXT = LOG.read_text(encoding="utf-8")

ENCODED = [  # (bytes, the encoding's name in the note)
    (codecs.BOM_UTF16_LE + TEXT.encode("utf-16-le"), "UTF-16LE"),  # PowerShell's `>`
    (codecs.BOM_UTF16_BE + TEXT.encode("utf-16-be"), "UTF-16BE"),
    (TEXT.encode("utf-16-le"), "UTF-16LE"),  # no byte order mark: ASCII with zero bytes between
    (codecs.BOM_UTF32_LE + TEXT.encode("utf-32-le"), "UTF-32LE"),
]


def _check(parsed) -> None:
    procs = parsed.tables["nccl_processes"]
    assert sorted(procs["rank"].to_list()) == [0, 1, 2, 4, 5, 6]
    assert set(procs["nranks"].to_list()) == {16} and set(procs["pid"].to_list()) == {2017630}
    assert procs["comm_id"].drop_nulls().to_list() == ["0x49bbd7790311d5eb"] * 5


@pytest.mark.parametrize(("data", "name"), ENCODED, ids=["utf16le-bom", "utf16be-bom", "utf16le", "utf32le"])
def test_a_log_in_utf16_or_utf32_is_read(data, name, tmp_path):
    assert nccl.sniff(data[:65536], "nccl.log") == "nccl_log"
    assert nccl.streams(data[:65536], "nccl_log")
    chunks = [data[i : i + 7] for i in range(0, len(data), 7)]  # cut mid-character: decoded as read

    def read(n: int = -1) -> bytes:
        return chunks.pop(0) if chunks else b""

    streamed = nccl.parse_stream(read, "nccl.log", "nccl_log")
    _check(streamed)
    assert streamed.notes[0] == f"{name} encoded log: decoded to UTF-8 as it was read"
    whole = nccl.parse(data, "nccl.log")
    _check(whole)
    assert f"{name} encoded file: decoded to UTF-8" in whole.notes
    # a directory search picks it up as a log (it was passed over)
    (tmp_path / "nccl.log").write_bytes(data)
    assert [f.name for f in discover([tmp_path])] == ["nccl.log"]


def test_utf8_and_binary_are_not_taken_for_utf16():
    assert text_encoding(TEXT.encode()) is None
    assert text_encoding(b"\x00" * 64 + TEXT.encode()) is None  # a log padded with NULs when its writer died
    assert text_encoding(bytes(range(256))) is None


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_host():
    """A log saved by a Windows editor starts with the UTF-8 mark (EF BB BF): streamed and parsed
    whole, every line's host is node01 (line 1 of the file: "node01:2017630:2017671 [2] NCCL
    INFO ..."), as in the file without it, and no note (UTF-8 needs no decoding)."""
    data = codecs.BOM_UTF8 + TEXT.encode("utf-8")
    chunks = [data[i : i + 7] for i in range(0, len(data), 7)]

    def read(n: int = -1) -> bytes:
        return chunks.pop(0) if chunks else b""

    for parsed in (nccl.parse_stream(read, "nccl.log", "nccl_log"), nccl.parse(data, "nccl.log")):
        _check(parsed)
        assert set(parsed.tables["nccl_processes"]["host"].to_list()) == {"node01"}
        events = parsed.tables["nccl_events"]  # a spool of frames when streamed
        hosts = {
            h for df in ([events] if hasattr(events, "columns") else events) for h in df["host"].to_list()
        }
        assert hosts == {"node01"}
        assert not [n for n in parsed.notes if "encoded" in n]
