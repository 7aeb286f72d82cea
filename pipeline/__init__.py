"""tracelake: distributed-training trace post-mortems.

Data flow (docs/architecture.md): pipeline.ingest (one package per input format) -> schemas/ (v3)
-> Parquet lake (pipeline.lake) -> queries/*.sql (DuckDB, pipeline.query) -> pipeline.analyze ->
pipeline.diagnosis (verdict, findings) -> pipeline.report (HTML, Markdown, JSON) -> pipeline.cli.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`pipeline.open_lake`: the lake from Python (pipeline/api.py), imported on first use so
    the CLI's start-up does not pay for it."""
    if name == "open_lake":
        from .api import open_lake

        return open_lake
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
