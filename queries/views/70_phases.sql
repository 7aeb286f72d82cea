-- phase_steps / phase_parts: which phase of the training step (forward, backward, optimizer,
-- other) launched each piece of GPU work, from the trace's own host records.
--
-- Definition (PyTorch's profiler names): for the GPU work launched in a step (the
-- launch's ProfilerStep window, gpu_work.step), by the host call that launched it (the runtime
-- call's thread and start: gpu_work.launch_pid / launch_tid / launch_ns), the first that holds:
--   optimizer  the launch lies inside an `Optimizer.step#…` or `Optimizer.zero_grad#…` range of
--              the same thread (torch.optim's record_function names);
--   backward   the launch lies inside an `autograd::engine::evaluate_function: …` op of the same
--              thread (the autograd engine runs each backward node inside one), or it comes from
--              an autograd thread: a thread other than the step's own (its ProfilerStep range's)
--              that runs evaluate_function ops in the step (the engine's device threads, where
--              DDP's gradient all-reduce is launched from its hooks and its end-of-backward
--              callback);
--   forward    the launch precedes the step's first evaluate_function op (any thread);
--   other      the rest (launched after backward began but outside it: loss scaling, metrics,
--              copies), and work launched outside every step or without a known launch.
-- A launch at t is inside a range [start, end) when the last range of its thread starting at or
-- before t reaches past t (the running maximum of the ends: nested ranges count).
-- phase_ranges holds those host ranges, read once from cpu_ops (each with the running maximum
-- of the ends of its thread's ranges of its kind so far, reach_ns); phase_steps and phase_parts
-- read it.
-- A step has phases only when its host window holds at least one evaluate_function op (phase_
-- steps); the work of other steps gets phase NULL (forward and backward cannot be told apart:
-- an inference trace, a capture without CPU ops, a step without backward).
-- phase_ranges columns: run_id, rank, pid, tid, start_ns, end_ns, bwd (an evaluate_function op,
-- else an optimizer range), reach_ns (the latest end of the thread's ranges of the same kind
-- starting at or before this one).
-- @internal phase_ranges: the host ranges phase_steps and phase_parts read.
CREATE OR REPLACE VIEW phase_ranges AS
SELECT run_id, rank, pid, tid, start_ns, end_ns, name LIKE 'autograd::engine::evaluate_function:%' AS bwd,
       max(end_ns) OVER (PARTITION BY run_id, rank, pid, tid, name LIKE 'autograd::engine::evaluate_function:%'
                         ORDER BY start_ns ROWS UNBOUNDED PRECEDING) AS reach_ns
FROM cpu_ops
WHERE name LIKE 'autograd::engine::evaluate_function:%' OR name LIKE 'Optimizer.step#%'
   OR name LIKE 'Optimizer.zero_grad#%';

-- @view phase_steps: The steps that have phases (at least one evaluate_function op in the host
--   window), with the start of their backward.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step.
-- @column pid BIGINT: The process of the step's ProfilerStep range (the step's own thread).
-- @column tid BIGINT: Its thread.
-- @column backward_start_ns BIGINT ns: The first evaluate_function op's start in the host window.
-- @column backward_ops BIGINT count: evaluate_function ops starting in the host window (all threads).
-- @column optimizer_ranges BIGINT count: Optimizer.step# / Optimizer.zero_grad# ranges starting in it.
CREATE OR REPLACE VIEW phase_steps AS
SELECT s.run_id, s.rank, s.step, any_value(s.pid) AS pid, any_value(s.tid) AS tid,
       min(h.start_ns) FILTER (WHERE h.bwd) AS backward_start_ns,
       count(*) FILTER (WHERE h.bwd) AS backward_ops,
       count(*) FILTER (WHERE NOT h.bwd) AS optimizer_ranges
FROM steps s
JOIN phase_ranges h ON h.run_id = s.run_id AND h.rank = s.rank AND h.start_ns >= s.start_ns AND h.start_ns < s.end_ns
GROUP BY ALL
HAVING count(*) FILTER (WHERE h.bwd) > 0;

-- phase_parts: the rows of scope_parts (views/45_scope_parts.sql: scope with each waiting
-- collective kernel cut into its wait and its transfer) with the phase that launched them.
-- @view phase_parts: The rows of scope_parts with the phase (forward, backward, optimizer, other)
--   that launched them.
-- @columns_of scope_parts
-- @column phase VARCHAR: forward, backward, optimizer or other; NULL when the launch's step has no
--   phases (not in phase_steps) or the work has no step.
CREATE OR REPLACE VIEW phase_parts AS
WITH bwd AS (SELECT * FROM phase_ranges WHERE bwd),
opt AS (SELECT * FROM phase_ranges WHERE NOT bwd),
-- autograd threads: threads other than the step's own with evaluate_function ops in its window
autograd_threads AS (
  SELECT DISTINCT p.run_id, p.rank, p.step, b.pid, b.tid
  FROM phase_steps p
  JOIN steps s ON s.run_id = p.run_id AND s.rank = p.rank AND s.step = p.step
  JOIN bwd b ON b.run_id = p.run_id AND b.rank = p.rank AND b.start_ns >= s.start_ns AND b.start_ns < s.end_ns
  WHERE b.pid IS DISTINCT FROM p.pid OR b.tid IS DISTINCT FROM p.tid
),
marked AS (
  SELECT s.*, o.reach_ns AS opt_reach_ns, k.reach_ns AS bwd_reach_ns
  FROM scope_parts s
  ASOF LEFT JOIN opt o ON o.run_id = s.run_id AND o.rank = s.rank AND o.pid = s.launch_pid
    AND o.tid = s.launch_tid AND o.start_ns <= s.launch_ns
  ASOF LEFT JOIN bwd k ON k.run_id = s.run_id AND k.rank = s.rank AND k.pid = s.launch_pid
    AND k.tid = s.launch_tid AND k.start_ns <= s.launch_ns
)
SELECT m.* EXCLUDE (opt_reach_ns, bwd_reach_ns),
  CASE
    WHEN p.step IS NULL THEN NULL
    WHEN m.opt_reach_ns > m.launch_ns THEN 'optimizer'
    WHEN m.bwd_reach_ns > m.launch_ns OR t.tid IS NOT NULL THEN 'backward'
    WHEN m.launch_ns < p.backward_start_ns THEN 'forward'
    ELSE 'other' END AS phase
FROM marked m
LEFT JOIN phase_steps p ON p.run_id = m.run_id AND p.rank = m.rank AND p.step = m.step
LEFT JOIN autograd_threads t ON t.run_id = m.run_id AND t.rank = m.rank AND t.step = m.step
  AND t.pid = m.launch_pid AND t.tid = m.launch_tid;
