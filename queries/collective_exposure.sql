-- Collective cost per step and op: kernel time, and the part of it not hidden under compute,
-- split into waiting for peers and transfer.
--
-- Definitions: each communication kernel in scope (views/20_scope.sql) is cut at its wait
-- boundary (views/44_comm_wait.sql: [start, start + duration - the call's transfer time)
-- waiting for peers, the rest transfer; a kernel of no consistent call is all transfer); the exposed
-- part of each piece is its length minus its overlap with the union of its rank's compute
-- kernels (views/60_exposure_cover.sql; XProf and TraceLens count a collective as exposed only
-- where no compute runs). Summed per op over the kernels of all ranks: two collectives running
-- at once on one rank each count their own time (breakdown.sql and step_time.sql count such an
-- instant once), so these sums rank ops by cost rather than add up to exposed_comm_ns. The op
-- is collectives.op (the trace's own records first, the kernel name last; 'unknown' for a
-- communication kernel with no collectives row).
-- @column run_id VARCHAR: Run.
-- @column step BIGINT: The step whose wall-clock window (views/25_step_window.sql) holds the kernel's
--   start, as step_time.sql cuts time; else the step of its launch; NULL: outside steps.
-- @column op VARCHAR: collectives.op ('unknown': a communication kernel with no collectives row).
-- @column kernels BIGINT count: Communication kernels.
-- @column ranks BIGINT count: Ranks they ran on.
-- @column kernel_ns BIGINT ns: Their summed duration.
-- @column exposed_ns BIGINT ns: Summed time not under compute (exposed_wait_ns + exposed_transfer_ns).
-- @column exposed_wait_ns BIGINT ns: Of it, waiting for peers.
-- @column exposed_transfer_ns BIGINT ns: Of it, transfer.
WITH ranks AS (  -- a dense integer per rank: the running max and sum sort on it, not on the strings
  SELECT run_id, rank, (row_number() OVER (ORDER BY run_id, rank))::INT AS rr
  FROM (SELECT DISTINCT run_id, rank FROM scope WHERE category = 'compute')
),
-- F(x), the time of the rank's compute union before instant x. With the compute intervals
-- (exposure_cover: the rank's compute kernels, or disjoint pieces of them) sorted by start,
-- interval i adds to the union what it reaches past the latest earlier end (prev_end); C(i), the
-- running sum of those additions, is the union of intervals 1..i, and since every one of them
-- starts at or before start_i, the union of 1..i covers [x, R(i)) whole for any x >= start_i
-- (R(i) = the latest end of 1..i). So for the last interval i starting at or before x, F(x) =
-- C(i) - greatest(0, R(i) - x), and the compute time covering [a, b) is F(b) - F(a): three ASOF
-- lookups per communication kernel, not a join of every kernel with every compute interval of
-- its rank (quadratic: 21 s at 64 ranks x 100k kernels). The running max and sum run over one
-- global order (keyed_ns, views/05_macros.sql); C then counts on across ranks, so each rank's F
-- is taken relative to its offset (C before its first interval).
comp AS (
  SELECT r.rr, s.start_ns, s.end_ns,
    keyed_ns_value(max(keyed_ns(r.rr, s.end_ns))
      OVER (ORDER BY r.rr, s.start_ns, s.end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), r.rr) AS prev_end
  FROM exposure_cover s JOIN ranks r ON r.run_id = s.run_id AND r.rank = s.rank
),
added AS (
  SELECT rr, start_ns, end_ns, greatest(end_ns, coalesce(prev_end, end_ns)) AS r_end,
    greatest(0, end_ns - greatest(start_ns, coalesce(prev_end, start_ns))) AS a
  FROM comp
),
running AS (
  SELECT rr, start_ns AS s, r_end, a, sum(a) OVER w AS c, lead(rr) OVER w AS next_rr, lead(start_ns) OVER w AS next_s
  FROM added
  WINDOW w AS (ORDER BY rr, start_ns, end_ns ROWS UNBOUNDED PRECEDING)
),
cum AS (  -- the last interval of each start instant (the lookup must see every interval starting there)
  SELECT rr, s, r_end, c FROM running WHERE next_rr IS DISTINCT FROM rr OR next_s IS DISTINCT FROM s
),
offsets AS (SELECT rr, min(c - a) AS off FROM running GROUP BY rr),
kern0 AS (
  SELECT s.run_id, s.rank, s.step, coalesce(c.op, 'unknown') AS op, s.start_ns,
    greatest(s.end_ns, s.start_ns) AS end_ns,
    least(greatest(coalesce(w.wait_end_ns, s.start_ns), s.start_ns), greatest(s.end_ns, s.start_ns)) AS w
  FROM scope s
  LEFT JOIN comm_wait w ON w.run_id = s.run_id AND w.source_id = s.source_id AND w.rank = s.rank
   AND w.correlation IS NOT DISTINCT FROM s.correlation AND w.start_ns = s.start_ns
  LEFT JOIN (SELECT run_id, source_id, rank, correlation, start_ns, min(op) AS op FROM collectives
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
  ASOF LEFT JOIN cum c ON c.rr = p.rr AND p.x >= c.s
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
