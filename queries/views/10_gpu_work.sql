-- gpu_work: every GPU activity with the host call that launched it and the step it belongs to.
--
-- The launch, the step and the graph-replay flag are columns of gpu_activities, derived once per
-- source when it was written (pipeline/derive.py has the definitions; schemas/v3.toml): the
-- launch is the runtime/driver call of the same source, rank and correlation id; the step is the
-- one whose host-side ProfilerStep window [start_ns, end_ns) holds the launch's start (HTA
-- assigns iterations the same way: hta/common/trace.py add_iteration); graph_replay marks
-- kernels sharing one correlation (a graph replay: the launch time of the graph says nothing
-- about when each kernel was ready). This view keeps the name the metric files and users know.
-- @view gpu_work: Every GPU activity with the host call that launched it and the step it belongs
--   to (gpu_activities under the name the metric files use).
-- @columns_of gpu_activities
CREATE OR REPLACE VIEW gpu_work AS SELECT * FROM gpu_activities;

-- @view gpu_launch: One row per run_id, source_id, rank and correlation seen in gpu_activities,
--   with its launch and step and how many activities share it.
-- @column run_id VARCHAR: Run.
-- @column source_id VARCHAR: Source file.
-- @column rank INTEGER: Rank.
-- @column correlation BIGINT: Correlation id.
-- @column activities BIGINT count: GPU activities with this correlation (> 1 on a kernel: graph replay).
-- @column launch_ns BIGINT ns: Start of the launching runtime/driver call (NULL: no launch in the trace).
-- @column launch_name VARCHAR: Its name.
-- @column launch_pid BIGINT: Its process id.
-- @column launch_tid BIGINT: Its thread id.
-- @column step BIGINT: The step whose host window holds the launch (NULL: outside every ProfilerStep
--   window, or no launch).
CREATE OR REPLACE VIEW gpu_launch AS
SELECT run_id, source_id, rank, correlation, count(*) AS activities, any_value(launch_ns) AS launch_ns,
  any_value(launch_name) AS launch_name, any_value(launch_pid) AS launch_pid,
  any_value(launch_tid) AS launch_tid, any_value(step) AS step
FROM gpu_activities WHERE correlation IS NOT NULL GROUP BY ALL;
