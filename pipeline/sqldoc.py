"""The documentation of what `tracelake sql` can query, read from where it is written.

Sources of truth:
- schema tables: schemas/v3.toml (doc, and per column type, unit and doc);
- metric views: each queries/<name>.sql file's leading comment (the file doc: its first
  paragraph is the one-line summary) and its column tags;
- derived views: the tags in queries/views/*.sql;
- the catalog tables (device_catalog, collective_catalog): CATALOGS below, in the same format.

Column tags (one per output column, in output order, Perfetto's SQL standard library style):

    -- @column NAME TYPE [UNIT]: doc

TYPE is the type as DuckDB names it (BIGINT, INTEGER, VARCHAR, DOUBLE, BOOLEAN, HUGEINT,
MAP(INTEGER, BIGINT), INTEGER[], ...; aliases such as INT64 or STRING are read as DuckDB's name,
normalize_type). UNIT is optional and one of UNITS. The doc may continue on the following
comment lines indented by two or more spaces after `--`. `-- @columns_of NAME` stands for the
columns of a schema table or a documented view, in their order (further @column tags follow
them).

In queries/views/*.sql every view the file creates is introduced by one of

    -- @view NAME: one-line summary     (a view meant for users; its @column tags follow)
    -- @internal NAME: why              (an implementation detail: not in --list)

placed before its `CREATE OR REPLACE VIEW NAME`; a view without either is an error (DocError).
Macros are never listed. The local_* schema tables (per-source results stored at ingest,
pipeline/local.py) are documented in schemas/v3.toml but left out of listed().

`python -m pipeline.sqldoc` writes docs/sql-reference.md from all of this (render_reference;
tests/test_sqldoc.py fails when the page is stale).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache

from . import schema as sch
from .paths import QUERIES_DIR, ROOT

# the unit tokens a column tag may carry (schemas/v3.toml uses the same ones)
UNITS = {
    "ns": "nanoseconds",
    "bytes": "bytes",
    "GB/s": "1e9 bytes per second",
    "Gb/s": "1e9 bits per second (a NIC's line rate as vendors state it)",
    "%": "percent, 0-100",
    "FLOP": "floating-point operations",
    "TFLOP/s": "1e12 FLOP per second",
    "FLOP/byte": "operational intensity",
    "FLOP/token": "floating-point operations per token",
    "tokens": "tokens",
    "tokens/s": "tokens per second",
    "J": "joules",
    "W": "watts",
    "count": "a number of things",
}

# DuckDB's own type names for the aliases a doc may use
_ALIASES = {
    "INT64": "BIGINT",
    "INT8": "BIGINT",
    "LONG": "BIGINT",
    "INT32": "INTEGER",
    "INT4": "INTEGER",
    "INT": "INTEGER",
    "SIGNED": "INTEGER",
    "INT16": "SMALLINT",
    "INT2": "SMALLINT",
    "SHORT": "SMALLINT",
    "INT128": "HUGEINT",
    "UINT64": "UBIGINT",
    "UINT32": "UINTEGER",
    "STRING": "VARCHAR",
    "TEXT": "VARCHAR",
    "CHAR": "VARCHAR",
    "BPCHAR": "VARCHAR",
    "BOOL": "BOOLEAN",
    "LOGICAL": "BOOLEAN",
    "FLOAT8": "DOUBLE",
    "FLOAT64": "DOUBLE",
    "FLOAT4": "FLOAT",
    "FLOAT32": "FLOAT",
    "REAL": "FLOAT",
}

KINDS = ("table", "catalog", "view", "metric", "kept", "replay")

REFERENCE = ROOT / "docs" / "sql-reference.md"

CATALOGS = """
-- @table device_catalog: The accelerators tracelake knows, with their datasheet peaks
--   (pipeline/catalog/devices.toml, one row per entry in file order).
-- @column key VARCHAR: The entry's name (rank_device.catalog_key).
-- @column match VARCHAR: Case-insensitive regex on the device name; the first matching entry wins.
-- @column fp32_tflops DOUBLE TFLOP/s: Dense FP32 peak (NULL: unknown).
-- @column tf32_tflops DOUBLE TFLOP/s: Dense TF32 tensor peak (NULL: unknown).
-- @column bf16_tflops DOUBLE TFLOP/s: Dense BF16 tensor peak (NULL: unknown).
-- @column fp16_tflops DOUBLE TFLOP/s: Dense FP16 tensor peak (NULL: unknown).
-- @column fp8_tflops DOUBLE TFLOP/s: Dense FP8 tensor peak (NULL: unknown).
-- @column memory_gbps DOUBLE GB/s: Device memory bandwidth.
-- @column nvlink_gbps DOUBLE GB/s: NVLink bandwidth per direction (what busbw is compared with).
-- @column source VARCHAR: The datasheet the numbers come from.
-- @column priority INTEGER: The entry's position in the file (lower wins when several match).
-- @table collective_catalog: Each collective operation's nccl-tests bus-bandwidth factor and
--   message size rule (pipeline/catalog/collectives.toml).
-- @column op VARCHAR: Normalized op name (collectives.op).
-- @column busbw_factor VARCHAR: '2(n-1)/n', '(n-1)/n' or '1' (nccl-tests doc/PERFORMANCE.md).
-- @column msg VARCHAR: Which element count gives msg_bytes: in, out or max.
"""


# the replay's views (pipeline/whatif/face.py register), bound when a query names them
REPLAY_VIEWS = """
-- @table critical_path: One row per segment of each step's critical path across ranks
--   (docs/whatif.md), from the identity replay of each run with GPU work and steps; bound by
--   `tracelake sql` when a query names it.
-- @column run_id VARCHAR: Run.
-- @column step BIGINT: Step number (step_window.step).
-- @column end_rank BIGINT: The rank whose step ends last: where the path starts, walking back.
-- @column seq BIGINT: Position of the segment along the path, from the step's start (0).
-- @column kind VARCHAR: What the time was spent on: compute, communication, memory, unknown (GPU
--   work of that category), transfer (a collective after its last rank arrived), gpu_gap,
--   launch, cross_stream, sync, host, data_loading or untraced (pipeline/whatif/critical.py).
-- @column rank BIGINT: The rank the segment lies on.
-- @column start_ns BIGINT ns: Start, absolute clock.
-- @column end_ns BIGINT ns: End, absolute clock.
-- @column dur_ns BIGINT ns: end_ns - start_ns; a step's segments add up to its time.
-- @column name VARCHAR: The kernel, copy or host call the segment is ('' for gaps and host work).
-- @table critical_path_summary: Each step's critical path by kind and rank (critical_path summed),
--   the largest first.
-- @column run_id VARCHAR: Run.
-- @column step BIGINT: Step number.
-- @column end_rank BIGINT: The rank whose step ends last.
-- @column kind VARCHAR: Segment kind (critical_path.kind).
-- @column rank BIGINT: The rank the segments lie on.
-- @column ns BIGINT ns: Their total time in the step.
"""


class DocError(ValueError):
    """A doc comment that does not follow the format in the module doc."""


@dataclass(frozen=True)
class ColumnDoc:
    name: str
    type: str  # DuckDB's name (normalize_type)
    unit: str  # one of UNITS, or ""
    doc: str


@dataclass(frozen=True)
class ObjectDoc:
    """A table or view a user can query: name, kind (KINDS), one-line summary, columns, where it is
    defined (a path relative to the repository), the file doc (metric files; else ""), and
    whether it is an implementation detail (not listed)."""

    name: str
    kind: str
    summary: str
    columns: tuple[ColumnDoc, ...]
    source: str
    prose: str = ""
    internal: bool = False


def normalize_type(t: str) -> str:
    """DuckDB's name for a type written with aliases: 'int64' -> 'BIGINT',
    'MAP(INT32,INT64)' -> 'MAP(INTEGER, BIGINT)', 'list<string>'-style names are not accepted."""
    t = re.sub(r"\s+", " ", t.strip().upper())
    t = re.sub(r"[A-Z_][A-Z0-9_]*", lambda m: _ALIASES.get(m.group(0), m.group(0)), t)
    return re.sub(r"\s*,\s*", ", ", re.sub(r"\(\s*", "(", re.sub(r"\s*\)", ")", t)))


def first_sentence(text: str) -> str:
    """The first sentence of a paragraph (up to a '.' followed by a capital letter or the end)."""
    text = " ".join(text.split())
    m = re.match(r"(.+?\.)(?=\s+[A-Z(`]|$)", text)
    return m.group(1) if m else text


_TAG = re.compile(r"^--\s*@(\w+)\b\s*(.*)$")
_CONT = re.compile(r"^--\s{2,}(\S.*)$")
_CREATE_VIEW = re.compile(r"^\s*CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)", re.IGNORECASE)


def _tags(lines: list[str], where: str) -> list[tuple[int, str, str]]:
    """(line index, tag, text) for each tag line, with its continuation lines joined."""
    out: list[tuple[int, str, str]] = []
    cont = False
    for i, line in enumerate(lines):
        s = line.strip()
        m = _TAG.match(s)
        if m:
            if m.group(1) not in ("column", "columns_of", "view", "internal", "table"):
                raise DocError(f"{where}:{i + 1}: unknown tag @{m.group(1)}")
            out.append((i, m.group(1), m.group(2).strip()))
            cont = m.group(1) != "columns_of"
            continue
        c = _CONT.match(s) if cont else None
        if c:
            idx, tag, text = out[-1]
            out[-1] = (idx, tag, f"{text} {c.group(1).strip()}")
        else:
            cont = False
    return out


def parse_column(text: str, where: str = "") -> ColumnDoc:
    """One @column tag's text: `NAME TYPE [UNIT]: doc`."""
    head, sep, doc = text.partition(": ")
    if not sep and text.endswith(":"):
        head, sep, doc = text[:-1], ":", ""
    words = head.split()
    if not sep or len(words) < 2 or not doc.strip():
        raise DocError(f"{where}: @column needs 'NAME TYPE [UNIT]: doc', not {text!r}")
    unit = words[-1] if len(words) > 2 and words[-1] in UNITS else ""
    typ = " ".join(words[1 : len(words) - (1 if unit else 0)])
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*(\[\])*|[A-Za-z]+\(.*\)(\[\])*", typ):
        raise DocError(f"{where}: @column {words[0]}: {typ!r} is not a type (or an unknown unit)")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", words[0]):
        raise DocError(f"{where}: @column {words[0]!r}: not a column name")
    return ColumnDoc(words[0], normalize_type(typ), unit, " ".join(doc.split()))


