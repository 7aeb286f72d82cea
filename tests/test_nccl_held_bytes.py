"""A text log's memory is bounded in bytes, not rows (issue 39 item 3): a 450 MB log whose every
line opens a new process and communicator took 4.7 GB before the 2^20-row caps on each table and
map held. Everything a parse holds to the end of the file is charged to one common.HeldBytes
(MAX_HELD_BYTES); the appended tables are built into frames every SPILL_ROWS rows or SPILL_BYTES;
nccl-tests device lines and torchfrtrace stack lines cost the same whatever came before them.

Each input is just over a cap scaled down with monkeypatch, and the test checks where it held.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from pipeline.ingest import nccl
from pipeline.ingest.nccl import common
from pipeline.ingest.nccl.log import LogParser
from pipeline.ingest.nccl.log_state import SPOOLED


def _new_process(i: int, host: str = "node01") -> str:
    """A line that opens a new process, thread and communicator (fixed width: each costs the same)."""
    return (
        f"{host}:{100000 + i}:{200000 + i} [0] NCCL INFO ncclCommInitRank comm 0x{0x8EC0000 + i:x} "
        f"rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId c8000 commId 0x{0x49BBD779000000 + i:x} - Init START"
    )


def _held_per_line(lines: list[str]) -> int:
    ps = LogParser("a.log")
    ps.feed(1, lines[0])
    one = ps.held.used_bytes
    ps.feed(2, lines[1])
    assert ps.held.used_bytes - one == one  # the first line costs what each later one does
    return one


def _parse(lines: list[str]):
    return nccl.parse(("\n".join(lines) + "\n").encode(), "a.log", "nccl_log")


def test_a_log_whose_every_line_opens_a_process_holds_at_most_the_byte_cap(monkeypatch):
    lines = [_new_process(i) for i in range(1000)]
    per_line = _held_per_line(lines)
    assert 1000 < per_line < 3000  # a processes row, a thread, a device and a communicator (1.7 kB measured)
    monkeypatch.setattr(common, "MAX_HELD_BYTES", 300 * per_line)
    p = _parse(lines)
    procs = p.tables["nccl_processes"]
    assert procs["first_line_no"].to_list() == list(range(1, 301))  # 300 of the 1,000 (all under the row cap)
    other = p.tables["nccl_events"].filter(pl.col("kind") == "other")
    assert other["line_no"].to_list() == list(range(301, 1001)) and other["text"].to_list() == lines[300:]
    assert p.tables["nccl_events"]["line_no"].is_unique().all()  # a refused line is one event, nothing else
    assert (
        "700 lines kept as kind 'other': the rows and maps held to the end of the file (tables still "
        "open to later lines; threads, processes, devices, communicators) reached 0 MiB"
    ) in p.notes


def test_a_long_host_name_counts_its_bytes(monkeypatch):
    """The same lines with a 20,000-character host name: 80 kB more each (the host is in four places),
    so fewer fit."""
    short = [_new_process(i) for i in range(50)]
    long = [_new_process(i, "n" * 20_000) for i in range(50)]
    short_line, long_line = _held_per_line(short), _held_per_line(long)
    assert (
        long_line > short_line + 3 * 20_000
    )  # the host is in the row, the device key and the communicator key
    monkeypatch.setattr(common, "MAX_HELD_BYTES", 40 * short_line)
    assert _parse(short).tables["nccl_processes"].height == 40
    # 1: a line is taken whole or not at all, and the first long line alone passes the cap
    assert 40 * short_line < long_line and _parse(long).tables["nccl_processes"].height == 1


def test_version_device_and_table_lines_are_held_within_the_cap(monkeypatch):
    """Lists that grew with every line (distinct bare versions, nccl-tests devices and headers) are
    charged too: past the cap their lines are kept as 'other'."""
    monkeypatch.setattr(common, "MAX_HELD_BYTES", 64 << 10)
    versions = [f"NCCL version 2.{i}.1+cuda12.2" for i in range(1000)]
    devices = [
        f"#  Rank {i:4d} Group  0 Pid {1000 + i} on node01 device  0 [0x07] NVIDIA H100" for i in range(1000)
    ]
    headers = ["#       size         count      type   redop    root     time   algbw   busbw #wrong"] * 1000
    for lines, attr in ((versions, "bare_versions"), (devices, "runs"), (headers, "tables")):
        ps = LogParser("a.log")
        full = 0
        for i, line in enumerate(lines, 1):
            try:
                ps.feed(i, line)
            except common.TableFull:
                full += 1
        held = len(getattr(ps, attr)) if attr != "runs" else sum(len(r.devices) for r in ps.runs)
        assert 0 < held < 1000 and held + full == 1000, attr
        assert ps.held.used_bytes <= 64 << 10


def test_a_device_line_does_not_scan_the_runs_earlier_devices():
    """nccl-tests device lines: whether a rank repeats (a new run) is a set lookup; the list of
    devices is not walked at each line (quadratic in a log of distinct ranks)."""

    class NoWalk(list):
        def __iter__(self):
            raise AssertionError("the device list was walked")

    ps = LogParser("a.log")
    line = "#  Rank {:4d} Group  0 Pid 1000 on node01 device  0 [0x07] NVIDIA H100"
    ps.feed(1, line.format(0))
    ps.run.devices = NoWalk(ps.run.devices)
    for i in range(1, 50):
        ps.feed(i + 1, line.format(i))
    ps.feed(51, line.format(3))  # a repeated rank opens a new run
    assert [len(r.devices) for r in ps.runs] == [50, 1] and ps.runs[0].ranks == {str(i) for i in range(50)}


def test_device_ranks_made_to_collide_are_not_hashed_as_ints():
    """Ranks k * (2**61 - 1) share one int hash; the run's set holds their digits (a str hash is
    randomized), and "007" is rank 7 again."""
    ps = LogParser("a.log")
    line = "#  Rank {} Group  0 Pid 1000 on node01 device  0 [0x07] NVIDIA H100"
    for i in range(1, 200):
        ps.feed(i, line.format(i * (2**61 - 1)))
    (run,) = ps.runs
    assert len({hash(r) for r in run.ranks}) == len(run.ranks) == 199
    ps.feed(200, line.format(7))
    ps.feed(201, line.format("007"))
    assert [len(r.devices) for r in ps.runs] == [200, 1]


def test_the_end_of_file_steps_add_their_rows_past_the_cap(monkeypatch):
    """Devices seen in lines that open no communicator get their processes rows at the end of the
    file; the cap is not applied then (they are already counted), so the parse finishes."""
    lines = [
        f"node01:{1000 + i}:{2000 + i} [0] NCCL INFO Bootstrap : Using eth0:10.0.0.{100 + i % 100}<0>"
        for i in range(200)
    ]
    ps = LogParser("a.log")
    ps.feed(1, lines[0])
    monkeypatch.setattr(common, "MAX_HELD_BYTES", 100 * ps.held.used_bytes)
    p = _parse(lines)
    assert p.tables["nccl_processes"]["pid"].to_list() == list(range(1000, 1100))


@pytest.mark.parametrize("spill_bytes", [1 << 20, 4 << 20])
def test_appended_rows_are_built_into_frames_by_bytes_too(tmp_path, monkeypatch, spill_bytes):
    """Lines of 100 kB: the unbuilt nccl_events rows hold at most SPILL_BYTES (and one line) at any
    time, not SPILL_ROWS (16,384) lines."""
    from pipeline.ingest.spool import _Budget

    monkeypatch.setattr(common, "SPILL_BYTES", spill_bytes)
    data = "".join(f"node01:1:2 [0] NCCL INFO {'x' * 100_000} {i}\n" for i in range(60)).encode()
    held = []
    real_feed = LogParser.feed

    def feed(self, i, text):
        real_feed(self, i, text)
        held.append(max(sum(len(v) for r in self.t[t].rows for v in r if type(v) is str) for t in SPOOLED))

    monkeypatch.setattr(LogParser, "feed", feed)
    pos = 0

    def read(n):
        nonlocal pos
        pos += n
        return data[pos - n : pos]

    p = nccl.parse_stream(read, "a.log", "nccl_log", _Budget(1 << 30, tmp_path))
    frames = list(p.tables["nccl_events"])
    p.close()
    assert sum(f.height for f in frames) == 60
    per_frame = -(-spill_bytes // 200_500)  # lines of 200.0-200.5 kB (text, message) until SPILL_BYTES
    assert len(frames) == -(-60 // per_frame)
    assert 0 < max(held) <= spill_bytes + 200_100


def test_torchfrtrace_stack_lines_are_appended_in_place(monkeypatch):
    """A finding's stack lines: appended to its frames list, not copied into a new list at each line
    (a report of 80,000 stack lines took 7 s, quadratic)."""
    calls = []
    real_set = common.Rows.set

    def spy(self, i, **kw):
        if "frames" in kw:
            calls.append(len(kw["frames"]))
        real_set(self, i, **kw)

    monkeypatch.setattr(common.Rows, "set", spy)
    report = "Not all ranks joining collective 5 at entry 4\ncollective stack trace: a\n" + "".join(
        f"  frame {i}\n" for i in range(1000)
    )
    p = nccl.parse(report.encode(), "frtrace.txt", "torchfrtrace")
    (row,) = p.tables["flight_recorder_mismatches"].to_dicts()
    assert row["frames"] == ["a"] + [f"frame {i}" for i in range(1000)]
    assert calls == [1]  # the list set once; the 1,000 lines appended to it


def test_a_whole_file_format_past_the_row_cap_fails_in_one_line(monkeypatch):
    from pipeline.ingest.errors import TraceError

    monkeypatch.setattr(common, "MAX_HELD_ROWS", 10)
    dump = {"version": "2.1", "entries": [{"record_id": i} for i in range(20)]}
    with pytest.raises(
        TraceError, match=r"^more rows than one table may hold \(10\): flight_recorder holds 10 rows$"
    ):
        nccl.parse(json.dumps(dump).encode(), "fr_0.json", "flight_recorder")


def test_group_ranks_repeated_on_every_entry_are_bounded_by_the_files_budget(monkeypatch):
    """pg_ranks repeats its group's ranks on each entry: 1,000 ranks x 100 entries from one ranks
    string. With the budget at 50 entries' worth (4 bytes a rank), the other 50 get null and a note."""
    from pipeline.ingest.nccl import unpickle

    ranks = str(list(range(1000)))
    entries = [{"record_id": i, "process_group": ["0", "default_pg"]} for i in range(100)]
    dump = {
        "version": "2.1",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "entries": entries,
    }
    data = json.dumps(dump).encode()
    monkeypatch.setattr(unpickle, "EXPANSION_FLOOR_BYTES", 50 * 4000)
    monkeypatch.setattr(unpickle, "EXPANSION_RATIO", 0)
    p = nccl.parse(data, "fr_0.json", "flight_recorder")
    got = p.tables["flight_recorder"]["pg_ranks"].to_list()
    assert got == [list(range(1000))] * 50 + [None] * 50
    assert (
        "pg_ranks left null on 50 entries: the group ranks repeated on each entry pass 200000 bytes"
        in p.notes
    )
    assert p.tables["flight_recorder_groups"]["ranks"].to_list() == [list(range(1000))]
