"""Kineto threads whose (pid, tid) pairs share one tuple hash (issue 39, the colliding-keys kind of
item 2 found in the fuzz harness's Kineto mutator): Python randomizes neither an int's hash nor a
tuple's (a function of its items' hashes), so a trace can name 20,000 such threads; a dict keyed
by them compared every pair (launch_chains: 4.1 -> 16.2 s on 10 MB). launch_chains keys its
threads by a dense index instead, whose hashes are distinct by construction.
"""

from __future__ import annotations

import sys

import polars as pl
from conftest import REPO

from pipeline.ingest.kineto import comm

sys.path.insert(0, str(REPO))  # tests.fuzz is imported as a package from the repository root

from tests.fuzz.mutators import colliding_pairs  # noqa: E402


def test_the_pairs_share_one_tuple_hash():
    pairs = colliding_pairs(500)
    assert len(set(pairs)) == 500 and len({hash(p) for p in pairs}) == 1
    assert all(0 <= a < 2**61 and 0 <= b < 2**61 for a, b in pairs)  # JSON ints, int64 columns


def test_launch_chains_keys_colliding_threads_by_distinct_hashes(monkeypatch):
    pairs = colliding_pairs(2000)
    pids, tids = [a for a, _ in pairs], [b for _, b in pairs]
    n = len(pairs)
    launches = pl.DataFrame({"correlation": range(1, n + 1), "pid": pids, "tid": tids, "start_ns": [5] * n})
    hosts = pl.DataFrame(
        {"event_index": range(100, 100 + n), "pid": pids, "tid": tids, "start_ns": [0] * n, "end_ns": [9] * n}
    )
    keys = []
    real = pl.DataFrame.partition_by

    def spy(self, *a, **kw):
        out = real(self, *a, **kw)
        if isinstance(out, dict):
            keys.append(list(out))
        return out

    monkeypatch.setattr(pl.DataFrame, "partition_by", spy)
    got = comm.launch_chains(launches, hosts)
    assert got == {c: [99 + c] for c in range(1, n + 1)}  # each launch inside its own thread's op
    assert len(keys) == 2 and all(len({hash(k) for k in ks}) == len(ks) == n for ks in keys)


def test_null_pid_or_tid_is_still_a_thread():
    launches = pl.DataFrame(
        {"correlation": [1, 2, 3], "pid": [1, None, 1], "tid": [2, 2, None], "start_ns": [5, 5, 5]},
        schema_overrides={"pid": pl.Int64, "tid": pl.Int64},
    )
    hosts = pl.DataFrame(
        {
            "event_index": [10, 11, 12],
            "pid": [1, None, 1],
            "tid": [2, 2, None],
            "start_ns": [0] * 3,
            "end_ns": [9] * 3,
        },
        schema_overrides={"pid": pl.Int64, "tid": pl.Int64},
    )
    assert comm.launch_chains(launches, hosts) == {1: [10], 2: [11], 3: [12]}
