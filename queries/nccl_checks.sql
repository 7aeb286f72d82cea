-- nccl_checks: problems the NCCL logs of a run state, one row per problem and place (the line
-- formats: docs/nccl.md).
--
-- kind values and their rule:
--   socket_transport   NET channels over NET/Socket (inter-node traffic on TCP sockets instead of
--                      IB/RoCE/EFA; nccl.md 1.5), or 'Using network Socket' for a communicator
--                      spanning nodes
--   gdr_off            NET channels over IB/RoCE or libfabric, none with /GDRDMA (GPUDirect RDMA
--                      off: traffic staged through host memory; nccl.md 1.5)
--   shm_transport      SHM channels: peers on one node talk through host shared memory, i.e. P2P
--                      (NVLink/PCIe peer access) is disabled or unavailable (nccl.md 1.5)
--   p2p_disabled       NCCL_P2P_DISABLE=1 set by the environment
--   channels_limited   NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS / NCCL_MAX_CTAS / NCCL_MIN_CTAS set
--                      by the environment (the channel count is forced, not chosen by topology)
--   channels_asymmetric ranks of one communicator report different collective channel counts
--                      (topology detected differently on some ranks)
--   watchdog_timeout   PyTorch ProcessGroupNCCL watchdog timeout: the collective (op, sequence
--                      number), the ranks that timed out, ranks that never enqueued it
--   coll_mismatch      COLL lines of one communicator and opCount that disagree across ranks on op
--                      or count (nccl.md 1.7), or a torchfrtrace mismatch report
--   nccl_warn          NCCL WARN lines (IB completion errors, plugin failures, ...)
--   ras_issue          an issue an NCCL RAS report (ncclras, nccl_ras) states for a communicator:
--                      MISMATCH (its ranks launched different numbers of operations: a desync or
--                      a hang in progress), INCOMPLETE, DEAD or another status, with the operation
--                      counts and the ranks the report names (NCCL docs troubleshooting/ras.rst)
-- Rows that compare files (watchdog_timeout: the timed-out ranks, the ranks behind, the known ranks
-- that did not report) are computed within one job (views/50_nccl.sql nccl_jobs: files linked by a
-- communicator id or a process), never across files of one run that share neither; coll_mismatch
-- and channels_asymmetric within one communicator id (a masked '0x...' id names none).
-- The file and line named are one place: the source of the row's first evidence line (arg_min on
-- (line, source), so the pair is the same on every run when several logs hold the problem).
-- @column run_id VARCHAR: Run.
-- @column kind VARCHAR: The problem (one of the kind values above).
-- @column severity VARCHAR: 'high' (breaks or cripples communication) or 'moderate' (slows it or needs
--   a look).
-- @column source_id VARCHAR: The log (sources.source_id).
-- @column file VARCHAR: The log's file name (the last part of sources.path; an archive member's own name).
-- @column host VARCHAR: Host the lines come from (NULL: not stated).
-- @column pid BIGINT: Process id the lines come from (NULL: not stated).
-- @column rank INTEGER: Rank (NULL: not stated).
-- @column line_no BIGINT: First line of the evidence.
-- @column n BIGINT count: How many lines, channels or ranks the row summarizes.
-- @column detail VARCHAR: One readable line.
WITH proc AS (
  SELECT t.*, p.n_nodes, p.nranks, p.rank AS p_rank
  FROM nccl_process_transport t
  LEFT JOIN (SELECT run_id, host, pid, max(n_nodes) AS n_nodes, max(nranks) AS nranks, min(rank) AS rank
             FROM nccl_processes GROUP BY ALL) p USING (run_id, host, pid)
),
chan AS (
  SELECT run_id, source_id, host, pid, min(rank) AS rank, min(line_no) AS line_no, transport, net_name,
         count(*) AS n, count(*) FILTER (WHERE gdr) AS n_gdr, min(via) AS via
  FROM nccl_channels GROUP BY run_id, source_id, host, pid, transport, net_name
),
env AS (
  SELECT run_id, source_id, host, pid, line_no, json_extract_string(detail, '$.var') AS var,
         json_extract_string(detail, '$.value') AS value
  FROM nccl_events WHERE kind = 'env' AND detail IS NOT NULL
),
wd AS (SELECT w.*, j.job FROM nccl_watchdog w JOIN nccl_jobs j USING (run_id, source_id)),
timeouts AS (
  SELECT run_id, job, arg_min(source_id, (line_no, source_id)) AS source_id, coalesce(pg_name, pg_id::VARCHAR, '?') AS pg, seq,
         min(op_type) AS op_type, list(DISTINCT rank ORDER BY rank) FILTER (WHERE rank IS NOT NULL) AS ranks,
         max(timeout_ns) AS timeout_ns, max(ran_for_ns) AS ran_for_ns, min(line_no) AS line_no, min(numel_in) AS numel_in
  FROM wd WHERE kind = 'timeout' AND seq IS NOT NULL
  GROUP BY run_id, job, coalesce(pg_name, pg_id::VARCHAR, '?'), seq
),
behind AS (
  SELECT w.run_id, w.job, t.seq, list(DISTINCT w.rank ORDER BY w.rank) AS ranks
  FROM wd w JOIN timeouts t ON t.run_id = w.run_id AND t.job = w.job
  WHERE w.last_enqueued IS NOT NULL AND w.last_enqueued < t.seq AND w.rank IS NOT NULL
  GROUP BY w.run_id, w.job, t.seq
),
-- the ranks each job knows: its watchdog lines and Flight Recorder dumps, and the run's traced ranks
known_ranks AS (
  SELECT run_id, job, rank FROM wd WHERE rank IS NOT NULL
  UNION SELECT f.run_id, j.job, f.rank FROM flight_recorder f JOIN nccl_jobs j USING (run_id, source_id) WHERE f.rank IS NOT NULL
  UNION SELECT s.run_id, j.job, u.r FROM sources s JOIN (SELECT DISTINCT run_id, job FROM nccl_jobs) j USING (run_id),
        unnest(s.ranks) AS u(r) WHERE s.ranks IS NOT NULL
),
ras_issues AS (
  SELECT i.run_id, i.source_id, i.line_no, i.status, i.severity,
    CASE WHEN i.comm_group IS NOT NULL THEN 'communicator #' || i.comm_group || '-' || coalesce(i.comm_index::VARCHAR, '?')
      || coalesce(' (' || i.comm_id || ')', '') || ' ' ELSE '' END AS comm,
    (SELECT any_value(o.collective) FROM nccl_ras o WHERE o.run_id = i.run_id AND o.source_id = i.source_id
       AND o.comm_id IS NOT DISTINCT FROM i.comm_id AND o.kind IN ('op_count', 'line') AND o.collective IS NOT NULL) AS coll,
    (SELECT string_agg(o.n_ranks || ' rank(s) up to operation ' || o.op_count, ', ' ORDER BY o.op_count)
       FROM nccl_ras o WHERE o.run_id = i.run_id AND o.source_id = i.source_id AND o.comm_id IS NOT DISTINCT FROM i.comm_id
       AND o.kind = 'op_count' AND o.n_ranks IS NOT NULL) AS counts,
    (SELECT string_agg(r.rank || coalesce(' at operation ' || r.op_count, '') || coalesce(' (' || r.host || ')', ''), ', ' ORDER BY r.rank)
       FROM nccl_ras r WHERE r.run_id = i.run_id AND r.source_id = i.source_id AND r.comm_id IS NOT DISTINCT FROM i.comm_id
       AND r.kind IN ('rank', 'missing_rank') AND r.rank IS NOT NULL) AS named,
    (SELECT count(*) FROM nccl_ras r WHERE r.run_id = i.run_id AND r.source_id = i.source_id
       AND r.comm_id IS NOT DISTINCT FROM i.comm_id AND r.kind IN ('rank', 'missing_rank') AND r.rank IS NOT NULL) AS n_named,
    (SELECT string_agg('process ' || d.pid || coalesce(' on node ' || d.host, '') || coalesce(' (GPU ' || d.cuda_dev || ')', ''), ', ' ORDER BY d.line_no)
       FROM nccl_ras d WHERE d.run_id = i.run_id AND d.source_id = i.source_id AND d.comm_id IS NOT DISTINCT FROM i.comm_id
       AND d.kind = 'dead_process') AS dead
  FROM nccl_ras i WHERE i.kind = 'issue'
),
mismatch AS (
  SELECT run_id, comm_id, op_count, arg_min(source_id, (line_no, source_id)) AS source_id, min(line_no) AS line_no,
         list(DISTINCT op ORDER BY op) AS ops, list(DISTINCT count ORDER BY count) AS counts, count(DISTINCT rank) AS ranks
  FROM nccl_coll_calls
  WHERE regexp_full_match(comm_id, '0x[0-9a-f]+') AND op NOT IN ('Send', 'Recv')
  GROUP BY run_id, comm_id, op_count
  HAVING count(DISTINCT op) > 1 OR count(DISTINCT count) > 1
),
checks AS (
SELECT run_id, 'socket_transport' AS kind, 'high' AS severity, source_id, host, pid, rank, line_no, n,
       n || ' NET channel(s) via ' || coalesce(via, 'NET/Socket') || ': inter-node traffic on TCP sockets' AS detail
FROM chan WHERE transport = 'NET' AND net_name = 'Socket'
UNION ALL
SELECT p.run_id, 'socket_transport', 'high', arg_min(p.source_id, (p.first_line_no, p.source_id)), p.host, p.pid, min(p.rank), min(p.first_line_no), count(*),
       'communicator spanning ' || max(p.n_nodes) || ' nodes uses network Socket'
FROM nccl_processes p
WHERE p.net_name = 'Socket' AND p.n_nodes > 1
  AND NOT EXISTS (SELECT 1 FROM chan c WHERE c.run_id = p.run_id AND c.host IS NOT DISTINCT FROM p.host AND c.pid = p.pid AND c.net_name = 'Socket')
GROUP BY p.run_id, p.host, p.pid
UNION ALL
SELECT run_id, 'gdr_off', 'moderate', source_id, host, pid, rank, line_no, n,
       n || ' NET channel(s) via ' || coalesce(via, 'NET/' || net_name) || ' without GPUDirect RDMA (no /GDRDMA)'
FROM chan WHERE transport = 'NET' AND coalesce(net_name, '') <> 'Socket' AND n_gdr = 0
UNION ALL
SELECT run_id, 'shm_transport', 'moderate', source_id, host, pid, rank, line_no, n,
       n || ' channel(s) via ' || coalesce(via, 'SHM') || ': intra-node peers use host shared memory, not P2P'
FROM chan WHERE transport = 'SHM'
UNION ALL
SELECT run_id, 'p2p_disabled', 'moderate', source_id, host, pid, NULL::INTEGER, line_no, 1,
       var || '=' || value || ' set by the environment'
FROM env WHERE var = 'NCCL_P2P_DISABLE' AND value NOT IN ('0', '')
UNION ALL
SELECT run_id, 'channels_limited', 'moderate', source_id, host, pid, NULL::INTEGER, line_no, 1,
       var || '=' || value || ' set by the environment: the channel count is forced'
FROM env WHERE var IN ('NCCL_MAX_NCHANNELS', 'NCCL_MIN_NCHANNELS', 'NCCL_MAX_CTAS', 'NCCL_MIN_CTAS')
UNION ALL
SELECT run_id, 'channels_asymmetric', 'moderate', arg_min(source_id, (first_line_no, source_id)), NULL, NULL::BIGINT, NULL::INTEGER, min(first_line_no),
       count(*), 'communicator ' || comm_id || ': ' || min(n_coll_channels) || ' to ' || max(n_coll_channels) || ' coll channels across its ranks'
FROM nccl_processes WHERE regexp_full_match(comm_id, '0x[0-9a-f]+') AND n_coll_channels IS NOT NULL
GROUP BY run_id, comm_id HAVING min(n_coll_channels) < max(n_coll_channels)
UNION ALL
SELECT t.run_id, 'watchdog_timeout', 'high', t.source_id, NULL, NULL::BIGINT, NULL::INTEGER, t.line_no, len(t.ranks),
       coalesce(t.op_type, 'collective') || ' SeqNum ' || t.seq || ' of process group ' || t.pg || ' timed out after '
       || round(coalesce(t.ran_for_ns, t.timeout_ns) / 1e9, 1) || ' s on rank(s) ' || array_to_string(t.ranks, ', ')
       || coalesce('; rank(s) that never enqueued it (stopped first): ' || array_to_string(b.ranks, ', '), '')
       || coalesce('; known rank(s) that did not report it: ' || nullif(array_to_string(
            (SELECT list(k.rank ORDER BY k.rank) FROM known_ranks k WHERE k.run_id = t.run_id AND k.job = t.job
              AND NOT list_contains(t.ranks, k.rank)), ', '), ''), '')
FROM timeouts t LEFT JOIN behind b ON b.run_id = t.run_id AND b.job = t.job AND b.seq = t.seq
UNION ALL
SELECT run_id, 'coll_mismatch', 'high', source_id, NULL, NULL::BIGINT, NULL::INTEGER, line_no, ranks,
       'communicator ' || comm_id || ' opCount ' || op_count || ': ranks disagree (ops ' || array_to_string(ops, '/')
       || ', counts ' || array_to_string(counts, '/') || ')'
FROM mismatch
UNION ALL
SELECT run_id, 'coll_mismatch', 'high', source_id, NULL, NULL::BIGINT, NULL::INTEGER, NULL::BIGINT, 1,
       'torchfrtrace: ' || coalesce(message, profiling_name, 'ranks disagree')
FROM flight_recorder_mismatches
UNION ALL
SELECT run_id, 'nccl_warn', CASE WHEN bool_or(message ILIKE '%status=%' OR message ILIKE '%error%' OR message ILIKE '%fail%') THEN 'high' ELSE 'moderate' END,
       source_id, host, pid, NULL::INTEGER, min(line_no), count(*), 'NCCL WARN: ' || arg_min(message, line_no)
FROM nccl_events WHERE level = 'WARN' AND message IS NOT NULL
GROUP BY run_id, source_id, host, pid
UNION ALL
SELECT run_id, 'ras_issue', CASE WHEN severity = 'error' OR status IN ('MISMATCH', 'DEAD') THEN 'high' ELSE 'moderate' END,
       source_id, NULL, NULL::BIGINT, NULL::INTEGER, line_no, greatest(n_named, 1),
       'NCCL RAS: ' || comm || coalesce(status, 'issue')
       || CASE WHEN status = 'MISMATCH' THEN ': its ranks launched different numbers of ' || coalesce(coll || ' ', '') || 'operations' ELSE '' END
       || coalesce(' (' || counts || ')', '') || coalesce('; the report names rank(s) ' || named, '')
       || coalesce('; considered dead: ' || dead, '')
FROM ras_issues
),
files AS (SELECT run_id, source_id, regexp_extract(min(path), '[^/!]+$') AS file FROM sources GROUP BY ALL)
SELECT c.run_id, c.kind, c.severity, c.source_id, f.file, c.host, c.pid, c.rank, c.line_no, c.n, c.detail
FROM checks c LEFT JOIN files f ON f.run_id = c.run_id AND f.source_id = c.source_id
ORDER BY c.run_id, c.severity, c.kind, c.source_id, c.line_no
