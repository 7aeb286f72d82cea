"""Phase-1 spools (pipeline/ingest/spool.py) given polars frames: kept as frames in memory (a
small trace's spools read as frames cost no conversion to Arrow and back), converted when spilled
or read as Arrow; every table comes back with the first one's types. Expected values written by
hand."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from pipeline.ingest.spool import _Budget, _Spool


def _frames(limit: int, tmp_path) -> _Spool:
    sp = _Spool("t", _Budget(limit, tmp_path))
    sp.add(pl.DataFrame({"x": [1, 2], "name": ["a", "b"]}))
    sp.add(pl.DataFrame({"x": [None], "name": [None]}))  # all null: Null dtype in polars
    sp.add(pl.DataFrame({"x": [], "name": []}, schema={"x": pl.Int64, "name": pl.String}))  # no rows
    sp.add(pl.DataFrame({"x": [7], "name": ["c"]}))
    return sp


def test_frames_in_memory_and_spilled_come_back_with_the_first_types(tmp_path):
    for limit in (1 << 30, 0):  # held in memory; spilled at the first add
        sp = _frames(limit, tmp_path)
        assert sp.rows == 4
        assert (sp.path is not None) == (limit == 0)
        frames = list(sp)
        assert [f.schema for f in frames] == [pl.Schema({"x": pl.Int64, "name": pl.String})] * 3
        assert [f["x"].to_list() for f in frames] == [[1, 2], [None], [7]]
        assert [f["name"].to_list() for f in frames] == [["a", "b"], [None], ["c"]]
        tables = [t if isinstance(t, pa.Table) else pa.Table.from_batches([t]) for t in sp.arrow()]
        assert [t.column("x").to_pylist() for t in tables] == [[1, 2], [None], [7]]
        assert {t.schema.field("x").type for t in tables} == {pa.int64()}
        sp.close()


def test_a_spool_of_empty_frames_gives_one_empty_table_with_its_columns(tmp_path):
    sp = _Spool("t", _Budget(1 << 30, tmp_path))
    sp.add(pl.DataFrame({"x": []}, schema={"x": pl.Int32}))
    (t,) = list(sp.arrow())
    assert t.num_rows == 0 and t.schema.names == ["x"] and t.schema.field("x").type == pa.int32()
    assert [(f.height, f.schema) for f in sp] == [(0, pl.Schema({"x": pl.Int32}))]


def test_arrow_tables_first_then_frames_take_the_arrow_types(tmp_path):
    sp = _Spool("t", _Budget(1 << 30, tmp_path))
    sp.add(pa.table({"x": pa.array([1], pa.int32())}))
    sp.add(pl.DataFrame({"x": [2]}))  # Int64 in polars: cast to the first table's int32
    assert [t.column("x").type for t in sp.arrow()] == [pa.int32(), pa.int32()]
    assert [f["x"].dtype for f in sp] == [pl.Int32, pl.Int32]
