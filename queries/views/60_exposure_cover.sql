-- exposure_cover: per rank, the compute time collective_exposure.sql measures each communication
-- kernel against, as disjoint pieces (start order): the union of the rank's compute kernels in
-- scope, merged where they overlap or touch (an interval starts a new piece when it starts after
-- the latest end of every compute interval before it). When the connection reads per-source
-- results (pipeline/query.py use_local), connect() replaces this view by the rank-level pieces
-- of local_comm_cover (compute ∩ communication, stored at ingest): every communication kernel
-- lies inside the communication union, so its overlap with either set of pieces is the same.
-- Columns:
--   run_id STRING; rank INT32; start_ns, end_ns INT64 ns (end_ns >= start_ns; pieces of a rank
--   are disjoint and have distinct starts)
CREATE OR REPLACE VIEW exposure_cover AS
WITH ranks AS (  -- a dense integer per rank: the running max and sum sort on it, not on the strings
  SELECT run_id, rank, (row_number() OVER (ORDER BY run_id, rank))::INT AS rr
  FROM (SELECT DISTINCT run_id, rank FROM scope WHERE category = 'compute')
),
comp AS (  -- the latest end before each interval, in one global order (keyed_ns, views/05_macros.sql)
  SELECT r.rr, s.start_ns, greatest(s.end_ns, s.start_ns) AS end_ns,
    keyed_ns_value(max(keyed_ns(r.rr, greatest(s.end_ns, s.start_ns)))
      OVER (ORDER BY r.rr, s.start_ns, s.end_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), r.rr) AS prev_end
  FROM scope s JOIN ranks r ON r.run_id = s.run_id AND r.rank = s.rank
  WHERE s.category = 'compute'
),
numbered AS (
  SELECT rr, start_ns, end_ns,
    sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
      OVER (ORDER BY rr, start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS piece
  FROM comp
)
SELECT r.run_id, r.rank, min(n.start_ns) AS start_ns, max(n.end_ns) AS end_ns
FROM numbered n JOIN ranks r USING (rr)
GROUP BY r.run_id, r.rank, n.piece;
