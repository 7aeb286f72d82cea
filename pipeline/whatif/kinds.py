"""The kinds of a critical path's segments (pipeline/whatif/critical.py says what each is), in the
order the report's chart shows them. A room of its own, with no imports, so that the report can
read it without the replay's polars and DuckDB."""

KINDS = (
    "compute",
    "communication",
    "memory",
    "unknown",
    "transfer",
    "gpu_gap",
    "launch",
    "cross_stream",
    "sync",
    "host",
    "data_loading",
    "untraced",
)
