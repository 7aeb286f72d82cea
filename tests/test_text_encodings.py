"""Text in every Unicode encoding, through the one rule every text reader uses
(pipeline/ingest/streams.py: text_encoding, utf8_reader; Kineto JSON and NCCL-family logs alike):
UTF-8 with and without a byte order mark, UTF-16LE/BE and UTF-32LE/BE with and without one, as a
plain file, gzipped, and inside a tar and a tar.gz. The bytes are the codecs' own output; each
file gives the rows of the UTF-8 one (read by hand: the trace written below; the log's 8 lines of
node01, pid 2017630, ranks 2, 6, 4, 0, 1, 5 of 16, communicator 0x49bbd7790311d5eb on its five
ncclCommInitRank lines) and a note naming its encoding. UTF-32 logs without a mark were passed
over (as UTF-16 ones were, the tester's finding 12) while Kineto JSON in UTF-32 without a mark
was read: the two readers now share the rule, so both are read."""

from __future__ import annotations

import codecs
import gzip
import io
import json
import tarfile

import pytest
from conftest import X, corpus

from pipeline.ingest import ingest_paths
from pipeline.ingest.streams import JSON_SIGN_BYTES, text_encoding, utf8_reader
from pipeline.lake import Lake
from pipeline.query import connect

TRACE = json.dumps(
    {
        "schemaVersion": 1,
        "traceEvents": [
            X("kernel", "gemm_é_核", 10, 5, pid=0, tid=7, stream=7, device=0, correlation=1),
            X("cuda_runtime", "cudaLaunchKernel", 1, 2, correlation=1),
        ],
    },
    ensure_ascii=False,
)
LOG = corpus("nccl", "nccl-issue-1412-init-complete-and-init-timings-16rank.log").read_text(encoding="utf-8")

