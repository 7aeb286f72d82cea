-- replay/gpu_nodes: the GPU side of one run's dependency graph (pipeline/whatif/graph.py), one row
-- per kernel, copy or memset (synchronization rows are not work and are left out), in stream order.
--
-- A row is matched to its collective call by the collectives row of the same source, rank,
-- correlation and start (views/40_collective_calls.sql collective_keys: pg_key, call_key), the
-- key collective_matching.sql matches the ranks' calls by.
-- Parameters: getvariable('replay_run'), the run; getvariable('replay_categories'). Needs the
-- temporary table replay_names (replay/gpu_names.sql) of the same run.
-- @column rank INTEGER: Rank.
-- @column stream BIGINT: Stream (-1: not recorded).
-- @column category_id TINYINT: Position of gpu_activities.category in
--   getvariable('replay_categories') (compute, communication, memory, unknown), from 0.
-- @column name_id INTEGER: The kernel name's or copy label's position in replay/gpu_names.sql.
-- @column start_ns BIGINT ns: Start, absolute clock.
-- @column end_ns BIGINT ns: End.
-- @column correlation BIGINT: Correlation id of that call.
-- @column step BIGINT: The step whose host window holds the launch (NULL: outside steps).
-- @column shape UBIGINT: A hash of the grid and block dimensions of a kernel, or of the byte count
--   of a copy or memset (NULL: none recorded): with the name, what --durations-from matches by.
-- @column graph_replay BOOLEAN: Part of a CUDA graph replay (one launch for many kernels).
-- @column pg_key VARCHAR: Its collective's group key (NULL: not a collective's kernel).
-- @column call_key BIGINT: Its collective's call key within the group.
-- @column event_index BIGINT: Position in its input file (the tie-breaker of stream order).
SELECT a.rank, coalesce(a.stream, -1) AS stream,
  (coalesce(list_position(getvariable('replay_categories'), a.category), 4) - 1)::TINYINT AS category_id,
  n.name_id, a.start_ns, a.end_ns, a.correlation, a.step,
  CASE WHEN a.kind = 'kernel' AND a.grid_x IS NOT NULL
       THEN hash(a.grid_x, a.grid_y, a.grid_z, a.block_x, a.block_y, a.block_z)
       WHEN a.bytes IS NOT NULL THEN hash(a.bytes) END AS shape,
  coalesce(a.graph_replay, false) AS graph_replay, c.pg_key, c.call_key, a.event_index
FROM gpu_activities a
JOIN replay_names n ON n.name = a.name
LEFT JOIN (SELECT DISTINCT ON (source_id, rank, correlation, start_ns) source_id, rank, correlation, start_ns, pg_key, call_key
           FROM collective_keys WHERE run_id = getvariable('replay_run')) c
  ON c.source_id = a.source_id AND c.rank = a.rank AND c.correlation = a.correlation AND c.start_ns = a.start_ns
WHERE a.run_id = getvariable('replay_run') AND a.kind <> 'sync'
