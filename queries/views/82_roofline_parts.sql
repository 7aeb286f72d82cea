-- roofline_parts: the roofline's sums per rank and kernel group (kernel name x the op that
-- launched it x work class x precision), from view kernel_roofline (80_kernel_roofline.sql has
-- the definitions). queries/roofline.sql merges them over the ranks of a run. They depend on the
-- rank's own work alone, so they are also computed per source at ingest (pipeline/local.py,
-- table local_roofline, through queries/local/roofline_parts.sql) and, when every source has
-- current results and no --peak-tflops is given, this view reads those instead
-- (pipeline/query.py connect): the analysis of 64 ranks x 100k kernels then reads a few hundred
-- rows per rank, not every kernel with its name.
-- The per-kernel FLOPs, bytes, peak work and lost time are rounded to whole FLOPs, bytes and ns
-- and summed as integers (HUGEINT): exact, so the same lake gives the same digits whatever order
-- a parallel sum takes (a sum of doubles does not), at a cost of at most half a unit per kernel;
-- a kernel whose modelled work passes HUGEINT's 1.7e38 is left out of the sums (such a kernel is
-- far above its roof, above_roof_ns counts it, and the analysis notes it).
-- Columns:
--   run_id STRING; rank INT32; kernel_name STRING; op_name STRING; work_class STRING;
--   precision STRING; device_name STRING; kernels BIGINT; dur_ns BIGINT ns; flops DOUBLE FLOP;
--   bytes DOUBLE bytes; peak_work DOUBLE FLOP (sum of dur_ns x peak: what the peak would have
--   done in the kernels' time); peak_tflops, memory_gbps DOUBLE (the group's peaks);
--   compute_bound_ns, memory_bound_ns, latency_bound_ns, unknown_bound_ns, above_roof_ns BIGINT ns;
--   lost_ns BIGINT ns; rank_compute_ns BIGINT ns (all compute-kernel time of the rank in scope)
-- @internal roofline_parts: roofline.sql's per-rank sums (replaced by local_roofline when stored).
CREATE OR REPLACE VIEW roofline_parts AS
WITH g AS (
  SELECT run_id, rank, kernel_name, op_name, work_class, precision,
    any_value(device_name) AS device_name, count(*) AS kernels, sum(dur_ns)::BIGINT AS dur_ns,
    sum(TRY_CAST(round(flops) AS HUGEINT))::DOUBLE AS flops, sum(TRY_CAST(round(bytes) AS HUGEINT))::DOUBLE AS bytes,
    sum(TRY_CAST(round(dur_ns * peak_tflops * 1e3) AS HUGEINT))::DOUBLE AS peak_work,
    max(peak_tflops) AS peak_tflops, max(memory_gbps) AS memory_gbps,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'compute'), 0)::BIGINT AS compute_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'memory'), 0)::BIGINT AS memory_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'latency'), 0)::BIGINT AS latency_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE bound = 'unknown'), 0)::BIGINT AS unknown_bound_ns,
    coalesce(sum(dur_ns) FILTER (WHERE roof_pct > 100), 0)::BIGINT AS above_roof_ns,
    sum(TRY_CAST(round(lost_ns) AS HUGEINT))::BIGINT AS lost_ns
  FROM kernel_roofline
  GROUP BY ALL
),
rank_compute AS (
  SELECT run_id, rank, sum(dur_ns)::BIGINT AS rank_compute_ns
  FROM scope WHERE kind = 'kernel' AND category = 'compute'
  GROUP BY ALL
)
SELECT g.*, rc.rank_compute_ns
FROM g LEFT JOIN rank_compute rc USING (run_id, rank);
