-- Idle time per stream, by cause (HTA get_idle_time_breakdown,
-- hta/analyzers/breakdown_analysis.py _analyze_idle_time_for_stream).
--
-- Definition: on each (rank, device, stream), activities (kernels, memcpy, memset; sync
-- events excluded) are sorted by start; the gap before an activity is
--   gap = start - (latest end of the activities before it on the stream),
-- counted only when positive (overlapping activities leave no gap; HTA subtracts the previous
-- row's end only and so sums negative gaps into kernel_wait). Each gap is:
--   host_wait   the activity's launch call started after the stream had drained
--               (launch_ns > previous end): the host was late;
--   kernel_wait otherwise, when gap < kernel_wait_threshold_ns (DuckDB variable, default
--               30000 ns = HTA's consecutive_kernel_delay of 30 µs): launch overhead;
--   other       otherwise (waiting on an event, another stream, ...).
-- Graph-replay kernels (gpu_activities.graph_replay, pipeline/derive.py) have no per-kernel launch time: their gaps
-- are counted under `unreliable` instead of a cause.
-- The gap belongs to the step of the activity after it.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column device INTEGER: Device.
-- @column stream BIGINT: Stream.
-- @column step BIGINT: The step of the activity after the gap (NULL: outside steps).
-- @column host_wait_ns BIGINT ns: Gaps the host was late for.
-- @column kernel_wait_ns BIGINT ns: Gaps shorter than kernel_wait_threshold_ns (launch overhead).
-- @column other_ns BIGINT ns: The other gaps.
-- @column unreliable_ns BIGINT ns: Gaps before graph-replay kernels (no per-kernel launch time).
-- @column gaps BIGINT count: Gaps counted.
WITH streams AS (  -- a dense integer per stream: the running max below sorts on it instead of the strings
  SELECT run_id, rank, device, stream, (row_number() OVER (ORDER BY run_id, rank, device, stream))::INT AS sid
  FROM (SELECT DISTINCT run_id, rank, device, stream FROM scope)
),
-- The latest earlier end on the stream, as a running max over one global order (keyed_ns,
-- views/05_macros.sql); NULL for a stream's first activity.
ordered AS (
  SELECT sid, step, start_ns, launch_ns, graph_replay, keyed_ns_value(pm, sid) AS prev_end
  FROM (
    SELECT m.sid, s.step, s.start_ns, s.launch_ns, s.graph_replay,
      max(keyed_ns(m.sid, s.end_ns))
        OVER (ORDER BY m.sid, s.start_ns, s.end_ns, s.event_index ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pm
    FROM scope s
    JOIN streams m ON m.run_id = s.run_id AND m.rank = s.rank AND m.device IS NOT DISTINCT FROM s.device
      AND m.stream IS NOT DISTINCT FROM s.stream)
),
gaps AS (
  SELECT *, start_ns - prev_end AS gap,
    CASE
      WHEN graph_replay THEN 'unreliable'
      WHEN launch_ns > prev_end THEN 'host_wait'
      WHEN start_ns - prev_end < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other'
    END AS cause
  FROM ordered
  WHERE prev_end IS NOT NULL AND start_ns > prev_end
),
agg AS (
  SELECT sid, step,
    coalesce(sum(gap) FILTER (WHERE cause = 'host_wait'), 0)::BIGINT AS host_wait_ns,
    coalesce(sum(gap) FILTER (WHERE cause = 'kernel_wait'), 0)::BIGINT AS kernel_wait_ns,
    coalesce(sum(gap) FILTER (WHERE cause = 'other'), 0)::BIGINT AS other_ns,
    coalesce(sum(gap) FILTER (WHERE cause = 'unreliable'), 0)::BIGINT AS unreliable_ns,
    count(*) AS gaps
  FROM gaps
  GROUP BY ALL
)
SELECT m.run_id, m.rank, m.device, m.stream, a.step, a.host_wait_ns, a.kernel_wait_ns, a.other_ns, a.unreliable_ns, a.gaps
FROM agg a JOIN streams m USING (sid)
ORDER BY m.run_id, m.rank, m.device, m.stream, a.step;
