-- collective_ranks / collective_calls: the same collective matched across the ranks of its group.
--
-- Matching key (per run): the process group (collectives.process_group; when the trace names
-- none, the communication stream the kernel ran on, since PyTorch's ProcessGroupNCCL gives each
-- group its own stream: streams are numbered per rank in order of their first collective,
-- 'comm stream #0', '#1', ..., because stream ids differ between processes, e.g. 7 and 15 in the
-- two ranks of nsys-ai/mfu_2gpu_before.sqlite) and the call's sequence number within that group
-- (collectives.seq when the trace records it, else its position in start order on the rank). Caveat: starts are compared across
-- hosts, so host clock skew (NTP) shifts arrival order by that much.
-- Definitions (TraceLens NcclAnalyser; torch-tb-profiler "data transfer time",
-- ../shared/reference/peers.md section 4.1):
--   transfer_ns = the shortest duration among the ranks (the time the data movement itself takes);
--   wait_ns     = each rank's duration - transfer_ns (time spent waiting for late peers);
--   straggler_rank = the rank that started the call last (the others waited for it; a rank's
--                    start is its latest kernel start in the call); NULL when only one rank has
--                    the call, when the call is not consistent (below), and NULL on a tie for last arrival (two or more ranks share the
--                    latest start): then no single rank made the others wait, their waits are
--                    real but caused by no one rank (stragglers.sql leaves such calls to no rank);
--   algbw/busbw as in collective_bandwidth.sql but over transfer_ns.
-- A call is complete when every expected rank has it (group_size when recorded; else the run's
-- world size for an unnamed group) and all agree on op and msg_bytes; incomplete calls keep their
-- numbers over the ranks present but are flagged.
-- A call is consistent when it is seen on two or more ranks, they agree on op and msg_bytes, and
-- its kernels overlap in time: none ends before the last one starts (max start <= min end). The
-- kernels of one collective cannot finish before its last rank arrives, so a call that fails this
-- pairs different collectives (matching by order in a trace whose events were sampled or whose
-- ranks recorded different calls) or compares clocks that are far apart (hosts not
-- synchronized, or Nsight Systems reports projected onto one timeline). Only consistent calls
-- name a straggler or split their kernels into waiting and transfer (views/44_comm_wait.sql,
-- stragglers.sql); for the others arrival order says nothing.
-- collective_step: the step of each collective's kernel: gpu_work.step of the GPU activity with the
-- collective's source, rank, correlation and start (the step whose host window holds its launch),
-- else, for a kernel whose launch is not in the trace, the step whose wall-clock window
-- (views/25_step_window.sql) holds its start, as step_time.sql cuts time; only those activities
-- are read.
--   Columns: run_id, source_id, rank, correlation, start_ns, step.
-- @view traced_world: Each run's world size from its traces (Kineto distributedInfo, Nsight), not
--   its NCCL logs: a log in the run may be of another job (one that matched no traced rank still
--   lands in the run, nccl_log_match). Read by collective_calls, collective_bandwidth.sql and
--   rank_nccl (views/50_nccl.sql).
-- @column run_id VARCHAR: Run.
-- @column world_size INTEGER count: The largest world size its traced sources record (NULL: none does).
CREATE OR REPLACE VIEW traced_world AS
SELECT run_id, max(world_size) AS world_size FROM sources
WHERE NOT nccl_family(format) AND status <> 'failed' GROUP BY run_id;

-- @internal collective_step: the step of each collective's kernel, read by collective_ranks.
CREATE OR REPLACE VIEW collective_step AS
WITH by_launch AS (
  SELECT a.run_id, a.source_id, a.rank, a.correlation, a.start_ns, any_value(a.step) AS step
  FROM gpu_activities a
  SEMI JOIN collectives c ON c.run_id = a.run_id AND c.source_id = a.source_id AND c.rank = a.rank
    AND c.correlation = a.correlation AND c.start_ns = a.start_ns
  GROUP BY ALL
)
SELECT b.run_id, b.source_id, b.rank, b.correlation, b.start_ns,
  coalesce(b.step, CASE WHEN b.start_ns < w.step_end_ns THEN w.step END) AS step
FROM by_launch b
ASOF LEFT JOIN step_window w ON w.run_id = b.run_id AND w.rank = b.rank AND b.start_ns >= w.step_start_ns;

