-- Kernels (and copies) launched inside steps: time per name, for comparing two runs kernel by kernel.
--
-- Definition: the GPU activities in scope whose launch falls in a ProfilerStep host window
-- (gpu_work.step, pipeline/derive.py), grouped by name and category over all ranks and steps
-- of the run. Work launched outside every step (start-up, compilation) is left out, so runs with
-- different start-ups compare on their steps. Overlapping activities are each counted (per-kernel
-- cost, not wall time), as in top_kernels.sql.
-- @column run_id VARCHAR: Run.
-- @column name VARCHAR: Kernel (or copy, memset) name.
-- @column category VARCHAR: compute, communication, memory or unknown.
-- @column calls BIGINT count: Activities.
-- @column ranks BIGINT count: Ranks they ran on.
-- @column steps BIGINT count: Distinct step numbers.
-- @column total_ns BIGINT ns: Summed duration.
-- @column max_ns BIGINT ns: Longest single activity.
SELECT run_id, name, category, count(*) AS calls, count(DISTINCT rank) AS ranks, count(DISTINCT step) AS steps,
  sum(dur_ns)::BIGINT AS total_ns, max(dur_ns) AS max_ns
FROM scope
WHERE step IS NOT NULL
GROUP BY run_id, name, category
ORDER BY run_id, total_ns DESC, name, category;
