-- replay/host_nodes: the host side of one run's dependency graph (pipeline/whatif/graph.py): per
-- rank, the host events the replay may move, in no particular order.
--
-- Rows: every runtime or driver call with a correlation id (pipeline/whatif/graph.py keeps those
-- whose correlation is a GPU activity's of the same rank: the calls that launched work) or whose
-- name is a blocking call (pipeline/catalog/replay.toml, passed in as getvariable('replay_blocking'));
-- every DataLoader fetch (is_data_loading, views/05_macros.sql); and each step's host window as two
-- zero-length marks (its start and its end). Everything the host did between two kept rows is host
-- work the replay keeps as it was. Which calls launched work is found in Python, by a sorted lookup
-- of the GPU rows' (rank, correlation): a join here cost three times the read (6.7 M calls).
-- Parameters: getvariable('replay_run'), the run; getvariable('replay_blocking'), the names.
-- @column rank INTEGER: Rank.
-- @column what TINYINT: 0 a call (a runtime or driver call), 1 a DataLoader fetch (data_loading), 2 a
--   step's start mark (step_start), 3 its end mark (step_end): a code, not 6.7 M strings.
-- @column name VARCHAR: Event name (the step number for the marks).
-- @column start_ns BIGINT ns: Start, absolute clock.
-- @column end_ns BIGINT ns: End (a mark: its start).
-- @column correlation BIGINT: Correlation id of a call (NULL otherwise).
-- @column step BIGINT: Step number of a mark (NULL otherwise).
-- The caller puts the rows in chain order (rank, start).
SELECT rank, 0::TINYINT AS what, name, start_ns, end_ns, correlation, NULL::BIGINT AS step
FROM cpu_ops
WHERE run_id = getvariable('replay_run') AND kind IN ('runtime', 'driver')
  AND (correlation IS NOT NULL OR name IN (SELECT unnest(getvariable('replay_blocking'))))
UNION ALL
SELECT rank, 1, name, start_ns, end_ns, NULL, NULL FROM cpu_ops
WHERE run_id = getvariable('replay_run') AND end_ns > start_ns AND is_data_loading(name)
UNION ALL
SELECT rank, 2, step::VARCHAR, start_ns, start_ns, NULL, step FROM steps
WHERE run_id = getvariable('replay_run')
UNION ALL
SELECT rank, 3, step::VARCHAR, end_ns, end_ns, NULL, step FROM steps
WHERE run_id = getvariable('replay_run')
