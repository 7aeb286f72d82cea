-- Step time per rank and step: where each step's wall-clock time went on the GPU.
--
-- Step window (torch-tb-profiler's rule, kineto tb_plugin torch_tb_profiler/profiler/
-- event_parser.py StepParser._update_steps_duration): a step starts at its host ProfilerStep
-- window's start, or at the end of the previous step's window if that is later, and ends at the
-- host window's end or at the end of the last GPU work launched inside the host window (gpu_work.
-- step), whichever is later. Consecutive windows of a rank never overlap, and they cover the time
-- between steps, so the data loading, Python and launch work the host does before a step's first
-- kernel counts against that step. With the 'hta' analysis window the last step of a rank with
-- two or more steps is left out (its work is out of scope, views/20_scope.sql).
-- Only ranks with GPU work in scope get rows (a CPU-only trace has no GPU time to divide).
--
-- Breakdown: the rank's GPU work (scope: every device and stream of the rank merged) is cut at
-- the window edges and every instant of the window goes to the first active of compute >
-- communication > memory > unknown > idle (torch-tb-profiler / TraceLens gpu_timeline priority,
-- ../shared/reference/peers.md section 4.1), so
--   compute_ns + exposed_comm_ns + exposed_memory_ns + exposed_unknown_ns + idle_ns = step_ns.
-- Idle by cause (the parts sum to idle_ns), the first that applies:
--   idle_input_ns      the host was inside a DataLoader fetch (a cpu_ops event named
--                      'enumerate(DataLoader)#...__next__' or 'enumerate(DataPipe)#...', the names
--                      torch-tb-profiler counts as DataLoader time, event_parser.py _parse_step);
--   idle_unreliable_ns the work ending the gap is a CUDA/HIP graph replay (no per-kernel launch);
--   idle_host_wait_ns  everything ending the gap was launched after the GPU drained, or no more
--                      work was launched before the window ended (HTA's host-wait rule applied to
--                      the device, as in breakdown.sql);
--   idle_kernel_wait_ns the gap is shorter than kernel_wait_threshold_ns (default 30 µs);
--   idle_other_ns      the rest (work was queued but waited: events, cross-stream dependencies).
-- Columns:
--   run_id STRING; rank INT32; step INT64
--   step_start_ns, step_end_ns INT64 ns: the step window (absolute clock); step_ns INT64 ns: its length
--   host_start_ns, host_end_ns INT64 ns: the host ProfilerStep window; host_step_ns INT64 ns: its length
--   activities INT64: GPU activities launched inside the host window
--   gpu_busy_ns, compute_ns, comm_ns, memory_ns, overlap_ns (compute ∩ comm), exposed_comm_ns
--     (comm \ compute), exposed_memory_ns, exposed_unknown_ns, idle_ns: INT64 ns inside the window
--   idle_input_ns, idle_unreliable_ns, idle_host_wait_ns, idle_kernel_wait_ns, idle_other_ns: INT64 ns
WITH st AS (
  SELECT run_id, rank, step, start_ns AS host_start_ns, end_ns AS host_end_ns,
         count(*) OVER (PARTITION BY run_id, rank) AS n_steps,
         start_ns = max(start_ns) OVER (PARTITION BY run_id, rank) AS is_last
  FROM steps
),
gpu_ranks AS (SELECT DISTINCT run_id, rank FROM scope),
launched AS (
  SELECT run_id, rank, step, max(end_ns) AS gpu_end_ns, count(*) AS activities
  FROM scope WHERE step IS NOT NULL GROUP BY ALL
),
w0 AS (
  SELECT st.run_id, st.rank, st.step, st.host_start_ns, st.host_end_ns, coalesce(l.activities, 0) AS activities,
         greatest(st.host_end_ns, coalesce(l.gpu_end_ns, st.host_end_ns)) AS end0
  FROM st
  JOIN gpu_ranks USING (run_id, rank)
  LEFT JOIN launched l USING (run_id, rank, step)
  WHERE getvariable('analysis_window') IS DISTINCT FROM 'hta' OR st.n_steps < 2 OR NOT st.is_last
),
-- start = max(host start, end of every earlier window); the running max of end0 equals the
-- previous adjusted end in tb-profiler's loop because host_start <= host_end <= end0
w1 AS (
  SELECT *, greatest(host_start_ns, coalesce(max(end0) OVER (PARTITION BY run_id, rank ORDER BY host_start_ns, step
                                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), host_start_ns)) AS ws
  FROM w0
),
win AS (SELECT *, greatest(end0, ws) AS we FROM w1),
bounds AS (SELECT run_id, rank, min(ws) AS r0, max(we) AS r1 FROM win GROUP BY ALL),
work AS (
  SELECT s.run_id, s.rank, s.start_ns, s.end_ns, s.category, s.launch_ns, s.graph_replay
  FROM scope s JOIN bounds b ON s.run_id = b.run_id AND s.rank = b.rank AND s.end_ns > b.r0 AND s.start_ns < b.r1
),
edges AS (
  SELECT run_id, rank, start_ns AS t, (category = 'compute')::INT AS dc, (category = 'communication')::INT AS dm,
         (category = 'memory')::INT AS dy, (category = 'unknown')::INT AS du, 1 AS dk,
         launch_ns AS launch, graph_replay AS graph, false AS tail
  FROM work
  UNION ALL
  SELECT run_id, rank, end_ns, -(category = 'compute')::INT, -(category = 'communication')::INT,
         -(category = 'memory')::INT, -(category = 'unknown')::INT, 0, NULL::BIGINT, NULL::BOOLEAN, false
  FROM work
  UNION ALL  -- sentinels: the sweep covers every window even before the first and after the last work
  SELECT run_id, rank, r0, 0, 0, 0, 0, 0, NULL::BIGINT, NULL::BOOLEAN, false FROM bounds
  UNION ALL
  SELECT run_id, rank, r1, 0, 0, 0, 0, 0, NULL::BIGINT, NULL::BOOLEAN, true FROM bounds
),
pts AS (
  SELECT run_id, rank, t, sum(dc) AS dc, sum(dm) AS dm, sum(dy) AS dy, sum(du) AS du,
    CASE WHEN count(*) FILTER (WHERE dk = 1) = 0 THEN
           -- no work starts here: the end sentinel means nothing more was launched in the windows
           CASE WHEN bool_or(tail) THEN 9223372036854775807 END
         WHEN count(*) FILTER (WHERE dk = 1 AND launch IS NULL) = 0 THEN min(launch) FILTER (WHERE dk = 1) END AS first_launch,
    coalesce(bool_or(graph) FILTER (WHERE dk = 1), false) AS graph
  FROM edges GROUP BY ALL
),
sweep AS (
  SELECT run_id, rank, t,
    sum(dc) OVER w AS nc, sum(dm) OVER w AS nm, sum(dy) OVER w AS ny, sum(du) OVER w AS nu,
    coalesce(lead(t) OVER p, t) AS t_end,
    lead(first_launch) OVER p AS next_launch,
    lead(graph) OVER p AS next_graph
  FROM pts
  WINDOW w AS (PARTITION BY run_id, rank ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW),
         p AS (PARTITION BY run_id, rank ORDER BY t)
),
seg AS (
  SELECT *, CASE
      WHEN nc > 0 THEN 'compute' WHEN nm > 0 THEN 'comm' WHEN ny > 0 THEN 'memory' WHEN nu > 0 THEN 'unknown'
      WHEN next_graph THEN 'unreliable'
      WHEN next_launch > t THEN 'host_wait'
      WHEN t_end - t < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other' END AS part
  FROM sweep WHERE t_end > t
),
-- segments cut at the window edges
pieces AS (
  SELECT w.run_id, w.rank, w.step, greatest(s.t, w.ws) AS a, least(s.t_end, w.we) AS b, s.part, s.nc, s.nm
  FROM win w JOIN seg s ON s.run_id = w.run_id AND s.rank = w.rank AND s.t < w.we AND s.t_end > w.ws
),
loader_ev AS (
  SELECT run_id, rank, start_ns, end_ns FROM cpu_ops
  WHERE end_ns > start_ns
    AND ((name LIKE 'enumerate(DataLoader)#%' AND name LIKE '%.\_\_next\_\_' ESCAPE '\') OR name LIKE 'enumerate(DataPipe)#%')
),
-- union of the DataLoader intervals per rank (islands of overlapping events)
loader_isl AS (
  SELECT *, sum(new_isl) OVER (PARTITION BY run_id, rank ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS isl
  FROM (SELECT *, CASE WHEN start_ns <= max(end_ns) OVER (PARTITION BY run_id, rank ORDER BY start_ns, end_ns
                                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       THEN 0 ELSE 1 END AS new_isl FROM loader_ev)
),
loader AS (SELECT run_id, rank, min(start_ns) AS la, max(end_ns) AS lb FROM loader_isl GROUP BY run_id, rank, isl),
idle_pieces AS (SELECT * FROM pieces WHERE part NOT IN ('compute', 'comm', 'memory', 'unknown')),
input AS (
  SELECT p.run_id, p.rank, p.step, p.a, sum(least(p.b, l.lb) - greatest(p.a, l.la)) AS input_ns
  FROM idle_pieces p JOIN loader l ON l.run_id = p.run_id AND l.rank = p.rank AND l.la < p.b AND l.lb > p.a
  GROUP BY ALL
),
agg AS (
  SELECT run_id, rank, step,
    sum(b - a) FILTER (WHERE part IN ('compute', 'comm', 'memory', 'unknown'))::BIGINT AS gpu_busy_ns,
    sum(b - a) FILTER (WHERE part = 'compute')::BIGINT AS compute_ns,
    sum(b - a) FILTER (WHERE nm > 0)::BIGINT AS comm_ns,
    sum(b - a) FILTER (WHERE nc > 0 AND nm > 0)::BIGINT AS overlap_ns,
    sum(b - a) FILTER (WHERE part = 'comm')::BIGINT AS exposed_comm_ns,
    sum(b - a) FILTER (WHERE part = 'memory')::BIGINT AS exposed_memory_ns,
    sum(b - a) FILTER (WHERE part = 'unknown')::BIGINT AS exposed_unknown_ns
  FROM pieces GROUP BY ALL
),
mem AS (  -- memory_ns counts copies under compute or communication too (their union, cut at the windows)
  SELECT w.run_id, w.rank, w.step, sum(least(m.e, w.we) - greatest(m.s, w.ws))::BIGINT AS memory_ns
  FROM win w JOIN (
    SELECT run_id, rank, min(start_ns) AS s, max(end_ns) AS e FROM (
      SELECT *, sum(nw) OVER (PARTITION BY run_id, rank ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS isl
      FROM (SELECT run_id, rank, start_ns, end_ns,
                   CASE WHEN start_ns <= max(end_ns) OVER (PARTITION BY run_id, rank ORDER BY start_ns, end_ns
                                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS nw
            FROM work WHERE category = 'memory'))
    GROUP BY run_id, rank, isl) m
  ON m.run_id = w.run_id AND m.rank = w.rank AND m.s < w.we AND m.e > w.ws
  GROUP BY ALL
),
idle_agg AS (
  SELECT p.run_id, p.rank, p.step,
    sum(coalesce(i.input_ns, 0))::BIGINT AS idle_input_ns,
    sum(p.b - p.a - coalesce(i.input_ns, 0)) FILTER (WHERE p.part = 'unreliable')::BIGINT AS idle_unreliable_ns,
    sum(p.b - p.a - coalesce(i.input_ns, 0)) FILTER (WHERE p.part = 'host_wait')::BIGINT AS idle_host_wait_ns,
    sum(p.b - p.a - coalesce(i.input_ns, 0)) FILTER (WHERE p.part = 'kernel_wait')::BIGINT AS idle_kernel_wait_ns,
    sum(p.b - p.a - coalesce(i.input_ns, 0)) FILTER (WHERE p.part = 'other')::BIGINT AS idle_other_ns
  FROM idle_pieces p LEFT JOIN input i USING (run_id, rank, step, a)
  GROUP BY ALL
)
SELECT w.run_id, w.rank, w.step,
  w.ws AS step_start_ns, w.we AS step_end_ns, w.we - w.ws AS step_ns,
  w.host_start_ns, w.host_end_ns, w.host_end_ns - w.host_start_ns AS host_step_ns, w.activities,
  coalesce(a.gpu_busy_ns, 0) AS gpu_busy_ns, coalesce(a.compute_ns, 0) AS compute_ns, coalesce(a.comm_ns, 0) AS comm_ns,
  coalesce(m.memory_ns, 0) AS memory_ns, coalesce(a.overlap_ns, 0) AS overlap_ns,
  coalesce(a.exposed_comm_ns, 0) AS exposed_comm_ns, coalesce(a.exposed_memory_ns, 0) AS exposed_memory_ns,
  coalesce(a.exposed_unknown_ns, 0) AS exposed_unknown_ns,
  (w.we - w.ws) - coalesce(a.gpu_busy_ns, 0) AS idle_ns,
  coalesce(i.idle_input_ns, 0) AS idle_input_ns, coalesce(i.idle_unreliable_ns, 0) AS idle_unreliable_ns,
  coalesce(i.idle_host_wait_ns, 0) AS idle_host_wait_ns, coalesce(i.idle_kernel_wait_ns, 0) AS idle_kernel_wait_ns,
  coalesce(i.idle_other_ns, 0) AS idle_other_ns
FROM win w
LEFT JOIN agg a USING (run_id, rank, step)
LEFT JOIN mem m USING (run_id, rank, step)
LEFT JOIN idle_agg i USING (run_id, rank, step)
ORDER BY w.run_id, w.rank, w.step;
