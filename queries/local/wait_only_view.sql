-- wait_only: the time a rank's communication only waits for peers, as disjoint segments per
-- bucket of breakdown.sql: the waiting parts of its collective kernels (scope_parts, category
-- comm_wait: views/44_comm_wait.sql) minus every transfer part (category communication), so
-- W \ M with W the union of waiting parts and M the union of transfer parts. Exposed
-- communication waiting for peers is the part of these segments no compute covers
-- (breakdown.sql, step_time.sql: |W \ (C ∪ M)|); queries/local/breakdown.sql and step_time.sql
-- use it with the compute pieces stored at ingest (local_comm_cover), and pipeline/query.py
-- creates it only on a connection that reads them. Only ranks with a waiting kernel have rows.
-- Sweep: the parts' start and end edges per bucket with running counts of active waiting (nw)
-- and transfer (nm) parts; a segment runs from an edge to the next one. Edges at one instant
-- leave zero-length segments between them, and the last edge of an instant has the counts after
-- every change there, whatever the order of the edges within the instant.
-- Columns:
--   run_id STRING; rank INT32; level STRING ('rank': all the rank's work; 'step': work launched
--   in one step); step INT64 (NULL for level rank); start_ns, end_ns INT64 ns (end_ns > start_ns)
CREATE OR REPLACE VIEW wait_only AS
WITH waiting AS (SELECT DISTINCT run_id, rank FROM comm_wait),
parts AS (
  SELECT p.run_id, p.rank, p.step, p.start_ns, p.end_ns, (p.category = 'comm_wait')::INT AS w
  FROM scope_parts p SEMI JOIN waiting USING (run_id, rank)
  WHERE p.category IN ('comm_wait', 'communication') AND p.end_ns > p.start_ns
),
bucketed AS (
  SELECT run_id, rank, 'rank' AS level, NULL::BIGINT AS step, start_ns, end_ns, w FROM parts
  UNION ALL
  SELECT run_id, rank, 'step', step, start_ns, end_ns, w FROM parts WHERE step IS NOT NULL
),
edges AS (
  SELECT run_id, rank, level, step, start_ns AS t, w AS dw, 1 - w AS dm FROM bucketed
  UNION ALL
  SELECT run_id, rank, level, step, end_ns, -w, w - 1 FROM bucketed
),
sweep AS (
  SELECT run_id, rank, level, step, t, sum(dw) OVER g AS nw, sum(dm) OVER g AS nm, lead(t) OVER g AS t1
  FROM edges
  WINDOW g AS (PARTITION BY run_id, rank, level, step ORDER BY t ROWS UNBOUNDED PRECEDING)
)
SELECT run_id, rank, level, step, t AS start_ns, t1 AS end_ns
FROM sweep WHERE nw > 0 AND nm = 0 AND t1 > t;
