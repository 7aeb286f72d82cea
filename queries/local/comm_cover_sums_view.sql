-- comm_cover_sums: the pieces of local_comm_cover (compute under communication, disjoint within a
-- bucket: queries/local/comm_cover.sql), each with the summed length of the pieces before it in
-- its bucket. queries/local/breakdown.sql, step_time.sql and phases.sql take the compute a
-- segment [a, b) of waiting overlaps as C(b) - C(a), with C(x) = before_ns + least(x - start_ns,
-- len_ns) of the last piece starting before x (0 when none does): two ASOF joins per segment
-- instead of comparing every segment with every piece of its bucket (20k wait-only segments
-- against 140k pieces of one rank: 3-4 CPU-s per metric, slower than the full files;
-- benchmarks/wait_bench.py). pipeline/query.py creates it only on a connection that reads the
-- per-source results, as wait_only_view.sql.
-- Columns:
--   run_id STRING; rank INT32; level STRING ('rank' | 'step')
--   k INT64: the step, 0 for level rank (an ASOF join's equality key cannot be NULL)
--   start_ns INT64 ns; len_ns INT64 ns: the piece
--   before_ns HUGEINT ns: the summed length of the bucket's pieces that start before it
CREATE OR REPLACE VIEW comm_cover_sums AS
SELECT run_id, rank, level, coalesce(step, 0) AS k, start_ns, end_ns - start_ns AS len_ns,
  coalesce(sum(end_ns - start_ns) OVER (PARTITION BY run_id, rank, level, step ORDER BY start_ns
    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before_ns
FROM local_comm_cover;
