-- idle_breakdown from per-source results: the rows of idle_breakdown.sql, stored at ingest for each source alone
-- (local_idle_breakdown: the metric reads nothing but the rank's own work), read as they are. Used by
-- pipeline/query.py instead of idle_breakdown.sql when every source with GPU activities in scope has current
-- local results and the options are the defaults (pipeline/local.py); its rows equal
-- idle_breakdown.sql's (tests/test_local.py).
-- Columns: those of idle_breakdown.sql, in its order.
SELECT * EXCLUDE (source_id) FROM local_idle_breakdown ORDER BY run_id, rank, device, stream, step;
