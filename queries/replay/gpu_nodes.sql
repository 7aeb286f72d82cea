-- replay/gpu_nodes: the GPU side of one run's dependency graph (pipeline/whatif/graph.py), one row
-- per kernel, copy or memset (synchronization rows are not work and are left out), in stream order.
--
-- A row is matched to its collective call by the collectives row of the same source, rank,
-- correlation and start (views/40_collective_calls.sql collective_keys: pg_key, call_key), the
-- key collective_matching.sql matches the ranks' calls by.
-- Parameter: getvariable('replay_run'), the run.
-- @column rank INTEGER: Rank.
-- @column stream BIGINT: Stream (-1: not recorded).
-- @column kind VARCHAR: kernel, memcpy or memset.
-- @column category VARCHAR: compute, communication, memory or unknown (gpu_activities.category).
-- @column name VARCHAR: Kernel name or copy label.
-- @column start_ns BIGINT ns: Start, absolute clock.
-- @column end_ns BIGINT ns: End.
-- @column launch_ns BIGINT ns: Start of the host call that launched it (NULL: not recorded).
-- @column correlation BIGINT: Correlation id of that call.
-- @column step BIGINT: The step whose host window holds the launch (NULL: outside steps).
-- @column shape VARCHAR: grid and block dimensions 'gx,gy,gz/bx,by,bz' (NULL: not recorded), or the
--   byte count of a copy or memset: with the name, what --durations-from matches kernels by.
-- @column graph_replay BOOLEAN: Part of a CUDA graph replay (one launch for many kernels).
-- @column pg_key VARCHAR: Its collective's group key (NULL: not a collective's kernel).
-- @column call_key BIGINT: Its collective's call key within the group.
-- @column event_index BIGINT: Position in its input file (the tie-breaker of stream order).
SELECT a.rank, coalesce(a.stream, -1) AS stream, a.kind, a.category, a.name, a.start_ns, a.end_ns,
  a.launch_ns, a.correlation, a.step,
  CASE WHEN a.kind = 'kernel' AND a.grid_x IS NOT NULL
       THEN concat_ws(',', a.grid_x, a.grid_y, a.grid_z) || '/' || concat_ws(',', a.block_x, a.block_y, a.block_z)
       WHEN a.bytes IS NOT NULL THEN a.bytes::VARCHAR END AS shape,
  coalesce(a.graph_replay, false) AS graph_replay, c.pg_key, c.call_key, a.event_index
FROM gpu_activities a
LEFT JOIN (SELECT DISTINCT ON (source_id, rank, correlation, start_ns) source_id, rank, correlation, start_ns, pg_key, call_key
           FROM collective_keys WHERE run_id = getvariable('replay_run')) c
  ON c.source_id = a.source_id AND c.rank = a.rank AND c.correlation = a.correlation AND c.start_ns = a.start_ns
WHERE a.run_id = getvariable('replay_run') AND a.kind <> 'sync'
