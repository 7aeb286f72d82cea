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
-- the two passes below must see one order: activities of one interval (twins) are told apart
-- by a row id, else DuckDB may order them one way in the first pass and the other in the second,
-- and a piece is merged into the one before it (a 0-ns kernel beside its twin)
ided AS (SELECT *, row_number() OVER () AS rid FROM act),
marked AS (
  SELECT *, max(end_ns) OVER (PARTITION BY run_id, rank, level, step, category ORDER BY start_ns, end_ns, rid
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM ided
),
numbered AS (
  SELECT *, sum(CASE WHEN prev_end IS NULL OR start_ns > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY run_id, rank, level, step, category ORDER BY start_ns, end_ns, rid
                    ROWS UNBOUNDED PRECEDING) AS piece
  FROM marked
),
merged AS (
  SELECT run_id, rank, level, step, category, min(start_ns) AS s, max(end_ns) AS e
  FROM numbered GROUP BY run_id, rank, level, step, category, piece
),
-- a dense integer per bucket, and each compute piece's place in its bucket's order: the pieces of
-- a union are disjoint and sorted, so their starts and ends both rise with it
bucket AS (
  SELECT run_id, rank, level, step, (row_number() OVER ())::INT AS bid
  FROM (SELECT DISTINCT run_id, rank, level, step FROM merged)
),
pieces AS (
  SELECT b.bid, m.category, m.s, m.e
  FROM merged m JOIN bucket b ON b.run_id = m.run_id AND b.rank = m.rank AND b.level = m.level
    AND b.step IS NOT DISTINCT FROM m.step
),
comp AS (
  SELECT bid, s, e, row_number() OVER (PARTITION BY bid ORDER BY s) AS i FROM pieces WHERE category = 'compute'
),
comm AS (SELECT bid, s, e FROM pieces WHERE category = 'communication'),
-- the compute pieces a communication piece k overlaps (c.s < k.e and k.s < c.e) are therefore
-- consecutive: from the first that ends after k starts (i0) to the last that starts before k
-- ends (i1), found by two ASOF joins instead of comparing every pair of the bucket (a rank's
-- bucket held 100k compute pieces against 900 communication pieces: 90 M pairs)
ranged AS (
  SELECT k.bid, k.s, k.e, lo.i AS i0, hi.i AS i1
  FROM comm k
  ASOF JOIN comp lo ON lo.bid = k.bid AND k.s < lo.e
  ASOF JOIN comp hi ON hi.bid = k.bid AND k.e > hi.s
  WHERE lo.i <= hi.i
),
pairs AS (
  SELECT bid, s, e, unnest(range(i0, i1 + 1)) AS i FROM ranged
)
SELECT b.run_id, b.rank, b.level, b.step, greatest(c.s, p.s) AS start_ns, least(c.e, p.e) AS end_ns
FROM pairs p
JOIN comp c ON c.bid = p.bid AND c.i = p.i
JOIN bucket b ON b.bid = p.bid
ORDER BY b.run_id, b.rank, b.level, b.step, start_ns;