def _named(text: str, tag: str, where: str) -> tuple[str, str]:
    """`NAME: summary` of a @view / @internal / @table tag."""
    name, sep, summary = text.partition(":")
    if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", name.strip()) or not summary.strip():
        raise DocError(f"{where}: @{tag} needs 'NAME: summary', not {text!r}")
    return name.strip(), " ".join(summary.split())


def _columns(tags, where: str) -> tuple[tuple, ...]:
    """The column entries of a run of tags: ColumnDoc, or ('columns_of', NAME) to resolve."""
    out: list = []
    for _, tag, text in tags:
        if tag == "column":
            out.append(parse_column(text, where))
        elif tag == "columns_of":
            out.append(("columns_of", text.strip()))
        else:
            raise DocError(f"{where}: @{tag} where a column tag was expected")
    return tuple(out)


def parse_metric(text: str, source: str) -> tuple[str, str, tuple]:
    """(summary, prose, column entries) of a metric file: the leading comment is the file doc,
    its first paragraph (the text before the first blank comment line or tag, a leading 'name:'
    dropped) the summary; its tags are @column / @columns_of only."""
    lines = text.splitlines()
    head = []
    for line in lines:
        if line.strip() and not line.strip().startswith("--"):
            break
        head.append(line.strip())
    tags = _tags(head, source)
    if _tags(lines[len(head) :], source):
        raise DocError(f"{source}: doc tags belong in the leading comment")
    tag_lines = {i for i, _, _ in tags}
    prose, para, in_tag = [], [], False
    for i, line in enumerate(head):
        if i in tag_lines:
            in_tag = True
            continue
        if in_tag and _CONT.match(line):
            continue
        in_tag = False
        prose.append(line[2:].removeprefix(" ") if line.startswith("--") else line)
    for line in prose:
        if not line.strip():
            if para:
                break
            continue
        para.append(line)
    summary = " ".join(" ".join(para).split())
    name = source.rsplit("/", 1)[-1].removesuffix(".sql")
    summary = summary.removeprefix(f"{name}: ")
    if not summary:
        raise DocError(f"{source}: no file doc (the leading comment's first paragraph)")
    while prose and not prose[-1].strip():
        prose.pop()
    return summary[:1].upper() + summary[1:], "\n".join(prose), _columns(tags, source)


