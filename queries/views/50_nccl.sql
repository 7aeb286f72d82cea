-- trace_process / rank_nccl / nccl_process_transport / collectives_nccl: NCCL logs joined to the
-- traces of the same run (docs/nccl.md).
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

-- nccl_jobs: which NCCL-family files of a run are one job (pipeline/ingest/runs.py rule 4, as
-- ingest places them): files linked by a communicator id they both state (commId, RAS and profiler
-- comm hashes; NCCL's documentation masks ids as '0x...', which names none) or by a process (host
-- up to the first dot and pid) they both name, transitively (label propagation, 8 rounds: chains
-- of more than 8 links are not joined). A file without either is a job of its own. Findings that
-- compare files (watchdog timeouts, the ranks behind them) are computed within one job.
-- @view nccl_jobs: Each NCCL-family source's job: the files it shares a communicator or a process with.
-- @column run_id VARCHAR: Run.
-- @column source_id VARCHAR: The NCCL-family source (log, nccl-tests output, dump, report).
-- @column job VARCHAR: The job: the smallest source_id among the files linked to it.
CREATE OR REPLACE VIEW nccl_jobs AS
WITH RECURSIVE logs AS (
  SELECT DISTINCT run_id, source_id FROM sources
  WHERE nccl_family(format) AND status <> 'failed'
),
ids AS (
  SELECT run_id, source_id, comm_id AS k FROM nccl_processes
  UNION SELECT run_id, source_id, comm_id FROM nccl_ras
  UNION SELECT run_id, source_id, comm_id FROM nccl_profiler_events
),
keys AS (
  SELECT DISTINCT run_id, source_id, k FROM ids
  WHERE regexp_full_match(k, '0x[0-9a-f]+') AND NOT regexp_full_match(k, '0x0+')
  UNION
  SELECT run_id, source_id, 'p:' || split_part(lower(host), '.', 1) || ':' || pid
  FROM (SELECT run_id, source_id, host, pid FROM nccl_processes UNION SELECT run_id, source_id, host, pid FROM nccl_ras)
  WHERE coalesce(host, '') <> '' AND pid IS NOT NULL
),
lab(it, run_id, source_id, job) AS (
  SELECT 0, run_id, source_id, source_id FROM logs
  UNION ALL
  SELECT any_value(x.it) + 1, x.run_id, x.source_id, min(x.m) FROM (
    SELECT l.it, l.run_id, l.source_id, least(l.job, coalesce(km.m, l.job)) AS m
    FROM lab l
    LEFT JOIN keys k ON k.run_id = l.run_id AND k.source_id = l.source_id
    LEFT JOIN (SELECT k2.run_id, k2.k, min(l2.job) AS m FROM lab l2
               JOIN keys k2 ON k2.run_id = l2.run_id AND k2.source_id = l2.source_id GROUP BY ALL) km
      ON km.run_id = k.run_id AND km.k = k.k
  ) x WHERE x.it < 8 GROUP BY x.run_id, x.source_id
)
SELECT run_id, source_id, min(job) AS job FROM lab GROUP BY run_id, source_id;

