-- Phases per rank and step: how much of each step window forward, backward, optimizer and other
-- work took on the GPU, and what each phase's compute and communication did there.
--
-- Phase of a piece of GPU work: the phase whose host work launched it (views/70_phases.sql:
-- optimizer = launched inside Optimizer.step# / Optimizer.zero_grad#, backward = inside an
-- autograd::engine::evaluate_function op or from an autograd thread, forward = before the step's
-- first backward op, other = the rest). Communication counts in the phase that launched it
-- (DDP's gradient all-reduce in backward, FSDP's all-gathers in forward).
-- Window: the step window of step_time.sql (views/25_step_window.sql), the one the verdict
-- divides by; work is cut at its edges (work launched in another step that runs inside this
-- window counts here, in its own phase). Only steps with phases (views/70_phases.sql
-- phase_steps: at least one backward op in the host window) get rows: four per step, one per
-- phase, zeros included; other steps are left out (abstention, never a guess).
-- Measures, per phase p, with C the rank's compute (every phase), and A_p, C_p, M_p, W_p the
-- phase's work, compute, communication transfer and communication waiting for peers
-- (views/44_comm_wait.sql):
--   gpu_busy_ns = |A_p|, compute_ns = |C_p|, comm_ns = |M_p ∪ W_p|,
--   exposed_comm_ns = |(M_p ∪ W_p) \ C| (no compute of any phase hides it), of which
--   exposed_comm_transfer_ns = |M_p \ C| and exposed_comm_wait_ns the rest (only the phase's
--   collectives waiting for peers), as step_time.sql splits the step's;
--   idle_ns: the window's idle time (no GPU work at all) attributed to the phase of the work that
--   ends the gap (the GPU was waiting for it; the earliest-launched when several start at once),
--   to other when the window ends first (work without a known launch only when nothing launched
--   starts then): summed over the four phases it is step_time's idle_ns.
-- phase_ns partitions the window: every busy instant goes to one phase, the first in the order
-- forward, backward, optimizer, other that has work of the instant's step_time category
-- (compute, else communication, else copies and unknown work), every idle instant as idle_ns
-- does; summed over the phases it is step_ns, and phase_pct = 100 * phase_ns / step_ns.
-- Phases can overlap on the GPU (backward compute under forward's collectives, streams), so
-- gpu_busy_ns summed over phases can exceed step_time's gpu_busy_ns; phase_ns never does.
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step.
-- @column phase VARCHAR: forward, backward, optimizer or other.
-- @column step_ns BIGINT ns: The step window's length (step_time.sql).
-- @column phase_ns BIGINT ns: The phase's share of the window (the partition above).
-- @column phase_pct DOUBLE %: 100 * phase_ns / step_ns.
-- @column activities BIGINT count: GPU activities of the phase starting in the window.
-- @column gpu_busy_ns BIGINT ns: |A_p| inside the window.
-- @column compute_ns BIGINT ns: |C_p| inside the window.
-- @column comm_ns BIGINT ns: |M_p ∪ W_p| inside the window.
-- @column exposed_comm_ns BIGINT ns: |(M_p ∪ W_p) \ C| inside the window.
-- @column exposed_comm_wait_ns BIGINT ns: Of it, waiting for peers.
-- @column exposed_comm_transfer_ns BIGINT ns: Of it, transfer (|M_p \ C|).
-- @column idle_ns BIGINT ns: The window's idle time attributed to the phase.
WITH win AS (
  SELECT w.run_id, w.rank, w.step, w.step_start_ns AS ws, w.step_end_ns AS we, w.step_ns
  FROM step_window w SEMI JOIN phase_steps p USING (run_id, rank, step)
),
bounds AS (  -- a dense integer per (run_id, rank): the sweep sorts on it, not on the strings
  SELECT *, (row_number() OVER (ORDER BY run_id, rank))::INT AS rr
  FROM (SELECT run_id, rank, min(ws) AS r0, max(we) AS r1 FROM win GROUP BY ALL)
),
-- each part with its phase index (0 forward, 1 backward, 2 optimizer, 3 other) and the bit field
-- of its category in that phase's packed count: 16 bits each for compute, transfer, waiting,
-- copies and unknown
work AS (
  SELECT b.rr, p.start_ns, p.end_ns, p.launch_ns, p.first_part,
    CASE coalesce(p.phase, 'other') WHEN 'forward' THEN 0 WHEN 'backward' THEN 1 WHEN 'optimizer' THEN 2 ELSE 3 END AS ph,
    CASE p.category WHEN 'compute' THEN 1 WHEN 'communication' THEN 65536 WHEN 'comm_wait' THEN 4294967296
      ELSE 281474976710656 END::BIGINT AS bit
  FROM phase_parts p JOIN bounds b ON b.run_id = p.run_id AND b.rank = p.rank
  WHERE p.end_ns > b.r0 AND p.start_ns < b.r1
),
wins AS (SELECT b.rr, w.step, w.ws, w.we FROM win w JOIN bounds b USING (run_id, rank)),
-- edges: work starts (o 0, ordered by launch, so the first start of an instant is the
-- earliest-launched; work without a known launch after every launched one) and ends (o 1) with the delta of their phase's packed count; window edges
-- (o 2 start, 3 end) carrying the step number
edges AS (
  SELECT rr, start_ns AS t, 0 AS o, launch_ns AS launch, ph,
    CASE ph WHEN 0 THEN bit ELSE 0 END AS d0, CASE ph WHEN 1 THEN bit ELSE 0 END AS d1,
    CASE ph WHEN 2 THEN bit ELSE 0 END AS d2, CASE ph WHEN 3 THEN bit ELSE 0 END AS d3, 0 AS dw, 0::BIGINT AS ds
  FROM work
  UNION ALL
  SELECT rr, end_ns, 1, NULL, NULL,
    CASE ph WHEN 0 THEN -bit ELSE 0 END, CASE ph WHEN 1 THEN -bit ELSE 0 END,
    CASE ph WHEN 2 THEN -bit ELSE 0 END, CASE ph WHEN 3 THEN -bit ELSE 0 END, 0, 0
  FROM work
  UNION ALL SELECT rr, ws, 2, NULL, NULL, 0, 0, 0, 0, 1, step FROM wins
  UNION ALL SELECT rr, we, 3, NULL, NULL, 0, 0, 0, 0, -1, -step FROM wins
),
-- one sort of all edges: the running sums are each rank's own (every rank's deltas sum to zero);
-- only the last edge of an instant carries a segment (to the next instant), with the counts
-- after every change there (each 16-bit field then >= 0); lead(ph) is then the first edge of
-- the next instant
sweep AS (
  SELECT * FROM (
    SELECT rr, sum(d0) OVER g AS n0, sum(d1) OVER g AS n1, sum(d2) OVER g AS n2, sum(d3) OVER g AS n3,
      sum(dw) OVER g AS inw, sum(ds) OVER g AS cur_step,
      coalesce(lead(t) OVER g, t) - t AS seg, lead(ph) OVER g AS next_ph
    FROM edges
    WINDOW g AS (ORDER BY rr, t, o, launch NULLS LAST ROWS UNBOUNDED PRECEDING))
  WHERE inw > 0 AND seg > 0
),
-- per segment, with nk phase k's packed count (bits 0-15 compute, 16-31 transfer, 32-47
-- waiting, 48-63 copies and unknown): the instant's category and the phase that owns it
seg AS (
  SELECT *, (n0 | n1 | n2 | n3) & 65535 > 0 AS any_c,
    ((n0 | n1 | n2 | n3) >> 16) & 4294967295 > 0 AS any_m, (n0 | n1 | n2 | n3) >> 48 > 0 AS any_o
  FROM sweep
),
owned AS (
  SELECT *, CASE
      WHEN any_c THEN CASE WHEN n0 & 65535 > 0 THEN 0 WHEN n1 & 65535 > 0 THEN 1 WHEN n2 & 65535 > 0 THEN 2 ELSE 3 END
      WHEN any_m THEN CASE WHEN (n0 >> 16) & 4294967295 > 0 THEN 0 WHEN (n1 >> 16) & 4294967295 > 0 THEN 1
                           WHEN (n2 >> 16) & 4294967295 > 0 THEN 2 ELSE 3 END
      WHEN any_o THEN CASE WHEN n0 >> 48 > 0 THEN 0 WHEN n1 >> 48 > 0 THEN 1 WHEN n2 >> 48 > 0 THEN 2 ELSE 3 END
      ELSE coalesce(next_ph, 3) END AS owner,
    NOT (any_c OR any_m OR any_o) AS idle
  FROM seg
),
-- every measure of every phase in one pass over the segments (phase_k, busy_k, ... for phase k),
-- then one row per phase (INCLUDE NULLS: a phase with some measures empty keeps the others)
wide AS (
  SELECT rr, cur_step AS step,
    sum(seg) FILTER (WHERE owner = 0)::BIGINT AS phase_0, sum(seg) FILTER (WHERE n0 <> 0)::BIGINT AS busy_0,
    sum(seg) FILTER (WHERE n0 & 65535 > 0)::BIGINT AS compute_0, sum(seg) FILTER (WHERE (n0 >> 16) & 4294967295 > 0)::BIGINT AS comm_0,
    sum(seg) FILTER (WHERE NOT any_c AND (n0 >> 16) & 4294967295 > 0)::BIGINT AS exposed_0,
    sum(seg) FILTER (WHERE NOT any_c AND (n0 >> 16) & 65535 > 0)::BIGINT AS transfer_0, sum(seg) FILTER (WHERE idle AND owner = 0)::BIGINT AS idle_0,
    sum(seg) FILTER (WHERE owner = 1)::BIGINT AS phase_1, sum(seg) FILTER (WHERE n1 <> 0)::BIGINT AS busy_1,
    sum(seg) FILTER (WHERE n1 & 65535 > 0)::BIGINT AS compute_1, sum(seg) FILTER (WHERE (n1 >> 16) & 4294967295 > 0)::BIGINT AS comm_1,
    sum(seg) FILTER (WHERE NOT any_c AND (n1 >> 16) & 4294967295 > 0)::BIGINT AS exposed_1,
    sum(seg) FILTER (WHERE NOT any_c AND (n1 >> 16) & 65535 > 0)::BIGINT AS transfer_1, sum(seg) FILTER (WHERE idle AND owner = 1)::BIGINT AS idle_1,
    sum(seg) FILTER (WHERE owner = 2)::BIGINT AS phase_2, sum(seg) FILTER (WHERE n2 <> 0)::BIGINT AS busy_2,
    sum(seg) FILTER (WHERE n2 & 65535 > 0)::BIGINT AS compute_2, sum(seg) FILTER (WHERE (n2 >> 16) & 4294967295 > 0)::BIGINT AS comm_2,
    sum(seg) FILTER (WHERE NOT any_c AND (n2 >> 16) & 4294967295 > 0)::BIGINT AS exposed_2,
    sum(seg) FILTER (WHERE NOT any_c AND (n2 >> 16) & 65535 > 0)::BIGINT AS transfer_2, sum(seg) FILTER (WHERE idle AND owner = 2)::BIGINT AS idle_2,
    sum(seg) FILTER (WHERE owner = 3)::BIGINT AS phase_3, sum(seg) FILTER (WHERE n3 <> 0)::BIGINT AS busy_3,
    sum(seg) FILTER (WHERE n3 & 65535 > 0)::BIGINT AS compute_3, sum(seg) FILTER (WHERE (n3 >> 16) & 4294967295 > 0)::BIGINT AS comm_3,
    sum(seg) FILTER (WHERE NOT any_c AND (n3 >> 16) & 4294967295 > 0)::BIGINT AS exposed_3,
    sum(seg) FILTER (WHERE NOT any_c AND (n3 >> 16) & 65535 > 0)::BIGINT AS transfer_3, sum(seg) FILTER (WHERE idle AND owner = 3)::BIGINT AS idle_3
  FROM owned GROUP BY ALL
),
agg AS (
  SELECT * FROM wide UNPIVOT INCLUDE NULLS (
    (phase_ns, gpu_busy_ns, compute_ns, comm_ns, exposed_comm_ns, exposed_comm_transfer_ns, idle_ns) FOR ph IN (
    (phase_0, busy_0, compute_0, comm_0, exposed_0, transfer_0, idle_0) AS '0',
    (phase_1, busy_1, compute_1, comm_1, exposed_1, transfer_1, idle_1) AS '1',
    (phase_2, busy_2, compute_2, comm_2, exposed_2, transfer_2, idle_2) AS '2',
    (phase_3, busy_3, compute_3, comm_3, exposed_3, transfer_3, idle_3) AS '3'))
),
-- activities of each phase starting in the window (the window holding its start)
counted AS (
  SELECT x.rr, w.step, x.ph, count(*) AS activities
  FROM work x ASOF JOIN wins w ON w.rr = x.rr AND w.ws <= x.start_ns
  WHERE x.first_part AND x.start_ns < w.we
  GROUP BY ALL
)
SELECT w.run_id, w.rank, w.step, ['forward', 'backward', 'optimizer', 'other'][p.ph + 1] AS phase, w.step_ns,
  coalesce(a.phase_ns, 0) AS phase_ns,
  CASE WHEN w.step_ns > 0 THEN 100.0 * coalesce(a.phase_ns, 0) / w.step_ns END AS phase_pct,
  coalesce(c.activities, 0) AS activities,
  coalesce(a.gpu_busy_ns, 0) AS gpu_busy_ns, coalesce(a.compute_ns, 0) AS compute_ns,
  coalesce(a.comm_ns, 0) AS comm_ns, coalesce(a.exposed_comm_ns, 0) AS exposed_comm_ns,
  coalesce(a.exposed_comm_ns, 0) - coalesce(a.exposed_comm_transfer_ns, 0) AS exposed_comm_wait_ns,
  coalesce(a.exposed_comm_transfer_ns, 0) AS exposed_comm_transfer_ns,
  coalesce(a.idle_ns, 0) AS idle_ns
FROM win w
JOIN bounds b USING (run_id, rank)
CROSS JOIN (SELECT unnest([0, 1, 2, 3]) AS ph) p
LEFT JOIN agg a ON a.rr = b.rr AND a.step = w.step AND a.ph::INT = p.ph
LEFT JOIN counted c ON c.rr = b.rr AND c.step = w.step AND c.ph = p.ph
ORDER BY w.run_id, w.rank, w.step, p.ph;
