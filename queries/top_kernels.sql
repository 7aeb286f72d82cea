-- Top GPU kernels (and copies) by total time, per run.
--
-- Definition: total_ns = sum of durations of activities with the same name and category over
-- all ranks in scope (overlapping activities are each counted: this is per-kernel cost, not
-- wall time). share_pct = 100 * total_ns / sum of total_ns over the run.
-- Columns:
--   run_id STRING; name STRING; category STRING; calls INT64; ranks INT64
--   total_ns INT64 ns; mean_ns DOUBLE ns; max_ns INT64 ns; share_pct DOUBLE 0-100
SELECT run_id, name, category, count(*) AS calls, count(DISTINCT rank) AS ranks,
  sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS mean_ns, max(dur_ns) AS max_ns,
  100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY run_id) AS share_pct
FROM scope
GROUP BY run_id, name, category
ORDER BY run_id, total_ns DESC, name, category;
