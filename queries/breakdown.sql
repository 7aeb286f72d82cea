-- GPU time breakdown per rank and per step: busy, idle, compute, communication, memory,
-- comm-compute overlap and exposed communication.
--
-- Definitions (one sort of the activities per bucket, O(n log n); see the comment at `inst`):
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
-- Buckets: level = 'step' (work assigned to a step by launch, gpu_activities.step: pipeline/derive.py) and
-- level = 'rank' (all work in scope, step = NULL).
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column level VARCHAR: 'step' (the work launched in one step) or 'rank' (all work in scope).
-- @column step BIGINT: The step (ProfilerStep number); NULL for level rank.
-- @column first_ns BIGINT ns: First start of the bucket's work (absolute clock).
-- @column last_ns BIGINT ns: Last end of the bucket's work (absolute clock).
-- @column span_ns BIGINT ns: last_ns - first_ns (HTA kernel_time).
-- @column gpu_busy_ns BIGINT ns: Union of all work, streams and devices of the rank merged.
-- @column gpu_idle_ns BIGINT ns: span_ns - gpu_busy_ns.
-- @column compute_ns BIGINT ns: Union of the compute kernels.
-- @column comm_ns BIGINT ns: Union of the communication kernels.
-- @column memory_ns BIGINT ns: Union of the memory copies and memsets.
-- @column unknown_ns BIGINT ns: Union of the work of category unknown.
-- @column overlap_ns BIGINT ns: compute ∩ communication.
-- @column exposed_comm_ns BIGINT ns: Communication not under compute (exposed_comm_wait_ns +
--   exposed_comm_transfer_ns).
-- @column exposed_comm_wait_ns BIGINT ns: Of it, where the only communication active waits for a peer.
-- @column exposed_comm_transfer_ns BIGINT ns: Of it, where some collective moves data.
-- @column exposed_memory_ns BIGINT ns: Copies and memsets under neither compute nor communication.
-- @column exposed_unknown_ns BIGINT ns: Unknown work under nothing else.
-- @column comm_comp_overlap_pct DOUBLE %: 100 * overlap_ns / comm_ns; NULL when comm_ns = 0 (nothing to
--   overlap).
-- @column idle_host_wait_ns BIGINT ns: Idle ended by work launched after the device drained.
-- @column idle_kernel_wait_ns BIGINT ns: Other idle intervals shorter than kernel_wait_threshold_ns.
-- @column idle_other_ns BIGINT ns: The remaining idle intervals.
-- @column idle_unreliable_ns BIGINT ns: Idle ended by a graph replay (no per-kernel launch time).
-- @column kernels BIGINT count: GPU activities in the bucket.
WITH buckets AS (  -- a dense integer per bucket: the sweep sorts on it instead of (run_id, rank, step)
  SELECT run_id, rank, step, (row_number() OVER (ORDER BY run_id, rank, step NULLS LAST))::INT AS bid
  FROM (SELECT DISTINCT run_id, rank, step FROM scope WHERE step IS NOT NULL
        UNION ALL SELECT DISTINCT run_id, rank, NULL::BIGINT FROM scope)
),
w0 AS (
  SELECT sb.bid AS step_bid, rb.bid AS rank_bid, s.start_ns, s.end_ns, s.launch_ns, s.graph_replay AS graph,
         s.category AS cat, s.first_part::INT AS k
  FROM scope_parts s
  JOIN buckets rb ON rb.run_id = s.run_id AND rb.rank = s.rank AND rb.step IS NULL
  LEFT JOIN buckets sb ON sb.run_id = s.run_id AND sb.rank = s.rank AND sb.step = s.step
),
work AS (  -- every activity once in its step's bucket (when it has a step) and once in its rank's
  SELECT step_bid AS bid, * EXCLUDE (step_bid, rank_bid) FROM w0 WHERE step_bid IS NOT NULL
  UNION ALL
  SELECT rank_bid AS bid, * EXCLUDE (step_bid, rank_bid) FROM w0
),
-- Every measure is the length of a union of intervals: with C compute, M communication
-- (transfer), W communication waiting for peers, Y memory, U unknown,
--   gpu_busy = |C∪M∪W∪Y∪U|, compute = |C|, comm = |M∪W|, memory = |Y|, unknown = |U|,
--   overlap = |C| + |M∪W| - |C∪M∪W|, exposed_comm = |C∪M∪W| - |C|,
--   exposed_comm_transfer = |C∪M| - |C|, exposed_comm_wait = |C∪M∪W| - |C∪M|,
--   exposed_memory = |C∪M∪W∪Y| - |C∪M∪W|, exposed_unknown = |C∪M∪W∪Y∪U| - |C∪M∪W∪Y|
-- (each instant goes to the first active category in priority order, so each exposed part is
-- what a larger union adds to the one before it). The length of a union of intervals sorted by
-- start is the sum over them of what each adds past the latest end before it:
-- greatest(0, end - greatest(start, latest earlier end)). So one sort of the activities gives,
-- per set, the latest end before each of them in its bucket (a running max keyed by bucket,
-- keyed_ns in views/05_macros.sql: one global order instead of a window per bucket; measured at
-- 64 ranks x 100k kernels, 7 % less time than sorting the 2n start and end edges with running
-- counts, which this file did before; grouping the activities by start instant first cost more
-- than it saved).
-- Idle gaps: where an activity starts after the latest end of everything before it in its
-- bucket. At one instant the activities are ordered graph replays first, then by launch (unknown
-- launches first), so the first of them, the one that sees the gap, tells the gap's cause for
-- them all: unreliable if one of them is a graph replay, host_wait if every one has a known
-- launch later than the gap's start, else kernel_wait when the gap is shorter than
-- kernel_wait_threshold_ns, else other.
sets AS (
  SELECT bid, start_ns AS t, k, graph, launch_ns, end_ns AS e_all,
    CASE WHEN cat = 'compute' THEN end_ns END AS e_c,
    CASE WHEN cat IN ('communication', 'comm_wait') THEN end_ns END AS e_mw,
    CASE WHEN cat = 'memory' THEN end_ns END AS e_y,
    CASE WHEN cat = 'unknown' THEN end_ns END AS e_u,
    CASE WHEN cat IN ('compute', 'communication') THEN end_ns END AS e_cm,
    CASE WHEN cat IN ('compute', 'communication', 'comm_wait') THEN end_ns END AS e_cmw,
    CASE WHEN cat <> 'unknown' THEN end_ns END AS e_cmwy
  FROM work
),
prev AS (
  SELECT bid, t, k, graph, launch_ns, e_all, e_c, e_mw, e_y, e_u, e_cm, e_cmw, e_cmwy,
    keyed_ns_value(max(keyed_ns(bid, e_all)) OVER w, bid) AS p_all,
    keyed_ns_value(max(keyed_ns(bid, e_c)) OVER w, bid) AS p_c,
    keyed_ns_value(max(keyed_ns(bid, e_mw)) OVER w, bid) AS p_mw,
    keyed_ns_value(max(keyed_ns(bid, e_y)) OVER w, bid) AS p_y,
    keyed_ns_value(max(keyed_ns(bid, e_u)) OVER w, bid) AS p_u,
    keyed_ns_value(max(keyed_ns(bid, e_cm)) OVER w, bid) AS p_cm,
    keyed_ns_value(max(keyed_ns(bid, e_cmw)) OVER w, bid) AS p_cmw,
    keyed_ns_value(max(keyed_ns(bid, e_cmwy)) OVER w, bid) AS p_cmwy
  FROM sets
  WINDOW w AS (ORDER BY bid, t, CASE WHEN graph THEN 0 ELSE 1 END, launch_ns NULLS FIRST
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
gaps AS (
  SELECT bid, t - p_all AS gap, CASE
      WHEN graph THEN 'unreliable'
      WHEN launch_ns > p_all THEN 'host_wait'
      WHEN t - p_all < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other' END AS cause
  FROM prev WHERE t > p_all
),
added AS (  -- what each group adds to each union (NULL: none of its activities is in the set)
  SELECT bid, t, k, e_all,
    greatest(0, e_all - greatest(t, coalesce(p_all, t))) AS a_all,
    greatest(0, e_c - greatest(t, coalesce(p_c, t))) AS a_c,
    greatest(0, e_mw - greatest(t, coalesce(p_mw, t))) AS a_mw,
    greatest(0, e_y - greatest(t, coalesce(p_y, t))) AS a_y,
    greatest(0, e_u - greatest(t, coalesce(p_u, t))) AS a_u,
    greatest(0, e_cm - greatest(t, coalesce(p_cm, t))) AS a_cm,
    greatest(0, e_cmw - greatest(t, coalesce(p_cmw, t))) AS a_cmw,
    greatest(0, e_cmwy - greatest(t, coalesce(p_cmwy, t))) AS a_cmwy
  FROM prev
),
unions AS (
  SELECT bid, min(t) AS first_ns, max(e_all) AS last_ns, coalesce(sum(k), 0)::BIGINT AS kernels,
    coalesce(sum(a_all), 0)::BIGINT AS u_all, coalesce(sum(a_c), 0)::BIGINT AS u_c,
    coalesce(sum(a_mw), 0)::BIGINT AS u_mw, coalesce(sum(a_y), 0)::BIGINT AS u_y,
    coalesce(sum(a_u), 0)::BIGINT AS u_u, coalesce(sum(a_cm), 0)::BIGINT AS u_cm,
    coalesce(sum(a_cmw), 0)::BIGINT AS u_cmw, coalesce(sum(a_cmwy), 0)::BIGINT AS u_cmwy
  FROM added GROUP BY bid
),
idle AS (
  SELECT bid,
    coalesce(sum(gap) FILTER (WHERE cause = 'host_wait'), 0)::BIGINT AS idle_host_wait_ns,
    coalesce(sum(gap) FILTER (WHERE cause = 'kernel_wait'), 0)::BIGINT AS idle_kernel_wait_ns,
    coalesce(sum(gap) FILTER (WHERE cause = 'other'), 0)::BIGINT AS idle_other_ns,
    coalesce(sum(gap) FILTER (WHERE cause = 'unreliable'), 0)::BIGINT AS idle_unreliable_ns
  FROM gaps GROUP BY bid
)
SELECT b.run_id, b.rank, CASE WHEN b.step IS NULL THEN 'rank' ELSE 'step' END AS level, b.step, a.first_ns, a.last_ns,
  (a.last_ns - a.first_ns) AS span_ns, a.u_all AS gpu_busy_ns, (a.last_ns - a.first_ns) - a.u_all AS gpu_idle_ns,
  a.u_c AS compute_ns, a.u_mw AS comm_ns, a.u_y AS memory_ns, a.u_u AS unknown_ns,
  a.u_c + a.u_mw - a.u_cmw AS overlap_ns, a.u_cmw - a.u_c AS exposed_comm_ns,
  a.u_cmw - a.u_cm AS exposed_comm_wait_ns, a.u_cm - a.u_c AS exposed_comm_transfer_ns,
  a.u_cmwy - a.u_cmw AS exposed_memory_ns, a.u_all - a.u_cmwy AS exposed_unknown_ns,
  CASE WHEN a.u_mw > 0 THEN 100.0 * (a.u_c + a.u_mw - a.u_cmw) / a.u_mw END AS comm_comp_overlap_pct,
  coalesce(i.idle_host_wait_ns, 0) AS idle_host_wait_ns, coalesce(i.idle_kernel_wait_ns, 0) AS idle_kernel_wait_ns,
  coalesce(i.idle_other_ns, 0) AS idle_other_ns, coalesce(i.idle_unreliable_ns, 0) AS idle_unreliable_ns, a.kernels
FROM unions a
JOIN buckets b USING (bid)
LEFT JOIN idle i USING (bid)
ORDER BY b.run_id, b.rank, level DESC, b.step;
