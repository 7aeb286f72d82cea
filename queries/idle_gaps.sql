-- Idle gaps: how long the GPU's idle intervals are, as a histogram per run and cause.
--
-- Definition (the gaps themselves: views/48_idle_gap_intervals.sql): per rank, the union of its
-- GPU work in scope (every device and stream merged, as in breakdown.sql) leaves idle gaps between consecutive busy islands (the time before the first and
-- after the last activity is not a gap). Each gap gets the device-level cause of breakdown.sql
-- (HTA's idle rule applied to the device, hta/analyzers/breakdown_analysis.py): unreliable when
-- the work ending it is a graph replay; host_wait when everything starting at the gap's end was
-- launched after the gap began; kernel_wait when shorter than kernel_wait_threshold_ns (default
-- 30 µs); other otherwise. Gaps are counted in power-of-two buckets of their length:
-- bucket_lo_ns <= gap < bucket_hi_ns with bucket_lo_ns = 2^floor(log2(gap)).
-- @column run_id VARCHAR: Run.
-- @column bucket_lo_ns BIGINT ns: The bucket's lower bound (a power of two).
-- @column bucket_hi_ns BIGINT ns: Its upper bound (exclusive), 2 * bucket_lo_ns; the int64 maximum
--   for the last bucket (2^62 ns and longer, where 2^63 does not fit).
-- @column cause VARCHAR: host_wait, kernel_wait, other or unreliable.
-- @column gaps BIGINT count: Number of gaps, over all ranks of the run.
-- @column ranks BIGINT count: Ranks with such a gap.
-- @column total_ns BIGINT ns: Their summed length.
SELECT run_id, (2::BIGINT ** k)::BIGINT AS bucket_lo_ns, CASE WHEN k < 62 THEN (2::BIGINT ** (k + 1))::BIGINT ELSE 9223372036854775807 END AS bucket_hi_ns, cause,
  count(*) AS gaps, count(DISTINCT rank) AS ranks, sum(gap_ns)::BIGINT AS total_ns
FROM (SELECT *, floor(log2(gap_ns))::INT AS k FROM idle_gap_intervals)
GROUP BY run_id, k, cause
ORDER BY run_id, bucket_lo_ns, cause;
