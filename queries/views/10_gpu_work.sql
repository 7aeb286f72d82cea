-- gpu_work: every GPU activity with the host call that launched it and the step it belongs to.
--
-- Definition: a GPU activity belongs to the step whose host-side ProfilerStep window
-- [start_ns, end_ns) holds the start of its launching runtime/driver call (HTA assigns
-- iterations the same way: hta/common/trace.py add_iteration). The launch is found by
-- correlation id within the same source file and rank (correlation ids repeat across processes,
-- and one Nsight Systems report holds several).
-- Graph replay: several kernels share one correlation; they are flagged because the launch time
-- of the graph says nothing about when each kernel was ready (host-wait classification and
-- per-op attribution of those kernels are unreliable).
--
-- Columns: all of gpu_activities, plus
--   launch_ns        INT64  ns   start of the launching runtime/driver call (NULL: none in trace)
--   launch_name      STRING      name of that call (cudaLaunchKernel, hipExtModuleLaunchKernel, ...)
--   launch_pid, launch_tid INT64 process and thread that made the call
--   step             INT64       step number (NULL: launched outside every ProfilerStep window)
--   graph_replay     BOOL        TRUE when the launch's correlation is shared by >1 GPU activity
-- gpu_launch: the launch of each correlation of GPU work (one row per run_id, source_id, rank,
-- correlation seen in gpu_activities), the step it belongs to and how many activities share it.
-- gpu_work is gpu_activities joined to it; pipeline.query.connect(materialize=True) computes it
-- once into a table so that the metric queries do not repeat the launch and step joins.
--   run_id STRING; source_id STRING; rank INT32; correlation INT64
--   activities INT64   GPU activities with this correlation (> 1 on a kernel: graph replay)
--   launch_ns INT64 ns; launch_name STRING; launch_pid, launch_tid INT64 (NULL: no launch in trace)
--   step INT64         (NULL: launched outside every ProfilerStep window, or no launch)
CREATE OR REPLACE VIEW gpu_launch AS
WITH corr AS (
  SELECT run_id, source_id, rank, correlation, count(*) AS activities
  FROM gpu_activities WHERE correlation IS NOT NULL GROUP BY ALL
),
launches AS (
  SELECT run_id, source_id, rank, correlation, min(start_ns) AS launch_ns, arg_min(name, start_ns) AS launch_name,
         arg_min(pid, start_ns) AS launch_pid, arg_min(tid, start_ns) AS launch_tid
  FROM cpu_ops
  WHERE kind IN ('runtime', 'driver') AND correlation IS NOT NULL
  GROUP BY ALL
),
linked AS (
  SELECT c.*, l.launch_ns, l.launch_name, l.launch_pid, l.launch_tid
  FROM corr c LEFT JOIN launches l USING (run_id, source_id, rank, correlation)
)
SELECT k.*, CASE WHEN k.launch_ns < s.end_ns THEN s.step END AS step
FROM linked k
ASOF LEFT JOIN steps s
  ON k.run_id = s.run_id AND k.rank = s.rank AND k.launch_ns >= s.start_ns;

CREATE OR REPLACE VIEW gpu_work AS
SELECT a.*, l.launch_ns, l.launch_name, l.launch_pid, l.launch_tid,
       coalesce(l.activities > 1 AND a.kind = 'kernel', false) AS graph_replay, l.step
FROM gpu_activities a
LEFT JOIN gpu_launch l USING (run_id, source_id, rank, correlation);
