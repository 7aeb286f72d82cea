-- Top GPU kernels (and copies) by total time, per run.
--
-- Definition: total_ns = sum of durations of activities with the same name and category over
-- all ranks in scope (overlapping activities are each counted: this is per-kernel cost, not
-- wall time). share_pct = 100 * total_ns / sum of total_ns over the run.
-- @column run_id VARCHAR: Run.
-- @column name VARCHAR: Kernel (or copy, memset) name.
-- @column category VARCHAR: compute, communication, memory or unknown.
-- @column calls BIGINT count: Activities.
-- @column ranks BIGINT count: Ranks they ran on.
-- @column total_ns BIGINT ns: Summed duration.
-- @column mean_ns DOUBLE ns: Mean duration.
-- @column max_ns BIGINT ns: Longest single activity.
-- @column share_pct DOUBLE %: 100 * total_ns / the run's summed total_ns.
SELECT run_id, name, category, count(*) AS calls, count(DISTINCT rank) AS ranks,
  sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS mean_ns, max(dur_ns) AS max_ns,
  100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY run_id) AS share_pct
FROM scope
GROUP BY run_id, name, category
ORDER BY run_id, total_ns DESC, name, category;