def parse_views(text: str, source: str) -> list[tuple[str, str, bool, tuple]]:
    """(name, summary, internal, column entries) of each view a queries/views file creates, in
    file order; raises DocError for a view without its @view / @internal tag."""
    lines = text.splitlines()
    tags = _tags(lines, source)
    by_line = {i: (tag, t) for i, tag, t in tags}
    out, pending = [], None
    for i, line in enumerate(lines):
        if i in by_line:
            tag, t = by_line[i]
            if tag in ("view", "internal"):
                if pending is not None:
                    raise DocError(f"{source}:{i + 1}: @{tag} before view {pending[0]} was created")
                name, summary = _named(t, tag, f"{source}:{i + 1}")
                pending = [name, summary, tag == "internal", []]
            elif tag in ("column", "columns_of"):
                if pending is None or pending[2]:
                    raise DocError(f"{source}:{i + 1}: @{tag} outside a @view block")
                pending[3].append((i, tag, t))
            else:
                raise DocError(f"{source}:{i + 1}: @{tag} in a views file")
            continue
        m = _CREATE_VIEW.match(line)
        if m:
            name = m.group(1).lower()
            if pending is None or pending[0] != name:
                raise DocError(f"{source}:{i + 1}: view {name} has no @view or @internal doc before it")
            if not pending[2] and not pending[3]:
                raise DocError(f"{source}: view {name} documents no columns")
            out.append((name, pending[1], pending[2], _columns(pending[3], source)))
            pending = None
    if pending is not None:
        raise DocError(f"{source}: @view {pending[0]} but no CREATE OR REPLACE VIEW {pending[0]}")
    return out


