"""pipeline/arrow_calls.py (cast, add, sort_by) against pyarrow.compute itself (the
reference: the functions they stand in for), on columns with nulls, several chunks, ties and
int64 overflow; and the rows a real trace's ingest stores against the same trace ingested with
pyarrow.compute's own functions put back in their place."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import arrow_calls
from pipeline.ingest.kineto import result

I64_MAX = 2**63 - 1


def _chunked(values: list, chunks: int, type_=pa.int64()) -> pa.ChunkedArray:
    cut = sorted(random.Random(len(values)).sample(range(len(values) + 1), chunks - 1)) if chunks > 1 else []
    bounds = [0, *cut, len(values)]
    return pa.chunked_array([pa.array(values[a:b], type_) for a, b in zip(bounds, bounds[1:])], type_)


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("nulls", [False, True])
def test_add_is_arrow_add(chunks, nulls):
    rng = random.Random(7)
    xs = [rng.randrange(-(2**62), 2**62) for _ in range(200)] + [I64_MAX, -(2**63)]
    ys = [rng.randrange(-(2**62), 2**62) for _ in range(200)] + [1, -1]  # both ends wrap
    if nulls:
        xs[5] = None
        ys[9] = None
    a, b = _chunked(xs, chunks), _chunked(ys, chunks)
    assert arrow_calls.add(a, b).to_pylist() == pc.add(a, b).to_pylist()
    for s in (result._i64(123), result._i64(I64_MAX), 5):
        assert (
            arrow_calls.add(a, s).to_pylist()
            == pc.add(a, s if not isinstance(s, int) else pa.scalar(s)).to_pylist()
        )
    null = pa.array([None], pa.int64())[0]  # a null scalar: every sum null, as Arrow's add
    assert arrow_calls.add(a, null).to_pylist() == pc.add(a, null).to_pylist()
    empty = pa.chunked_array([], pa.int64())
    assert arrow_calls.add(empty, result._i64(3)).to_pylist() == []


def test_cast_is_arrow_cast():
    texts = pa.array(["1.5", "0.001", "-3", None, "1733000000123456.789"])
    assert arrow_calls.cast(texts, pa.decimal128(38, 3)).equals(texts.cast(pa.decimal128(38, 3)))
    ints = _chunked([1, None, 2**31 - 1], 2)
    assert arrow_calls.cast(ints, pa.int32()).equals(ints.cast(pa.int32()))
    with pytest.raises(pa.ArrowInvalid):  # a lossy cast raises, as Array.cast's safe default
        arrow_calls.cast(pa.array([2**40]), pa.int32())
    with pytest.raises(pa.ArrowInvalid):
        texts.cast(pa.int32())  # (the reference raises there too)
    with pytest.raises(pa.ArrowInvalid):
        arrow_calls.cast(texts, pa.int32())


def test_sort_by_is_table_sort_by():
    rng = random.Random(3)
    n = 500
    t = pa.table(
        {
            "rank": [rng.choice([0, 1, None]) for _ in range(n)],
            "source_id": [rng.choice(["a", "b", "c"]) for _ in range(n)],
            "start_ns": [rng.randrange(5) for _ in range(n)],  # ties: the sort must be stable
            "i": list(range(n)),
        }
    )
    t = pa.concat_tables([t.slice(0, 200), t.slice(200)])  # two chunks
    for keys in (
        [("rank", "ascending"), ("source_id", "ascending"), ("start_ns", "ascending")],
        [("start_ns", "descending"), ("rank", "ascending")],
    ):
        assert arrow_calls.sort_by(t, keys).equals(t.sort_by(keys))


def test_a_trace_ingests_to_the_rows_pyarrow_compute_gives(tmp_path, monkeypatch):
    """A real trace ingested as it is, and again with arrow_calls' add, cast and sort_by
    replaced by pyarrow.compute's own: every table's rows are the same."""
    from conftest import REPO

    from pipeline import lake_compact, schema, timeparse
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    src = REPO / "sample_traces" / "hta_trace_filter"
    ingest_paths([src], Lake(tmp_path / "a"), run="r")
    monkeypatch.setattr(result, "add", pc.add)
    monkeypatch.setattr(timeparse, "cast", lambda a, t: a.cast(t))
    monkeypatch.setattr(schema, "cast", lambda a, t: a.cast(t, safe=True))
    monkeypatch.setattr(lake_compact, "sort_by", lambda t, k: t.sort_by(k))
    ingest_paths([src], Lake(tmp_path / "b"), run="r")
    seen = 0
    for table in schema.tables():
        rows = []
        for lake in ("a", "b"):
            files = sorted((tmp_path / lake / table).rglob("*.parquet"))
            parts = [pq.ParquetFile(f).read() for f in files]
            t = pa.concat_tables(parts) if parts else schema.empty(table)
            drop = [c for c in ("ingested_at_ns",) if c in t.column_names]
            rows.append(t.drop(drop).to_pylist())
        assert rows[0] == rows[1], table
        seen += len(rows[0])
    assert seen > 5_000  # the trace's events are there (9,513 rows), not two empty lakes
