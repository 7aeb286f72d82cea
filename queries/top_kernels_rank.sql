-- Top GPU kernels (and copies) by total time, per run and rank: top_kernels.sql rank by rank.
--
-- Definition: total_ns = sum of durations of the rank's activities in scope with the same name
-- and category (overlapping activities are each counted: this is per-kernel cost, not wall
-- time). share_pct = 100 * total_ns / sum of total_ns over the rank, so a rank whose time goes
-- to other kernels than its peers' stands out. Not run by analyze (top_kernels.sql is the run's).
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column name VARCHAR: Kernel (or copy, memset) name.
-- @column category VARCHAR: compute, communication, memory or unknown.
-- @column calls BIGINT count: The rank's activities of this name and category.
-- @column total_ns BIGINT ns: Their summed duration.
-- @column mean_ns DOUBLE ns: Their mean duration.
-- @column max_ns BIGINT ns: The longest one.
-- @column share_pct DOUBLE %: 100 * total_ns / the rank's summed total_ns.
SELECT run_id, rank, name, category, count(*) AS calls,
  sum(dur_ns)::BIGINT AS total_ns, avg(dur_ns) AS mean_ns, max(dur_ns) AS max_ns,
  100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER (PARTITION BY run_id, rank) AS share_pct
FROM scope
GROUP BY run_id, rank, name, category
ORDER BY run_id, rank, total_ns DESC, name, category;
