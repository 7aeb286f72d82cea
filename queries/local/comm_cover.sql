-- local_comm_cover: run at ingest on one source alone (pipeline/local.py), for each bucket of
-- breakdown.sql (level 'rank': all the rank's work in scope; level 'step': the work launched in
-- one step, gpu_activities.step) the compute time that lies under communication kernels, as
-- disjoint pieces: (union of the bucket's compute activities) ∩ (union of its communication
-- activities, before any split into waiting and transfer).
--
-- Why: analysis splits exposed communication into waiting for peers and transfer (breakdown.sql,
-- step_time.sql) with the other ranks' kernels. The waiting parts lie inside communication
-- kernels, so the compute they overlap is their overlap with these pieces; analysis then never
-- re-sweeps every compute kernel (queries/local/breakdown.sql, queries/local/step_time.sql).
-- Merging: an interval starts a new piece of its category's union when it starts after the
-- latest end of every interval before it (sorted by start); touching intervals are one piece.
-- Columns:
--   run_id STRING; rank INT32; level STRING ('rank' | 'step'); step INT64 (NULL for level rank)
--   start_ns, end_ns INT64 ns: a piece, end_ns > start_ns (absolute clock)
WITH act AS (
  SELECT run_id, rank, 'rank' AS level, NULL::BIGINT AS step, category, start_ns, greatest(end_ns, start_ns) AS end_ns
  FROM scope WHERE category IN ('compute', 'communication')
  UNION ALL
  SELECT run_id, rank, 'step', step, category, start_ns, greatest(end_ns, start_ns)
  FROM scope WHERE category IN ('compute', 'communication') AND step IS NOT NULL
),
marked AS (
  SELECT *, max(end_ns) OVER (PARTITION BY run_id, rank, level, step, category ORDER BY start_ns, end_ns
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM act
),
numbered AS (
  SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY run_id, rank, level, step, category ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS piece
  FROM marked
),
merged AS (
  SELECT run_id, rank, level, step, category, min(start_ns) AS s, max(end_ns) AS e
  FROM numbered GROUP BY run_id, rank, level, step, category, piece
)
SELECT c.run_id, c.rank, c.level, c.step, greatest(c.s, k.s) AS start_ns, least(c.e, k.e) AS end_ns
FROM merged c
JOIN merged k ON k.run_id = c.run_id AND k.rank = c.rank AND k.level = c.level
  AND k.step IS NOT DISTINCT FROM c.step AND k.s < c.e AND c.s < k.e
WHERE c.category = 'compute' AND k.category = 'communication'
ORDER BY c.run_id, c.rank, c.level, c.step, start_ns;
