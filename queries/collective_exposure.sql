-- Collective cost per step and op: kernel time, and the part of it not hidden under compute,
-- split into waiting for peers and transfer.
--
-- Definitions: each communication kernel in scope (views/20_scope.sql) is cut at its wait
-- boundary (views/45_scope_parts.sql: [start, start + duration - the call's transfer time)
-- waiting for peers, the rest transfer; a kernel of no consistent call is all transfer); the exposed
-- part of each piece is its length minus its overlap with the union of its rank's compute
-- kernels (the union: compute intervals sorted by start, merged where they touch; XProf and
-- TraceLens count a collective as exposed only where no compute runs). Summed per op over the
-- kernels of all ranks: two collectives running at once on one rank each count their own time
-- (breakdown.sql and step_time.sql count such an instant once), so these sums rank ops by cost
-- rather than add up to exposed_comm_ns. The op is collectives.op (the trace's own records
-- first, the kernel name last; 'unknown' for a communication kernel with no collectives row).
-- Columns:
--   run_id STRING; step INT64 (the step whose wall-clock window, views/25_step_window.sql, holds the
--     kernel's start, as step_time.sql cuts time; else the step of its launch; NULL: outside
--     steps); op STRING
--   kernels INT64: communication kernels; ranks INT64: ranks they ran on
--   kernel_ns INT64 ns: their summed duration
--   exposed_ns INT64 ns = exposed_wait_ns + exposed_transfer_ns: summed time not under compute
--   exposed_wait_ns INT64 ns: of it, waiting for peers; exposed_transfer_ns INT64 ns: of it, transfer
WITH comp AS (
  SELECT run_id, rank, start_ns, greatest(end_ns, start_ns) AS end_ns,
    max(greatest(end_ns, start_ns)) OVER (PARTITION BY run_id, rank ORDER BY start_ns, end_ns
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM scope WHERE category = 'compute'
),
islands AS (  -- an island of the compute union starts where no earlier interval reaches
  SELECT run_id, rank, start_ns, end_ns,
    sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
      OVER (PARTITION BY run_id, rank ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS isl
  FROM comp
),
merged AS (SELECT run_id, rank, min(start_ns) AS s, max(end_ns) AS e FROM islands GROUP BY run_id, rank, isl),
kern0 AS (
  SELECT s.run_id, s.rank, s.step, coalesce(c.op, 'unknown') AS op, s.start_ns,
    greatest(s.end_ns, s.start_ns) AS end_ns,
    least(greatest(coalesce(w.wait_end_ns, s.start_ns), s.start_ns), greatest(s.end_ns, s.start_ns)) AS w
  FROM scope s
  LEFT JOIN comm_wait w ON w.run_id = s.run_id AND w.source_id = s.source_id AND w.rank = s.rank
   AND w.correlation IS NOT DISTINCT FROM s.correlation AND w.start_ns = s.start_ns
  LEFT JOIN (SELECT run_id, source_id, rank, correlation, start_ns, any_value(op) AS op FROM collectives
             WHERE correlation IS NOT NULL GROUP BY ALL) c
    ON c.run_id = s.run_id AND c.source_id = s.source_id AND c.rank = s.rank AND c.correlation = s.correlation
   AND c.start_ns = s.start_ns
  WHERE s.category = 'communication'
),
kern AS (
  SELECT row_number() OVER () AS kid, k.* REPLACE (coalesce(CASE WHEN k.start_ns < sw.step_end_ns THEN sw.step END, k.step) AS step)
  FROM kern0 k ASOF LEFT JOIN step_window sw ON sw.run_id = k.run_id AND sw.rank = k.rank AND k.start_ns >= sw.step_start_ns
),
covered AS (
  SELECT k.kid,
    sum(greatest(0, least(k.w, m.e) - greatest(k.start_ns, m.s))) AS cov_wait,
    sum(greatest(0, least(k.end_ns, m.e) - greatest(k.w, m.s))) AS cov_transfer
  FROM kern k JOIN merged m ON m.run_id = k.run_id AND m.rank = k.rank AND m.s < k.end_ns AND m.e > k.start_ns
  GROUP BY k.kid
)
SELECT k.run_id, k.step, k.op, count(*) AS kernels, count(DISTINCT k.rank) AS ranks,
  sum(k.end_ns - k.start_ns)::BIGINT AS kernel_ns,
  sum((k.w - k.start_ns) - coalesce(v.cov_wait, 0) + (k.end_ns - k.w) - coalesce(v.cov_transfer, 0))::BIGINT AS exposed_ns,
  sum((k.w - k.start_ns) - coalesce(v.cov_wait, 0))::BIGINT AS exposed_wait_ns,
  sum((k.end_ns - k.w) - coalesce(v.cov_transfer, 0))::BIGINT AS exposed_transfer_ns
FROM kern k LEFT JOIN covered v USING (kid)
GROUP BY ALL
ORDER BY k.run_id, k.step NULLS LAST, exposed_ns DESC, k.op;
