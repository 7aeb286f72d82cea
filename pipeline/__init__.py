"""tracelake: distributed-training trace post-mortems.

Data flow (docs/architecture.md): pipeline.ingest (one package per input format) -> schemas/ (v2)
-> Parquet lake (pipeline.lake) -> queries/*.sql (DuckDB, pipeline.query) -> pipeline.analyze ->
pipeline.diagnosis (verdict, findings) -> pipeline.report (HTML, Markdown, JSON) -> pipeline.cli.
"""

__version__ = "0.1.0"
