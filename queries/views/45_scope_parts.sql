-- comm_wait / scope_parts: each rank's collective kernel split into waiting for peers and transfer.
--
-- Definition: for a consistent collective call (matched across two or more ranks that agree on
-- op and size, whose kernels overlap in time: views/40_collective_calls.sql), each rank's kernel
-- first waits for its peers, then transfers: its wait is its duration minus the call's transfer
-- time (the shortest duration among the ranks, the straggler's: TraceLens NcclAnalyser's and
-- torch-tb-profiler's wait and "data transfer time", ../shared/reference/peers.md section 4.1),
-- so [start_ns, start_ns + wait) is waiting for peers (arrival skew: load imbalance, a straggler)
-- and the last transfer_ns of every kernel is transfer (every rank is in the collective: the
-- network or NVLink moving data). Durations, not starts, set the boundary: each rank's is
-- measured on its own clock, so host clock skew does not move it (comparing starts across hosts
-- would make a constant clock offset look like waiting).
-- comm_wait: one row per matched collective kernel that waits (wait_end_ns > start_ns).
--   run_id STRING; source_id STRING; rank INT32; correlation INT64; start_ns INT64 ns
--   wait_end_ns INT64 ns: start_ns + (dur_ns - the call's transfer_ns)
CREATE OR REPLACE VIEW comm_wait AS
SELECT r.run_id, r.source_id, r.rank, r.correlation, r.start_ns, max(r.start_ns + r.dur_ns - k.transfer_ns) AS wait_end_ns
FROM collective_ranks r
JOIN collective_calls k USING (run_id, pg_key, call_key)
WHERE k.consistent AND r.dur_ns > k.transfer_ns
GROUP BY ALL;

-- scope_parts: the rows of scope (views/20_scope.sql) the interval sweeps of breakdown.sql and
-- step_time.sql read, with every waiting communication kernel in two parts: its wait
-- [start_ns, wait_end_ns) with category 'comm_wait', and its transfer [wait_end_ns, end_ns) with
-- category 'communication' (absent when empty). Every other row is scope's row, whole: a kernel
-- of a call seen on one rank only, or of an inconsistent call, counts as transfer.
-- Columns:
--   run_id STRING; rank INT32; step INT64; start_ns, end_ns INT64 ns (end_ns >= start_ns)
--   launch_ns INT64 ns; graph_replay BOOL; category STRING (compute, communication, comm_wait,
--   memory, unknown)
--   first_part BOOL: TRUE on the part that starts at the activity's start (count activities on it)
CREATE OR REPLACE VIEW scope_parts AS
WITH comm AS (
  SELECT s.run_id, s.rank, s.step, s.start_ns, greatest(s.end_ns, s.start_ns) AS end_ns, s.launch_ns,
         coalesce(s.graph_replay, false) AS graph_replay, w.wait_end_ns
  FROM scope s
  LEFT JOIN comm_wait w ON w.run_id = s.run_id AND w.source_id = s.source_id AND w.rank = s.rank
   AND w.correlation IS NOT DISTINCT FROM s.correlation AND w.start_ns = s.start_ns
  WHERE s.category = 'communication'
)
SELECT run_id, rank, step, start_ns, greatest(end_ns, start_ns) AS end_ns, launch_ns, coalesce(graph_replay, false) AS graph_replay,
       category, true AS first_part
FROM scope WHERE category <> 'communication'
UNION ALL
SELECT run_id, rank, step, start_ns, coalesce(wait_end_ns, end_ns), launch_ns, graph_replay,
       CASE WHEN wait_end_ns IS NULL THEN 'communication' ELSE 'comm_wait' END, true
FROM comm
UNION ALL
SELECT run_id, rank, step, wait_end_ns, end_ns, launch_ns, graph_replay, 'communication', false
FROM comm WHERE wait_end_ns IS NOT NULL AND end_ns > wait_end_ns;
