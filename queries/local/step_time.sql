-- step_time from per-source results: the rows of step_time.sql, read from local_step_time
-- (computed at ingest on each source alone, every collective counted as transfer) with the
-- split of exposed communication into waiting for peers and transfer made here, where the
-- other ranks are known. Used by pipeline/query.py instead of step_time.sql when every source
-- with GPU activities in scope has current local results and the options are the defaults
-- (pipeline/local.py); its rows equal step_time.sql's (tests/test_local.py).
--
-- Definition (step_time.sql): within each step window, exposed_comm_wait is the time where
-- communication only waits and no compute runs, |W \ (C ∪ M)|: the rank's wait_only segments
-- (level rank) cut at the window's edges, minus their overlap with the rank's compute under
-- communication (local_comm_cover, level rank: disjoint pieces), also cut at the window:
--   exposed_comm_wait_ns = Σ |segment ∩ window| - Σ |segment ∩ piece ∩ window|;
--   exposed_comm_transfer_ns = exposed_comm_ns - exposed_comm_wait_ns.
-- Every other column is local_step_time's (none depends on the split).
-- Columns: those of step_time.sql, in its order.
WITH seg AS (  -- wait-only segments cut at the windows
  SELECT s.run_id, s.rank, t.step, greatest(s.start_ns, t.step_start_ns) AS a, least(s.end_ns, t.step_end_ns) AS b
  FROM wait_only s
  JOIN local_step_time t ON t.run_id = s.run_id AND t.rank = s.rank
   AND t.step_start_ns < s.end_ns AND t.step_end_ns > s.start_ns
  WHERE s.level = 'rank'
),
seg_len AS (SELECT run_id, rank, step, sum(b - a) AS seg_ns FROM seg GROUP BY ALL),
-- Σ |segment ∩ piece| per segment as C(b) - C(a) (local/comm_cover_sums_view.sql)
covered AS (
  SELECT s.run_id, s.rank, s.step,
    sum(coalesce(e.before_ns + least(s.b - e.start_ns, e.len_ns), 0)
      - coalesce(f.before_ns + least(s.a - f.start_ns, f.len_ns), 0)) AS cov_ns
  FROM seg s
  ASOF LEFT JOIN (SELECT * FROM comm_cover_sums WHERE level = 'rank') e
    ON e.run_id = s.run_id AND e.rank = s.rank AND s.b > e.start_ns
  ASOF LEFT JOIN (SELECT * FROM comm_cover_sums WHERE level = 'rank') f
    ON f.run_id = s.run_id AND f.rank = s.rank AND s.a > f.start_ns
  GROUP BY ALL
),
wait AS (
  SELECT l.run_id, l.rank, l.step, (l.seg_ns - coalesce(c.cov_ns, 0))::BIGINT AS wait_ns
  FROM seg_len l LEFT JOIN covered c USING (run_id, rank, step)
)
SELECT t.* EXCLUDE (source_id) REPLACE (
    coalesce(w.wait_ns, 0)::BIGINT AS exposed_comm_wait_ns,
    (t.exposed_comm_ns - coalesce(w.wait_ns, 0))::BIGINT AS exposed_comm_transfer_ns)
FROM local_step_time t
LEFT JOIN wait w USING (run_id, rank, step)
ORDER BY t.run_id, t.rank, t.step;
