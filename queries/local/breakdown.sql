-- breakdown from per-source results: the rows of breakdown.sql, read from local_breakdown
-- (computed at ingest on each source alone, every collective counted as transfer) with the
-- split of exposed communication into waiting for peers and transfer made here, where the
-- other ranks are known. Used by pipeline/query.py instead of breakdown.sql when every source
-- with GPU activities in scope has current local results and the options are the defaults
-- (pipeline/local.py); its rows equal breakdown.sql's (tests/test_local.py).
--
-- Definition (breakdown.sql): exposed_comm_wait = |C∪M∪W| - |C∪M| = |W \ (C ∪ M)|, the
-- segments where communication only waits (wait_only: W \ M) minus the compute over them.
-- Those segments lie inside communication kernels, so the compute over them is their overlap
-- with local_comm_cover (compute ∩ communication, disjoint pieces per bucket):
--   exposed_comm_wait_ns = Σ |segment| - Σ |segment ∩ piece|;
--   exposed_comm_transfer_ns = exposed_comm_ns - exposed_comm_wait_ns.
-- Every other column is local_breakdown's: none depends on the split (breakdown.sql, its
-- comment on the unions).
-- Columns: those of breakdown.sql, in its order.
WITH seg AS (
  SELECT run_id, rank, level, step, sum(end_ns - start_ns) AS seg_ns FROM wait_only GROUP BY ALL
),
-- Σ |segment ∩ piece| per segment as C(end_ns) - C(start_ns) (local/comm_cover_sums_view.sql)
covered AS (
  SELECT w.run_id, w.rank, w.level, w.step,
    sum(coalesce(e.before_ns + least(w.end_ns - e.start_ns, e.len_ns), 0)
      - coalesce(s.before_ns + least(w.start_ns - s.start_ns, s.len_ns), 0)) AS cov_ns
  FROM (SELECT *, coalesce(step, 0) AS k FROM wait_only) w
  ASOF LEFT JOIN comm_cover_sums e ON e.run_id = w.run_id AND e.rank = w.rank AND e.level = w.level AND e.k = w.k
   AND w.end_ns > e.start_ns
  ASOF LEFT JOIN comm_cover_sums s ON s.run_id = w.run_id AND s.rank = w.rank AND s.level = w.level AND s.k = w.k
   AND w.start_ns > s.start_ns
  GROUP BY ALL
),
wait AS (
  SELECT s.run_id, s.rank, s.level, s.step, (s.seg_ns - coalesce(c.cov_ns, 0))::BIGINT AS wait_ns
  FROM seg s LEFT JOIN covered c ON c.run_id = s.run_id AND c.rank = s.rank AND c.level = s.level
   AND c.step IS NOT DISTINCT FROM s.step
)
SELECT b.* EXCLUDE (source_id) REPLACE (
    coalesce(w.wait_ns, 0)::BIGINT AS exposed_comm_wait_ns,
    (b.exposed_comm_ns - coalesce(w.wait_ns, 0))::BIGINT AS exposed_comm_transfer_ns)
FROM local_breakdown b
LEFT JOIN wait w ON w.run_id = b.run_id AND w.rank = b.rank AND w.level = b.level AND w.step IS NOT DISTINCT FROM b.step
ORDER BY b.run_id, b.rank, b.level DESC, b.step;