def _table_docs() -> list[ObjectDoc]:
    out = []
    for t in sch.tables().values():
        cols = tuple(ColumnDoc(c.name, sch.duckdb_type(c.type), c.unit, c.doc) for c in t.columns)
        out.append(ObjectDoc(t.name, "table", first_sentence(t.doc), cols, "schemas/v3.toml", t.doc))
    return out


def _tagged_docs(text: str, where: str, kind: str, source) -> list[ObjectDoc]:
    """The @table entries of a doc text held in this module (CATALOGS, REPLAY_VIEWS), each with
    its @column tags, as ObjectDocs of `kind`; source(name) names the file the object comes from."""
    lines = text.strip().splitlines()
    tags = _tags(lines, f"pipeline/sqldoc.py {where}")
    out, cur = [], None
    for i, tag, t in tags + [(len(lines), "table", "")]:
        if tag == "table":
            if cur:
                out.append(ObjectDoc(cur[0], kind, cur[1], _columns(cur[2], where), source(cur[0])))
            if t:
                name, summary = _named(t, tag, where)
                cur = (name, summary, [])
        else:
            cur[2].append((i, tag, t))
    return out


def _catalog_docs() -> list[ObjectDoc]:
    def source(name: str) -> str:
        return "pipeline/catalog/" + ("devices" if "device" in name else "collectives") + ".toml"

    return _tagged_docs(CATALOGS, "CATALOGS", "catalog", source)


