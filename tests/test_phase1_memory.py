"""Phase 1 of a Kineto parse keeps nothing per batch that grows with the event count (issue 40).

What it keeps to the end of the parse (ProfilerStep ranges, comm host ops, ops with collective
metadata) is a few rows a batch, in buffers of their own: a polars filter of contiguous rows is a
slice of the batch's columns and kept the whole batch alive (about 1 MB of RSS per 16 MB batch of
benchmarks/ingest_memory.py's trace). The expected rows are the ones the same trace gives decoded
in one batch with nothing spilled; the memory itself is measured by benchmarks/ingest_memory.py,
not here.
"""

from __future__ import annotations

import gzip
import io
import sys

import numpy as np
import polars as pl
import pytest
from conftest import corpus

from pipeline.ingest import kineto
from pipeline.ingest.kineto.acc import _owned
from pipeline.ingest.kineto.stream import _Splitter

TRACES = {
    # 40,573 events: 3 ProfilerSteps, 69 comm host ops, 27 ops with collective metadata
    "nccl_data": ("hta", "tests", "data", "nccl_parser_config", "nccl_data.json.gz"),
    # 56,451 events (MI300): 3 ProfilerSteps, 42 comm host ops, 18 with collective metadata
    "resnet": ("tracelens", "tests", "traces", "mi300", "resnet_act_checkpoint.json.gz"),
}


def test_kept_rows_do_not_hold_the_batch():
    """_owned: the same rows and dtypes; the batch's numpy column is no longer referenced once
    the batch's frame is gone (a plain filter of one row keeps it)."""
    start = np.arange(10, 110, dtype=np.int64)  # a batch's start_ns, as cpu_frame builds it
    alone = sys.getrefcount(start)
    batch = pl.DataFrame(
        {"name": [f"aten::op_{k}_with_a_long_name" for k in range(100)], "start_ns": start}
    ).with_columns(name=pl.when(pl.col("start_ns") == 42).then(pl.lit("ProfilerStep#7")).otherwise("name"))
    assert sys.getrefcount(start) == alone + 1  # the frame uses the numpy buffer, not a copy
    step = batch.filter(pl.col("name") == "ProfilerStep#7")
    kept = _owned(step)
    plain = step  # what acc kept before
    del batch, step
    assert sys.getrefcount(start) == alone + 1  # the plain filter still holds the batch's column
    del plain
    assert sys.getrefcount(start) == alone
    assert kept.schema == pl.Schema({"name": pl.String, "start_ns": pl.Int64})
    assert kept.to_dict(as_series=False) == {"name": ["ProfilerStep#7"], "start_ns": [42]}


def test_the_previous_batch_is_gone_while_the_next_is_decoded():
    """The splitter keeps no reference to a batch it handed out once the caller dropped it: while
    the next batch is decoded only the caller's own reference (the watch below) remains."""

    class Watch(_Splitter):
        last = None
        refs: list[int] = []

        def _decode(self, pos, end):
            if self.last is not None:
                self.refs.append(sys.getrefcount(self.last))  # the watch's reference and the call's
            return super()._decode(pos, end)

    data = gzip.decompress(corpus(*TRACES["nccl_data"]).read_bytes())
    sp = Watch(io.BytesIO(data).read, 64 << 10)
    batches = events = 0
    for evs in sp.batches():
        batches, events = batches + 1, events + len(evs)
        sp.last = evs
        del evs
    assert events == 40_573 and batches > 50
    assert sp.refs and set(sp.refs) == {2}


@pytest.mark.parametrize("key", list(TRACES))
def test_small_batches_keep_the_same_rows(key, tmp_path):
    """Decoded in batches of 64 KB with every table spilled at once, the trace gives the rows
    (every table, and the kept steps, comm host ops and collective ops) of the trace decoded in one
    batch with nothing spilled (whose kept rows are not copied: acc._as_is)."""
    data = gzip.decompress(corpus(*TRACES[key]).read_bytes())

    def parse(**kw):
        s = kineto.parse_stream(io.BytesIO(data).read, **kw)
        try:
            out = {
                t: pl.concat(list(v() if callable(v) else v), how="vertical_relaxed")
                for t, v in s.tables().items()
            }
            out |= {"kept_steps": s.steps, "kept_hosts": s.comm_hosts, "kept_rpc": s.rpc}
            return out, s.acc.spools["cpu"].path is not None
        finally:
            s.close()

    whole, spilled = parse(batch_bytes=1 << 30)
    small, spilled_small = parse(batch_bytes=64 << 10, spool_bytes=0, spool_dir=tmp_path)
    assert not spilled and spilled_small
    assert whole["kept_steps"].height == 3 and whole["kept_hosts"].height > 0 and whole["kept_rpc"].height > 0
    assert whole["collectives"].height > 0
    for t in whole:
        assert whole[t].schema == small[t].schema, t
        assert whole[t].equals(small[t]), t
    assert not list(tmp_path.iterdir())  # spill files are removed
