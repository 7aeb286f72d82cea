-- step_status from per-source results: the rows of step_status.sql, stored at ingest for each source alone
-- (local_step_status: the metric reads nothing but the rank's own work), read as they are. Used by
-- pipeline/query.py instead of step_status.sql when every source with GPU activities in scope has current
-- local results and the options are the defaults (pipeline/local.py); its rows equal
-- step_status.sql's (tests/test_local.py).
-- Columns: those of step_status.sql, in its order.
SELECT * EXCLUDE (source_id) FROM local_step_status ORDER BY run_id, rank, step;
