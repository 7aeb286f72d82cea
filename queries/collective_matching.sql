-- Collectives matched across ranks: transfer time, bus bandwidth, straggler and per-rank wait.
--
-- Definitions: views/40_collective_calls.sql (matching, transfer = shortest duration among the
-- ranks, wait = duration - transfer, straggler = last rank to start; NULL when one rank has the
-- call or two or more share the latest start). Bandwidth (nccl-tests
-- doc/PERFORMANCE.md): algbw_gbps = msg_bytes / transfer_ns; busbw_gbps = algbw * factor(op, n)
-- with n = expected_ranks (busbw_factor, views/05_macros.sql); link_peak_gbps
-- from the device of the straggler (else of the call's lowest rank) as in collective_bandwidth.sql.
-- Columns:
--   run_id STRING; process_group STRING (NULL: unnamed, matched by communication stream order); pg_key STRING
--   call_key INT64 (seq, else order in the group); seq INT64; step INT64; op STRING
--   msg_bytes INT64 bytes; group_size INT32; expected_ranks INT64; ranks_seen INT64; complete BOOL
--   consistent BOOL: seen on two or more ranks that agree on op and size and whose kernels overlap
--     in time (views/40_collective_calls.sql); only these name a straggler and split wait / transfer
--   transfer_ns INT64 ns; arrival_spread_ns INT64 ns (last start - first start)
--   algbw_gbps, busbw_gbps, link_peak_gbps DOUBLE GB/s; straggler_rank INT32 (NULL: single rank, or a tie for last)
--   wait_ns MAP(INT32, INT64) ns: each rank's wait (its longest kernel in the call - transfer_ns)
SELECT k.run_id, k.process_group, k.pg_key, k.call_key, k.seq, k.step, k.op, k.msg_bytes, k.group_size,
  k.expected_ranks, k.ranks_seen, k.complete, k.consistent, k.transfer_ns, k.arrival_spread_ns,
  CASE WHEN k.transfer_ns > 0 THEN k.msg_bytes / k.transfer_ns END AS algbw_gbps,
  CASE WHEN k.transfer_ns > 0 THEN k.msg_bytes / k.transfer_ns * busbw_factor(cat.busbw_factor, k.expected_ranks) END AS busbw_gbps,
  CASE WHEN k.expected_ranks <= d.visible_devices THEN d.nvlink_gbps END AS link_peak_gbps,
  k.straggler_rank,
  w.wait_ns
FROM collective_calls k
LEFT JOIN collective_catalog cat ON cat.op = k.op
LEFT JOIN rank_device d ON d.run_id = k.run_id AND d.rank = coalesce(k.straggler_rank, k.low_rank)
LEFT JOIN (
  -- a rank with several kernels in one call (coalesced, or a repeated Seq) waits by its longest
  SELECT run_id, pg_key, call_key, map(list(rank ORDER BY rank), list(w ORDER BY rank)) AS wait_ns
  FROM (SELECT r.run_id, r.pg_key, r.call_key, r.rank, max(r.dur_ns) - any_value(k2.transfer_ns) AS w
        FROM collective_ranks r JOIN collective_calls k2 USING (run_id, pg_key, call_key) GROUP BY ALL)
  GROUP BY ALL
) w ON w.run_id = k.run_id AND w.pg_key = k.pg_key AND w.call_key = k.call_key
ORDER BY k.run_id, k.pg_key, k.call_key;
