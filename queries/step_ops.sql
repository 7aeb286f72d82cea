-- GPU time per launching op of the work launched inside steps, for comparing two runs op by op
-- (tracelake diff, pipeline/diagnosis/diff.py; the kernels' counterpart is step_kernels.sql).
--
-- Definition: the GPU activities in scope whose launch falls in a step's host window
-- (gpu_work.step, pipeline/derive.py), each given the op that launched it: the host op (cpu_ops
-- kind op) of the launching thread that started last at or before the launch call (same source,
-- rank, pid and tid; the launch call is the runtime event of the activity's correlation) and was
-- still running then, i.e. the innermost op around the launch, as PyTorch's profiler attributes
-- kernels to ops. Activities whose launch is in no op (or unknown, an Nsight Systems export
-- without PyTorch NVTX ranges) are left out. Grouped by op name over all ranks and steps of the
-- run; overlapping activities are each counted.
-- @column run_id VARCHAR: Run.
-- @column op VARCHAR: The launching op's name (aten::mm, ...).
-- @column calls BIGINT count: GPU activities it launched.
-- @column ranks BIGINT count: Ranks they ran on.
-- @column steps BIGINT count: Distinct step numbers.
-- @column total_ns BIGINT ns: Summed GPU duration.
WITH launches AS (
  SELECT g.run_id, g.source_id, g.rank, g.step, g.dur_ns, c.pid, c.tid, c.start_ns AS launch_ns
  FROM scope g
  JOIN cpu_ops c ON c.run_id = g.run_id AND c.source_id = g.source_id AND c.rank = g.rank
    AND c.correlation = g.correlation AND c.kind IN ('runtime', 'driver')
  WHERE g.step IS NOT NULL AND g.correlation IS NOT NULL
),
ops AS (
  SELECT run_id, source_id, rank, pid, tid, name, start_ns, end_ns FROM cpu_ops WHERE kind = 'op'
)
SELECT l.run_id, o.name AS op, count(*) AS calls, count(DISTINCT l.rank) AS ranks,
  count(DISTINCT l.step) AS steps, sum(l.dur_ns)::BIGINT AS total_ns
FROM launches l
ASOF JOIN ops o ON o.run_id = l.run_id AND o.source_id = l.source_id AND o.rank = l.rank
  AND o.pid IS NOT DISTINCT FROM l.pid AND o.tid IS NOT DISTINCT FROM l.tid AND o.start_ns <= l.launch_ns
WHERE o.end_ns >= l.launch_ns
GROUP BY l.run_id, o.name
ORDER BY l.run_id, total_ns DESC, op;
