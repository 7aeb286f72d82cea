-- step_window: the wall-clock window of each rank's steps, the one step time every per-step
-- metric divides by (step_time.sql, mfu.sql, the verdict and the findings).
--
-- Definition (torch-tb-profiler's step time, kineto tb_plugin torch_tb_profiler/profiler/
-- event_parser.py StepParser._update_steps_duration): a step starts at its host ProfilerStep
-- window's start, or at the end of the previous step's window if that is later, and ends at the
-- host window's end or at the end of the last GPU work launched inside the host window
-- (gpu_work.step), whichever is later. Consecutive windows of a rank never overlap, and they
-- cover the time between steps, so the data loading, Python and launch work the host does
-- before a step's first kernel counts against that step, and a host that runs ahead of its GPU
-- (the normal case: the host step ends long before the kernels it queued) does not shorten it.
-- With the 'hta' analysis window the last step of a rank with two or more steps is left out
-- (its work is out of scope, views/20_scope.sql).
-- Only ranks with GPU work in scope get rows (a CPU-only trace has no GPU time to divide).
-- @view step_window: The wall-clock window of each rank's steps, the one step time every per-step
--   metric divides by.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step.
-- @column step_start_ns BIGINT ns: The window's start (absolute clock).
-- @column step_end_ns BIGINT ns: The window's end.
-- @column step_ns BIGINT ns: Its length.
-- @column host_start_ns BIGINT ns: The host ProfilerStep window's start.
-- @column host_end_ns BIGINT ns: The host ProfilerStep window's end.
-- @column host_step_ns BIGINT ns: Its length.
-- @column gpu_start_ns BIGINT ns: First start of the GPU work launched inside the host window (NULL: none).
-- @column gpu_end_ns BIGINT ns: Last end of that work (NULL: none).
-- @column gpu_span_ns BIGINT ns: gpu_end_ns - gpu_start_ns (HTA's per-iteration kernel span; NULL: no work).
-- @column activities BIGINT count: GPU activities launched inside the host window.
CREATE OR REPLACE VIEW step_window AS
WITH st AS (
  SELECT run_id, rank, step, start_ns AS host_start_ns, end_ns AS host_end_ns,
         count(*) OVER (PARTITION BY run_id, rank) AS n_steps,
         start_ns = max(start_ns) OVER (PARTITION BY run_id, rank) AS is_last
  FROM steps
),
gpu_ranks AS (SELECT DISTINCT run_id, rank FROM scope),
launched AS (
  SELECT run_id, rank, step, min(start_ns) AS gpu_start_ns, max(end_ns) AS gpu_end_ns, count(*) AS activities
  FROM scope WHERE step IS NOT NULL GROUP BY ALL
),
w0 AS (
  SELECT st.run_id, st.rank, st.step, st.host_start_ns, st.host_end_ns, coalesce(l.activities, 0) AS activities,
         l.gpu_start_ns, l.gpu_end_ns,
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
)
SELECT run_id, rank, step, ws AS step_start_ns, greatest(end0, ws) AS step_end_ns, greatest(end0, ws) - ws AS step_ns,
  host_start_ns, host_end_ns, host_end_ns - host_start_ns AS host_step_ns,
  gpu_start_ns, gpu_end_ns, gpu_end_ns - gpu_start_ns AS gpu_span_ns, activities
FROM w1;
