-- Model FLOPs utilization (MFU) per rank and step, with the FLOP coverage that qualifies it.
--
-- Definition (PaLM, Chowdhery et al. 2022, arXiv 2204.02311 appendix B):
--   mfu_pct = 100 * model_flops / (step_ns * 1e-9 * peak_tflops * 1e12)
--   model_flops = sum of cpu_ops.flops for ops starting inside the step's host window (the
--                 trace's own flops args, else pipeline/flops.py formulas from input shapes).
--   step_ns     = the step's host-side duration (steps.dur_ns): the wall time of one iteration.
--   peak_tflops = dense peak of the rank's device (view rank_device, devices.toml) in the
--                 precision that carries most of the step's modelled FLOPs (flops_dtype).
--   flop_coverage_pct = 100 * (compute-kernel time launched by ops with modelled FLOPs,
--                 matched by External id) / (all compute-kernel time of the step).
-- MFU is NULL (with no made-up default) when there are no modelled FLOPs or no known peak;
-- pipeline.analyze turns that into a note.
-- Columns:
--   run_id STRING; rank INT32; step INT64; step_ns INT64 ns; model_flops DOUBLE FLOP
--   flops_dtype STRING; peak_tflops DOUBLE TFLOP/s; device_name STRING
--   mfu_pct DOUBLE 0-100; flop_coverage_pct DOUBLE 0-100; compute_kernel_ns INT64 ns
WITH op_step AS (
  SELECT o.run_id, o.rank, s.step, o.flops, o.flops_dtype
  FROM cpu_ops o
  ASOF JOIN steps s ON o.run_id = s.run_id AND o.rank = s.rank AND o.start_ns >= s.start_ns
  WHERE o.flops IS NOT NULL AND o.start_ns < s.end_ns
),
flops_by_dtype AS (
  SELECT run_id, rank, step, flops_dtype, sum(flops) AS f FROM op_step GROUP BY ALL
),
flops AS (
  SELECT run_id, rank, step, sum(f) AS model_flops, arg_max(flops_dtype, f) AS flops_dtype
  FROM flops_by_dtype GROUP BY ALL
),
modelled_ids AS (
  SELECT DISTINCT run_id, source_id, external_id FROM cpu_ops WHERE flops IS NOT NULL AND external_id IS NOT NULL
),
coverage AS (
  SELECT w.run_id, w.rank, w.step, sum(w.dur_ns)::BIGINT AS compute_kernel_ns,
    coalesce(sum(w.dur_ns) FILTER (WHERE m.external_id IS NOT NULL), 0) AS modelled_ns
  FROM scope w LEFT JOIN modelled_ids m USING (run_id, source_id, external_id)
  WHERE w.category = 'compute' AND w.step IS NOT NULL
  GROUP BY ALL
)
SELECT s.run_id, s.rank, s.step, s.dur_ns AS step_ns, f.model_flops, f.flops_dtype,
  CASE f.flops_dtype WHEN 'fp32' THEN d.fp32_tflops WHEN 'tf32' THEN d.tf32_tflops WHEN 'bf16' THEN d.bf16_tflops
                     WHEN 'fp16' THEN d.fp16_tflops WHEN 'fp8' THEN d.fp8_tflops END AS peak_tflops,
  d.device_name,
  100.0 * f.model_flops / (s.dur_ns * 1e-9 * peak_tflops * 1e12) AS mfu_pct,
  CASE WHEN c.compute_kernel_ns > 0 THEN 100.0 * c.modelled_ns / c.compute_kernel_ns END AS flop_coverage_pct,
  c.compute_kernel_ns
FROM steps s
LEFT JOIN flops f USING (run_id, rank, step)
LEFT JOIN rank_device d USING (run_id, rank)
LEFT JOIN coverage c USING (run_id, rank, step)
ORDER BY s.run_id, s.rank, s.step;
