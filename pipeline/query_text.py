"""The SQL files of queries/ by name, for pipeline/query.py (which re-exports these): a metric
file's text (sql_text), the metric names (one per queries/*.sql), the views queries/views/*.sql
create, and the connect() arguments one ad-hoc query needs (for_query: `tracelake sql`). Reads
files only; no DuckDB."""

from __future__ import annotations

import re

from .paths import QUERIES_DIR


def sql_text(name: str) -> str:
    """The text of queries/<name>.sql. Raises FileNotFoundError naming a query that is not there."""
    p = QUERIES_DIR / f"{name}.sql"
    if not p.exists():
        raise FileNotFoundError(f"no query named {name!r} in {QUERIES_DIR}")
    return p.read_text()


def metric_names() -> list[str]:
    """The metric files' names (queries/*.sql stems), sorted."""
    return sorted(p.stem for p in QUERIES_DIR.glob("*.sql"))


def derived_view_names() -> set[str]:
    """The views queries/views/*.sql create."""
    return {v for f in (QUERIES_DIR / "views").glob("*.sql") for v in _views_in(f.read_text())}


def _views_in(text: str) -> set[str]:
    """The views an SQL text creates (CREATE OR REPLACE VIEW name), lower case."""
    return {m.lower() for m in re.findall(r"CREATE\s+OR\s+REPLACE\s+VIEW\s+(\w+)", text, re.IGNORECASE)}


# words of a query that list or describe the catalog: such a query gets every view
_CATALOG_WORDS = {"show", "describe", "summarize", "information_schema", "pg_catalog"}


def for_query(text: str) -> dict:
    """connect() arguments for one ad-hoc query (`tracelake sql`): the metric views it names,
    and the derived views (materialized as for analyze on a small lake) only when it names one
    of them or a metric, so a query of the schema tables alone pays nothing for them (on a lake
    of thousands of small sources, the derived views' materialization alone reads every part).
    A query naming the catalog (SHOW, DESCRIBE, information_schema, duckdb_*) gets every view.
    Names are matched as words of the text, so a mention in a comment or a string counts too
    (it only costs time)."""
    words = set(re.findall(r"[a-z_][a-z0-9_]*", text.lower()))
    if words & _CATALOG_WORDS or any(w.startswith("duckdb_") for w in words):
        return {}
    fleet = "runs_overview" in words
    metrics = tuple(n for n in metric_names() if n in words)
    if metrics or words & derived_view_names():
        return {"metric_views": metrics, "fleet": fleet}
    return {"derived_views": False, "fleet": fleet}
