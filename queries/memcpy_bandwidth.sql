-- Memory copy and memset bandwidth per rank and direction.
--
-- Definition: achieved_gbps = sum(bytes) / sum(dur_ns) over the copies of one kind and
-- direction (bytes per ns = 1e9 bytes/s), the duration-weighted mean bandwidth. Kineto's own
-- per-event 'memory bandwidth (GB/s)' arg is bytes / dur_ns of one event (CuptiActivity.h).
-- Pageable host memory forces a staged, synchronous copy (CUDA C Programming Guide, "Page-Locked
-- Host Memory"): pageable_bytes shows how much could move to pinned buffers.
-- Columns:
--   run_id STRING; rank INT32; kind STRING (memcpy | memset); copy_kind STRING (HtoD, DtoH, DtoD, ...)
--   src_kind STRING; dst_kind STRING; copies INT64; total_bytes INT64 bytes; total_ns INT64 ns
--   achieved_gbps DOUBLE GB/s (NULL when total_ns = 0)
SELECT run_id, rank, kind, copy_kind, src_kind, dst_kind,
  count(*) AS copies, sum(bytes)::BIGINT AS total_bytes, sum(dur_ns)::BIGINT AS total_ns,
  CASE WHEN sum(dur_ns) > 0 THEN sum(bytes) / sum(dur_ns) END AS achieved_gbps
FROM scope
WHERE kind IN ('memcpy', 'memset')
GROUP BY ALL
ORDER BY run_id, rank, total_ns DESC, kind, copy_kind, src_kind, dst_kind;
