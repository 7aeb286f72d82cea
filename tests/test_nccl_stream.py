"""NCCL-family text logs read line by line (issue 21, point 7: a 200 MB log took 3.8 GB because it
was read, decoded and split whole, and every nccl_events row stayed a Python dict to the end).

pipeline.ingest.nccl.parse_stream must give what parse() gives on the same bytes (parse() is the
path the corpus tests check against lines read by hand), whatever the chunk size, the spill size
and the spool budget; and while it reads, the append-only tables hold at most one batch of dict
rows, the rest built into frames on disk. The caps that bound the rest (line length, bytes of the
tables still open to later lines) are checked on inputs that pass them by one.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import CORPUS

from pipeline import lake as lake_mod
from pipeline.ingest import nccl
from pipeline.ingest.nccl import common, stream
from pipeline.ingest.nccl.log import LogParser
from pipeline.ingest.nccl.log_state import SPOOLED
from pipeline.ingest.spool import _Budget


def _streamed(p) -> bool:
    data = p.read_bytes()
    return p.suffix in (".log", ".txt", ".out") and nccl.streams(data, nccl.sniff(data, p.name))


TEXT_LOGS = sorted(p for p in (CORPUS / "nccl").iterdir() if _streamed(p))


def _reader(data: bytes):
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        out = data[pos : pos + n]
        pos += len(out)
        return out

    return read


def _frames(parsed) -> dict[str, pl.DataFrame]:
    out = {}
    for t, v in parsed.tables.items():
        out[t] = v if isinstance(v, pl.DataFrame) else pl.concat(list(v))
        if not isinstance(v, pl.DataFrame):
            v.close()
    return out


def _tiny(monkeypatch) -> None:
    monkeypatch.setattr(stream, "CHUNK_BYTES", 7)  # chunk edges inside lines and characters
    monkeypatch.setattr(common, "SPILL_ROWS", 3)  # a frame every 3 rows


def test_the_corpus_has_text_logs_of_each_streamed_kind():
    kinds = {nccl.sniff(p.read_bytes(), p.name) for p in TEXT_LOGS}
    assert {"nccl_log", "nccl_tests", "torch_watchdog"} <= kinds
    assert len(TEXT_LOGS) >= 20


@pytest.mark.parametrize("path", TEXT_LOGS, ids=lambda p: p.name)
def test_streamed_log_equals_the_whole_parse(path, tmp_path, monkeypatch):
    data = path.read_bytes()
    fmt = nccl.sniff(data, path.name)
    whole = nccl.parse(data, path.name, fmt)
    _tiny(monkeypatch)
    streamed = nccl.parse_stream(_reader(data), path.name, fmt, _Budget(512, tmp_path))  # spills to disk
    assert streamed.notes == whole.notes
    assert (streamed.event_count, streamed.host, streamed.world_size, streamed.tool_versions) == (
        whole.event_count,
        whole.host,
        whole.world_size,
        whole.tool_versions,
    )
    got = _frames(streamed)
    assert sorted(got) == sorted(whole.tables)
    for t, df in whole.tables.items():
        assert got[t].equals(df), t


def test_the_append_only_tables_hold_one_batch_while_the_rest_is_on_disk(tmp_path, monkeypatch):
    """A log of 2,000 corpus lines with the spill at 100 rows and a 4 kB budget: at every line
    nccl_events holds under 100 dict rows, and its frames went to an Arrow file in the spool dir."""
    src = CORPUS / "nccl" / "aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"
    lines = src.read_text().splitlines()
    data = ("\n".join((lines * (2000 // len(lines) + 1))[:2000]) + "\n").encode()
    monkeypatch.setattr(common, "SPILL_ROWS", 100)
    held = []
    real_feed = nccl.log.LogParser.feed

    def feed(self, i, text):
        real_feed(self, i, text)
        held.append(max(len(self.t[t].rows) for t in SPOOLED))

    monkeypatch.setattr(nccl.log.LogParser, "feed", feed)
    parsed = nccl.parse_stream(_reader(data), "big.log", "nccl_log", _Budget(4096, tmp_path))
    ev = parsed.tables["nccl_events"]
    assert ev.path is not None and ev.path.exists()  # spilled to the spool directory
    assert max(held) < 100 and len(held) == sum(1 for x in data.split(b"\n") if x.strip())
    frames = _frames(parsed)
    whole = nccl.parse(data, "big.log", "nccl_log")
    assert frames["nccl_events"].equals(whole.tables["nccl_events"])


def test_utf8_split_across_chunks_is_not_invalid_and_bad_bytes_are_noted(tmp_path, monkeypatch):
    good = "node01é:1:2 [0] NCCL INFO Using network IB — ünïcode\n".encode() * 5
    bad = good + b"node01:1:2 [0] NCCL INFO bad \xff\xfe byte\n"
    _tiny(monkeypatch)
    g = nccl.parse_stream(_reader(good), "a.log", "nccl_log", _Budget(1 << 20, tmp_path))
    assert "invalid UTF-8 replaced" not in g.notes
    assert _frames(g)["nccl_events"]["host"].to_list() == ["node01é"] * 5
    b = nccl.parse_stream(_reader(bad), "a.log", "nccl_log", _Budget(1 << 20, tmp_path))
    assert b.notes[0] == "invalid UTF-8 replaced"
    assert _frames(b)["nccl_events"]["text"][-1] == "node01:1:2 [0] NCCL INFO bad \ufffd\ufffd byte"


def test_a_line_past_the_line_cap_is_cut_and_the_next_line_keeps_its_number(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(stream, "CHUNK_BYTES", 16)
    first = b"node01:1:2 [0] NCCL INFO Using network IB\n"
    long = b"node01:1:2 [0] NCCL INFO " + b"a" * 400 + b"\n"
    last = b"node01:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>\n"
    p = nccl.parse_stream(_reader(first + long + last), "a.log", "nccl_log", _Budget(1 << 20, tmp_path))
    assert "1 lines longer than 0 MB cut there" in p.notes
    ev = _frames(p)["nccl_events"].sort("line_no")
    assert ev["line_no"].to_list()[:2] == [1, 2]
    assert len(ev.filter(pl.col("line_no") == 2)["text"][0]) <= 100 + 16
    net = _frames(nccl.parse(first + long + last, "a.log", "nccl_log"))["nccl_net_devices"]
    assert net["line_no"].to_list() == [3]  # the line after the cut one, numbered as in the file
    assert _frames(p)["nccl_net_devices"]["line_no"].to_list() == [3]


def test_a_held_table_past_its_cap_keeps_later_lines_as_other(monkeypatch):
    """nccl_channels stays open to later lines (its communicator is named after it), so it is held
    to the end, its rows counted in bytes against MAX_HELD_BYTES: with the cap at what 4 channel
    lines hold, 6 channel lines give 4 channel rows and 2 events of kind 'other' carrying the
    lines, with one note."""
    chan = [f"node01:1:2 [0] NCCL INFO Channel 0{k}/0 : 0[0] -> 1[1] via P2P/IPC" for k in range(6)]
    four = LogParser("a.log")
    for i, line in enumerate(chan[:4], 1):
        four.feed(i, line)
    monkeypatch.setattr(common, "MAX_HELD_BYTES", four.held.used_bytes)
    p = nccl.parse(("\n".join(chan) + "\n").encode(), "a.log", "nccl_log")
    assert p.tables["nccl_channels"]["line_no"].to_list() == [1, 2, 3, 4]
    other = p.tables["nccl_events"].filter(pl.col("kind") == "other")
    assert other["line_no"].to_list() == [5, 6] and other["text"].to_list() == chan[4:]
    assert any(n.startswith("2 lines kept as kind 'other'") for n in p.notes)


def test_ingest_reads_a_log_by_stream_into_the_same_lake_rows(tmp_path, monkeypatch):
    """Through `ingest_paths`, with a tiny spill and chunk, a corpus log's lake rows equal parse()'s."""
    from pipeline.ingest import ingest_paths

    src = CORPUS / "nccl" / "nvidia-nccl-docs-2.30-logging-examples-by-subsystem.log"
    whole = nccl.parse(src.read_bytes(), src.name)
    _tiny(monkeypatch)
    calls = []
    real = nccl.parse_stream
    monkeypatch.setattr(nccl, "parse_stream", lambda *a: calls.append(a[1]) or real(*a))
    lake = lake_mod.Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([src], lake, jobs=1)] == ["ok"]
    assert calls == [src.name]  # read by stream, not whole
    for t, df in whole.tables.items():
        got = pl.read_parquet(lake.table_files(t)).drop("run_id", "source_id")
        assert got.equals(df), t


def test_a_note_a_long_log_repeats_is_given_once_with_its_count():
    """nccl-tests-issue-284's log starts with a units line without its header (line 1: one note).
    Three copies of it, each after a complete nccl-tests table (OCI's output), give one note
    naming the first such line and the 2 more, not three notes (a 1 GB log of corpus files
    repeated gave 28,000 notes, one per copy)."""
    headless = (
        CORPUS / "nccl" / "nccl-tests-issue-284-socket-transport-info-interleaved-in-table.log"
    ).read_bytes()
    table = (CORPUS / "nccl" / "ncclTests-oci-a100-16rank-roce-allreduce.txt").read_bytes()
    note = "nccl-tests units line without its header; assumed the nccl-tests >= 2.13 columns"
    assert [n for n in nccl.parse(headless, "a.log").notes if "units line" in n] == [f"line 1: {note}"]
    log = headless + table + headless + table + headless
    three = nccl.parse(log, "a.log")
    assert [n for n in three.notes if "units line" in n] == [f"line 1 (and 2 more): {note}"]
