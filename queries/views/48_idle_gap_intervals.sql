-- idle_gap_intervals: each GPU idle gap of each rank, with its cause: the definition idle_gaps.sql
-- counts in its histogram and `tracelake timeline` draws on each rank's "idle" track.
--
-- Definition: per rank, the union of its GPU work in scope (every device and stream merged, as in
-- breakdown.sql) leaves idle gaps between consecutive busy islands (the time before the first and
-- after the last activity is not a gap). Each gap gets the device-level cause of breakdown.sql
-- (HTA's idle rule applied to the device, hta/analyzers/breakdown_analysis.py): unreliable when
-- the work ending it is a graph replay; host_wait when everything starting at the gap's end was
-- launched after the gap began; kernel_wait when shorter than kernel_wait_threshold_ns (default
-- 30 µs); other otherwise.
-- @view idle_gap_intervals: Each GPU idle gap of each rank with its cause (what idle_gaps counts and
--   `tracelake timeline` draws).
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column start_ns BIGINT ns: The gap's start: the latest earlier end of the rank's work (absolute clock).
-- @column end_ns BIGINT ns: Its end: the start of the work that ends it.
-- @column gap_ns BIGINT ns: end_ns - start_ns.
-- @column cause VARCHAR: host_wait, kernel_wait, other or unreliable.
CREATE OR REPLACE VIEW idle_gap_intervals AS
WITH ranks AS (  -- a dense integer per rank: the queries below group and sort on it instead of the strings
  SELECT run_id, rank, (row_number() OVER (ORDER BY run_id, rank))::INT AS rr FROM (SELECT DISTINCT run_id, rank FROM scope)
),
starts AS (  -- activities grouped by start instant (all of them end the gap before it together)
  SELECT r.rr, s.start_ns, max(s.end_ns) AS end_ns,
         CASE WHEN count(*) FILTER (WHERE s.launch_ns IS NULL) = 0 THEN min(s.launch_ns) END AS first_launch,
         bool_or(s.graph_replay) AS graph
  FROM scope s JOIN ranks r ON r.run_id = s.run_id AND r.rank = s.rank
  GROUP BY r.rr, s.start_ns
),
-- the latest earlier end of the rank, as a running max over one global order (keyed_ns,
-- views/05_macros.sql); NULL for a rank's first start
prev AS (
  SELECT rr, start_ns, first_launch, graph, keyed_ns_value(pm, rr) AS prev_end
  FROM (
    SELECT *, max(keyed_ns(rr, end_ns)) OVER (ORDER BY rr, start_ns ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pm
    FROM starts)
),
gaps AS (
  SELECT rr, prev_end AS gap_start_ns, start_ns AS gap_end_ns, start_ns - prev_end AS gap_ns, CASE
      WHEN graph THEN 'unreliable'
      WHEN first_launch > prev_end THEN 'host_wait'
      WHEN start_ns - prev_end < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other' END AS cause
  FROM prev WHERE start_ns > prev_end
)
SELECT r.run_id, r.rank, g.gap_start_ns AS start_ns, g.gap_end_ns AS end_ns, g.gap_ns, g.cause
FROM gaps g JOIN ranks r USING (rr);
