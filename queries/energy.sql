-- Energy per rank and step from the power counters in the lake (Nsight Systems GPU metrics).
--
-- Definition:
--   power series = counters rows whose name contains "power" (case-insensitive) and whose
--                  value is in watts: unit W, or no unit and a name that says so (watt, _w,
--                  .w, (w) at the end: DCGM's DCGM_FI_DEV_POWER_USAGE exported with unit W,
--                  a Kineto counter "GPU Power" with an arg "power_w"). Several power series of
--                  one rank: the first by name is used (a device and a board series would
--                  count the same watts twice). Negative or non-finite readings are dropped; two
--                  samples at one time are held in value order (the first holds for 0 ns).
--   energy_j     = the integral of power over the step window (view step_window: the window
--                  every per-step metric uses), each sample held until the next one of its
--                  series (sample-and-hold, as nsys and DCGM report sampled power); the part of
--                  the window before the first sample and after the last is not counted (the last
--                  sample has no next one to hold until; covered_pct says how much
--                  of the window the samples cover).
--   mean_power_w = energy_j / (covered time).
-- A lake without power counters gives no rows; pipeline.analyze says so only when asked for
-- energy (the report omits the line).
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step.
-- @column series VARCHAR: The power counter's name.
-- @column step_ns BIGINT ns: The step window's length (step_window).
-- @column energy_j DOUBLE J: Power integrated over the window's sampled part.
-- @column mean_power_w DOUBLE W: energy_j / the covered time.
-- @column covered_pct DOUBLE %: How much of the window the samples cover.
WITH series AS (
  SELECT run_id, rank, min(name) AS series
  FROM counters
  WHERE regexp_matches(name, '(?i)power')
    AND (lower(unit) IN ('w', 'watt', 'watts')
         OR (unit IS NULL AND regexp_matches(name, '(?i)(watts?|_w|\.w|\(w\))$')))
  GROUP BY ALL
),
samples AS (
  SELECT c.run_id, c.rank, s.series, c.ts_ns, c.value,
    lead(c.ts_ns) OVER (PARTITION BY c.run_id, c.rank ORDER BY c.ts_ns, c.value) AS next_ns
  FROM counters c JOIN series s ON c.run_id = s.run_id AND c.rank IS NOT DISTINCT FROM s.rank AND c.name = s.series
  WHERE c.value >= 0 AND isfinite(c.value)  -- a negative or infinite power is not a reading
),
pieces AS (
  SELECT w.run_id, w.rank, w.step, p.series, w.step_ns,
    least(p.next_ns, w.step_end_ns) - greatest(p.ts_ns, w.step_start_ns) AS held_ns, p.value
  FROM step_window w
  JOIN samples p ON p.run_id = w.run_id AND p.rank = w.rank
    AND p.ts_ns < w.step_end_ns AND p.next_ns > w.step_start_ns
)
SELECT run_id, rank, step, any_value(series) AS series, any_value(step_ns) AS step_ns,
  sum(value * held_ns ORDER BY held_ns, value) * 1e-9 AS energy_j,
  sum(value * held_ns ORDER BY held_ns, value) / sum(held_ns) AS mean_power_w,
  100.0 * sum(held_ns) / any_value(step_ns) AS covered_pct
FROM pieces
GROUP BY run_id, rank, step
ORDER BY run_id, rank, step;