-- @view collective_keys: Each rank's collective with its matching key (pg_key, call_key), without
--   its step (collective_ranks adds it; the replay reads this cheaper view).
-- @columns_of collectives
-- @column pg_key VARCHAR: The group part of the key: the process group, else 'comm stream #N' (N:
--   the rank's communication streams in order of their first collective), else 'unnamed'; ' p2p'
--   appended for point-to-point calls with a seq.
-- @column ord BIGINT: The call's position in start order among the rank's calls of pg_key (from 0).
-- @column call_key BIGINT: The call part of the key: seq, else ord.
CREATE OR REPLACE VIEW collective_keys AS
WITH streams AS (
  SELECT run_id, rank, stream, row_number() OVER (PARTITION BY run_id, rank ORDER BY first_ns, stream) - 1 AS stream_ord
  FROM (SELECT run_id, rank, stream, min(start_ns) AS first_ns FROM collectives
        WHERE process_group IS NULL AND stream IS NOT NULL GROUP BY run_id, rank, stream)
),
keyed AS (
  -- PyTorch numbers point-to-point and collective calls of a group apart (ProcessGroupNCCL
  -- seqP2P_ / seqCollective_), so with a Seq they are matched apart too
  SELECT c.*, coalesce(c.process_group, 'comm stream #' || s.stream_ord::VARCHAR, 'unnamed')
              || CASE WHEN c.seq IS NOT NULL AND c.op IN ('send', 'recv', 'send_recv') THEN ' p2p' ELSE '' END AS pg_key
  FROM collectives c LEFT JOIN streams s ON s.run_id = c.run_id AND s.rank = c.rank AND s.stream = c.stream AND c.process_group IS NULL
),
c AS (
  SELECT *, row_number() OVER (PARTITION BY run_id, rank, pg_key ORDER BY start_ns, correlation) - 1 AS ord FROM keyed
)
SELECT c.*, coalesce(c.seq, c.ord) AS call_key FROM c;

-- @view collective_ranks: Each rank's collective with its matching key (pg_key, call_key) and step.
-- @columns_of collective_keys
-- @column step BIGINT: The kernel's step (collective_step; NULL: outside steps).
CREATE OR REPLACE VIEW collective_ranks AS
SELECT c.*, g.step
FROM collective_keys c
LEFT JOIN collective_step g
  ON g.run_id = c.run_id AND g.source_id = c.source_id AND g.rank = c.rank AND g.correlation = c.correlation AND g.start_ns = c.start_ns;

-- @view collective_calls: One row per collective call matched across the ranks of its group.
-- @column run_id VARCHAR: Run.
-- @column pg_key VARCHAR: The group part of the matching key (collective_ranks.pg_key).
-- @column call_key BIGINT: The call part of the key (collective_ranks.call_key).
-- @column ranks_seen BIGINT count: Ranks that have the call.
-- @column n_ops BIGINT count: Distinct ops among them (1 when they agree).
-- @column n_sizes BIGINT count: Distinct msg_bytes among them (at most 1 when they agree).
-- @column op VARCHAR: Collective operation (one of the ranks').
-- @column msg_bytes BIGINT bytes: The largest message size among the ranks.
-- @column group_size INTEGER: Ranks in the group, as recorded (the largest).
-- @column process_group VARCHAR: Process group (NULL: unnamed).
-- @column seq BIGINT: collectives.seq (NULL: not recorded).
-- @column transfer_ns BIGINT ns: The shortest duration among the ranks.
-- @column first_start_ns BIGINT ns: The first kernel start among the ranks.
-- @column last_start_ns BIGINT ns: The last kernel start.
-- @column first_end_ns BIGINT ns: The first kernel end.
-- @column last_end_ns BIGINT ns: The last kernel end.
-- @column low_rank INTEGER: The lowest rank that has the call.
-- @column step BIGINT: The lowest step of its kernels (NULL: outside steps).
-- @column straggler_rank INTEGER: The rank that started last (NULL: one rank, a tie for last, or not
--   consistent).
-- @column expected_ranks BIGINT count: group_size, else the run's world size for an unnamed group, else
--   ranks_seen.
-- @column complete BOOLEAN: Every expected rank has the call and all agree on op and msg_bytes.
-- @column consistent BOOLEAN: Seen on two or more ranks that agree on op and size, kernels overlapping.
-- @column arrival_spread_ns BIGINT ns: last_start_ns - first_start_ns.
CREATE OR REPLACE VIEW collective_calls AS
WITH world AS (SELECT * FROM traced_world),
-- each rank's (latest) start in each call, and how many ranks share the call's latest start
rank_starts AS (
  SELECT *, max(rank_start_ns) OVER (PARTITION BY run_id, pg_key, call_key) AS last_ns
  FROM (SELECT run_id, pg_key, call_key, rank, max(start_ns) AS rank_start_ns FROM collective_ranks GROUP BY ALL)
),
straggler AS (
  SELECT run_id, pg_key, call_key,
    CASE WHEN count(*) >= 2 AND count(*) FILTER (WHERE rank_start_ns = last_ns) = 1
         THEN arg_max(rank, rank_start_ns) END AS straggler_rank0
  FROM rank_starts GROUP BY ALL
),
calls AS (
  SELECT run_id, pg_key, call_key,
    count(DISTINCT rank) AS ranks_seen,
    count(DISTINCT op) AS n_ops, count(DISTINCT msg_bytes) AS n_sizes,
    -- min, not any_value: ranks that disagree on the op (then n_ops > 1: not consistent, not
    -- complete) must still give the same op, and so the same busbw factor, on every run
    min(op) AS op, max(msg_bytes) AS msg_bytes, max(group_size) AS group_size,
    min(process_group) AS process_group, min(seq) AS seq,
    min(dur_ns) AS transfer_ns, min(start_ns) AS first_start_ns, max(start_ns) AS last_start_ns,
    min(end_ns) AS first_end_ns, max(end_ns) AS last_end_ns, min(rank) AS low_rank, min(step) AS step
  FROM collective_ranks GROUP BY ALL
)
SELECT c.* EXCLUDE (consistent), CASE WHEN c.consistent THEN g.straggler_rank0 END AS straggler_rank,
  coalesce(group_ranks(c.group_size, c.process_group, w.world_size), c.ranks_seen) AS expected_ranks,
  c.ranks_seen = expected_ranks AND c.n_ops = 1 AND c.n_sizes <= 1 AS complete, c.consistent,
  c.last_start_ns - c.first_start_ns AS arrival_spread_ns
FROM (SELECT *, ranks_seen >= 2 AND n_ops = 1 AND n_sizes <= 1 AND last_start_ns <= first_end_ns AS consistent FROM calls) c
JOIN straggler g USING (run_id, pg_key, call_key) LEFT JOIN world w USING (run_id);
