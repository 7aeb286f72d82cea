-- Memory copy and memset bandwidth per rank and direction.
--
-- Definition: achieved_gbps = sum(bytes) / sum(dur_ns) over the copies of one kind and
-- direction (bytes per ns = 1e9 bytes/s), the duration-weighted mean bandwidth. Kineto's own
-- per-event 'memory bandwidth (GB/s)' arg is bytes / dur_ns of one event (CuptiActivity.h).
-- Pageable host memory forces a staged, synchronous copy (CUDA C Programming Guide, "Page-Locked
-- Host Memory"): pageable_bytes shows how much could move to pinned buffers.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column kind VARCHAR: memcpy or memset.
-- @column copy_kind VARCHAR: HtoD, DtoH, DtoD, ...
-- @column src_kind VARCHAR: Source memory kind (Pageable, Pinned, Device, ...).
-- @column dst_kind VARCHAR: Destination memory kind.
-- @column copies BIGINT count: Copies (or memsets).
-- @column total_bytes BIGINT bytes: Their bytes.
-- @column total_ns BIGINT ns: Their summed duration.
-- @column achieved_gbps DOUBLE GB/s: total_bytes / total_ns (NULL when total_ns = 0).
SELECT run_id, rank, kind, copy_kind, src_kind, dst_kind,
  count(*) AS copies, sum(bytes)::BIGINT AS total_bytes, sum(dur_ns)::BIGINT AS total_ns,
  CASE WHEN sum(dur_ns) > 0 THEN sum(bytes) / sum(dur_ns) END AS achieved_gbps
FROM scope
WHERE kind IN ('memcpy', 'memset')
GROUP BY ALL
ORDER BY run_id, rank, total_ns DESC, kind, copy_kind, src_kind, dst_kind;
