-- GPU hardware metrics sampled by Nsight Systems (`nsys profile --gpu-metrics-devices=...`),
-- per rank and step and over the whole trace: direct evidence of how busy the SMs, the tensor
-- cores and DRAM were, beside the roofline's modelled figures (roofline.sql).
--
-- Definition: the counters rows of the GPU_METRICS samples (pipeline/ingest/nsys mapping
-- COUNTER_SQL: name as nsys writes it, unit from its [brackets]); a metric is recognised by its
-- name (../shared/reference/nsys.md "GPU metrics sampling": names vary across nsys versions, older
-- recipes use un-suffixed names):
--   sm_active_pct      "SM Active [Throughput %]" / "SMs Active"
--   sm_issue_pct       "SM Issue [Throughput %]"
--   tensor_active_pct  "Tensor Active [Throughput %]" (also "Tensor Active / FP16 Active")
--   dram_read_pct      "DRAM Read Bandwidth [Throughput %]"
--   dram_write_pct     "DRAM Write Bandwidth [Throughput %]"
-- each the mean of the samples whose time lies in the window: step rows over the step window
-- (view step_window), the whole-trace row (step NULL) over every sample of the rank. nsys samples
-- at a fixed frequency (default 10 kHz), so the mean of the samples is the time average.
-- Values are percentages of the device's peak, as nsys reports them.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step (NULL: the whole trace).
-- @column samples BIGINT count: GPU-metric samples in the window.
-- @column sm_active_pct DOUBLE %: Mean SM Active (NULL: not captured).
-- @column sm_issue_pct DOUBLE %: Mean SM Issue (NULL: not captured).
-- @column tensor_active_pct DOUBLE %: Mean Tensor Active (NULL: not captured).
-- @column dram_read_pct DOUBLE %: Mean DRAM read bandwidth, of the peak (NULL: not captured).
-- @column dram_write_pct DOUBLE %: Mean DRAM write bandwidth, of the peak (NULL: not captured).
WITH m AS (
  SELECT run_id, rank, ts_ns, value,
    CASE WHEN regexp_matches(name, '(?i)^SMs? Active') THEN 'sm_active'
         WHEN regexp_matches(name, '(?i)^SM Issue') THEN 'sm_issue'
         WHEN regexp_matches(name, '(?i)^Tensor Active') THEN 'tensor_active'
         WHEN regexp_matches(name, '(?i)^DRAM Read Bandwidth') THEN 'dram_read'
         WHEN regexp_matches(name, '(?i)^DRAM Write Bandwidth') THEN 'dram_write' END AS metric
  FROM counters
  WHERE rank IS NOT NULL
),
k AS (SELECT * FROM m WHERE metric IS NOT NULL),
per_step AS (
  SELECT k.run_id, k.rank, w.step, k.metric, k.value
  FROM k JOIN step_window w ON w.run_id = k.run_id AND w.rank = k.rank
    AND k.ts_ns >= w.step_start_ns AND k.ts_ns < w.step_end_ns
  UNION ALL
  SELECT run_id, rank, NULL::BIGINT AS step, metric, value FROM k
)
SELECT run_id, rank, step, count(*) AS samples,
  avg(value) FILTER (WHERE metric = 'sm_active') AS sm_active_pct,
  avg(value) FILTER (WHERE metric = 'sm_issue') AS sm_issue_pct,
  avg(value) FILTER (WHERE metric = 'tensor_active') AS tensor_active_pct,
  avg(value) FILTER (WHERE metric = 'dram_read') AS dram_read_pct,
  avg(value) FILTER (WHERE metric = 'dram_write') AS dram_write_pct
FROM per_step
GROUP BY ALL
ORDER BY run_id, rank, step NULLS FIRST;
