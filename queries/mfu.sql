-- Model FLOPs utilization (MFU) per rank and step, with the FLOP coverage that qualifies it.
--
-- Definition (PaLM, Chowdhery et al. 2022, arXiv 2204.02311 appendix B):
--   mfu_pct = 100 * model_flops / (greatest(step_ns, gpu_span_ns) * 1e-9 * peak_tflops * 1e12)
--   model_flops = sum of cpu_ops.flops for ops starting inside the step's host window (the
--                 trace's own flops args, else pipeline/flops.py formulas from input shapes);
--                 or the user's FLOPs per step and rank (DuckDB variable model_flops_per_step,
--                 `--model-flops-per-step` or PaLM's 6N + 12LHQT per token, pipeline/cli/options.py).
--   step_ns     = the step's wall-clock window (views/25_step_window.sql: the host ProfilerStep
--                 window stretched to the end of the GPU work launched in it), the window the
--                 verdict and step_time use; a host that runs ahead of its GPU (host step shorter
--                 than its GPU work) does not shorten it, so MFU never counts FLOPs over less
--                 time than the step really took. A rank without GPU work (no window) falls back
--                 to the host window. When the previous step's work runs on into this step's
--                 own (a trailing collective on another stream), the window starts late and can
--                 be shorter than the step's own GPU work; MFU then divides by that work's span
--                 (gpu_span_ns), so FLOPs are never counted over less time than their kernels ran
--                 and MFU stays <= 100 % when the FLOPs are right.
--   peak_tflops = the variable peak_tflops (`--peak-tflops`), else the dense peak of the rank's
--                 device (view rank_device, devices.toml) in the precision that carries most of the
--                 step's modelled FLOPs (flops_dtype; bf16 when the user gave the FLOPs).
--   flop_coverage_pct = 100 * (compute-kernel time launched by ops with modelled FLOPs) /
--                 (all compute-kernel time of the step). A kernel is launched by an op when its
--                 External id is the op's, or its launch call ran inside the op on the same thread.
--                 100 when the user gave the FLOPs per step (they cover the whole model).
--   tokens_per_step = tokens this rank processed in the step, from the first of:
--                 'user': the variable tokens_per_step (`--tokens-per-step`, per rank);
--                 'global_batch': the variable global_tokens_per_step (`--global-batch` x
--                   `--seq-len`, the whole job's) / the run's world size (sources.world_size, else
--                   its ranks with steps): every rank its share, as in data parallelism;
--                 'embedding': read from the trace: the aten::embedding ops starting in the
--                   step's host window whose indices (second input) are 2-D [B, S]; of those
--                   with the largest B x S, B x S x calls / tables (tables = distinct weight
--                   shapes), so one forward through several embedding tables (token, position,
--                   type) counts its tokens once and k gradient-accumulation micro-batches k
--                   times. B and S must be positive integers. A model without a 2-D
--                   aten::embedding (vision, DLRM's embedding_bag,
--                   inference over flattened [N] indices) gets NULL: never a guess.
--   tokens_source = user | global_batch | embedding | NULL.
--   tokens_per_s = tokens_per_step / (step_ns * 1e-9) per rank, else NULL.
--   palm_flops_per_token = the variable palm_flops_per_token: PaLM's 6N + 12LHQT from the
--                 model's shape (`--params --layers --heads --head-dim --seq-len`,
--                 pipeline/flops.py palm_flops_per_token), else NULL.
--   palm_mfu_pct = 100 * palm_flops_per_token * tokens_per_step / (mfu_ns * 1e-9 * peak * 1e12),
--                 peak = the variable peak_tflops, else the device's dense bf16 peak, else its fp16
--                 tensor peak (V100, T4: no bf16) (PaLM and torchtitan compare with the matmul
--                 peak, ../shared/reference/peers.md 3.1/3.4):
--                 MFU by PaLM's formula next to the shape-derived mfu_pct; NULL without the
--                 model's shape, the tokens or a known peak.
-- HFU is not reported: recomputed (rematerialized) ops are counted like any other op here, so
-- with activation checkpointing the shape-derived figure includes recompute; docs/metrics.md.
-- MFU is NULL (with no made-up default) when there are no modelled FLOPs or no known peak;
-- pipeline.analyze turns that into a note.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step.
-- @column step_ns BIGINT ns: The step window's length.
-- @column host_step_ns BIGINT ns: The host ProfilerStep's duration, for reference.
-- @column model_flops DOUBLE FLOP: Model FLOPs of the step (NULL: none modelled).
-- @column flops_source VARCHAR: trace_ops or user.
-- @column flops_dtype VARCHAR: The precision carrying most of the modelled FLOPs.
-- @column peak_tflops DOUBLE TFLOP/s: The peak MFU divides by.
-- @column device_name VARCHAR: The rank's device.
-- @column mfu_pct DOUBLE %: Model FLOPs utilization (NULL: no FLOPs or no known peak).
-- @column flop_coverage_pct DOUBLE %: Compute-kernel time launched by ops with modelled FLOPs.
-- @column compute_kernel_ns BIGINT ns: All compute-kernel time of the step.
-- @column tokens_per_s DOUBLE tokens/s: tokens_per_step / step time (NULL: tokens unknown).
-- @column tokens_per_step DOUBLE tokens: Tokens this rank processed in the step.
-- @column tokens_source VARCHAR: user, global_batch, embedding or NULL.
-- @column palm_flops_per_token DOUBLE FLOP/token: PaLM's 6N + 12LHQT (NULL: no model shape given).
-- @column palm_mfu_pct DOUBLE %: MFU by PaLM's formula (NULL: see above).
WITH op_step AS (  -- the ops MFU and the tokens read, each in the step whose host window holds its start
  SELECT o.run_id, o.rank, s.step, o.name, o.flops, o.flops_dtype, o.input_dims
  FROM cpu_ops o
  ASOF JOIN steps s ON o.run_id = s.run_id AND o.rank = s.rank AND o.start_ns >= s.start_ns
  WHERE (o.flops IS NOT NULL OR (o.name = 'aten::embedding' AND o.input_dims IS NOT NULL))
    AND o.start_ns < s.end_ns
),
emb AS (  -- 2-D aten::embedding calls per step: indices [B, S] (second Input Dims entry)
  SELECT run_id, rank, step, input_dims->>'$[0]' AS weight, input_dims->'$[1]' AS idx
  FROM op_step WHERE name = 'aten::embedding' AND input_dims IS NOT NULL
),
emb_sized AS (  -- B and S positive integers (JSON ints; DOUBLE: no overflow on absurd shapes)
  SELECT run_id, rank, step, weight, (idx->>0)::DOUBLE * (idx->>1)::DOUBLE AS n,
    max((idx->>0)::DOUBLE * (idx->>1)::DOUBLE) OVER (PARTITION BY run_id, rank, step) AS top
  FROM emb
  WHERE json_array_length(idx) = 2
    AND json_type(idx->0) IN ('UBIGINT', 'BIGINT') AND json_type(idx->1) IN ('UBIGINT', 'BIGINT')
    AND (idx->>0)::DOUBLE > 0 AND (idx->>1)::DOUBLE > 0
),
emb_tokens AS (
  SELECT run_id, rank, step, max(n) * count(*) / count(DISTINCT weight) AS tokens
  FROM emb_sized WHERE n = top GROUP BY ALL
),
world AS (
  SELECT r.run_id, coalesce(max(w.world_size), count(DISTINCT r.rank)) AS world_size
  FROM (SELECT DISTINCT run_id, rank FROM steps) r
  LEFT JOIN (SELECT run_id, world_size FROM sources WHERE status <> 'failed') w USING (run_id)
  GROUP BY ALL
),
flops_by_dtype AS (
  SELECT run_id, rank, step, flops_dtype, sum(flops) AS f FROM op_step WHERE flops IS NOT NULL GROUP BY ALL
),
flops AS (
  SELECT run_id, rank, step, sum(f) AS model_flops, arg_max(flops_dtype, f) AS flops_dtype
  FROM flops_by_dtype GROUP BY ALL
),
attributed AS (  -- flops_op: launched by an op with modelled FLOPs (derived per source, pipeline/derive.py)
  SELECT run_id, rank, step, dur_ns, NOT graph_replay AND flops_op AS modelled
  FROM scope WHERE category = 'compute' AND step IS NOT NULL
),
coverage AS (
  SELECT run_id, rank, step, sum(dur_ns)::BIGINT AS compute_kernel_ns,
    coalesce(sum(dur_ns) FILTER (WHERE modelled), 0) AS modelled_ns
  FROM attributed
  GROUP BY ALL
),
per_step AS (
  SELECT s.run_id, s.rank, s.step, coalesce(w.step_ns, s.dur_ns) AS step_ns, s.dur_ns AS host_step_ns,
    greatest(coalesce(w.step_ns, s.dur_ns), coalesce(w.gpu_span_ns, 0)) AS mfu_ns,
    coalesce(getvariable('model_flops_per_step'), f.model_flops) AS eff_flops,
    CASE WHEN getvariable('model_flops_per_step') IS NOT NULL THEN 'user' WHEN f.model_flops IS NOT NULL THEN 'trace_ops' END AS eff_source,
    CASE WHEN getvariable('model_flops_per_step') IS NOT NULL THEN 'bf16' ELSE f.flops_dtype END AS eff_dtype,
    d.device_name, d.fp32_tflops, d.tf32_tflops, d.bf16_tflops, d.fp16_tflops, d.fp8_tflops,
    c.compute_kernel_ns, c.modelled_ns,
    CASE WHEN getvariable('tokens_per_step') IS NOT NULL THEN getvariable('tokens_per_step')
         WHEN getvariable('global_tokens_per_step') IS NOT NULL THEN getvariable('global_tokens_per_step') / wo.world_size
         ELSE e.tokens END AS eff_tokens,
    CASE WHEN getvariable('tokens_per_step') IS NOT NULL THEN 'user'
         WHEN getvariable('global_tokens_per_step') IS NOT NULL THEN 'global_batch'
         WHEN e.tokens IS NOT NULL THEN 'embedding' END AS tokens_source
  FROM steps s
  LEFT JOIN step_window w USING (run_id, rank, step)
  LEFT JOIN flops f USING (run_id, rank, step)
  LEFT JOIN rank_device d USING (run_id, rank)
  LEFT JOIN coverage c USING (run_id, rank, step)
  LEFT JOIN emb_tokens e USING (run_id, rank, step)
  LEFT JOIN world wo USING (run_id)
),
with_peak AS (
  SELECT *, coalesce(getvariable('peak_tflops'),
    CASE eff_dtype WHEN 'fp32' THEN fp32_tflops WHEN 'tf32' THEN tf32_tflops WHEN 'bf16' THEN bf16_tflops
                   WHEN 'fp16' THEN fp16_tflops WHEN 'fp8' THEN fp8_tflops END) AS eff_peak
  FROM per_step
)
SELECT run_id, rank, step, step_ns, host_step_ns, eff_flops AS model_flops, eff_source AS flops_source, eff_dtype AS flops_dtype,
  eff_peak AS peak_tflops, device_name,
  100.0 * eff_flops / (mfu_ns * 1e-9 * eff_peak * 1e12) AS mfu_pct,
  CASE WHEN eff_source = 'user' THEN 100.0
       WHEN compute_kernel_ns > 0 THEN 100.0 * modelled_ns / compute_kernel_ns END AS flop_coverage_pct,
  compute_kernel_ns,
  CASE WHEN step_ns > 0 THEN eff_tokens / (step_ns * 1e-9) END AS tokens_per_s,
  eff_tokens::DOUBLE AS tokens_per_step, tokens_source,
  getvariable('palm_flops_per_token')::DOUBLE AS palm_flops_per_token,
  100.0 * getvariable('palm_flops_per_token') * eff_tokens
    / (mfu_ns * 1e-9 * coalesce(getvariable('peak_tflops'), bf16_tflops, fp16_tflops) * 1e12) AS palm_mfu_pct
FROM with_peak
ORDER BY run_id, rank, step;
