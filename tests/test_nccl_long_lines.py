"""NCCL-family text with hostile long lines is parsed in time linear in the line (issue: a 100 kB
line took 97 s, a 1 MB line over 11 minutes, because line patterns backtracked over runs of word
characters or '[' from every start position).

Two kinds of check:
- every line grammar of pipeline/ingest/nccl/ gets a 1 MB line built to make its patterns
  backtrack (runs of word characters, digits, '[' without ']', repeated keys and separators
  after each dispatching prefix) and must come back within a bound (10 s) that a quadratic
  pattern misses by minutes — a hang check, not a speed measurement;
- the guards that made the patterns linear (a lookbehind so a match cannot start inside a run
  it would also match from the run's start; '[' excluded inside a bracketed time stamp) change
  no result: hypothesis compares each with the pattern as it was, on text built from the
  characters those patterns care about. The corpus files parse as before (tests/test_nccl_*).
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest import nccl
from pipeline.ingest.nccl import log, log_comm, log_info, log_torch, ras
from pipeline.ingest.nccl.common import findall_linear

MB = 1 << 20
HEAD = b"host1:100:200 [0] NCCL INFO NCCL version 2.18.1+cuda12.1\n"
INFO = b"host1:100:200 [0] NCCL INFO "
WARN = b"host1:100:200 [0] NCCL WARN "


def _rep(unit: bytes) -> bytes:
    return unit * (MB // len(unit))


LINES = {
    "word run": _rep(b"a"),
    "digit run": _rep(b"1"),
    "open brackets before an NCCL line": _rep(b"[") + b" NCCL INFO x",
    "time stamps without ']'": _rep(b"[12:00:00") + b" NCCL INFO x",
    "host:pid:tid-like run": _rep(b"a:1:") + b" NCCL INFO x",
    "INFO word run": INFO + _rep(b"a"),
    "INFO lifecycle keys": INFO + _rep(b"comm 0x1 rank 0 "),
    "INFO lifecycle without func": INFO + _rep(b"x comm 0x1 rank "),
    "INFO comm key-values": INFO + b"comm 0x1 rank 0 nRanks 2 " + _rep(b"k "),
    "INFO COLL": INFO + b"AllReduce: opCount " + _rep(b"0"),
    "INFO tuning": INFO + _rep(b"1") + b" Bytes -> Algo",
    "INFO init timings": INFO + b"Init timings: rank 0 nranks 2 total 1.0 (" + _rep(b"a 1 ") + b")",
    "INFO channel counts": INFO + _rep(b"1") + b" coll channels",
    "CALL": b"host1:100:200 [0] NCCL CALL ncclAllReduce(" + _rep(b"("),
    "WARN error chain": WARN + _rep(b"a") + b":1 -> 2",
    "launcher wrappers": _rep(b"a.b: ") + b"NCCL version 2.1.1",
    "torch WorkNCCL": b"[rank0]:[E ProcessGroupNCCL.cpp:1] WorkNCCL(" + _rep(b"a=1") + b")",
    "torch word run": b"[rank0]: ProcessGroupNCCL " + _rep(b"a") + b"=",
    "nccl-tests comment": b"# " + _rep(b"1 "),
    "RAS counts": _rep(b"1 rank has launched up to operation "),
}


@pytest.mark.parametrize("name", list(LINES))
def test_a_1mb_line_is_parsed_in_bounded_time(name):
    t = time.perf_counter()
    parsed = nccl.parse(HEAD + LINES[name] + b"\n", "hostile.log", "nccl_log")
    took = time.perf_counter() - t
    assert took < 10, f"{name}: {took:.1f} s"
    assert parsed.tables["nccl_processes"].height >= 1  # the good first line is still read


# (pattern as it was before the guard, pattern now)
GUARDED = [
    (r"(\w+) (\S+)", log_comm.KV),
    (r"(\d+) (coll|collnet|nvls|p2p) channels( per peer)?", log_info.CHANNEL_COUNTS),
    (r"(\w+(?:\(ms\))?)=([^,]*)", log_torch.WORK_KV),
    (r"(?P<n>\d+) ranks? (?:have|has) launched up to operation (?P<op>\d+)", ras.RAS_COUNT),
    (r"(?P<n>\d+) ranks? (?:have|has) not launched any operations", ras.RAS_NONE),
    (
        r"(?:\[Rank (?P<rk>\d+)\] )?(?:(?P<func>\w+) )?comm (?P<comm>\S+) (?P<kv>rank .*?)\s*"
        r"- (?P<what>(?:Init|Destroy|Abort|Revoke) (?:START|COMPLETE))(?:, result (?P<res>-?\d+))?\s*$",
        log_comm.LIFECYCLE,
    ),
    (
        r"(?:\[(?P<ts>[^\]]*\d{2}:\d{2}:\d{2}[^\]]*)\] )?"
        r"(?P<host>[^\s:\[\]]*):(?P<pid>\d+):(?P<tid>\d+) "
        r"(?:\[(?P<dev>\d+)\] )?(?:(?P<ms>\d+\.\d+) )?"
        r"(?:(?P<src>[\w./-]+):(?P<sline>\d+)(?: \((?P<func>\w+)\))? )?"
        r"NCCL (?P<lvl>INFO|WARN|TRACE|CALL|ABORT) (?P<msg>.*)$",
        log.PREFIX,
    ),
]
WORDS = st.sampled_from(
    ["a", "ab", "1", "12", "0x1", " ", "  ", ":", "=", ",", "(ms)", "[", "]", "12:00:00", "[Rank 3] ",
     "comm ", "rank ", "- Init START", ", result 0", "coll", " channels", " per peer", "ranks ", "rank ",
     "has ", "have ", "launched up to operation ", "not launched any operations", "NCCL INFO ", "x.cc",
     "host1:12:34 ", "[0] ", "1.5 ", "-", "\t", "Init", "[2024-01-01 12:00:00] "]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(WORDS, max_size=14).map("".join))
def test_linear_findall_is_findall(text):
    # NAMED_SECONDS ends in [\d.]+, so its next match can start inside a word run
    # ('ranks 1ranks 1'): common.findall_linear, not a bare guard
    got = findall_linear(log_info.NAMED_SECONDS, log_info.NAMED_SECONDS_AT_RUN, text)
    assert got == re.compile(r"(\w+) ([\d.]+)").findall(text)


@settings(max_examples=400, deadline=None)
@given(st.lists(WORDS, max_size=14).map("".join))
def test_the_guards_change_no_match(text):
    for before, now in GUARDED:
        old = re.compile(before)
        if "$" in before:  # searched for one match (LIFECYCLE, PREFIX)
            a, b = old.search(text), now.search(text)
            assert (a and (a.span(), a.groupdict())) == (b and (b.span(), b.groupdict())), before
        else:  # findall
            assert old.findall(text) == now.findall(text), before
