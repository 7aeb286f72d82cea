-- replay/host_nodes: the host side of one run's dependency graph (pipeline/whatif/graph.py): per
-- rank, the host events the replay moves, in start order.
--
-- Rows: every runtime or driver call that launched GPU work of the run (its correlation is a
-- gpu_activities row's) or whose name is a blocking call (pipeline/catalog/replay.toml, passed in
-- as getvariable('replay_blocking')); every DataLoader fetch (is_data_loading,
-- views/05_macros.sql); and each step's host window as two zero-length marks (its start and its
-- end). Everything the host did between two rows is host work the replay keeps as it was.
-- Parameters: getvariable('replay_run'), the run; getvariable('replay_blocking'), the names.
-- @column rank INTEGER: Rank.
-- @column what VARCHAR: launch (launched GPU work), blocking (a blocking call that launched nothing),
--   data_loading, step_start or step_end.
-- @column name VARCHAR: Event name (the step number for the marks).
-- @column start_ns BIGINT ns: Start, absolute clock.
-- @column end_ns BIGINT ns: End (a mark: its start).
-- @column correlation BIGINT: Correlation id of a call (NULL otherwise).
-- @column step BIGINT: Step number of a mark (NULL otherwise).
-- @column tid BIGINT: Thread (NULL: not recorded).
-- @column blocking BOOLEAN: Its name is a blocking call's (getvariable('replay_blocking')).
-- The caller puts the rows in chain order (rank, start).
WITH launched AS (
  SELECT DISTINCT rank, correlation FROM gpu_activities
  WHERE run_id = getvariable('replay_run') AND correlation IS NOT NULL AND kind <> 'sync'
)
SELECT c.rank, CASE WHEN l.correlation IS NOT NULL THEN 'launch' ELSE 'blocking' END AS what, c.name,
  c.start_ns, c.end_ns, c.correlation, NULL::BIGINT AS step, c.tid,
  list_contains(getvariable('replay_blocking'), c.name) AS blocking
FROM cpu_ops c LEFT JOIN launched l ON l.rank = c.rank AND l.correlation = c.correlation
WHERE c.run_id = getvariable('replay_run') AND c.kind IN ('runtime', 'driver')
  AND (l.correlation IS NOT NULL OR list_contains(getvariable('replay_blocking'), c.name))
UNION ALL
SELECT rank, 'data_loading', name, start_ns, end_ns, NULL, NULL, tid, false FROM cpu_ops
WHERE run_id = getvariable('replay_run') AND end_ns > start_ns AND is_data_loading(name)
UNION ALL
SELECT rank, 'step_start', step::VARCHAR, start_ns, start_ns, NULL, step, tid, false FROM steps
WHERE run_id = getvariable('replay_run')
UNION ALL
SELECT rank, 'step_end', step::VARCHAR, end_ns, end_ns, NULL, step, tid, false FROM steps
WHERE run_id = getvariable('replay_run')
