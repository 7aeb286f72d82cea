-- idle_gaps from per-source results: the histogram of idle_gaps.sql, summed over the rows stored
-- at ingest for each source alone (local_idle_gaps). Each gap belongs to one rank and a rank's
-- work to one source (pipeline/query.py use_local checks it), so a bucket's gaps and total_ns
-- are the sums of its sources' and its ranks the sum of their rank counts. Used instead of
-- idle_gaps.sql when every source with GPU activities in scope has current local results and the
-- options are the defaults (pipeline/local.py); its rows equal idle_gaps.sql's
-- (tests/test_local.py).
-- Columns: those of idle_gaps.sql, in its order.
SELECT run_id, bucket_lo_ns, bucket_hi_ns, cause, sum(gaps)::BIGINT AS gaps, sum(ranks)::BIGINT AS ranks,
  sum(total_ns)::BIGINT AS total_ns
FROM local_idle_gaps
GROUP BY run_id, bucket_lo_ns, bucket_hi_ns, cause
ORDER BY run_id, bucket_lo_ns, cause;
