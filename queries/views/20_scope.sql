-- scope: the GPU work the metric queries analyse (gpu_work minus synchronization events, which
-- are waits, never busy time: HTA PR #162, ../shared/reference/hta.md section 0 item 4).
--
-- The window is chosen by the DuckDB variable `analysis_window` (pipeline.query sets it):
--   'all' (default) every activity of the rank;
--   'hta' HolisticTraceAnalysis's load-time window: when a rank has 2 or more ProfilerSteps,
--         only work launched (with a known launch) before the start of its last step
--         (hta/common/trace.py _filter_irrelevant_gpu_kernels); otherwise everything.
-- @view scope: The GPU work the metric queries analyse: gpu_work without synchronization events,
--   in the analysis window.
-- @columns_of gpu_work
CREATE OR REPLACE VIEW scope AS
WITH last_step AS (
  SELECT run_id, rank, max(start_ns) AS last_start, count(*) AS n_steps FROM steps GROUP BY ALL
)
SELECT w.* EXCLUDE (last_start, n_steps)
FROM (SELECT g.*, l.last_start, l.n_steps FROM gpu_work g LEFT JOIN last_step l USING (run_id, rank)) w
WHERE w.category <> 'sync'
  AND (getvariable('analysis_window') IS DISTINCT FROM 'hta'
       OR coalesce(w.n_steps, 0) < 2
       OR (w.launch_ns IS NOT NULL AND w.launch_ns < w.last_start));
