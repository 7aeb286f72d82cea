-- trace_process / rank_nccl / nccl_process_transport / collectives_nccl: NCCL logs joined to the
-- traces of the same run (issue 5 part 4).
--
-- trace_process: the OS process that wrote each rank's trace: the pid that made most of its
-- host calls (cpu_ops; Kineto and Nsight Systems both record OS pids there), and the host the
-- source names.
-- @view trace_process: The OS process (pid and host) that wrote each traced rank's trace.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column pid BIGINT: The pid that made most of its host calls.
-- @column host VARCHAR: The host its source names (NULL: the trace names none).
CREATE OR REPLACE VIEW trace_process AS
SELECT c.run_id, c.rank, mode(c.pid) AS pid, any_value(s.host) AS host
FROM cpu_ops c JOIN sources s ON s.run_id = c.run_id AND s.source_id = c.source_id
WHERE c.pid IS NOT NULL
GROUP BY c.run_id, c.rank;

-- rank_nccl: the NCCL process of each traced rank. Matched on pid and host (hosts compared up to
-- the first dot, since NCCL prints the short name; a side without a host matches any), else on
-- the rank the log states in the run's largest communicator (the world communicator).
-- @view rank_nccl: The NCCL process of each traced rank, matched on pid and host, else on rank.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: The trace's rank.
-- @column nccl_host VARCHAR: Host of the NCCL process.
-- @column nccl_pid BIGINT: Its pid.
-- @column matched_by VARCHAR: 'host_pid' or 'rank'.
CREATE OR REPLACE VIEW rank_nccl AS
WITH procs AS (SELECT DISTINCT run_id, host, pid FROM nccl_processes WHERE pid IS NOT NULL),
by_pid AS (
  SELECT t.run_id, t.rank, p.host AS nccl_host, p.pid AS nccl_pid, 'host_pid' AS matched_by
  FROM trace_process t JOIN procs p ON p.run_id = t.run_id AND p.pid = t.pid
   AND (t.host IS NULL OR coalesce(p.host, '') = '' OR split_part(lower(t.host), '.', 1) = split_part(lower(p.host), '.', 1))
),
world AS (SELECT run_id, max(nranks) AS n FROM nccl_processes GROUP BY run_id),
by_rank AS (
  SELECT DISTINCT p.run_id, p.rank, p.host AS nccl_host, p.pid AS nccl_pid, 'rank' AS matched_by
  FROM nccl_processes p JOIN world w ON w.run_id = p.run_id AND p.nranks = w.n
  JOIN trace_process t ON t.run_id = p.run_id AND t.rank = p.rank
  WHERE p.rank IS NOT NULL
)
SELECT * FROM by_pid
UNION ALL
SELECT b.* FROM by_rank b WHERE NOT EXISTS (SELECT 1 FROM by_pid x WHERE x.run_id = b.run_id AND x.rank = b.rank);

-- nccl_process_transport: the transports one NCCL process's channel lines state
-- (../shared/reference/nccl.md section 1.5).
-- @view nccl_process_transport: The transports each NCCL process's channel lines state.
-- @column run_id VARCHAR: Run.
-- @column host VARCHAR: Host.
-- @column pid BIGINT: Process id.
-- @column transports VARCHAR: Distinct labels in alphabetical order, e.g. 'NET/IB/GDRDMA, P2P/CUMEM'
--   (NET/<net>[/GDRDMA], P2P[/<mode>], SHM, NVLS, COLLNET).
-- @column net_name VARCHAR: Network of its NET channels (IB, Socket, AWS Libfabric); NULL: no NET.
-- @column net_channels BIGINT count: NET channels.
-- @column gdr_channels BIGINT count: NET channels with GPUDirect RDMA.
-- @column shm_channels BIGINT count: SHM channels.
CREATE OR REPLACE VIEW nccl_process_transport AS
SELECT run_id, host, pid,
  string_agg(DISTINCT label, ', ' ORDER BY label) AS transports,
  any_value(net_name) FILTER (WHERE transport = 'NET') AS net_name,
  count(*) FILTER (WHERE transport = 'NET') AS net_channels,
  count(*) FILTER (WHERE transport = 'NET' AND gdr) AS gdr_channels,
  count(*) FILTER (WHERE transport = 'SHM') AS shm_channels
FROM (SELECT *, CASE transport
        WHEN 'NET' THEN 'NET/' || coalesce(net_name, '?') || CASE WHEN gdr THEN '/GDRDMA' ELSE '' END
        WHEN 'P2P' THEN 'P2P' || coalesce('/' || p2p_mode, '')
        ELSE transport END AS label
      FROM nccl_channels)
GROUP BY run_id, host, pid;

-- collectives_nccl: collectives with what the NCCL log of the rank's process says.
-- Columns: all of collectives, with comm_id and transport filled from the log when the trace has
-- none, plus nccl_matched_by and net_name.
-- comm_id: the process's communicator with group_size ranks when exactly one fits, else its only
-- communicator; NULL when ambiguous.
-- @view collectives_nccl: Collectives with what the NCCL log of the rank's process says.
-- @columns_of collectives
-- @column nccl_matched_by VARCHAR: How the rank's NCCL process was found (rank_nccl.matched_by); NULL:
--   no log.
-- @column net_name VARCHAR: Network of the process's NET channels.
CREATE OR REPLACE VIEW collectives_nccl AS
WITH comms AS (
  SELECT run_id, host, pid, nranks, count(DISTINCT comm_id) AS n, any_value(comm_id) AS comm_id
  FROM nccl_processes WHERE comm_id IS NOT NULL GROUP BY ALL
),
only_comm AS (
  SELECT run_id, host, pid, any_value(comm_id) AS comm_id FROM nccl_processes WHERE comm_id IS NOT NULL
  GROUP BY ALL HAVING count(DISTINCT comm_id) = 1
)
SELECT c.* REPLACE (
    coalesce(c.comm_id, (SELECT k.comm_id FROM comms k WHERE k.run_id = c.run_id AND k.host IS NOT DISTINCT FROM r.nccl_host
                           AND k.pid = r.nccl_pid AND k.nranks = c.group_size AND k.n = 1),
             o.comm_id) AS comm_id,
    coalesce(c.transport, t.transports) AS transport),
  r.matched_by AS nccl_matched_by, t.net_name
FROM collectives c
LEFT JOIN rank_nccl r ON r.run_id = c.run_id AND r.rank = c.rank
LEFT JOIN nccl_process_transport t ON t.run_id = c.run_id AND t.host IS NOT DISTINCT FROM r.nccl_host AND t.pid = r.nccl_pid
LEFT JOIN only_comm o ON o.run_id = c.run_id AND o.host IS NOT DISTINCT FROM r.nccl_host AND o.pid = r.nccl_pid;
