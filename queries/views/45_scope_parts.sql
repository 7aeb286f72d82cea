-- scope_parts: the rows of scope (views/20_scope.sql) the interval sweeps of breakdown.sql and
-- step_time.sql read, with every waiting communication kernel in two parts: its wait
-- [start_ns, wait_end_ns) with category 'comm_wait', and its transfer [wait_end_ns, end_ns) with
-- category 'communication' (absent when empty). Every other row is scope's row, whole: a kernel
-- of a call seen on one rank only, or of an inconsistent call, counts as transfer.
-- @view scope_parts: The rows of scope the interval sweeps read, each waiting communication kernel
--   cut into its wait (category comm_wait) and its transfer.
-- @column run_id VARCHAR: Run.
-- @column source_id VARCHAR: Source file.
-- @column rank INTEGER: Rank.
-- @column correlation BIGINT: The activity's correlation id.
-- @column step BIGINT: The activity's step (gpu_work.step).
-- @column start_ns BIGINT ns: The part's start.
-- @column end_ns BIGINT ns: The part's end (end_ns >= start_ns).
-- @column launch_ns BIGINT ns: The activity's launch.
-- @column launch_pid BIGINT: The launching process.
-- @column launch_tid BIGINT: The launching thread.
-- @column graph_replay BOOLEAN: The activity is a graph replay.
-- @column category VARCHAR: compute, communication, comm_wait, memory or unknown.
-- @column first_part BOOLEAN: TRUE on the part that starts at the activity's start (count activities on it).
CREATE OR REPLACE VIEW scope_parts AS
WITH comm AS (
  SELECT s.run_id, s.source_id, s.rank, s.correlation, s.step, s.start_ns, greatest(s.end_ns, s.start_ns) AS end_ns, s.launch_ns,
         s.launch_pid, s.launch_tid, coalesce(s.graph_replay, false) AS graph_replay, w.wait_end_ns
  FROM scope s
  LEFT JOIN comm_wait w ON w.run_id = s.run_id AND w.source_id = s.source_id AND w.rank = s.rank
   AND w.correlation IS NOT DISTINCT FROM s.correlation AND w.start_ns = s.start_ns
  WHERE s.category = 'communication'
)
SELECT run_id, source_id, rank, correlation, step, start_ns, greatest(end_ns, start_ns) AS end_ns, launch_ns,
       launch_pid, launch_tid, coalesce(graph_replay, false) AS graph_replay, category, true AS first_part
FROM scope WHERE category <> 'communication'
UNION ALL
SELECT run_id, source_id, rank, correlation, step, start_ns, coalesce(wait_end_ns, end_ns), launch_ns, launch_pid,
       launch_tid, graph_replay,
       CASE WHEN wait_end_ns IS NULL THEN 'communication' ELSE 'comm_wait' END, true
FROM comm
UNION ALL
SELECT run_id, source_id, rank, correlation, step, wait_end_ns, end_ns, launch_ns, launch_pid, launch_tid, graph_replay,
       'communication', false
FROM comm WHERE wait_end_ns IS NOT NULL AND end_ns > wait_end_ns;
