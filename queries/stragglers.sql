-- Stragglers per step: the ranks that most often arrive last at a collective, and the wait they cause.
--
-- Definition: over the matched collectives of a step (views/40_collective_calls.sql), for each
-- straggler rank: times_last = number of calls it started last; caused_wait_ns = sum over those
-- calls of the other ranks' wait (duration - transfer). Only consistent calls (seen on at least
-- two ranks, agreeing on op and size, kernels overlapping in time: views/40_collective_calls.sql);
-- for the others arrival order says nothing.
-- A call where two or more ranks share the latest start has no straggler (straggler_rank NULL):
-- its waits are real but caused by no single rank, so it gives no row (no rank is charged with
-- it), yet it counts in `calls`.
-- @column run_id VARCHAR: Run.
-- @column step BIGINT: Step (NULL: outside steps).
-- @column straggler_rank INTEGER: The rank that started last (never NULL).
-- @column times_last BIGINT count: Calls it started last.
-- @column calls BIGINT count: Consistent calls in the step, tied ones included.
-- @column caused_wait_ns BIGINT ns: The other ranks' wait in its times_last calls.
-- @column complete_calls BIGINT count: Of its times_last calls, the complete ones.
WITH waits AS (
  SELECT r.run_id, r.pg_key, r.call_key, sum(r.dur_ns - k.transfer_ns) FILTER (WHERE r.rank <> k.straggler_rank) AS others_wait
  FROM collective_ranks r JOIN collective_calls k USING (run_id, pg_key, call_key)
  GROUP BY ALL
),
calls AS (
  SELECT k.*, w.others_wait FROM collective_calls k JOIN waits w USING (run_id, pg_key, call_key) WHERE k.consistent
)
SELECT run_id, step, straggler_rank, count(*) AS times_last,
  any_value(n_calls) AS calls, sum(others_wait)::BIGINT AS caused_wait_ns, sum(complete::INT)::BIGINT AS complete_calls
FROM (SELECT *, count(*) OVER (PARTITION BY run_id, step) AS n_calls FROM calls)
WHERE straggler_rank IS NOT NULL  -- after the window: tied calls count in n_calls
GROUP BY ALL
ORDER BY run_id, step, caused_wait_ns DESC, straggler_rank;
