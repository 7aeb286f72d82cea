"""The schema (v3): the TOML is the single definition, pages are current, writes are enforced."""

import pyarrow as pa
import pytest

from pipeline import schema as sch


def test_tables_and_required_columns():
    t = sch.tables()
    for name in (
        "sources",
        "devices",
        "gpu_activities",
        "cpu_ops",
        "steps",
        "collectives",
        "process_groups",
        "annotations",
        "counters",
    ):
        assert name in t
    cols = {c.name: c for c in t["gpu_activities"].columns}
    for c in (
        "device",
        "stream",
        "correlation",
        "grid_x",
        "block_x",
        "bytes",
        "copy_kind",
        "start_ns",
        "end_ns",
    ):
        assert c in cols
    assert cols["start_ns"].type == "int64" and not cols["start_ns"].nullable
    coll = {c.name for c in t["collectives"].columns}
    assert {
        "op",
        "msg_bytes",
        "dtype",
        "group_size",
        "process_group",
        "pg_ranks",
        "seq",
        "algorithm",
        "protocol",
        "comm_id",
        "transport",
    } <= coll
    src = {c.name for c in t["sources"].columns}
    assert {
        "format",
        "path",
        "content_sha256",
        "run_id",
        "rank",
        "host",
        "world_size",
        "tool_versions",
        "status",
        "error",
    } <= src


def test_every_time_column_is_int64_ns():
    for t in sch.tables().values():
        for c in t.columns:
            if c.name.endswith("_ns"):
                assert c.type == "int64" and c.unit == "ns", (t.name, c.name)
            if c.name.endswith("_bytes"):
                assert c.unit == "bytes", (t.name, c.name)


def test_pages_are_generated_from_toml():
    for t in sch.tables().values():
        page = (sch.SCHEMAS_DIR / f"v{sch.SCHEMA_VERSION}" / f"{t.name}.md").read_text()
        assert page == sch.render_page(t), f"schemas/v3/{t.name}.md is stale: run python -m pipeline.schema"


def test_conform_rejects_extra_missing_nonnull_and_lossy():
    with pytest.raises(sch.SchemaError, match="not in schema"):
        sch.conform("steps", {"bogus": [1]})
    with pytest.raises(sch.SchemaError, match="nulls in a non-null"):
        sch.conform(
            "steps",
            {
                "run_id": ["r"],
                "source_id": ["s"],
                "rank": [0],
                "step": [None],
                "name": ["x"],
                "start_ns": [1],
                "end_ns": [2],
                "dur_ns": [1],
                "source": ["profiler_step"],
            },
        )
    with pytest.raises(sch.SchemaError, match="cannot store"):
        sch.conform(
            "steps",
            {
                "run_id": ["r"],
                "source_id": ["s"],
                "rank": pa.array([2**40], pa.int64()),
                "step": [3],
                "name": ["x"],
                "start_ns": [1],
                "end_ns": [2],
                "dur_ns": [1],
                "source": ["profiler_step"],
            },
        )
    ok = sch.conform(
        "steps",
        {
            "run_id": ["r"],
            "source_id": ["s"],
            "rank": [0],
            "step": [3],
            "name": ["x"],
            "start_ns": [1],
            "end_ns": [2],
            "dur_ns": [1],
            "source": ["profiler_step"],
        },
    )
    assert ok.schema.field("pid").nullable and ok.column("pid").null_count == 1
    assert ok.schema.metadata[b"tracelake.schema_version"] == b"3"
