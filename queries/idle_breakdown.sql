-- Idle time per stream, by cause (HTA get_idle_time_breakdown,
-- hta/analyzers/breakdown_analysis.py _analyze_idle_time_for_stream).
--
-- Definition: on each (rank, device, stream), activities (kernels, memcpy, memset; sync
-- events excluded) are sorted by start; the gap before an activity is
--   gap = start - (latest end of the activities before it on the stream),
-- counted only when positive (overlapping activities leave no gap; HTA subtracts the previous
-- row's end only and so sums negative gaps into kernel_wait). Each gap is:
--   host_wait   the activity's launch call started after the stream had drained
--               (launch_ns > previous end): the host was late;
--   kernel_wait otherwise, when gap < kernel_wait_threshold_ns (DuckDB variable, default
--               30000 ns = HTA's consecutive_kernel_delay of 30 µs): launch overhead;
--   other       otherwise (waiting on an event, another stream, ...).
-- Graph-replay kernels (see views/10_gpu_work.sql) have no per-kernel launch time: their gaps
-- are counted under `unreliable` instead of a cause.
-- The gap belongs to the step of the activity after it.
-- Columns:
--   run_id STRING; rank INT32; device INT32; stream INT64; step INT64 (NULL: outside steps)
--   host_wait_ns, kernel_wait_ns, other_ns, unreliable_ns INT64 ns; gaps INT64 count
WITH ordered AS (
  SELECT run_id, rank, device, stream, step, start_ns, end_ns, launch_ns, graph_replay,
    max(end_ns) OVER (PARTITION BY run_id, rank, device, stream ORDER BY start_ns, end_ns, event_index
                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM scope
),
gaps AS (
  SELECT *, start_ns - prev_end AS gap,
    CASE
      WHEN graph_replay THEN 'unreliable'
      WHEN launch_ns > prev_end THEN 'host_wait'
      WHEN start_ns - prev_end < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other'
    END AS cause
  FROM ordered
  WHERE prev_end IS NOT NULL AND start_ns > prev_end
)
SELECT run_id, rank, device, stream, step,
  coalesce(sum(gap) FILTER (WHERE cause = 'host_wait'), 0)::BIGINT AS host_wait_ns,
  coalesce(sum(gap) FILTER (WHERE cause = 'kernel_wait'), 0)::BIGINT AS kernel_wait_ns,
  coalesce(sum(gap) FILTER (WHERE cause = 'other'), 0)::BIGINT AS other_ns,
  coalesce(sum(gap) FILTER (WHERE cause = 'unreliable'), 0)::BIGINT AS unreliable_ns,
  count(*) AS gaps
FROM gaps
GROUP BY ALL
ORDER BY run_id, rank, device, stream, step;
