-- Steps per rank with a completeness flag.
--
-- Definition: a step is complete when every kernel/copy/memset launch call made inside its host
-- window has GPU work with the same correlation in the trace. A launch without GPU work means the
-- trace ended (or the profiler stopped) before that work was recorded: the step's GPU figures
-- are then cut off, and the step is flagged (complete = FALSE), not dropped. HTA drops the last
-- ProfilerStep for the same reason (hta/common/trace.py, include_last_profiler_step=False).
-- Launch calls: runtime/driver names matching LaunchKernel, MemcpyAsync, MemsetAsync,
-- GraphLaunch, ModuleLaunch or MTIA runFunction (HTA's launch symbol list, trace_counters.py).
-- Columns:
--   run_id STRING; rank INT32; step INT64; name STRING; start_ns, end_ns INT64 ns; dur_ns INT64 ns
--   launches INT64; launches_without_gpu_work INT64; complete BOOL; is_last BOOL (last step of the rank)
WITH launch_calls AS (
  SELECT run_id, source_id, rank, correlation, start_ns FROM cpu_ops
  WHERE kind IN ('runtime', 'driver') AND correlation IS NOT NULL
    AND regexp_matches(name, '(LaunchKernel|MemcpyAsync|MemsetAsync|GraphLaunch|ModuleLaunch|runFunction)')
),
gpu_corr AS (SELECT run_id, source_id, rank, correlation FROM gpu_launch),  -- one row per correlation with GPU work
per_step AS (
  SELECT l.run_id, l.rank, s.step, count(*) AS launches, count(*) FILTER (WHERE g.correlation IS NULL) AS missing
  FROM launch_calls l
  ASOF JOIN steps s ON l.run_id = s.run_id AND l.rank = s.rank AND l.start_ns >= s.start_ns
  LEFT JOIN gpu_corr g ON g.run_id = l.run_id AND g.source_id = l.source_id AND g.rank = l.rank AND g.correlation = l.correlation
  WHERE l.start_ns < s.end_ns
  GROUP BY ALL
)
SELECT s.run_id, s.rank, s.step, s.name, s.start_ns, s.end_ns, s.dur_ns,
  coalesce(p.launches, 0) AS launches, coalesce(p.missing, 0) AS launches_without_gpu_work,
  coalesce(p.missing, 0) = 0 AS complete,
  s.start_ns = max(s.start_ns) OVER (PARTITION BY s.run_id, s.rank) AS is_last
FROM steps s LEFT JOIN per_step p USING (run_id, rank, step)
ORDER BY s.run_id, s.rank, s.step;