-- rank_nccl: the NCCL process of each traced rank. Matched on pid and host (hosts compared up to
-- the first dot, since NCCL prints the short name; a side without a host matches any), else on
-- the rank the log states in its job's largest communicator (the world communicator), when that
-- communicator has as many ranks as the traces' world size (where the traces state one) and the
-- GPU the log names (nccl-tests' device list) is the trace's (devices.name; both come from
-- cudaDeviceProp.name, compared case-insensitively; either unknown: no objection).
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
job_procs AS (SELECT p.*, j.job FROM nccl_processes p JOIN nccl_jobs j USING (run_id, source_id)),
world AS (SELECT run_id, job, max(nranks) AS n FROM job_procs GROUP BY run_id, job),
by_rank AS (
  SELECT DISTINCT p.run_id, p.rank, p.host AS nccl_host, p.pid AS nccl_pid, 'rank' AS matched_by
  FROM job_procs p JOIN world w ON w.run_id = p.run_id AND w.job = p.job AND p.nranks = w.n
  JOIN trace_process t ON t.run_id = p.run_id AND t.rank = p.rank
  LEFT JOIN traced_world tw ON tw.run_id = p.run_id
  LEFT JOIN (
    SELECT run_id, rank, min(lower(trim(name))) AS gpu FROM devices WHERE trim(coalesce(name, '')) <> ''
    GROUP BY ALL
  ) d ON d.run_id = p.run_id AND d.rank = p.rank
  WHERE p.rank IS NOT NULL AND (tw.world_size IS NULL OR tw.world_size = w.n)
    AND (d.gpu IS NULL OR trim(coalesce(p.gpu_name, '')) = '' OR lower(trim(p.gpu_name)) = d.gpu)
)
SELECT * FROM by_pid
UNION ALL
SELECT b.* FROM by_rank b WHERE NOT EXISTS (SELECT 1 FROM by_pid x WHERE x.run_id = b.run_id AND x.rank = b.rank);

-- nccl_log_match: how each NCCL-family file of a run was matched to its traced ranks (rank_nccl
-- joined to the file's processes on host and pid); a file that matched none has no ranks.
-- @view nccl_log_match: Each NCCL-family file of a run and the traced ranks matched to its processes.
-- @column run_id VARCHAR: Run.
-- @column source_id VARCHAR: The NCCL-family source.
-- @column file VARCHAR: Its file name (the last part of sources.path).
-- @column host VARCHAR: The host its sources row names (NULL: none).
-- @column ranks INTEGER[]: Traced ranks matched to one of its processes (NULL: none).
-- @column matched_by VARCHAR: How: 'host_pid', 'rank', or both comma-separated (NULL: not matched).
CREATE OR REPLACE VIEW nccl_log_match AS
WITH logs AS (
  SELECT run_id, source_id, regexp_extract(min(path), '[^/!]+$') AS file, min(host) AS host FROM sources
  WHERE nccl_family(format) AND status <> 'failed' GROUP BY run_id, source_id
),
procs AS (SELECT DISTINCT run_id, source_id, host, pid FROM nccl_processes WHERE pid IS NOT NULL)
SELECT l.run_id, l.source_id, l.file, l.host,
  list(DISTINCT r.rank ORDER BY r.rank) FILTER (WHERE r.rank IS NOT NULL) AS ranks,
  string_agg(DISTINCT r.matched_by, ', ' ORDER BY r.matched_by) AS matched_by
FROM logs l
LEFT JOIN procs p ON p.run_id = l.run_id AND p.source_id = l.source_id
LEFT JOIN rank_nccl r ON r.run_id = p.run_id AND r.nccl_pid = p.pid AND r.nccl_host IS NOT DISTINCT FROM p.host
GROUP BY l.run_id, l.source_id, l.file, l.host;

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
  min(net_name) FILTER (WHERE transport = 'NET') AS net_name,
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

-- nccl_line_rate: the network line rate each host's NCCL logs state (nccl_link_rates;
-- ../shared/reference/nccl.md section 1.11; docs/nccl.md "Line rate"): the NICs its channels go
-- through (`Channel ... via NET/IB/<index>`: nccl_channels.net_dev, named from the NET/IB Using line), else every NIC it
-- states a rate for, each at the best rate stated for it; their sum is the bound of a ring that
-- crosses the node through them (each channel's ring leaves the node through one NIC; nccl-tests
-- busbw of a ring on several nodes cannot pass it, Tree and NVLS-Tree can: nccl-tests#196). A
-- topology dump printed without an NCCL line prefix names no host (host NULL). ring_*: NCCL's own
-- expectation, its ring graph's search result (`Pattern 4`, NCCL_TOPO_PATTERN_RING in
-- src/include/graph.h): bandwidth per channel x channels, inside the node and between nodes.
-- @view nccl_line_rate: Per run and host, the NICs NCCL states a rate for and their sum, and NCCL's ring estimate.
-- @column run_id VARCHAR: Run.
-- @column host VARCHAR: Host (NULL: a topology dump printed without an NCCL line prefix).
-- @column nics BIGINT count: NICs counted.
-- @column nic_names VARCHAR: Their names (dev_name, else NET/<index>), comma-separated.
-- @column nic_gbps DOUBLE GB/s: The slowest of them.
-- @column nic_max_gbps DOUBLE GB/s: The fastest.
-- @column sum_gbps DOUBLE GB/s: Their sum: the network bound of a ring through them.
-- @column from_channels BOOLEAN: The NICs are those NCCL's channels use (else every NIC stated).
-- @column ring_intra_gbps DOUBLE GB/s: NCCL's ring graph, bandwidth per channel x channels inside the node (NULL: no Pattern 4 line).
-- @column ring_inter_gbps DOUBLE GB/s: The same between nodes.
CREATE OR REPLACE VIEW nccl_line_rate AS
WITH nic AS (
  SELECT run_id, host, coalesce(dev_name, 'NET/' || dev_index) AS nic, max(bw_gbps) AS bw_gbps
  FROM nccl_link_rates WHERE kind = 'nic' AND bw_gbps > 0 GROUP BY ALL
),
used AS (
  SELECT DISTINCT c.run_id, c.host, coalesce(d.dev_name, 'NET/' || c.net_dev) AS nic
  FROM nccl_channels c
  LEFT JOIN (SELECT DISTINCT run_id, host, pid, dev_index, dev_name FROM nccl_net_devices WHERE kind = 'ib') d
    ON d.run_id = c.run_id AND d.host = c.host AND d.pid = c.pid AND d.dev_index = c.net_dev
  WHERE c.transport = 'NET' AND c.net_dev IS NOT NULL
),
chosen AS (
  SELECT n.*, u.nic IS NOT NULL AS from_channels FROM nic n
  LEFT JOIN used u ON u.run_id = n.run_id AND u.host IS NOT DISTINCT FROM n.host AND u.nic = n.nic
  WHERE u.nic IS NOT NULL
     OR NOT EXISTS (SELECT 1 FROM used x WHERE x.run_id = n.run_id AND x.host IS NOT DISTINCT FROM n.host)
),
ring AS (
  SELECT run_id, host, max(bw_gbps * n_channels) AS ring_intra_gbps, max(bw_inter_gbps * n_channels) AS ring_inter_gbps
  FROM nccl_link_rates WHERE form = 'pattern' AND pattern = 4 AND n_channels > 0 GROUP BY ALL
)
SELECT c.run_id, c.host, count(*) AS nics, string_agg(c.nic, ', ' ORDER BY c.nic) AS nic_names,
       min(c.bw_gbps) AS nic_gbps, max(c.bw_gbps) AS nic_max_gbps, sum(c.bw_gbps) AS sum_gbps,
       bool_and(c.from_channels) AS from_channels, any_value(r.ring_intra_gbps) AS ring_intra_gbps,
       any_value(r.ring_inter_gbps) AS ring_inter_gbps
FROM chosen c LEFT JOIN ring r ON r.run_id = c.run_id AND r.host IS NOT DISTINCT FROM c.host
GROUP BY c.run_id, c.host;

-- nccl_process_settings: what each NCCL process of a run says of its own configuration, one row
-- per process and setting, for comparing the ranks of one job (pipeline/diagnosis/link_findings.py
-- drift): its NCCL and CUDA versions (nccl_processes), every NCCL_* variable it reports "set by
-- environment" (nccl_events kind env), the network it chose ('Using network ...'), the
-- inter-node transports its channels use (nccl_channels via NET/<name>, with GDRDMA or not), and
-- the algorithm/protocol it chose for each collective and size (TUNING lines `AllReduce: N Bytes
-- -> Algo RING proto SIMPLE`, nccl_events kind tuning).
-- A process that states no value for a setting has no row for it (unknown, not different).
-- @view nccl_process_settings: Per NCCL process (host and pid) of a run, each setting it states and its value.
-- @column run_id VARCHAR: Run.
-- @column job VARCHAR: The process's job (nccl_jobs.job of its source).
-- @column source_id VARCHAR: The log that states it.
-- @column host VARCHAR: Host.
-- @column pid BIGINT: Process id.
-- @column rank INTEGER: Its rank in its largest communicator (NULL: none stated).
-- @column setting VARCHAR: nccl_version, cuda_version, network, net_transport, 'algorithm <op> <bytes> B', or the NCCL_* variable's name.
-- @column value VARCHAR: Its value as printed (net_transport: the NET transports of its channels, sorted).
-- @column line_no BIGINT: The first line that states it.
CREATE OR REPLACE VIEW nccl_process_settings AS
WITH procs AS (
  SELECT run_id, source_id, host, pid, arg_max(rank, coalesce(nranks, 0)) AS rank,
         max(nccl_version) AS nccl_version, max(cuda_version) AS cuda_version, max(net_name) AS net_name,
         min(first_line_no) AS line_no
  FROM nccl_processes WHERE pid IS NOT NULL GROUP BY ALL
),
vals AS (
  SELECT run_id, source_id, host, pid, 'nccl_version' AS setting, nccl_version AS value, line_no FROM procs
  UNION ALL SELECT run_id, source_id, host, pid, 'cuda_version', cuda_version, line_no FROM procs
  UNION ALL SELECT run_id, source_id, host, pid, 'network', net_name, line_no FROM procs
  UNION ALL
  SELECT run_id, source_id, host, pid, json_extract_string(detail, '$.var'), any_value(json_extract_string(detail, '$.value')),
         min(line_no)
  FROM nccl_events WHERE kind = 'env' AND pid IS NOT NULL GROUP BY ALL
  UNION ALL
  SELECT run_id, source_id, host, pid,
         'algorithm ' || json_extract_string(detail, '$.op') || ' ' || json_extract_string(detail, '$.bytes') || ' B',
         string_agg(DISTINCT json_extract_string(detail, '$.algo') || '/' || json_extract_string(detail, '$.proto'), ', '
                    ORDER BY json_extract_string(detail, '$.algo') || '/' || json_extract_string(detail, '$.proto')),
         min(line_no)
  FROM nccl_events WHERE kind = 'tuning' AND pid IS NOT NULL AND json_extract_string(detail, '$.op') IS NOT NULL
  GROUP BY ALL
  UNION ALL
  SELECT run_id, source_id, host, pid, 'net_transport',
         string_agg(DISTINCT 'NET/' || net_name || CASE WHEN gdr THEN '/GDRDMA' ELSE '' END, ', '
                    ORDER BY 'NET/' || net_name || CASE WHEN gdr THEN '/GDRDMA' ELSE '' END),
         min(line_no)
  FROM nccl_channels WHERE transport = 'NET' AND net_name IS NOT NULL AND pid IS NOT NULL GROUP BY ALL
)
SELECT v.run_id, j.job, v.source_id, v.host, v.pid, p.rank, v.setting, v.value, v.line_no
FROM vals v
JOIN procs p USING (run_id, source_id, host, pid)
LEFT JOIN nccl_jobs j ON j.run_id = v.run_id AND j.source_id = v.source_id
WHERE v.value IS NOT NULL AND v.setting IS NOT NULL;

-- rank_line_rate: the NICs' rate behind each traced rank, from its matched NCCL process (rank_nccl)
-- and the line rate that process's host states (nccl_line_rate): the peak a collective of a group
-- that spans hosts is held against (pipeline/analyze.py fills collectives_per_rank's link peak
-- with it where the device catalog's NVLink peak does not apply).
-- @view rank_line_rate: Per traced rank, the rate of the NICs its NCCL process's host states.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: The trace's rank.
-- @column nic_rate_gbps DOUBLE GB/s: nccl_line_rate.sum_gbps of the rank's NCCL host.
-- @column nics BIGINT count: NICs behind it.
-- @column nic_names VARCHAR: Their names.
CREATE OR REPLACE VIEW rank_line_rate AS
SELECT r.run_id, r.rank, any_value(l.sum_gbps) AS nic_rate_gbps, any_value(l.nics) AS nics,
       any_value(l.nic_names) AS nic_names
FROM rank_nccl r JOIN nccl_line_rate l ON l.run_id = r.run_id AND l.host = r.nccl_host
GROUP BY r.run_id, r.rank;
