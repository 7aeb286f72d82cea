-- GPU time breakdown per rank and per step: busy, idle, compute, communication, memory,
-- comm-compute overlap and exposed communication.
--
-- Definitions (one sweep over sorted interval end points, O(n log n); see the comment at `sweep`):
--   span      = last end - first start of the bucket's GPU work (HTA "kernel_time").
--   busy      = |union of all work|, streams and devices of the rank merged; idle = span - busy.
--   compute / comm / memory = |union| of each category's intervals.
--   overlap   = |compute ∩ comm|; comm_comp_overlap_pct = 100 * overlap / comm
--               (HTA get_comm_comp_overlap, hta/analyzers/communication_analysis.py).
--   exposed_comm   = |comm \ compute| (communication not hidden under compute).
--   Priority breakdown: every instant goes to the first active of compute > communication >
--   memory > unknown > idle, so compute_ns + exposed_comm_ns + exposed_memory_ns +
--   exposed_unknown_ns + gpu_idle_ns = span_ns (torch-tb-profiler / TraceLens gpu_timeline;
--   ../shared/reference/peers.md section 4.1). HTA's non_compute = span - compute - idle.
--   Idle by cause (device level, so the parts sum to gpu_idle_ns): each idle interval of the
--   union ends when some activity starts; HTA's stream rule is applied to the device:
--   idle_host_wait_ns if every activity starting there was launched after the device drained
--   (launch_ns > start of the idle interval), else idle_kernel_wait_ns if the interval is shorter
--   than kernel_wait_threshold_ns (default 30 µs), else idle_other_ns; idle_unreliable_ns when one
--   of those activities is a graph replay (no per-kernel launch time). Idle intervals always end
--   at an activity start, because span ends at the last end.
-- Buckets: level = 'step' (work assigned to a step by launch, see views/10_gpu_work.sql) and
-- level = 'rank' (all work in scope, step = NULL).
-- Columns:
--   run_id STRING; rank INT32; level STRING ('step' | 'rank'); step INT64 (NULL for level rank)
--   first_ns INT64 ns: first start; last_ns INT64 ns: last end
--   span_ns, gpu_busy_ns, gpu_idle_ns, compute_ns, comm_ns, memory_ns, unknown_ns,
--   overlap_ns, exposed_comm_ns, exposed_memory_ns, exposed_unknown_ns: INT64 ns
--   comm_comp_overlap_pct DOUBLE 0-100, NULL when comm_ns = 0 (nothing to overlap)
--   idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns, idle_unreliable_ns: INT64 ns
--   kernels INT64: number of activities in the bucket
WITH work AS (
  SELECT run_id, rank, 'step' AS level, step, start_ns, end_ns, category, launch_ns, graph_replay FROM scope WHERE step IS NOT NULL
  UNION ALL
  SELECT run_id, rank, 'rank', NULL::BIGINT, start_ns, end_ns, category, launch_ns, graph_replay FROM scope
),
edges AS (
  -- ord orders the edges of one instant: starts first (ordered so that the first carries a graph
  -- replay if any does, else the smallest launch, NULL if any launch is unknown), then ends, then
  -- the bucket's end sentinel (time NULL, sorted last in its bucket: the segment from the bucket's
  -- last end to it has length 0 and no start after it, and its own segment is NULL)
  SELECT run_id, rank, level, step, start_ns AS t, 0 AS ord,
         (category = 'compute')::INT AS dc, (category = 'communication')::INT AS dm,
         (category = 'memory')::INT AS dy, (category = 'unknown')::INT AS du, launch_ns AS launch, coalesce(graph_replay, false) AS graph
  FROM work
  UNION ALL
  SELECT run_id, rank, level, step, end_ns, 1,
         -(category = 'compute')::INT, -(category = 'communication')::INT,
         -(category = 'memory')::INT, -(category = 'unknown')::INT, NULL, NULL
  FROM work
  UNION ALL
  SELECT DISTINCT run_id, rank, level, step, NULL::BIGINT, 2, 0, 0, 0, 0, NULL::BIGINT, NULL::BOOLEAN FROM work
),
-- One sort of all edges (not a window per bucket: DuckDB evaluates framed aggregates per
-- partition several times slower). The running sums in (run_id, rank, step, t) order (a NULL step
-- is the rank level, sorted after the steps) equal the per-bucket sums, because each interval
-- adds +1 and -1 inside its own bucket, so every earlier bucket sums to zero. Edges at one
-- instant leave zero-length segments between them, so only the last edge of an instant carries a
-- segment, with the counts after every change at that instant; its lead() is the first edge of
-- the next instant, which, by ord, tells whether work starts there and with which launch.
sweep AS (
  SELECT run_id, rank, level, step, t, ord,
    sum(dc) OVER g AS nc, sum(dm) OVER g AS nm, sum(dy) OVER g AS ny, sum(du) OVER g AS nu,
    coalesce(lead(t) OVER g, t) - t AS seg,
    lead(ord) OVER g AS next_ord, lead(launch) OVER g AS next_launch, lead(graph) OVER g AS next_graph
  FROM edges
  WINDOW g AS (ORDER BY run_id, rank, step NULLS LAST, t NULLS LAST, ord, graph DESC, launch NULLS FIRST ROWS UNBOUNDED PRECEDING)
),
-- idle gaps: nothing active, time passes, and work of the same bucket starts at the end (the
-- segment from a bucket's last end to its sentinel has no start after it)
idle AS (
  SELECT run_id, rank, level, step, seg, CASE
      WHEN next_graph THEN 'unreliable'
      WHEN next_launch > t THEN 'host_wait'
      WHEN seg < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other' END AS cause
  FROM sweep WHERE nc + nm + ny + nu = 0 AND seg > 0 AND next_ord = 0
),
idle_agg AS (
  SELECT run_id, rank, level, step,
    sum(seg) FILTER (WHERE cause = 'host_wait') AS idle_host_wait_ns,
    sum(seg) FILTER (WHERE cause = 'kernel_wait') AS idle_kernel_wait_ns,
    sum(seg) FILTER (WHERE cause = 'other') AS idle_other_ns,
    sum(seg) FILTER (WHERE cause = 'unreliable') AS idle_unreliable_ns
  FROM idle GROUP BY ALL
),
agg AS (
  SELECT run_id, rank, level, step,
    min(t) AS first_ns, max(t) FILTER (WHERE ord < 2) AS last_ns,
    count(*) FILTER (WHERE ord = 0) AS kernels,
    coalesce(sum(seg) FILTER (WHERE nc + nm + ny + nu > 0), 0)::BIGINT AS gpu_busy_ns,
    coalesce(sum(seg) FILTER (WHERE nc > 0), 0)::BIGINT AS compute_ns,
    coalesce(sum(seg) FILTER (WHERE nm > 0), 0)::BIGINT AS comm_ns,
    coalesce(sum(seg) FILTER (WHERE ny > 0), 0)::BIGINT AS memory_ns,
    coalesce(sum(seg) FILTER (WHERE nu > 0), 0)::BIGINT AS unknown_ns,
    coalesce(sum(seg) FILTER (WHERE nc > 0 AND nm > 0), 0)::BIGINT AS overlap_ns,
    coalesce(sum(seg) FILTER (WHERE nc = 0 AND nm > 0), 0)::BIGINT AS exposed_comm_ns,
    coalesce(sum(seg) FILTER (WHERE nc = 0 AND nm = 0 AND ny > 0), 0)::BIGINT AS exposed_memory_ns,
    coalesce(sum(seg) FILTER (WHERE nc = 0 AND nm = 0 AND ny = 0 AND nu > 0), 0)::BIGINT AS exposed_unknown_ns
  FROM sweep GROUP BY ALL
)
SELECT a.run_id, a.rank, a.level, a.step, a.first_ns, a.last_ns,
  (a.last_ns - a.first_ns) AS span_ns, a.gpu_busy_ns, (a.last_ns - a.first_ns) - a.gpu_busy_ns AS gpu_idle_ns,
  a.compute_ns, a.comm_ns, a.memory_ns, a.unknown_ns, a.overlap_ns, a.exposed_comm_ns, a.exposed_memory_ns, a.exposed_unknown_ns,
  CASE WHEN a.comm_ns > 0 THEN 100.0 * a.overlap_ns / a.comm_ns END AS comm_comp_overlap_pct,
  coalesce(i.idle_host_wait_ns, 0)::BIGINT AS idle_host_wait_ns, coalesce(i.idle_kernel_wait_ns, 0)::BIGINT AS idle_kernel_wait_ns,
  coalesce(i.idle_other_ns, 0)::BIGINT AS idle_other_ns, coalesce(i.idle_unreliable_ns, 0)::BIGINT AS idle_unreliable_ns,
  a.kernels
FROM agg a
LEFT JOIN idle_agg i ON i.run_id = a.run_id AND i.rank = a.rank AND i.level = a.level AND i.step IS NOT DISTINCT FROM a.step
ORDER BY a.run_id, a.rank, a.level DESC, a.step;
