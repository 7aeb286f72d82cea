-- rank_device: the accelerator each rank ran on and its catalog peaks.
--
-- Definition: the rank's device is the device its GPU activities used (devices.used); its
-- catalog entry is the first row of device_catalog (pipeline/catalog/devices.toml, datasheet
-- sources there) whose `match` regex matches the device name, case-insensitively.
-- visible_devices counts the devices the trace lists for the rank's host (a group larger than
-- that spans hosts).
-- @view rank_device: The accelerator each rank ran on and its catalog peaks.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column device INTEGER: The device its GPU activities used (the lowest when several).
-- @column device_name VARCHAR: Its name.
-- @column catalog_key VARCHAR: The device_catalog entry it matches (NULL: not in the catalog).
-- @column fp32_tflops DOUBLE TFLOP/s: Dense FP32 peak (NULL: unknown).
-- @column tf32_tflops DOUBLE TFLOP/s: Dense TF32 peak (NULL: unknown).
-- @column bf16_tflops DOUBLE TFLOP/s: Dense BF16 peak (NULL: unknown).
-- @column fp16_tflops DOUBLE TFLOP/s: Dense FP16 peak (NULL: unknown).
-- @column fp8_tflops DOUBLE TFLOP/s: Dense FP8 peak (NULL: unknown).
-- @column memory_gbps DOUBLE GB/s: Memory bandwidth.
-- @column nvlink_gbps DOUBLE GB/s: NVLink bandwidth per direction.
-- @column visible_devices BIGINT count: Devices the trace lists for the rank's host.
-- @column num_sms INTEGER: Streaming multiprocessors (compute units) of the device as the trace states
--   it (Kineto deviceProperties numSms, nsys TARGET_INFO_GPU smCount); NULL when it does not.
CREATE OR REPLACE VIEW rank_device AS
WITH used AS (
  SELECT run_id, rank, min(device) AS device, min(name) FILTER (WHERE name IS NOT NULL AND name <> '') AS device_name,
    max(num_sms) AS num_sms
  FROM devices WHERE used GROUP BY ALL
),
visible AS (SELECT run_id, rank, count(*) AS visible_devices FROM devices GROUP BY ALL),
matched AS (
  SELECT u.run_id, u.rank, arg_min(c.key, c.priority) AS catalog_key
  FROM used u JOIN device_catalog c ON regexp_matches(u.device_name, c.match, 'i')
  GROUP BY ALL
)
SELECT u.run_id, u.rank, u.device, u.device_name, m.catalog_key,
  c.fp32_tflops, c.tf32_tflops, c.bf16_tflops, c.fp16_tflops, c.fp8_tflops, c.memory_gbps, c.nvlink_gbps,
  v.visible_devices, u.num_sms
FROM used u
LEFT JOIN matched m USING (run_id, rank)
LEFT JOIN device_catalog c ON c.key = m.catalog_key
LEFT JOIN visible v USING (run_id, rank);
