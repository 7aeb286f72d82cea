-- busbw_factor(kind, n): nccl-tests' bus-bandwidth factor for a collective of n ranks.
-- kind is collective_catalog.busbw_factor (from pipeline/catalog/collectives.toml):
-- '2(n-1)/n' (all_reduce), '(n-1)/n' (all_gather, reduce_scatter, all_to_all, gather, scatter),
-- anything else 1 (broadcast, reduce, send, recv). Source: nccl-tests doc/PERFORMANCE.md.
-- Returns DOUBLE; NULL when n is NULL or not positive.
CREATE OR REPLACE MACRO busbw_factor(kind, n) AS
  CASE WHEN n IS NULL OR n <= 0 THEN NULL
       WHEN kind = '2(n-1)/n' THEN 2.0 * (n - 1) / n
       WHEN kind = '(n-1)/n' THEN (n - 1) / n
       ELSE 1.0 END;
