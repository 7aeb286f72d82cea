-- comm_wait: each rank's collective kernel split into waiting for peers and transfer (the split;
-- views/45_scope_parts.sql applies it to scope).
--
-- Definition: for a consistent collective call (matched across two or more ranks that agree on
-- op and size, whose kernels overlap in time: views/40_collective_calls.sql), each rank's kernel
-- first waits for its peers, then transfers: its wait is its duration minus the call's transfer
-- time (the shortest duration among the ranks, the straggler's: TraceLens NcclAnalyser's and
-- torch-tb-profiler's wait and "data transfer time", ../shared/reference/peers.md section 4.1),
-- so [start_ns, start_ns + wait) is waiting for peers (arrival skew: load imbalance, a straggler)
-- and the last transfer_ns of every kernel is transfer (every rank is in the collective: the
-- network or NVLink moving data). Durations, not starts, set the boundary: each rank's is
-- measured on its own clock, so host clock skew does not move it (comparing starts across hosts
-- would make a constant clock offset look like waiting).
-- comm_wait: one row per matched collective kernel that waits (wait_end_ns > start_ns).
-- @view comm_wait: One row per matched collective kernel that waits for its peers, with the end of
--   its wait.
-- @column run_id VARCHAR: Run.
-- @column source_id VARCHAR: Source file.
-- @column rank INTEGER: Rank.
-- @column correlation BIGINT: The kernel's correlation id.
-- @column start_ns BIGINT ns: The kernel's start (absolute clock).
-- @column wait_end_ns BIGINT ns: start_ns + (dur_ns - the call's transfer_ns).
CREATE OR REPLACE VIEW comm_wait AS
SELECT r.run_id, r.source_id, r.rank, r.correlation, r.start_ns, max(r.start_ns + r.dur_ns - k.transfer_ns) AS wait_end_ns
FROM collective_ranks r
JOIN collective_calls k USING (run_id, pg_key, call_key)
WHERE k.consistent AND r.dur_ns > k.transfer_ns
GROUP BY ALL;
