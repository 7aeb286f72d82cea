-- Collective bandwidth per call: algbw and busbw in nccl-tests' definitions, against the link peak.
--
-- Definitions (NVIDIA nccl-tests doc/PERFORMANCE.md; ../shared/reference/nccl.md section 2.2):
--   algbw_gbps = msg_bytes / dur_ns (bytes per ns = 1e9 bytes/s); the time is this rank's
--                kernel duration, which includes any wait for late peers (cross-rank transfer
--                time without the wait: collective_matching.sql transfer_ns).
--   busbw_gbps = algbw_gbps * busbw_factor(op's kind, n) (views/05_macros.sql, pipeline/catalog/collectives.toml):
--                all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; others 1;
--                n = group_ranks (views/05_macros.sql): the call's group_size, else the run's world
--                size for a call of no named process group (the default group).
--   link_peak_gbps = the device's NVLink per-direction peak (pipeline/catalog/devices.toml)
--                when the group fits on the rank's host (group_size <= visible devices);
--                NULL when the group spans hosts (the NIC is unknown from a trace alone) or
--                the device is not in the catalog.
-- Rows without msg_bytes (no collective metadata in the trace) have NULL bandwidths.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: The step of the collective's kernel (views/40_collective_calls.sql
--   collective_step); NULL: outside steps.
-- @column op VARCHAR: Collective operation (all_reduce, all_gather, ...).
-- @column process_group VARCHAR: Process group name (NULL: the trace names none).
-- @column group_size INTEGER: Ranks in the group, as recorded.
-- @column seq BIGINT: The call's sequence number in its group (collectives.seq).
-- @column start_ns BIGINT ns: Kernel start (absolute clock).
-- @column dur_ns BIGINT ns: Kernel duration on this rank (includes waiting for late peers).
-- @column msg_bytes BIGINT bytes: Message size S (nccl-tests' definition); NULL: no metadata.
-- @column algbw_gbps DOUBLE GB/s: msg_bytes / dur_ns.
-- @column busbw_gbps DOUBLE GB/s: algbw_gbps * the op's bus-bandwidth factor for group_ranks ranks.
-- @column link_peak_gbps DOUBLE GB/s: NVLink peak per direction when the group fits on the host; NULL:
--   spans hosts or device not in the catalog.
-- @column busbw_util_pct DOUBLE %: 100 * busbw_gbps / link_peak_gbps.
-- @column algorithm VARCHAR: NCCL algorithm (Ring, Tree, ...) when known.
-- @column protocol VARCHAR: NCCL protocol (Simple, LL, LL128) when known.
SELECT c.run_id, c.rank, g.step, c.op, c.process_group, c.group_size, c.seq, c.start_ns, c.dur_ns, c.msg_bytes,
  CASE WHEN c.dur_ns > 0 THEN c.msg_bytes / c.dur_ns END AS algbw_gbps,
  CASE WHEN c.dur_ns > 0 THEN c.msg_bytes / c.dur_ns
    * busbw_factor(k.busbw_factor, group_ranks(c.group_size, c.process_group, w.world_size)) END AS busbw_gbps,
  CASE WHEN group_ranks(c.group_size, c.process_group, w.world_size) <= d.visible_devices THEN d.nvlink_gbps END AS link_peak_gbps,
  100.0 * busbw_gbps / link_peak_gbps AS busbw_util_pct,
  c.algorithm, c.protocol
FROM collectives c
LEFT JOIN collective_catalog k USING (op)
LEFT JOIN traced_world w ON w.run_id = c.run_id
LEFT JOIN rank_device d ON d.run_id = c.run_id AND d.rank = c.rank
LEFT JOIN collective_step g
  ON g.run_id = c.run_id AND g.source_id = c.source_id AND g.rank = c.rank AND g.correlation = c.correlation AND g.start_ns = c.start_ns
ORDER BY c.run_id, c.rank, c.start_ns, c.op, c.seq, c.dur_ns, c.msg_bytes;
