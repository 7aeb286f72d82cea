-- nccl_tests_bandwidth: the best bus bandwidth each nccl-tests run measured, against the link peak
-- from the device catalog (pipeline/catalog/devices.toml; busbw: nccl-tests doc/PERFORMANCE.md).
--
-- One row per source, test and placement (out_of_place / in_place). busbw as nccl-tests prints
-- it (algbw x the collective's factor, nccl-tests doc/PERFORMANCE.md). The link peak is the GPU's
-- NVLink rate per direction when every rank is on one node (busbw models the bytes each rank
-- sends on its link, one direction). For runs spanning nodes the bottleneck is the network: the
-- peak is then the sum of the rates of the NICs a node's rings go through, as the run's NCCL lines
-- state them (views/50_nccl.sql nccl_line_rate; the slowest node's), and NULL with link_note
-- "line rate unknown: run with NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET" when no line states one: never a
-- guess. That bound holds for the Ring algorithm; Tree and NVLS-Tree on few nodes can pass it
-- (nccl-tests#196), so a busbw above it is said to be so, not reported as a fault; NCCL_ALGO=Ring
-- measures the network (nccl-tests#290). nccl_expected_gbps is NCCL's own estimate: its ring
-- graph's bandwidth per channel x channels (between nodes when the run spans nodes).
-- half_peak_size_bytes: the smallest message size whose busbw reaches half of the test's best
-- (the n_1/2 of Hockney's model: below it latency, above it bandwidth dominates). Ties among
-- sizes of equal busbw go to the smallest size, so every run names the same row.
-- @column run_id VARCHAR: Run.
-- @column source_id VARCHAR: The nccl-tests output (sources.source_id).
-- @column file VARCHAR: Its file name (the last part of sources.path; an archive member's own name).
-- @column test VARCHAR: The test (all_reduce_perf, ...).
-- @column placement VARCHAR: out_of_place or in_place.
-- @column n_ranks INTEGER count: GPUs of the run (NULL when the output lists none).
-- @column n_nodes INTEGER count: Nodes of the run.
-- @column gpu_name VARCHAR: From the output's device list.
-- @column catalog_key VARCHAR: The device_catalog entry it matches.
-- @column peak_busbw_gbps DOUBLE GB/s: The best bus bandwidth measured.
-- @column peak_algbw_gbps DOUBLE GB/s: The algorithm bandwidth of the same row.
-- @column size_at_peak_bytes BIGINT bytes: Message size S of the best row (the smallest, on a tie).
-- @column half_peak_size_bytes BIGINT bytes: The smallest size whose busbw is at least half of peak_busbw_gbps.
-- @column rows BIGINT count: Sizes measured.
-- @column link_peak_gbps DOUBLE GB/s: NVLink per direction on one node, the NICs' rate across nodes (NULL: unknown, see link_note).
-- @column busbw_pct_of_link DOUBLE %: 100 * peak_busbw_gbps / link_peak_gbps.
-- @column link_note VARCHAR: Which link the peak is, or why it is unknown.
-- @column link_kind VARCHAR: nvlink or nic (NULL: unknown).
-- @column nics INTEGER count: NICs behind a nic peak (nccl_line_rate.nics).
-- @column nic_names VARCHAR: Their names.
-- @column nic_gbps DOUBLE GB/s: One NIC's rate (the slowest counted).
-- @column nccl_expected_gbps DOUBLE GB/s: NCCL's ring estimate (Pattern 4 line: bandwidth per channel x channels).
-- @column busbw_pct_of_expected DOUBLE %: 100 * peak_busbw_gbps / nccl_expected_gbps.
WITH best AS (
  SELECT run_id, source_id, test, placement, max(n_ranks) AS n_ranks, max(n_nodes) AS n_nodes,
         max(busbw_gbps) AS peak_busbw_gbps, arg_max(algbw_gbps, (busbw_gbps, -size_bytes)) AS peak_algbw_gbps,
         arg_max(size_bytes, (busbw_gbps, -size_bytes)) AS size_at_peak_bytes, count(*) AS rows
  FROM nccl_tests_results WHERE busbw_gbps IS NOT NULL
  GROUP BY run_id, source_id, test, placement
),
half AS (
  SELECT r.run_id, r.source_id, r.test, r.placement, min(r.size_bytes) AS half_peak_size_bytes
  FROM nccl_tests_results r JOIN best b USING (run_id, source_id, test, placement)
  WHERE r.busbw_gbps >= 0.5 * b.peak_busbw_gbps GROUP BY ALL
),
rate AS (  -- the run's network bound: the slowest host's NICs (a host-less topology dump when none has a host)
  SELECT run_id,
    coalesce(arg_min(sum_gbps, sum_gbps) FILTER (WHERE host IS NOT NULL), min(sum_gbps)) AS sum_gbps,
    coalesce(arg_min(nics, sum_gbps) FILTER (WHERE host IS NOT NULL), arg_min(nics, sum_gbps)) AS nics,
    coalesce(arg_min(nic_names, sum_gbps) FILTER (WHERE host IS NOT NULL), arg_min(nic_names, sum_gbps)) AS nic_names,
    coalesce(arg_min(nic_gbps, sum_gbps) FILTER (WHERE host IS NOT NULL), arg_min(nic_gbps, sum_gbps)) AS nic_gbps,
    bool_and(from_channels) AS from_channels,
    max(ring_inter_gbps) AS ring_inter_gbps, max(ring_intra_gbps) AS ring_intra_gbps
  FROM nccl_line_rate GROUP BY run_id
),
gpu AS (SELECT run_id, source_id, min(gpu_name) AS gpu_name FROM nccl_processes WHERE gpu_name IS NOT NULL GROUP BY ALL),
matched AS (
  SELECT g.run_id, g.source_id, g.gpu_name, arg_min(c.key, c.priority) AS catalog_key, arg_min(c.nvlink_gbps, c.priority) AS nvlink_gbps
  FROM gpu g JOIN device_catalog c ON regexp_matches(g.gpu_name, c.match, 'i') GROUP BY ALL
)
SELECT b.run_id, b.source_id, f.file, b.test, b.placement, b.n_ranks, b.n_nodes, g.gpu_name, m.catalog_key,
  b.peak_busbw_gbps, b.peak_algbw_gbps, b.size_at_peak_bytes, h.half_peak_size_bytes, b.rows,
  CASE WHEN b.n_nodes = 1 THEN m.nvlink_gbps WHEN b.n_nodes > 1 THEN r.sum_gbps END AS link_peak_gbps,
  100 * b.peak_busbw_gbps / (CASE WHEN b.n_nodes = 1 THEN m.nvlink_gbps WHEN b.n_nodes > 1 THEN r.sum_gbps END)
    AS busbw_pct_of_link,
  CASE WHEN b.n_nodes IS NULL THEN 'node count unknown (no device list in the output)'
       WHEN b.n_nodes > 1 AND r.sum_gbps IS NULL
         THEN 'spans ' || b.n_nodes || ' nodes: line rate unknown: run with NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET'
       WHEN b.n_nodes > 1
         THEN 'spans ' || b.n_nodes || ' nodes: the ring bound of ' || r.nics || ' NIC(s) per node ('
              || r.nic_names || ', ' || round(r.nic_gbps * 8, 1) || ' Gb/s = ' || round(r.nic_gbps, 3)
              || ' GB/s each' || CASE WHEN r.from_channels THEN ', the ones NCCL''s channels use' ELSE ', every NIC the log states' END
              || ')' || CASE WHEN b.peak_busbw_gbps > r.sum_gbps
                 THEN '; busbw above it: NCCL''s Tree or NVLS-Tree on few nodes can pass the network bound '
                      || '(nccl-tests#196), or the node has NICs the log does not list; NCCL_ALGO=Ring measures the network'
                 ELSE '' END
       WHEN g.gpu_name IS NULL THEN 'GPU not named in the output'
       WHEN m.nvlink_gbps IS NULL THEN 'no NVLink rate in the device catalog for ' || g.gpu_name
       ELSE 'NVLink per direction, ' || m.catalog_key END AS link_note,
  CASE WHEN b.n_nodes = 1 AND m.nvlink_gbps IS NOT NULL THEN 'nvlink'
       WHEN b.n_nodes > 1 AND r.sum_gbps IS NOT NULL THEN 'nic' END AS link_kind,
  CASE WHEN b.n_nodes > 1 THEN r.nics END::INTEGER AS nics,
  CASE WHEN b.n_nodes > 1 THEN r.nic_names END AS nic_names,
  CASE WHEN b.n_nodes > 1 THEN r.nic_gbps END AS nic_gbps,
  CASE WHEN b.n_nodes > 1 THEN r.ring_inter_gbps ELSE r.ring_intra_gbps END AS nccl_expected_gbps,
  100 * b.peak_busbw_gbps / nullif(CASE WHEN b.n_nodes > 1 THEN r.ring_inter_gbps ELSE r.ring_intra_gbps END, 0)
    AS busbw_pct_of_expected
FROM best b
LEFT JOIN half h USING (run_id, source_id, test, placement)
LEFT JOIN gpu g USING (run_id, source_id)
LEFT JOIN matched m USING (run_id, source_id)
LEFT JOIN rate r USING (run_id)
LEFT JOIN (SELECT run_id, source_id, regexp_extract(min(path), '[^/!]+$') AS file FROM sources GROUP BY ALL) f
  USING (run_id, source_id)
ORDER BY b.run_id, b.source_id, b.test, b.placement
