-- gpu_work: every GPU activity with the host call that launched it and the step it belongs to.
--
-- The launch, the step and the graph-replay flag are columns of gpu_activities, derived once per
-- source when it was written (pipeline/derive.py has the definitions; schemas/v3.toml): the
-- launch is the runtime/driver call of the same source, rank and correlation id; the step is the
-- one whose host-side ProfilerStep window [start_ns, end_ns) holds the launch's start (HTA
-- assigns iterations the same way: hta/common/trace.py add_iteration); graph_replay marks
-- kernels sharing one correlation (a graph replay: the launch time of the graph says nothing
-- about when each kernel was ready). This view keeps the name the metric files and users know.
--
-- Columns: all of gpu_activities (launch_ns, launch_name, launch_pid, launch_tid, step,
-- graph_replay and flops_op included).
CREATE OR REPLACE VIEW gpu_work AS SELECT * FROM gpu_activities;

-- gpu_launch: one row per run_id, source_id, rank and correlation seen in gpu_activities, with
-- its launch and step and how many activities share it.
--   run_id STRING; source_id STRING; rank INT32; correlation INT64
--   activities INT64   GPU activities with this correlation (> 1 on a kernel: graph replay)
--   launch_ns INT64 ns; launch_name STRING; launch_pid, launch_tid INT64 (NULL: no launch in trace)
--   step INT64         (NULL: launched outside every ProfilerStep window, or no launch)
CREATE OR REPLACE VIEW gpu_launch AS
SELECT run_id, source_id, rank, correlation, count(*) AS activities, any_value(launch_ns) AS launch_ns,
  any_value(launch_name) AS launch_name, any_value(launch_pid) AS launch_pid,
  any_value(launch_tid) AS launch_tid, any_value(step) AS step
FROM gpu_activities WHERE correlation IS NOT NULL GROUP BY ALL;
