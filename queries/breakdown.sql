-- GPU time breakdown per rank and per step: busy, idle, compute, communication, memory,
-- comm-compute overlap and exposed communication.
--
-- Definitions (one sweep over sorted interval end points, O(n log n); see the comment at `sweep`):
--   span      = last end - first start of the bucket's GPU work (HTA "kernel_time").
--   busy      = |union of all work|, streams and devices of the rank merged; idle = span - busy.
--   compute / comm / memory = |union| of each category's intervals.
--   overlap   = |compute ∩ comm|; comm_comp_overlap_pct = 100 * overlap / comm
--               (HTA get_comm_comp_overlap, hta/analyzers/communication_analysis.py).
--   exposed_comm   = |comm \ compute| (communication not hidden under compute), split in two
--               (views/45_scope_parts.sql): exposed_comm_wait = the part where the only
--               communication active is waiting for a peer that has not yet arrived at its
--               collective, exposed_comm_transfer = the rest (some collective is moving data), so
--               exposed_comm_wait_ns + exposed_comm_transfer_ns = exposed_comm_ns.
--   Priority breakdown: every instant goes to the first active of compute > communication
--   (transfer > waiting for peers) > memory > unknown > idle, so compute_ns + exposed_comm_ns + exposed_memory_ns +
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
--   overlap_ns, exposed_comm_ns, exposed_comm_wait_ns, exposed_comm_transfer_ns, exposed_memory_ns,
--   exposed_unknown_ns: INT64 ns
--   comm_comp_overlap_pct DOUBLE 0-100, NULL when comm_ns = 0 (nothing to overlap)
--   idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns, idle_unreliable_ns: INT64 ns
--   kernels INT64: number of activities in the bucket
WITH buckets AS (  -- a dense integer per bucket: the sweep sorts on it instead of (run_id, rank, step)
  SELECT run_id, rank, step, (row_number() OVER (ORDER BY run_id, rank, step NULLS LAST))::INT AS bid
  FROM (SELECT DISTINCT run_id, rank, step FROM scope WHERE step IS NOT NULL
        UNION ALL SELECT DISTINCT run_id, rank, NULL::BIGINT FROM scope)
),
-- the category counts travel packed: compute and communication (transfer) in c0, memory and
-- unknown in c1 (views/05_macros.sql), communication waiting for peers in c2; no count is ever
-- negative (end_ns >= start_ns, schemas/v1.toml and views/45_scope_parts.sql)
w0 AS (
  SELECT sb.bid AS step_bid, rb.bid AS rank_bid, s.start_ns, s.end_ns, s.launch_ns, s.graph_replay AS graph,
         pack_compute_comm(s.category) AS c0, pack_memory_unknown(s.category) AS c1,
         (s.category = 'comm_wait')::BIGINT AS c2, s.first_part::INT AS k
  FROM scope_parts s
  JOIN buckets rb ON rb.run_id = s.run_id AND rb.rank = s.rank AND rb.step IS NULL
  LEFT JOIN buckets sb ON sb.run_id = s.run_id AND sb.rank = s.rank AND sb.step = s.step
),
work AS (  -- every activity once in its step's bucket (when it has a step) and once in its rank's
  SELECT step_bid AS bid, * EXCLUDE (step_bid, rank_bid) FROM w0 WHERE step_bid IS NOT NULL
  UNION ALL
  SELECT rank_bid AS bid, * EXCLUDE (step_bid, rank_bid) FROM w0
),
edges AS (
  -- o orders the edges of one instant: starts first (ordered so that the first carries a graph
  -- replay if any does (o = 0), else the smallest launch, NULL if any launch is unknown), then
  -- ends (o = 2), then the bucket's end sentinel (o = 3, time NULL, sorted last in its bucket:
  -- the segment from the bucket's last end to it has length 0 and no start after it, and its own
  -- segment is NULL)
  -- (k: 1 on an activity's first part, which alone counts in `kernels`)
  SELECT bid, start_ns AS t, CASE WHEN graph THEN 0 ELSE 1 END AS o, c0, c1, c2, launch_ns AS launch, k FROM work
  UNION ALL
  SELECT bid, end_ns, 2, -c0, -c1, -c2, NULL, 0 FROM work
  UNION ALL
  SELECT DISTINCT bid, NULL::BIGINT, 3, 0, 0, 0, NULL::BIGINT, 0 FROM work
),
-- One sort of all edges (not a window per bucket: DuckDB evaluates framed aggregates per
-- partition several times slower). The running sums in (bid, t) order equal the per-bucket sums,
-- because each interval adds +1 and -1 inside its own bucket, so every earlier bucket sums to
-- zero. Edges at one instant leave zero-length segments between them, so only the last edge of an
-- instant carries a segment, with the counts after every change at that instant; its lead() is
-- the first edge of the next instant, which, by o, tells whether work starts there and with
-- which launch.
-- Idle gaps: nothing active, time passes, and work of the same bucket starts at the end (the
-- segment from a bucket's last end to its sentinel has no start after it); cause as above.
sweep AS (
  SELECT bid, t, o, k, seg, s0 <> 0 OR s1 <> 0 OR s2 <> 0 AS busy, lo32(s0) > 0 AS c, hi32(s0) > 0 AS m,
    s2 > 0 AS wt, lo32(s1) > 0 AS y, hi32(s1) > 0 AS u,
    CASE WHEN s0 <> 0 OR s1 <> 0 OR s2 <> 0 OR seg <= 0 OR next_o > 1 THEN NULL
      WHEN next_o = 0 THEN 'unreliable'
      WHEN next_launch > t THEN 'host_wait'
      WHEN seg < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other' END AS cause
  FROM (
    SELECT bid, t, o, k, sum(c0) OVER g AS s0, sum(c1) OVER g AS s1, sum(c2) OVER g AS s2,
      coalesce(lead(t) OVER g, t) - t AS seg, lead(o) OVER g AS next_o, lead(launch) OVER g AS next_launch
    FROM edges
    WINDOW g AS (ORDER BY bid, t NULLS LAST, o, launch NULLS FIRST ROWS UNBOUNDED PRECEDING))
),
agg AS (
  SELECT bid,
    min(t) AS first_ns, max(t) FILTER (WHERE o < 3) AS last_ns,
    coalesce(sum(k) FILTER (WHERE o < 2), 0)::BIGINT AS kernels,
    coalesce(sum(seg) FILTER (WHERE busy), 0)::BIGINT AS gpu_busy_ns,
    coalesce(sum(seg) FILTER (WHERE c), 0)::BIGINT AS compute_ns,
    coalesce(sum(seg) FILTER (WHERE m OR wt), 0)::BIGINT AS comm_ns,
    coalesce(sum(seg) FILTER (WHERE y), 0)::BIGINT AS memory_ns,
    coalesce(sum(seg) FILTER (WHERE u), 0)::BIGINT AS unknown_ns,
    coalesce(sum(seg) FILTER (WHERE c AND (m OR wt)), 0)::BIGINT AS overlap_ns,
    coalesce(sum(seg) FILTER (WHERE NOT c AND (m OR wt)), 0)::BIGINT AS exposed_comm_ns,
    coalesce(sum(seg) FILTER (WHERE NOT c AND NOT m AND wt), 0)::BIGINT AS exposed_comm_wait_ns,
    coalesce(sum(seg) FILTER (WHERE NOT c AND m), 0)::BIGINT AS exposed_comm_transfer_ns,
    coalesce(sum(seg) FILTER (WHERE NOT c AND NOT m AND NOT wt AND y), 0)::BIGINT AS exposed_memory_ns,
    coalesce(sum(seg) FILTER (WHERE NOT c AND NOT m AND NOT wt AND NOT y AND u), 0)::BIGINT AS exposed_unknown_ns,
    coalesce(sum(seg) FILTER (WHERE cause = 'host_wait'), 0)::BIGINT AS idle_host_wait_ns,
    coalesce(sum(seg) FILTER (WHERE cause = 'kernel_wait'), 0)::BIGINT AS idle_kernel_wait_ns,
    coalesce(sum(seg) FILTER (WHERE cause = 'other'), 0)::BIGINT AS idle_other_ns,
    coalesce(sum(seg) FILTER (WHERE cause = 'unreliable'), 0)::BIGINT AS idle_unreliable_ns
  FROM sweep GROUP BY ALL
)
SELECT b.run_id, b.rank, CASE WHEN b.step IS NULL THEN 'rank' ELSE 'step' END AS level, b.step, a.first_ns, a.last_ns,
  (a.last_ns - a.first_ns) AS span_ns, a.gpu_busy_ns, (a.last_ns - a.first_ns) - a.gpu_busy_ns AS gpu_idle_ns,
  a.compute_ns, a.comm_ns, a.memory_ns, a.unknown_ns, a.overlap_ns, a.exposed_comm_ns, a.exposed_comm_wait_ns,
  a.exposed_comm_transfer_ns, a.exposed_memory_ns, a.exposed_unknown_ns,
  CASE WHEN a.comm_ns > 0 THEN 100.0 * a.overlap_ns / a.comm_ns END AS comm_comp_overlap_pct,
  a.idle_host_wait_ns, a.idle_kernel_wait_ns, a.idle_other_ns, a.idle_unreliable_ns, a.kernels
FROM agg a
JOIN buckets b USING (bid)
ORDER BY b.run_id, b.rank, level DESC, b.step;
