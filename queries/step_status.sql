-- Steps per rank with a completeness flag.
--
-- Definition: a step is complete unless work launched in it was cut off by the end of the trace.
-- A launch call made inside the step's host window that has no GPU work with the same correlation
-- in the trace counts as cut off only when no later launch of the same source file and rank (by
-- launch start) has GPU work: it lies after the last launch whose GPU work was recorded, so the
-- profiler stopped (or the trace ended) before that work was written. The step's GPU figures are
-- then cut off, and the step is flagged (complete = FALSE), not dropped. HTA drops the last
-- ProfilerStep for the same reason (hta/common/trace.py, include_last_profiler_step=False).
-- Why not every launch without GPU work: some launches legitimately never produce a GPU record,
-- e.g. cuDNN's cudaMemsetAsync calls (47 per step in HTA's tests/data/ns_resolution_trace, one
-- per step in tests/data/nccl_parser_config/nccl_data.json.gz, 22 in TraceLens's h100 BERT
-- trace); counting them flagged every step of those traces. A launch without GPU work before
-- the last recorded one is kept in launches_without_gpu_work but does not make its step
-- incomplete. When no launch of the source and rank has GPU work, every launch without it counts
-- as cut off.
-- A truncated source (sources.status = 'partial': the file was cut while the profiler wrote it)
-- makes every one of its steps incomplete: Kineto does not write events in time order, so a cut
-- removes events of any step (host launches and their GPU records together, so no launch looks
-- cut off; a cut nccl_parser_config trace kept ProfilerStep#5 with none of its launches), and the
-- file cannot tell which steps are whole.
-- Launch calls: runtime/driver names matching LaunchKernel, MemcpyAsync, MemsetAsync,
-- GraphLaunch, ModuleLaunch or MTIA runFunction (HTA's launch symbol list, trace_counters.py).
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step.
-- @column name VARCHAR: The ProfilerStep's name.
-- @column start_ns BIGINT ns: Host window start (absolute clock).
-- @column end_ns BIGINT ns: Host window end.
-- @column dur_ns BIGINT ns: Host window length.
-- @column launches BIGINT count: Launch calls in the host window.
-- @column launches_without_gpu_work BIGINT count: Of them, those with no GPU work in the trace (cut off
--   or not).
-- @column launches_cut_off BIGINT count: Of those, the ones after the last launch of the source and rank
--   whose GPU work was recorded (the ones that make the step incomplete).
-- @column in_truncated_source BOOLEAN: The step's source file was cut (status 'partial').
-- @column complete BOOLEAN: launches_cut_off = 0 and not in_truncated_source.
-- @column is_last BOOLEAN: The last step of the rank.
WITH launch_calls AS (
  SELECT run_id, source_id, rank, correlation, start_ns FROM cpu_ops
  WHERE kind IN ('runtime', 'driver') AND correlation IS NOT NULL
    AND regexp_matches(name, '(LaunchKernel|MemcpyAsync|MemsetAsync|GraphLaunch|ModuleLaunch|runFunction)')
),
gpu_corr AS (  -- one row per correlation with GPU work
  SELECT DISTINCT run_id, source_id, rank, correlation FROM gpu_activities WHERE correlation IS NOT NULL
),
launched AS (
  SELECT l.run_id, l.source_id, l.rank, l.start_ns, g.correlation IS NOT NULL AS has_gpu
  FROM launch_calls l
  LEFT JOIN gpu_corr g ON g.run_id = l.run_id AND g.source_id = l.source_id AND g.rank = l.rank AND g.correlation = l.correlation
),
-- the start of the last launch whose GPU work was recorded, per source file and rank (NULL: none)
last_gpu AS (
  SELECT run_id, source_id, rank, max(start_ns) FILTER (WHERE has_gpu) AS last_gpu_ns FROM launched GROUP BY ALL
),
marked AS (
  SELECT l.run_id, l.rank, l.start_ns, l.has_gpu,
    NOT l.has_gpu AND (m.last_gpu_ns IS NULL OR l.start_ns > m.last_gpu_ns) AS cut_off
  FROM launched l JOIN last_gpu m USING (run_id, source_id, rank)
),
per_step AS (
  SELECT l.run_id, l.rank, s.step, count(*) AS launches, count(*) FILTER (WHERE NOT l.has_gpu) AS missing,
    count(*) FILTER (WHERE l.cut_off) AS cut_off
  FROM marked l
  ASOF JOIN steps s ON l.run_id = s.run_id AND l.rank = s.rank AND l.start_ns >= s.start_ns
  WHERE l.start_ns < s.end_ns
  GROUP BY ALL
)
SELECT s.run_id, s.rank, s.step, s.name, s.start_ns, s.end_ns, s.dur_ns,
  coalesce(p.launches, 0) AS launches, coalesce(p.missing, 0) AS launches_without_gpu_work,
  coalesce(p.cut_off, 0) AS launches_cut_off, s.in_truncated_source,
  coalesce(p.cut_off, 0) = 0 AND NOT s.in_truncated_source AS complete,
  s.start_ns = max(s.start_ns) OVER (PARTITION BY s.run_id, s.rank) AS is_last
FROM (
  SELECT st.*, coalesce(src.status = 'partial', false) AS in_truncated_source
  FROM steps st LEFT JOIN sources src ON src.run_id = st.run_id AND src.source_id = st.source_id
) s
LEFT JOIN per_step p USING (run_id, rank, step)
ORDER BY s.run_id, s.rank, s.step;
