-- Roofline per run and kernel: the kernels of view kernel_roofline
-- (queries/views/80_kernel_roofline.sql, which has the definitions: modelled work, peaks, roof,
-- bound) grouped by kernel name and the op that launched them, over all ranks and steps.
--
-- Definition (per run_id, kernel_name, op_name, work_class, precision):
--   intensity       = sum(flops) / sum(bytes)            (aggregate operational intensity)
--   achieved_tflops = sum(flops) / sum(dur_ns) / 1e3; achieved_gbps = sum(bytes) / sum(dur_ns)
--   roof_tflops     = min(peak, intensity * memory_gbps / 1e3) at that aggregate intensity
--   roof_pct        = 100 * achieved_tflops / roof_tflops
--   bound           = the bound (compute | memory | latency | unknown) holding most of the
--                     group's time; the time in each is in *_bound_ns
--   lost_ns         = sum of the kernels' lost_ns (time each would save at its own roof)
--   peak_pct        = 100 * sum(flops) / sum(dur_ns * peak_tflops * 1e3): the share of the
--                     device's peak the group's kernel time delivered
--   The sums of doubles are taken in a fixed order (ORDER BY inside the aggregate), so the
--   same lake always gives the same last digits (a parallel sum does not).
--   run_compute_ns  = all compute-kernel time of the run in scope (modelled or not), so that
--                     the modelled share is sum(dur_ns) over the run's rows / run_compute_ns
-- Columns:
--   run_id STRING; kernel_name STRING; op_name STRING; work_class STRING (matrix | vector)
--   precision STRING; device_name STRING; kernels BIGINT; ranks BIGINT; dur_ns BIGINT ns
--   flops DOUBLE FLOP; bytes DOUBLE bytes; intensity DOUBLE FLOP/byte
--   achieved_tflops DOUBLE TFLOP/s; achieved_gbps DOUBLE GB/s; peak_tflops DOUBLE TFLOP/s
--   memory_gbps DOUBLE GB/s; ridge_flop_per_byte DOUBLE FLOP/byte; roof_tflops DOUBLE TFLOP/s
--   roof_pct DOUBLE 0-100 (may exceed 100: modelled work above what ran); peak_pct DOUBLE 0-100
--   bound STRING; compute_bound_ns, memory_bound_ns, latency_bound_ns, unknown_bound_ns BIGINT ns
--   above_roof_ns BIGINT ns (kernels whose roof_pct exceeds 100: their modelled work is more than
--   the device can do in their time: misrecorded shapes or dtypes, or the 1 µs timing resolution
--   of older traces on short kernels); lost_ns DOUBLE ns; run_compute_ns BIGINT ns
WITH g AS (
  SELECT run_id, kernel_name, op_name, work_class, precision,
    any_value(device_name) AS device_name, count(*) AS kernels, count(DISTINCT rank) AS ranks,
    sum(dur_ns)::BIGINT AS dur_ns, sum(flops ORDER BY source_id, start_ns, dur_ns, op_event_index) AS flops, sum(bytes ORDER BY source_id, start_ns, dur_ns, op_event_index) AS bytes,
    max(peak_tflops) AS peak_tflops, max(memory_gbps) AS memory_gbps,
    sum(dur_ns * peak_tflops * 1e3 ORDER BY source_id, start_ns, dur_ns, op_event_index) AS peak_work,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'compute'), 0)::BIGINT AS compute_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'memory'), 0)::BIGINT AS memory_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'latency'), 0)::BIGINT AS latency_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'unknown'), 0)::BIGINT AS unknown_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE roof_pct > 100), 0)::BIGINT AS above_roof_ns,
    sum(lost_ns ORDER BY source_id, start_ns, dur_ns, op_event_index) AS lost_ns
  FROM kernel_roofline
  GROUP BY ALL
),
run_compute AS (
  SELECT run_id, sum(dur_ns)::BIGINT AS run_compute_ns
  FROM scope WHERE kind = 'kernel' AND category = 'compute' AND run_id IN (SELECT run_id FROM g)
  GROUP BY ALL
),
r AS (
  SELECT *,
    CASE WHEN bytes > 0 THEN flops / bytes END AS intensity,
    CASE WHEN dur_ns > 0 THEN flops / dur_ns / 1e3 END AS achieved_tflops,
    CASE WHEN dur_ns > 0 THEN bytes / dur_ns END AS achieved_gbps,
    peak_tflops * 1e3 / memory_gbps AS ridge_flop_per_byte
  FROM g
),
c AS (
  SELECT *,
    CASE WHEN intensity IS NULL THEN peak_tflops ELSE least(peak_tflops, intensity * memory_gbps / 1e3) END AS roof_tflops
  FROM r
)
SELECT run_id, kernel_name, op_name, work_class, precision, device_name, kernels, ranks, dur_ns, flops, bytes,
  intensity, achieved_tflops, achieved_gbps, peak_tflops, memory_gbps, ridge_flop_per_byte, roof_tflops,
  100.0 * achieved_tflops / roof_tflops AS roof_pct,
  CASE WHEN peak_work > 0 THEN 100.0 * flops / peak_work END AS peak_pct,
  CASE greatest(compute_bound_ns, memory_bound_ns, latency_bound_ns, unknown_bound_ns)
    WHEN latency_bound_ns THEN 'latency' WHEN memory_bound_ns THEN 'memory'
    WHEN compute_bound_ns THEN 'compute' ELSE 'unknown' END AS bound,
  compute_bound_ns, memory_bound_ns, latency_bound_ns, unknown_bound_ns, above_roof_ns, lost_ns, rc.run_compute_ns
FROM c LEFT JOIN run_compute rc USING (run_id)
ORDER BY run_id, lost_ns DESC NULLS LAST, dur_ns DESC, kernel_name, op_name;