def _replay_docs() -> list[ObjectDoc]:
    """critical_path and critical_path_summary (REPLAY_VIEWS), kind "replay"."""
    return _tagged_docs(REPLAY_VIEWS, "REPLAY_VIEWS", "replay", lambda name: "pipeline/whatif/face.py")


# DuckDB's names of the polars types the fleet view's columns have (pipeline/fleet.py)
_POLARS_TYPES = {"String": "VARCHAR", "Int64": "BIGINT", "Float64": "DOUBLE", "Boolean": "BOOLEAN"}
_FLEET_UNITS = {"ns": "ns", "pct": "%", "": ""}


def _overview_doc() -> ObjectDoc:
    """runs_overview (pipeline/results_fleet.py bind_overview): the fleet view's columns
    (pipeline/fleet.py FLEET_COLUMNS), then current, computed_at_ns and options."""
    from .fleet import FLEET_COLUMNS
    from .results_fleet import FLEET_EXTRA

    def duck(t) -> str:
        if str(t).startswith("Datetime"):
            return "TIMESTAMPTZ_NS"
        return _POLARS_TYPES[str(t)]

    cols = [
        ColumnDoc(n, duck(t), _FLEET_UNITS[u], d[0].upper() + d[1:] + ".") for n, t, u, d in FLEET_COLUMNS
    ]
    extra = {n: (t, d) for n, t, d in FLEET_EXTRA}
    cols += [
        ColumnDoc(
            "current",
            "BOOLEAN",
            "",
            "Whether the run's sources are still those the row was computed from (a file added, "
            "forgotten or re-ingested since makes it false until the next analyze).",
        ),
        ColumnDoc(
            "computed_at_ns", "BIGINT", "ns", "When the analysis was computed, ns since the Unix epoch."
        ),
        ColumnDoc("options", "VARCHAR", "", extra["options"][1][0].upper() + extra["options"][1][1:] + "."),
    ]
    return ObjectDoc(
        "runs_overview",
        "kept",
        "One row per run of the lake from its newest kept analysis (the fleet view of `tracelake runs`).",
        tuple(cols),
        "pipeline/results_fleet.py",
        "Each run's row is kept with its analysis by `tracelake analyze`, `report`, `run` or `runs` "
        "(docs/usage.md, Kept results); a run never analysed has none.",
    )


@lru_cache(maxsize=1)
def catalog() -> dict[str, ObjectDoc]:
    """Every table and view `tracelake sql` can read, keyed by name: the schema tables, the catalog
    tables, the views of queries/views/*.sql (internal ones flagged), the metric views; columns
    of @columns_of resolved. Raises DocError for a malformed or missing doc."""
    raw: dict[str, ObjectDoc] = {}
    for d in _table_docs() + _catalog_docs() + [_overview_doc()] + _replay_docs():
        raw[d.name] = d
    for f in sorted((QUERIES_DIR / "views").glob("*.sql")):
        rel = f.relative_to(ROOT).as_posix()
        for name, summary, internal, cols in parse_views(f.read_text(), rel):
            raw[name] = ObjectDoc(name, "view", summary, cols, rel, internal=internal)
    for f in sorted(QUERIES_DIR.glob("*.sql")):
        rel = f.relative_to(ROOT).as_posix()
        summary, prose, cols = parse_metric(f.read_text(), rel)
        raw[f.stem] = ObjectDoc(f.stem, "metric", summary, cols, rel, prose)

    done: dict[str, tuple[ColumnDoc, ...]] = {}

    def resolve(name: str, seen: tuple = ()) -> tuple[ColumnDoc, ...]:
        if name in done:
            return done[name]
        if name in seen or name not in raw:
            raise DocError(
                f"@columns_of {name}: {'a cycle' if name in seen else 'no such documented table or view'}"
            )
        cols: list[ColumnDoc] = []
        for c in raw[name].columns:
            cols += resolve(c[1], seen + (name,)) if isinstance(c, tuple) else [c]
        names = [c.name for c in cols]
        if len(set(names)) != len(names):
            raise DocError(f"{raw[name].source}: {name} documents a column twice")
        done[name] = tuple(cols)
        return done[name]

    return {
        n: ObjectDoc(d.name, d.kind, d.summary, resolve(n), d.source, d.prose, d.internal)
        for n, d in raw.items()
    }


