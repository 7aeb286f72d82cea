-- Collective cost per step and op: kernel time, and the part of it not hidden under compute,
-- split into waiting for peers and transfer.
--
-- Definitions: each communication kernel in scope (views/20_scope.sql) is cut at its wait
-- boundary (views/45_scope_parts.sql: [start, start + duration - the call's transfer time)
-- waiting for peers, the rest transfer; a kernel of no consistent call is all transfer); the exposed
-- part of each piece is its length minus its overlap with the union of its rank's compute
-- kernels (views/60_exposure_cover.sql: compute intervals sorted by start, merged where they
-- touch; XProf and TraceLens count a collective as exposed only where no compute runs). Summed per op over the
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
WITH ranks AS (  -- a dense integer per rank: the running sum sorts on it, not on the strings
  SELECT run_id, rank, (row_number() OVER (ORDER BY run_id, rank))::INT AS rr
  FROM (SELECT DISTINCT run_id, rank FROM exposure_cover)
),
-- F(x), the rank's compute time before instant x, from its compute pieces (views/60_exposure_cover.sql:
-- the union of its compute kernels as disjoint pieces): with C(i) the summed length of pieces
-- 1..i in start order, and i the last piece starting at or before x, F(x) = C(i) - greatest(0,
-- end_i - x). The compute time covering [a, b) is F(b) - F(a): three ASOF lookups per
-- communication kernel, not a join of every kernel with every compute interval of its rank
-- (quadratic: 21 s at 64 ranks x 100k kernels). The running sum runs over one global order; C
-- then counts on across ranks, so each rank's F is taken relative to its offset (C before its
-- first piece).
running AS (
  SELECT r.rr, c.start_ns AS s, c.end_ns AS r_end, c.end_ns - c.start_ns AS a,
    sum(c.end_ns - c.start_ns) OVER (ORDER BY r.rr, c.start_ns ROWS UNBOUNDED PRECEDING) AS c
  FROM exposure_cover c JOIN ranks r ON r.run_id = c.run_id AND r.rank = c.rank
),
offsets AS (SELECT rr, min(c - a) AS off FROM running GROUP BY rr),
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
points AS (  -- each kernel's start, wait boundary and end, with F at each
  SELECT p.kid, p.i, coalesce(c.c - greatest(0, c.r_end - p.x), o.off, 0) - coalesce(o.off, 0) AS f
  FROM (SELECT k.kid, r.rr, 0 AS i, k.start_ns AS x FROM kern k JOIN ranks r USING (run_id, rank)
        UNION ALL SELECT k.kid, r.rr, 1, k.w FROM kern k JOIN ranks r USING (run_id, rank)
        UNION ALL SELECT k.kid, r.rr, 2, k.end_ns FROM kern k JOIN ranks r USING (run_id, rank)) p
  LEFT JOIN offsets o ON o.rr = p.rr
  ASOF LEFT JOIN running c ON c.rr = p.rr AND p.x >= c.s
),
covered AS (
  SELECT kid,
    max(f) FILTER (WHERE i = 1) - max(f) FILTER (WHERE i = 0) AS cov_wait,
    max(f) FILTER (WHERE i = 2) - max(f) FILTER (WHERE i = 1) AS cov_transfer
  FROM points GROUP BY kid
)
SELECT k.run_id, k.step, k.op, count(*) AS kernels, count(DISTINCT k.rank) AS ranks,
  sum(k.end_ns - k.start_ns)::BIGINT AS kernel_ns,
  sum((k.w - k.start_ns) - coalesce(v.cov_wait, 0) + (k.end_ns - k.w) - coalesce(v.cov_transfer, 0))::BIGINT AS exposed_ns,
  sum((k.w - k.start_ns) - coalesce(v.cov_wait, 0))::BIGINT AS exposed_wait_ns,
  sum((k.end_ns - k.w) - coalesce(v.cov_transfer, 0))::BIGINT AS exposed_transfer_ns
FROM kern k LEFT JOIN covered v USING (kid)
GROUP BY ALL
ORDER BY k.run_id, k.step NULLS LAST, exposed_ns DESC, k.op;
