-- phase_wait_only: per rank and phase, the time the phase's communication only waits for peers,
-- as disjoint segments: the waiting parts of the collective kernels the phase launched minus the
-- phase's transfer parts, W_p \ M_p. Each kernel's phase is read from local_comm_phase (stored
-- at ingest: queries/local/comm_phase.sql; work of no phase counts as other, as in phases.sql)
-- and cut as views/45_scope_parts.sql cuts it: a kernel of comm_wait (views/44_comm_wait.sql)
-- waits over [start_ns, wait_end_ns) and transfers over [wait_end_ns, end_ns), any other is
-- transfer. queries/local/phases.sql takes its part no compute covers (|W_p \ (C ∪ M_p)|: the
-- phase's exposed waiting) with the compute pieces stored at ingest (local_comm_cover), and
-- pipeline/query.py creates it only on a connection that reads them (as wait_only_view.sql).
-- Only ranks with a waiting kernel have rows.
-- Sweep: as wait_only_view.sql, per (run_id, rank, phase).
-- Columns:
--   run_id STRING; rank INT32; phase STRING (forward, backward, optimizer, other)
--   start_ns, end_ns INT64 ns (end_ns > start_ns)
CREATE OR REPLACE VIEW phase_wait_only AS
WITH waiting AS (SELECT DISTINCT run_id, rank FROM comm_wait),
kernels AS (
  SELECT c.run_id, c.rank, coalesce(c.phase, 'other') AS phase, c.start_ns, greatest(c.end_ns, c.start_ns) AS end_ns,
         w.wait_end_ns
  FROM local_comm_phase c SEMI JOIN waiting USING (run_id, rank)
  LEFT JOIN comm_wait w ON w.run_id = c.run_id AND w.source_id = c.source_id AND w.rank = c.rank
   AND w.correlation IS NOT DISTINCT FROM c.correlation AND w.start_ns = c.start_ns
),
parts AS (  -- 1 = waiting, 0 = transfer
  SELECT run_id, rank, phase, start_ns, wait_end_ns AS end_ns, 1 AS w FROM kernels WHERE wait_end_ns IS NOT NULL
  UNION ALL
  SELECT run_id, rank, phase, coalesce(wait_end_ns, start_ns), end_ns, 0 FROM kernels
),
edges AS (
  SELECT run_id, rank, phase, start_ns AS t, w AS dw, 1 - w AS dm FROM parts WHERE end_ns > start_ns
  UNION ALL
  SELECT run_id, rank, phase, end_ns, -w, w - 1 FROM parts WHERE end_ns > start_ns
),
sweep AS (
  SELECT run_id, rank, phase, t, sum(dw) OVER g AS nw, sum(dm) OVER g AS nm, lead(t) OVER g AS t1
  FROM edges
  WINDOW g AS (PARTITION BY run_id, rank, phase ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT run_id, rank, phase, t AS start_ns, t1 AS end_ns
FROM sweep WHERE nw > 0 AND nm = 0 AND t1 > t;
