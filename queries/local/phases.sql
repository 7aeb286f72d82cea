-- phases from per-source results: the rows of phases.sql, read from local_phases (computed at
-- ingest on each source alone, every collective counted as transfer) with the split of each
-- phase's exposed communication into waiting for peers and transfer made here, where the other
-- ranks are known. Used by pipeline/query.py instead of phases.sql when every source with GPU
-- activities in scope has current local results and the options are the defaults
-- (pipeline/local.py); its rows equal phases.sql's (tests/test_local.py).
--
-- Definition (phases.sql): within each step window, the phase's exposed waiting is the time its
-- communication only waits and no compute of any phase runs, |W_p \ (C ∪ M_p)|: the phase's
-- phase_wait_only segments (queries/local/phase_wait_only_view.sql) cut at the window's edges,
-- minus their overlap with the rank's compute under communication (local_comm_cover, level
-- rank: disjoint pieces), also cut at the window:
--   exposed_comm_wait_ns = Σ |segment ∩ window| - Σ |segment ∩ piece ∩ window|;
--   exposed_comm_transfer_ns = exposed_comm_ns - exposed_comm_wait_ns.
-- Every other column is local_phases' (none depends on the split).
-- Columns: those of phases.sql, in its order.
WITH win AS (SELECT DISTINCT run_id, rank, step, step_start_ns, step_end_ns FROM local_step_time),
seg AS (  -- wait-only segments cut at the windows
  SELECT s.run_id, s.rank, s.phase, t.step, greatest(s.start_ns, t.step_start_ns) AS a, least(s.end_ns, t.step_end_ns) AS b
  FROM phase_wait_only s
  JOIN win t ON t.run_id = s.run_id AND t.rank = s.rank AND t.step_start_ns < s.end_ns AND t.step_end_ns > s.start_ns
),
seg_len AS (SELECT run_id, rank, phase, step, sum(b - a) AS seg_ns FROM seg GROUP BY ALL),
-- Σ |segment ∩ piece| per segment as C(b) - C(a) (local/comm_cover_sums_view.sql)
covered AS (
  SELECT s.run_id, s.rank, s.phase, s.step,
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
  SELECT l.run_id, l.rank, l.phase, l.step, (l.seg_ns - coalesce(c.cov_ns, 0))::BIGINT AS wait_ns
  FROM seg_len l LEFT JOIN covered c USING (run_id, rank, phase, step)
)
SELECT p.* EXCLUDE (source_id) REPLACE (
    coalesce(w.wait_ns, 0)::BIGINT AS exposed_comm_wait_ns,
    (p.exposed_comm_ns - coalesce(w.wait_ns, 0))::BIGINT AS exposed_comm_transfer_ns)
FROM local_phases p
LEFT JOIN wait w USING (run_id, rank, step, phase)
ORDER BY p.run_id, p.rank, p.step, CASE p.phase WHEN 'forward' THEN 0 WHEN 'backward' THEN 1 WHEN 'optimizer' THEN 2 ELSE 3 END;
