-- Roofline per run and kernel: the kernels of view kernel_roofline
-- (queries/views/80_kernel_roofline.sql, which has the definitions: modelled work, peaks, roof,
-- bound) grouped by kernel name and the op that launched them, over all ranks and steps: the
-- per-rank sums of view roofline_parts (views/82_roofline_parts.sql; stored per source at
-- ingest, pipeline/local.py) added up.
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
--   The sums are of whole FLOPs, bytes and ns (roofline_parts rounds each kernel's), added as
--   integers: the same lake gives the same digits whatever order a parallel sum takes.
--   run_compute_ns  = all compute-kernel time of the run in scope (modelled or not), so that
--                     the modelled share is sum(dur_ns) over the run's rows / run_compute_ns
-- @column run_id VARCHAR: Run.
-- @column kernel_name VARCHAR: Kernel name.
-- @column op_name VARCHAR: The op whose modelled work the kernels did.
-- @column work_class VARCHAR: matrix or vector.
-- @column precision VARCHAR: The precision the peak is taken in.
-- @column device_name VARCHAR: Device.
-- @column kernels BIGINT count: Kernels in the group.
-- @column ranks BIGINT count: Ranks they ran on.
-- @column dur_ns BIGINT ns: Their summed duration.
-- @column flops DOUBLE FLOP: Their modelled FLOPs.
-- @column bytes DOUBLE bytes: Their modelled bytes moved.
-- @column intensity DOUBLE FLOP/byte: flops / bytes.
-- @column achieved_tflops DOUBLE TFLOP/s: flops / dur_ns / 1e3.
-- @column achieved_gbps DOUBLE GB/s: bytes / dur_ns.
-- @column peak_tflops DOUBLE TFLOP/s: The device's peak in the precision.
-- @column memory_gbps DOUBLE GB/s: The device's memory bandwidth.
-- @column ridge_flop_per_byte DOUBLE FLOP/byte: peak_tflops * 1e3 / memory_gbps.
-- @column roof_tflops DOUBLE TFLOP/s: min(peak, intensity * memory_gbps / 1e3).
-- @column roof_pct DOUBLE %: 100 * achieved_tflops / roof_tflops (may exceed 100: modelled work above
--   what ran).
-- @column peak_pct DOUBLE %: The share of the device's peak the group's kernel time delivered.
-- @column bound VARCHAR: compute, memory, latency or unknown: the bound holding most of the time.
-- @column compute_bound_ns BIGINT ns: Time of the kernels bound by compute.
-- @column memory_bound_ns BIGINT ns: Time of the kernels bound by memory.
-- @column latency_bound_ns BIGINT ns: Time of the kernels bound by latency.
-- @column unknown_bound_ns BIGINT ns: Time of the kernels of unknown bound.
-- @column above_roof_ns BIGINT ns: Time of the kernels whose roof_pct exceeds 100 (misrecorded
--   shapes or dtypes, or the 1 µs timing resolution of older traces on short kernels).
-- @column lost_ns DOUBLE ns: Time the kernels would save at their own roof.
-- @column run_compute_ns BIGINT ns: All compute-kernel time of the run in scope (modelled or not).
WITH g AS (  -- the ranks' parts of each group (views/82_roofline_parts.sql), summed
  SELECT run_id, kernel_name, op_name, work_class, precision,
    any_value(device_name) AS device_name, sum(kernels)::BIGINT AS kernels, count(DISTINCT rank) AS ranks,
    sum(dur_ns)::BIGINT AS dur_ns, sum(TRY_CAST(flops AS HUGEINT))::DOUBLE AS flops, sum(TRY_CAST(bytes AS HUGEINT))::DOUBLE AS bytes,
    max(peak_tflops) AS peak_tflops, max(memory_gbps) AS memory_gbps,
    sum(TRY_CAST(peak_work AS HUGEINT))::DOUBLE AS peak_work,
    sum(compute_bound_ns)::BIGINT AS compute_bound_ns, sum(memory_bound_ns)::BIGINT AS memory_bound_ns,
    sum(latency_bound_ns)::BIGINT AS latency_bound_ns, sum(unknown_bound_ns)::BIGINT AS unknown_bound_ns,
    sum(above_roof_ns)::BIGINT AS above_roof_ns, sum(TRY_CAST(lost_ns AS HUGEINT))::DOUBLE AS lost_ns
  FROM roofline_parts
  GROUP BY ALL
),
run_compute AS (
  SELECT run_id, sum(rank_compute_ns)::BIGINT AS run_compute_ns
  FROM (SELECT DISTINCT run_id, rank, rank_compute_ns FROM roofline_parts)
  GROUP BY ALL
),
r AS (
  SELECT *, intensity(flops, bytes) AS intensity, achieved_tflops(flops, dur_ns) AS achieved_tflops,
    achieved_gbps(bytes, dur_ns) AS achieved_gbps, peak_tflops * 1e3 / memory_gbps AS ridge_flop_per_byte
  FROM g
),
c AS (
  SELECT *,
    roof_tflops(intensity, peak_tflops, memory_gbps) AS roof_tflops
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
ORDER BY run_id, lost_ns DESC NULLS LAST, dur_ns DESC, kernel_name, op_name, work_class, precision;