def listed() -> list[ObjectDoc]:
    """What `tracelake sql --list` shows, in KINDS order (tables in schema order, views in file
    order, metrics by name): everything in catalog() but the internal views and the local_*
    tables."""
    docs = [
        d
        for d in catalog().values()
        if not d.internal and not (d.kind == "table" and d.name.startswith("local_"))
    ]
    return sorted(docs, key=lambda d: KINDS.index(d.kind))


def render_reference() -> str:
    """docs/sql-reference.md: a short guide, then every listed table and view with its columns."""
    lines = [
        "# SQL reference",
        "",
        "<!-- generated by `python -m pipeline.sqldoc` from schemas/v3.toml and the doc comments of "
        "queries/*.sql and queries/views/*.sql; do not edit -->",
        "",
        "## Finding your way in SQL",
        "",
        "`tracelake sql --lake LAKE 'SELECT ...'` runs DuckDB SQL over the lake. "
        "`tracelake sql --list` names everything you can query, with one line each; "
        "`tracelake sql --describe NAME` gives its columns with type, unit and meaning (both read "
        "the same docs as this page and need no lake). Start from the metric views "
        "(`step_time`, `breakdown`, `top_kernels`, ...): one row per rank and step, per run or per "
        "kernel, with the definitions in their files. Below them are the derived views (`gpu_work`: "
        "every GPU activity with its launch and step; `scope`: the part the metrics analyse; "
        "`step_window`; `rank_device`) and the schema tables the ingest writes "
        "([schemas/v3/](../schemas/v3/)). Times are int64 nanoseconds on the absolute clock, "
        "units live in column names (`_ns`, `_bytes`, `_gbps`, `_pct`), and every row carries "
        "`run_id`; a `source_id` is the input file's hash (`sources.path` has the file, and the "
        "metric views that show one also show its `file`). Per-source results stored at ingest "
        "(the `local_*` tables) and the views marked internal in queries/views/ are implementation "
        "details and are not listed.",
        "",
        "Units: " + "; ".join(f"`{u}` {m}" for u, m in UNITS.items()) + ".",
        "",
    ]
    titles = {
        "table": "Schema tables",
        "catalog": "Catalog tables",
        "view": "Derived views",
        "metric": "Metric views",
        "kept": "Kept results",
        "replay": "Replay views (computed when a query names them)",
    }
    docs = listed()
    for kind in KINDS:
        lines += [f"## {titles[kind]}", ""]
        for d in (d for d in docs if d.kind == kind):
            if kind == "table":
                lines.append(f"- [`{d.name}`](../schemas/v3/{d.name}.md): {d.summary}")
                continue
            lines += [f"### `{d.name}`", "", f"{d.summary} ([{d.source}](../{d.source}))", ""]
            lines += ["| column | type | unit | meaning |", "|---|---|---|---|"]
            for c in d.columns:
                doc = c.doc.replace("|", "\\|")
                lines.append(f"| `{c.name}` | {c.type.replace('|', '')} | {c.unit or '—'} | {doc} |")
            lines.append("")
        if kind == "table":
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write_reference() -> str:
    REFERENCE.write_text(render_reference())
    return str(REFERENCE)


if __name__ == "__main__":
    print(write_reference(), file=sys.stderr)