# case -> (bytes of a text, the encoding's name in the note: None for UTF-8)
ENCODINGS = {
    "u8": (lambda t: t.encode("utf-8"), None),
    "u8bom": (lambda t: codecs.BOM_UTF8 + t.encode("utf-8"), None),
    "u16le": (lambda t: t.encode("utf-16-le"), "UTF-16LE"),
    "u16lebom": (lambda t: codecs.BOM_UTF16_LE + t.encode("utf-16-le"), "UTF-16LE"),
    "u16be": (lambda t: t.encode("utf-16-be"), "UTF-16BE"),
    "u16bebom": (lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"), "UTF-16BE"),
    "u32le": (lambda t: t.encode("utf-32-le"), "UTF-32LE"),
    "u32lebom": (lambda t: codecs.BOM_UTF32_LE + t.encode("utf-32-le"), "UTF-32LE"),
    "u32be": (lambda t: t.encode("utf-32-be"), "UTF-32BE"),
    "u32bebom": (lambda t: codecs.BOM_UTF32_BE + t.encode("utf-32-be"), "UTF-32BE"),
}


def _write(root, container: str, case: str, name: str, data: bytes) -> None:
    d = root / case
    d.mkdir(parents=True)
    if container == "plain":
        (d / name).write_bytes(data)
    elif container == "gzip":
        (d / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
    else:  # a member in a directory of the case's name: run <case>, as the plain file's
        with tarfile.open(d / f"x.{container}", "w:gz" if container == "tar.gz" else "w") as tf:
            info = tarfile.TarInfo(f"{case}/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("container", ["plain", "gzip", "tar", "tar.gz"])
def test_every_encoding_of_a_trace_and_a_log_gives_the_utf8_rows(container, tmp_path):
    for case, (encode, _) in ENCODINGS.items():
        _write(tmp_path / "in", container, f"k_{case}", "rank0.json", encode(TRACE))
        _write(tmp_path / "in", container, f"l_{case}", "nccl.log", encode(LOG))
    lake = Lake(tmp_path / "lake")
    res = ingest_paths(sorted((tmp_path / "in").iterdir()), lake, jobs=1)
    got = {r.run_id: (r.status, r.notes) for r in res}
    want = {}
    for case, (_, name) in ENCODINGS.items():
        for kind, what in (("k", "JSON"), ("l", "log")):
            want[f"{kind}_{case}"] = (
                "ok",
                [f"{name} encoded {what}: decoded to UTF-8 as it was read"] if name else [],
            )
    assert got == want
    con = connect(lake)
    kernels = con.execute("SELECT run_id, name, start_ns, dur_ns FROM gpu_activities").fetchall()
    assert sorted(kernels) == sorted((f"k_{c}", "gemm_é_核", 10_000, 5_000) for c in ENCODINGS)
    procs = con.execute(
        "SELECT run_id, list_sort(list(rank)), list_distinct(list(nranks)), list_distinct(list(pid)),"
        " list_sort(list(comm_id) FILTER (comm_id IS NOT NULL)), list_distinct(list(host))"
        " FROM nccl_processes GROUP BY 1"
    ).fetchall()
    comm = "0x49bbd7790311d5eb"
    # every line's host is node01 (line 1: "node01:2017630:2017671 [2] NCCL INFO ..."): a UTF-8
    # byte order mark is not part of the first line's host
    assert sorted(procs) == [
        (f"l_{c}", [0, 1, 2, 4, 5, 6], [16], [2017630], [comm] * 5, ["node01"]) for c in sorted(ENCODINGS)
    ]
    events = con.execute("SELECT run_id, count(*) FROM nccl_events GROUP BY 1").fetchall()
    assert sorted(events) == [(f"l_{c}", 8) for c in sorted(ENCODINGS)]


def test_the_rule_on_bytes_written_by_hand():
    # marks (Unicode 15 table 23-4): the mark's length, the codec, the note's name
    assert text_encoding(b"\xff\xfe\x00\x00{\x00\x00\x00") == (4, "utf-32-le", "UTF-32LE")
    assert text_encoding(b"\x00\x00\xfe\xff\x00\x00\x00{") == (4, "utf-32-be", "UTF-32BE")
    assert text_encoding(b"\xff\xfe{\x00") == (2, "utf-16-le", "UTF-16LE")
    assert text_encoding(b"\xfe\xff\x00{") == (2, "utf-16-be", "UTF-16BE")
    assert text_encoding(b"\xef\xbb\xbfNCCL INFO x") is None  # UTF-8: left to the readers
    # no mark: 16 bytes of ASCII with the zero bytes of UTF-16 (8 characters) or UTF-32 (4)
    assert text_encoding(b"N\x00C\x00C\x00L\x00 \x00I\x00N\x00F\x00") == (0, "utf-16-le", "UTF-16LE")
    assert text_encoding(b"\x00N\x00C\x00C\x00L\x00 \x00I\x00N\x00F") == (0, "utf-16-be", "UTF-16BE")
    assert text_encoding(b"N\x00\x00\x00C\x00\x00\x00C\x00\x00\x00L\x00\x00\x00") == (
        0,
        "utf-32-le",
        "UTF-32LE",
    )
    assert text_encoding(b"\x00\x00\x00N\x00\x00\x00C\x00\x00\x00C\x00\x00\x00L") == (
        0,
        "utf-32-be",
        "UTF-32BE",
    )
    assert text_encoding(b"N\x00C\x00C\x00L\x00 \x00I\x00N\x00\xe9\x00") is None  # not ASCII
    assert text_encoding(b"N\x00C\x00C\x00L\x00") is None  # fewer than 16 bytes
    assert text_encoding(b"ab\x00\x00" * 4) is None  # neither pattern: UTF-8 padded with NULs
    # JSON: the first 4 bytes (its first 2 characters are ASCII, RFC 4627 section 3)
    assert text_encoding(b'{\x00"\x00', JSON_SIGN_BYTES) == (0, "utf-16-le", "UTF-16LE")
    assert text_encoding(b'\x00{\x00"', JSON_SIGN_BYTES) == (0, "utf-16-be", "UTF-16BE")
    assert text_encoding(b"{\x00\x00\x00", JSON_SIGN_BYTES) == (0, "utf-32-le", "UTF-32LE")
    assert text_encoding(b"\x00\x00\x00{", JSON_SIGN_BYTES) == (0, "utf-32-be", "UTF-32BE")
    assert text_encoding(b'{"tr', JSON_SIGN_BYTES) is None


def _reader(data: bytes, piece: int):
    chunks = [data[i : i + piece] for i in range(0, len(data), piece)]
    return lambda n=-1: chunks.pop(0) if chunks else b""


@pytest.mark.parametrize("piece", [1, 3, 7, 4096])
def test_utf8_reader_decodes_in_pieces_and_passes_utf8_through(piece):
    text = "NCCL INFO é 核 😀\n" * 50
    for codec, bom, name in (("utf-16-le", b"", "UTF-16LE"), ("utf-32-be", codecs.BOM_UTF32_BE, "UTF-32BE")):
        notes: list[str] = []
        read = utf8_reader(_reader(bom + text.encode(codec), piece), notes, "log")
        out = b"".join(iter(lambda: read(5), b""))
        assert out == text.encode("utf-8")
        assert notes == [f"{name} encoded log: decoded to UTF-8 as it was read"]
    utf8 = codecs.BOM_UTF8 + text.encode("utf-8")
    for mark, want in ((False, utf8), (True, utf8[3:])):  # a UTF-8 mark dropped only when asked
        notes = []
        read = utf8_reader(_reader(utf8, piece), notes, "JSON", JSON_SIGN_BYTES, utf8_mark=mark)
        assert b"".join(iter(lambda: read(5), b"")) == want and notes == []


def test_json_is_told_by_its_first_two_characters(tmp_path):
    """Kineto JSON without a mark whose third character is not ASCII (a first key of one letter in
    another script): JSON's first two characters are ASCII (RFC 4627 section 3), so its first 4
    bytes tell the encoding (a log needs 16)."""
    text = '{"é": 0, ' + TRACE[1:]
    codecs_ = {"u16le": "utf-16-le", "u16be": "utf-16-be", "u32le": "utf-32-le", "u32be": "utf-32-be"}
    for case, codec in codecs_.items():
        (tmp_path / case).mkdir()
        (tmp_path / case / "rank0.json").write_bytes(text.encode(codec))
        assert text_encoding(text.encode(codec)) is None  # the 16 bytes of a log's rule: not ASCII
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([tmp_path / c for c in codecs_], lake, jobs=1)
    assert sorted((r.run_id, r.status) for r in res) == sorted((c, "ok") for c in codecs_)
    kernels = connect(lake).execute("SELECT run_id, name, start_ns, dur_ns FROM gpu_activities").fetchall()
    assert sorted(kernels) == sorted((c, "gemm_é_核", 10_000, 5_000) for c in codecs_)
