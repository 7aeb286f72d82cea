-- nccl_tests_bandwidth: the best bus bandwidth each nccl-tests run measured, against the link peak
-- from the device catalog (pipeline/catalog/devices.toml; ../shared/reference/nccl.md section 5).
--
-- One row per source, test and placement (out_of_place / in_place). busbw as nccl-tests prints
-- it (algbw x the collective's factor, nccl-tests doc/PERFORMANCE.md). The link peak is the GPU's
-- NVLink rate per direction when every rank is on one node (busbw models the bytes each rank
-- sends on its link, one direction); for runs spanning nodes the bottleneck is the NIC, whose
-- rate the output does not state, so the peak is NULL with link_note saying why.
-- Columns:
--   run_id STRING; source_id STRING; test STRING (all_reduce_perf, ...); placement STRING
--   n_ranks INT32 (GPUs of the run; NULL when the output lists none); n_nodes INT32
--   gpu_name STRING (from the output's device list); catalog_key STRING (device_catalog match)
--   peak_busbw_gbps DOUBLE 1e9 B/s; peak_algbw_gbps DOUBLE 1e9 B/s (of the same row)
--   size_at_peak_bytes INT64 (message size S of the best row); rows INT64 (sizes measured)
--   link_peak_gbps DOUBLE 1e9 B/s per direction (NULL: unknown, see link_note)
--   busbw_pct_of_link DOUBLE 0-100; link_note STRING
WITH best AS (
  SELECT run_id, source_id, test, placement, max(n_ranks) AS n_ranks, max(n_nodes) AS n_nodes,
         max(busbw_gbps) AS peak_busbw_gbps, arg_max(algbw_gbps, busbw_gbps) AS peak_algbw_gbps,
         arg_max(size_bytes, busbw_gbps) AS size_at_peak_bytes, count(*) AS rows
  FROM nccl_tests_results WHERE busbw_gbps IS NOT NULL
  GROUP BY run_id, source_id, test, placement
),
gpu AS (SELECT run_id, source_id, any_value(gpu_name) AS gpu_name FROM nccl_processes WHERE gpu_name IS NOT NULL GROUP BY ALL),
matched AS (
  SELECT g.run_id, g.source_id, g.gpu_name, arg_min(c.key, c.priority) AS catalog_key, arg_min(c.nvlink_gbps, c.priority) AS nvlink_gbps
  FROM gpu g JOIN device_catalog c ON regexp_matches(g.gpu_name, c.match, 'i') GROUP BY ALL
)
SELECT b.run_id, b.source_id, b.test, b.placement, b.n_ranks, b.n_nodes, g.gpu_name, m.catalog_key,
  b.peak_busbw_gbps, b.peak_algbw_gbps, b.size_at_peak_bytes, b.rows,
  CASE WHEN b.n_nodes = 1 THEN m.nvlink_gbps END AS link_peak_gbps,
  100 * b.peak_busbw_gbps / (CASE WHEN b.n_nodes = 1 THEN m.nvlink_gbps END) AS busbw_pct_of_link,
  CASE WHEN b.n_nodes IS NULL THEN 'node count unknown (no device list in the output)'
       WHEN b.n_nodes > 1 THEN 'spans ' || b.n_nodes || ' nodes: the inter-node NIC rate is not in the output'
       WHEN g.gpu_name IS NULL THEN 'GPU not named in the output'
       WHEN m.nvlink_gbps IS NULL THEN 'no NVLink rate in the device catalog for ' || g.gpu_name
       ELSE 'NVLink per direction, ' || m.catalog_key END AS link_note
FROM best b
LEFT JOIN gpu g USING (run_id, source_id)
LEFT JOIN matched m USING (run_id, source_id)
ORDER BY b.run_id, b.source_id, b.test, b.placement
