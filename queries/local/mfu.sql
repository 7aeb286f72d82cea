-- mfu from per-source results: the rows of mfu.sql, stored at ingest for each source alone
-- (local_mfu: the metric reads nothing but the rank's own work, steps, devices and the device
-- catalog, which is part of the results' SQL version), read as they are. Used by
-- pipeline/query.py instead of mfu.sql when every source with GPU activities in scope has
-- current local results, the options are the defaults and no MFU override is given
-- (pipeline/local.py); its rows equal mfu.sql's (tests/test_local.py).
-- Columns: those of mfu.sql, in its order.
SELECT * EXCLUDE (source_id) FROM local_mfu ORDER BY run_id, rank, step;
