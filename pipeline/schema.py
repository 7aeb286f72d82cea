"""The unified telemetry schema (schemas/v3.toml) as pyarrow schemas, and its enforcement.

`python -m pipeline.schema` rewrites the human-readable pages in schemas/v3/ from the TOML.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache

import polars as pl
import pyarrow as pa

from . import toml_data
from .arrow_calls import cast
from .paths import SCHEMAS_DIR

SCHEMA_VERSION = 3

# the sources.format values of NCCL-family files (pipeline/ingest/nccl/ writes them; runs are
# grouped by their identity, pipeline/ingest/runs.py rule 4; the analysis tells them from traces;
# SQL reads them through the macro nccl_family, which pipeline/query.py defines from this list)
NCCL_FORMATS = (
    "nccl_log",
    "nccl_tests",
    "torch_watchdog",
    "flight_recorder",
    "nccl_ras",
    "nccl_profiler",
    "torchfrtrace",
)

_TYPES = {
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint64": pa.uint64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "bool": pa.bool_(),
    "list<int32>": pa.list_(pa.int32()),
    "list<string>": pa.list_(pa.string()),
}


# the DuckDB type each schema type is read as (DuckDB's Parquet/Arrow type mapping)
_DUCKDB = {
    "int32": "INTEGER",
    "int64": "BIGINT",
    "uint64": "UBIGINT",
    "float64": "DOUBLE",
    "string": "VARCHAR",
    "bool": "BOOLEAN",
    "list<int32>": "INTEGER[]",
    "list<string>": "VARCHAR[]",
}

_POLARS = {
    "int32": pl.Int32,
    "int64": pl.Int64,
    "uint64": pl.UInt64,
    "float64": pl.Float64,
    "string": pl.String,
    "bool": pl.Boolean,
    "list<int32>": pl.List(pl.Int32),
    "list<string>": pl.List(pl.String),
}


def duckdb_type(t: str) -> str:
    """The DuckDB type a schema type is read as (INTEGER for int32, VARCHAR[] for list<string>, ...)."""
    return _DUCKDB[t]


def _from_python(values, field: pa.Field) -> pa.Array:
    """Python list -> Arrow array through polars (pa.array on a list imports pandas: ~0.3 s)."""
    t = next(k for k, v in _TYPES.items() if v == field.type)
    return cast(pl.Series(field.name, values, dtype=_POLARS[t], strict=True).to_arrow(), field.type)


class SchemaError(ValueError):
    """A table does not conform to schema v3 (missing/extra column, wrong type, null in a non-null column)."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool
    unit: str
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @cached_property  # built once per table (conform reads it for every table of every source)
    def arrow(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, _TYPES[c.type], nullable=c.nullable) for c in self.columns],
            metadata={
                b"tracelake.schema_version": str(SCHEMA_VERSION).encode(),
                b"tracelake.table": self.name.encode(),
            },
        )


@lru_cache(maxsize=1)
def tables() -> dict[str, Table]:
    """All tables of schema v3, keyed by name, in file order."""
    data = toml_data.load(SCHEMAS_DIR / f"v{SCHEMA_VERSION}.toml")
    if data.get("version") != SCHEMA_VERSION:
        raise SchemaError(f"schemas/v{SCHEMA_VERSION}.toml declares version {data.get('version')}")
    out = {}
    for name, t in data["tables"].items():
        cols = tuple(Column(**c) for c in t["columns"])
        for c in cols:
            if c.type not in _TYPES:
                raise SchemaError(f"table {name}: column {c.name} has unknown type {c.type}")
        out[name] = Table(name, t["doc"], cols)
    return out


def arrow_schema(table: str) -> pa.Schema:
    return tables()[table].arrow


def conform(table: str, data: pa.Table | dict) -> pa.Table:
    """Return `data` as a pyarrow Table with exactly schema v3's columns for `table`, in order.

    Columns absent from `data` are filled with nulls (allowed only when nullable); extra columns
    raise SchemaError; types are cast safely (a lossy cast raises SchemaError); nulls in non-null
    columns raise SchemaError.
    """
    schema = arrow_schema(table)
    if isinstance(data, dict):
        n = max((len(v) for v in data.values()), default=0)
        cols = data
    else:
        n = data.num_rows
        cols = {name: data.column(name) for name in data.column_names}
    extra = set(cols) - set(schema.names)
    if extra:
        raise SchemaError(f"{table}: columns not in schema v{SCHEMA_VERSION}: {sorted(extra)}")
    arrays = []
    for field in schema:
        if field.name in cols:
            v = cols[field.name]
            try:
                if isinstance(v, (pa.Array, pa.ChunkedArray)):
                    arr = cast(v, field.type) if v.type != field.type else v
                else:
                    arr = _from_python(list(v), field)
            except (
                pa.ArrowInvalid,
                pa.ArrowTypeError,
                OverflowError,
                TypeError,
                pl.exceptions.PolarsError,
            ) as e:
                raise SchemaError(f"{table}.{field.name}: cannot store as {field.type}: {e}") from e
        else:
            arr = pa.nulls(n, type=field.type)
        if len(arr) != n:
            raise SchemaError(f"{table}.{field.name}: {len(arr)} values, expected {n}")
        if not field.nullable and arr.null_count:
            raise SchemaError(f"{table}.{field.name}: {arr.null_count} nulls in a non-null column")
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=schema)


def empty(table: str) -> pa.Table:
    schema = arrow_schema(table)
    # built column by column: Schema.empty_table() imports pandas (slow start-up)
    return pa.Table.from_arrays([pa.nulls(0, type=f.type) for f in schema], schema=schema)


def create_empty_sql(table: str, name: str) -> str:
    """DuckDB DDL creating `name`, an empty table with `table`'s columns and their types (the
    types DuckDB reads its Parquet parts as): cheaper at connect time than registering an empty
    Arrow table and copying it (about 2.5 ms a table)."""
    cols = ", ".join('"' + c.name + '" ' + _DUCKDB[c.type] for c in tables()[table].columns)
    return f"CREATE TABLE {name} ({cols})"


def render_page(t: Table) -> str:
    lines = [
        f"# `{t.name}` (schema v{SCHEMA_VERSION})",
        "",
        "<!-- generated by `python -m pipeline.schema` from schemas/v3.toml; do not edit -->",
        "",
        t.doc,
        "",
        f"On disk: `<lake>/{t.name}/run=<run_id>/<source_id>.parquet`.",
        "",
        "| column | type | unit | nullable | meaning |",
        "|---|---|---|---|---|",
    ]
    for c in t.columns:
        lines.append(
            f"| `{c.name}` | {c.type} | {c.unit or '—'} | {'yes' if c.nullable else 'no'} | {c.doc} |"
        )
    return "\n".join(lines) + "\n"


def write_docs() -> list[str]:
    out_dir = SCHEMAS_DIR / f"v{SCHEMA_VERSION}"
    out_dir.mkdir(exist_ok=True)
    written = []
    for t in tables().values():
        p = out_dir / f"{t.name}.md"
        p.write_text(render_page(t))
        written.append(str(p))
    return written


if __name__ == "__main__":
    for p in write_docs():
        print(p, file=sys.stderr)
