-- kernel_roofline: every compute kernel whose work the trace lets us model, against the roofline
-- of the device it ran on (Williams, Waterman, Patterson, "Roofline: an insightful visual
-- performance model", CACM 52(4), 2009).
--
-- Definition:
--   kernels    = scope's compute kernels (kind kernel, category compute) with a work_op (the op
--                whose modelled work they did, pipeline/derive.py), outside CUDA-graph replays
--                (graph_replay: their launch, and so their op, is not known per kernel).
--   work       = the op's FLOPs (cpu_ops.flops: GEMM, attention, convolution, pipeline/flops.py;
--                else cpu_ops.vector_flops: elementwise, reduction, softmax, normalization, copy,
--                pipeline/opbytes.py) and bytes (cpu_ops.mem_bytes: compulsory traffic, each
--                tensor read once and each output written once, pipeline/opbytes.py). An op that
--                launched several kernels shares its work among them in proportion to their
--                durations, so each has the op's rates and the kernels' work adds up to the op's.
--   intensity  = flops / bytes (FLOP/byte).
--   peaks      = the rank's device (view rank_device, pipeline/catalog/devices.toml, datasheet
--                dense peaks): a matrix op's peak in its precision (flops_dtype: fp32, tf32, bf16,
--                fp16, fp8; none when the trace gives no element type: no roof, bound unknown);
--                a vector op's the fp32 non-tensor peak (it runs
--                on the CUDA cores: TraceLens's "vector" compute spec); memory_gbps the HBM
--                bandwidth. The variable peak_tflops (--peak-tflops) replaces the matrix peak.
--   ridge      = peak_tflops * 1e3 / memory_gbps (FLOP/byte): the intensity above which the
--                roof is the compute peak.
--   roof       = min(peak_tflops, intensity * memory_gbps / 1e3) TFLOP/s; peak_tflops when the
--                bytes are unknown (a matrix op whose shapes the traffic model cannot read).
--   roof_pct   = 100 * achieved_tflops / roof.
--   bound      = 'latency' when the kernel cannot fill the GPU: shorter than the variable
--                roofline_latency_ns (pipeline/catalog/roofline.toml: 10 us, the scale of a
--                launch) or fewer thread blocks than the device has SMs (torch-tb-profiler's
--                SM efficiency below 1); else 'compute' when intensity >= ridge, 'memory' when
--                below (the HBM-bandwidth meaning: not exposed copies); 'unknown' when the bytes
--                or the device's peaks are unknown.
--   lost_ns    = dur_ns * (1 - roof_pct / 100), at least 0: the time the kernel would save at its
--                roof (an upper bound: datasheet roofs are rarely reached, TraceLens measures
--                60-70 % of them as attainable, ../shared/reference/peers.md 3.7).
-- A kernel with a roof_pct above 100 is reported as it is: its modelled work is larger than what
-- it did (TraceLens flags the same as a measurement anomaly).
-- @view kernel_roofline: Every compute kernel whose work the trace lets us model, against the
--   roofline of the device it ran on.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step (NULL: launched outside every step).
-- @column source_id VARCHAR: Source file.
-- @column kernel_name VARCHAR: Kernel name.
-- @column op_name VARCHAR: The modelled op.
-- @column op_event_index BIGINT: The op's cpu_ops.event_index.
-- @column start_ns BIGINT ns: Kernel start (absolute clock).
-- @column dur_ns BIGINT ns: Kernel duration.
-- @column op_kernels BIGINT count: Kernels sharing the op's work.
-- @column work_class VARCHAR: matrix or vector.
-- @column precision VARCHAR: fp32, tf32, bf16, fp16 or fp8 (NULL: unknown).
-- @column flops DOUBLE FLOP: The kernel's share of the op's FLOPs.
-- @column bytes DOUBLE bytes: Its share of the op's bytes (NULL: not modelled).
-- @column intensity DOUBLE FLOP/byte: flops / bytes.
-- @column achieved_tflops DOUBLE TFLOP/s: flops / dur_ns / 1e3.
-- @column achieved_gbps DOUBLE GB/s: bytes / dur_ns.
-- @column blocks BIGINT count: Thread blocks, grid x*y*z (NULL: not recorded).
-- @column num_sms INTEGER count: The device's streaming multiprocessors.
-- @column device_name VARCHAR: Device.
-- @column peak_tflops DOUBLE TFLOP/s: The peak in the kernel's precision (matrix) or fp32 (vector).
-- @column memory_gbps DOUBLE GB/s: The device's memory bandwidth.
-- @column ridge_flop_per_byte DOUBLE FLOP/byte: peak_tflops * 1e3 / memory_gbps.
-- @column roof_tflops DOUBLE TFLOP/s: min(peak_tflops, intensity * memory_gbps / 1e3).
-- @column roof_pct DOUBLE %: 100 * achieved_tflops / roof_tflops (may exceed 100, see above).
-- @column bound VARCHAR: compute, memory, latency or unknown.
-- @column lost_ns DOUBLE ns: dur_ns * (1 - roof_pct / 100), at least 0 (NULL: no roof).
CREATE OR REPLACE VIEW kernel_roofline AS
WITH k AS (
  SELECT run_id, source_id, rank, step, name AS kernel_name, start_ns, dur_ns, work_op,
    CASE WHEN grid_x IS NOT NULL THEN grid_x::BIGINT * coalesce(grid_y, 1) * coalesce(grid_z, 1) END AS blocks,
    sum(dur_ns) OVER w AS op_ns, count(*) OVER w AS op_kernels
  FROM scope
  WHERE kind = 'kernel' AND category = 'compute' AND work_op IS NOT NULL AND NOT graph_replay
  WINDOW w AS (PARTITION BY source_id, work_op)
),
shared AS (
  SELECT k.*, o.name AS op_name,
    CASE WHEN o.flops IS NOT NULL THEN 'matrix' ELSE 'vector' END AS work_class,
    CASE WHEN o.flops IS NOT NULL THEN o.flops_dtype ELSE 'fp32' END AS precision,
    CASE WHEN k.op_ns > 0 THEN k.dur_ns / k.op_ns ELSE 1.0 / k.op_kernels END AS share,
    coalesce(o.flops, o.vector_flops) AS op_flops, o.mem_bytes AS op_bytes
  FROM k JOIN cpu_ops o ON o.source_id = k.source_id AND o.event_index = k.work_op
  WHERE o.flops IS NOT NULL OR o.mem_bytes IS NOT NULL
),
rated AS (
  SELECT s.*, s.share * s.op_flops AS flops, s.share * s.op_bytes AS bytes,
    d.device_name, d.num_sms, d.memory_gbps,
    CASE WHEN s.work_class = 'vector' THEN d.fp32_tflops
         ELSE coalesce(getvariable('peak_tflops'),
           CASE s.precision WHEN 'fp32' THEN d.fp32_tflops WHEN 'tf32' THEN d.tf32_tflops
             WHEN 'bf16' THEN d.bf16_tflops WHEN 'fp16' THEN d.fp16_tflops WHEN 'fp8' THEN d.fp8_tflops END)
    END AS peak_tflops
  FROM shared s LEFT JOIN rank_device d ON d.run_id = s.run_id AND d.rank = s.rank
),
roofed AS (
  SELECT *, intensity(flops, bytes) AS intensity, achieved_tflops(flops, dur_ns) AS achieved_tflops,
    achieved_gbps(bytes, dur_ns) AS achieved_gbps, peak_tflops * 1e3 / memory_gbps AS ridge_flop_per_byte
  FROM rated
),
capped AS (
  SELECT *,
    roof_tflops(intensity, peak_tflops, memory_gbps) AS roof_tflops
  FROM roofed
)
SELECT run_id, rank, step, source_id, kernel_name, op_name, work_op AS op_event_index, start_ns, dur_ns, op_kernels,
  work_class, precision, flops, bytes, intensity, achieved_tflops, achieved_gbps, blocks, num_sms, device_name,
  peak_tflops, memory_gbps, ridge_flop_per_byte, roof_tflops,
  100.0 * achieved_tflops / roof_tflops AS roof_pct,
  CASE WHEN dur_ns < getvariable('roofline_latency_ns') OR blocks < num_sms THEN 'latency'
       WHEN intensity IS NULL OR ridge_flop_per_byte IS NULL THEN 'unknown'
       WHEN intensity >= ridge_flop_per_byte THEN 'compute'
       ELSE 'memory' END AS bound,
  CASE WHEN roof_tflops > 0 THEN greatest(0.0, dur_ns * (1 - achieved_tflops / roof_tflops)) END AS lost_ns
FROM capped;
