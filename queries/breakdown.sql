-- GPU time breakdown per rank and per step: busy, idle, compute, communication, memory,
-- comm-compute overlap and exposed communication.
--
-- Definitions (one sweep over sorted interval end points, O(n log n)):
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
  SELECT run_id, rank, level, step, start_ns AS t,
         (category = 'compute')::INT AS dc, (category = 'communication')::INT AS dm,
         (category = 'memory')::INT AS dy, (category = 'unknown')::INT AS du, 1 AS dk,
         launch_ns AS launch, graph_replay AS graph
  FROM work
  UNION ALL
  SELECT run_id, rank, level, step, end_ns,
         -(category = 'compute')::INT, -(category = 'communication')::INT,
         -(category = 'memory')::INT, -(category = 'unknown')::INT, 0, NULL::BIGINT, NULL::BOOLEAN
  FROM work
),
pts AS (
  SELECT run_id, rank, level, step, t, sum(dc) AS dc, sum(dm) AS dm, sum(dy) AS dy, sum(du) AS du, sum(dk) AS dk,
    -- launches of the activities starting at t: NULL when any of them has no known launch
    CASE WHEN count(*) FILTER (WHERE dk = 1 AND launch IS NULL) = 0 THEN min(launch) FILTER (WHERE dk = 1) END AS first_launch,
    coalesce(bool_or(graph) FILTER (WHERE dk = 1), false) AS graph
  FROM edges GROUP BY ALL
),
sweep AS (
  SELECT *,
    sum(dc) OVER w AS nc, sum(dm) OVER w AS nm, sum(dy) OVER w AS ny, sum(du) OVER w AS nu,
    coalesce(lead(t) OVER p - t, 0) AS seg,
    lead(first_launch) OVER p AS next_launch,
    lead(graph) OVER p AS next_graph
  FROM pts
  WINDOW w AS (PARTITION BY run_id, rank, level, step ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
         p AS (PARTITION BY run_id, rank, level, step ORDER BY t)
),
idle AS (
  SELECT *, CASE
      WHEN next_graph THEN 'unreliable'
      WHEN next_launch > t THEN 'host_wait'
      WHEN seg < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other' END AS cause
  FROM sweep
),
agg AS (
  SELECT run_id, rank, level, step,
    min(t) AS first_ns, max(t) AS last_ns,
    sum(dk)::BIGINT AS kernels,
    coalesce(sum(seg) FILTER (WHERE nc + nm + ny + nu > 0), 0)::BIGINT AS gpu_busy_ns,
    coalesce(sum(seg) FILTER (WHERE nc > 0), 0)::BIGINT AS compute_ns,
    coalesce(sum(seg) FILTER (WHERE nm > 0), 0)::BIGINT AS comm_ns,
    coalesce(sum(seg) FILTER (WHERE ny > 0), 0)::BIGINT AS memory_ns,
    coalesce(sum(seg) FILTER (WHERE nu > 0), 0)::BIGINT AS unknown_ns,
    coalesce(sum(seg) FILTER (WHERE nc > 0 AND nm > 0), 0)::BIGINT AS overlap_ns,
    coalesce(sum(seg) FILTER (WHERE nc = 0 AND nm > 0), 0)::BIGINT AS exposed_comm_ns,
    coalesce(sum(seg) FILTER (WHERE nc = 0 AND nm = 0 AND ny > 0), 0)::BIGINT AS exposed_memory_ns,
    coalesce(sum(seg) FILTER (WHERE nc = 0 AND nm = 0 AND ny = 0 AND nu > 0), 0)::BIGINT AS exposed_unknown_ns,
    coalesce(sum(seg) FILTER (WHERE nc + nm + ny + nu = 0 AND cause = 'host_wait'), 0)::BIGINT AS idle_host_wait_ns,
    coalesce(sum(seg) FILTER (WHERE nc + nm + ny + nu = 0 AND cause = 'kernel_wait'), 0)::BIGINT AS idle_kernel_wait_ns,
    coalesce(sum(seg) FILTER (WHERE nc + nm + ny + nu = 0 AND cause = 'other'), 0)::BIGINT AS idle_other_ns,
    coalesce(sum(seg) FILTER (WHERE nc + nm + ny + nu = 0 AND cause = 'unreliable'), 0)::BIGINT AS idle_unreliable_ns
  FROM idle GROUP BY ALL
)
SELECT run_id, rank, level, step, first_ns, last_ns,
  (last_ns - first_ns) AS span_ns, gpu_busy_ns, (last_ns - first_ns) - gpu_busy_ns AS gpu_idle_ns,
  compute_ns, comm_ns, memory_ns, unknown_ns, overlap_ns, exposed_comm_ns, exposed_memory_ns, exposed_unknown_ns,
  CASE WHEN comm_ns > 0 THEN 100.0 * overlap_ns / comm_ns END AS comm_comp_overlap_pct,
  idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns, idle_unreliable_ns,
  kernels
FROM agg
ORDER BY run_id, rank, level DESC, step;
