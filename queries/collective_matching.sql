-- Collectives matched across ranks: transfer time, bus bandwidth, straggler and per-rank wait.
--
-- Definitions: views/40_collective_calls.sql (matching, transfer = shortest duration among the
-- ranks, wait = duration - transfer, straggler = last rank to start; NULL when one rank has the
-- call or two or more share the latest start). Bandwidth (nccl-tests
-- doc/PERFORMANCE.md): algbw_gbps = msg_bytes / transfer_ns; busbw_gbps = algbw * factor(op, n)
-- with n = expected_ranks (busbw_factor, views/05_macros.sql); link_peak_gbps
-- from the device of the straggler (else of the call's lowest rank) as in collective_bandwidth.sql.
-- @column run_id VARCHAR: Run.
-- @column process_group VARCHAR: Process group (NULL: unnamed, matched by communication stream order).
-- @column pg_key VARCHAR: The matching key's group part: the process group, else 'comm stream #N'.
-- @column call_key BIGINT: The call within the group: seq, else its order in the group.
-- @column seq BIGINT: collectives.seq (NULL: not recorded).
-- @column step BIGINT: The lowest step of the call's kernels (NULL: outside steps).
-- @column op VARCHAR: Collective operation.
-- @column msg_bytes BIGINT bytes: Message size S.
-- @column group_size INTEGER: Ranks in the group, as recorded.
-- @column expected_ranks BIGINT count: group_size, else the run's world size for an unnamed group.
-- @column ranks_seen BIGINT count: Ranks that have the call.
-- @column complete BOOLEAN: Every expected rank has it and all agree on op and msg_bytes.
-- @column consistent BOOLEAN: Seen on two or more ranks that agree on op and size and whose kernels
--   overlap in time (views/40_collective_calls.sql); only these name a straggler and split wait and
--   transfer.
-- @column transfer_ns BIGINT ns: The shortest duration among the ranks.
-- @column arrival_spread_ns BIGINT ns: Last start - first start.
-- @column end_spread_ns BIGINT ns: Last end - first end. A collective completes on every rank at
--   about one instant (no rank finishes before the last one's data arrived: NCCL's ring and tree
--   algorithms end with every rank receiving), so on a consistent call this bounds the offset
--   between the ranks' clocks (pipeline/diagnosis/straggler.py: whether clock skew can explain a
--   late rank).
-- @column algbw_gbps DOUBLE GB/s: msg_bytes / transfer_ns.
-- @column busbw_gbps DOUBLE GB/s: algbw_gbps * the op's bus-bandwidth factor for expected_ranks.
-- @column link_peak_gbps DOUBLE GB/s: NVLink peak per direction of the straggler's (else the lowest
--   rank's) device when the group fits on its host.
-- @column straggler_rank INTEGER: The rank that started last (NULL: a single rank, a tie for last, or
--   not consistent).
-- @column wait_ns MAP(INTEGER, BIGINT) ns: Each rank's wait (its longest kernel in the call - transfer_ns).
SELECT k.run_id, k.process_group, k.pg_key, k.call_key, k.seq, k.step, k.op, k.msg_bytes, k.group_size,
  k.expected_ranks, k.ranks_seen, k.complete, k.consistent, k.transfer_ns, k.arrival_spread_ns,
  k.last_end_ns - k.first_end_ns AS end_spread_ns,
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
