"""tracelake: distributed-training trace post-mortems.

Data flow: pipeline.ingest.<format> -> schemas/ (v1) -> Parquet lake -> queries/*.sql (DuckDB)
-> pipeline.report.
"""

__version__ = "0.1.0"
