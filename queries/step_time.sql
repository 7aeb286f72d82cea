-- Step time per rank and step: where each step's wall-clock time went on the GPU.
--
-- Step window: views/25_step_window.sql (torch-tb-profiler's step time: the host ProfilerStep
-- window, started no earlier than the previous step's end and stretched to the end of the GPU
-- work launched in it), the window every per-step metric divides by.
-- Only ranks with GPU work in scope get rows (a CPU-only trace has no GPU time to divide).
--
-- Breakdown: the rank's GPU work (scope: every device and stream of the rank merged) is cut at
-- the window edges and every instant of the window goes to the first active of compute >
-- communication > memory > unknown > idle (torch-tb-profiler / TraceLens gpu_timeline priority,
-- ../shared/reference/peers.md section 4.1), so
--   compute_ns + exposed_comm_ns + exposed_memory_ns + exposed_unknown_ns + idle_ns = step_ns;
-- exposed communication is split into waiting for peers and transfer (views/44_comm_wait.sql;
-- an instant where some collective transfers is transfer), exposed_comm_wait_ns +
-- exposed_comm_transfer_ns = exposed_comm_ns.
-- Idle by cause (the parts sum to idle_ns), the first that applies:
--   idle_input_ns      the host was inside a DataLoader fetch (a cpu_ops event named
--                      'enumerate(DataLoader)#...__next__' or 'enumerate(DataPipe)#...', the names
--                      torch-tb-profiler counts as DataLoader time: is_data_loading,
--                      views/05_macros.sql);
--   idle_unreliable_ns the work ending the gap is a CUDA/HIP graph replay (no per-kernel launch);
--   idle_host_wait_ns  everything ending the gap was launched after the GPU drained, or no more
--                      work was launched before the window ended (HTA's host-wait rule applied to
--                      the device, as in breakdown.sql);
--   idle_kernel_wait_ns the gap is shorter than kernel_wait_threshold_ns (default 30 µs);
--   idle_other_ns      the rest (work was queued but waited: events, cross-stream dependencies).
-- @column run_id VARCHAR: Run.
-- @column rank INTEGER: Rank.
-- @column step BIGINT: Step.
-- @column step_start_ns BIGINT ns: The step window's start (absolute clock).
-- @column step_end_ns BIGINT ns: The step window's end.
-- @column step_ns BIGINT ns: Its length.
-- @column host_start_ns BIGINT ns: The host ProfilerStep window's start.
-- @column host_end_ns BIGINT ns: The host ProfilerStep window's end.
-- @column host_step_ns BIGINT ns: Its length.
-- @column activities BIGINT count: GPU activities launched inside the host window.
-- @column gpu_span_ns BIGINT ns: First start to last end of the GPU work launched in the host window
--   (views/25_step_window.sql; NULL: none), a named extra, never a denominator.
-- @column gpu_busy_ns BIGINT ns: Union of the GPU work inside the window.
-- @column compute_ns BIGINT ns: Union of compute inside the window.
-- @column comm_ns BIGINT ns: Union of communication inside the window.
-- @column memory_ns BIGINT ns: Union of copies and memsets inside the window.
-- @column overlap_ns BIGINT ns: compute ∩ comm.
-- @column exposed_comm_ns BIGINT ns: comm \ compute.
-- @column exposed_comm_wait_ns BIGINT ns: Of it, waiting for peers.
-- @column exposed_comm_transfer_ns BIGINT ns: Of it, transfer.
-- @column exposed_memory_ns BIGINT ns: Copies under neither compute nor communication.
-- @column exposed_unknown_ns BIGINT ns: Unknown work under nothing else.
-- @column idle_ns BIGINT ns: No GPU work at all.
-- @column idle_input_ns BIGINT ns: Idle while the host was inside a DataLoader fetch.
-- @column idle_unreliable_ns BIGINT ns: Idle ended by a graph replay.
-- @column idle_host_wait_ns BIGINT ns: Idle the host was late for.
-- @column idle_kernel_wait_ns BIGINT ns: Idle gaps shorter than kernel_wait_threshold_ns.
-- @column idle_other_ns BIGINT ns: The rest of the idle time.
WITH win AS (
  SELECT *, step_start_ns AS ws, step_end_ns AS we FROM step_window
),
-- rr: a dense integer per (run_id, rank), which the sweep sorts on instead of the strings
bounds AS (
  SELECT *, (row_number() OVER (ORDER BY run_id, rank))::INT AS rr
  FROM (SELECT run_id, rank, min(ws) AS r0, max(we) AS r1 FROM win GROUP BY ALL)
),
work AS (
  SELECT b.rr, s.start_ns, s.end_ns, s.launch_ns, s.graph_replay AS graph,
         -- the category counts travel packed: compute and communication (transfer) in c0,
         -- memory and unknown in c1 (views/05_macros.sql), communication waiting for peers in c2
         pack_compute_comm(s.category) AS c0, pack_memory_unknown(s.category) AS c1, (s.category = 'comm_wait')::BIGINT AS c2
  FROM scope_parts s JOIN bounds b ON s.run_id = b.run_id AND s.rank = b.rank AND s.end_ns > b.r0 AND s.start_ns < b.r1
),
loader_ev AS (
  SELECT b.rr, c.start_ns, c.end_ns FROM cpu_ops c JOIN bounds b ON b.run_id = c.run_id AND b.rank = c.rank
  WHERE c.end_ns > c.start_ns
    AND is_data_loading(c.name)
),
wins AS (SELECT b.rr, w.step, w.ws, w.we FROM win w JOIN bounds b USING (run_id, rank)),
-- One sweep per rank over every instant where something changes, as edges with deltas:
--   work starts/ends (c0, c1, c2: active compute, communication transfer, memory, unknown work,
--   communication waiting for peers),
--   the sentinels r1 and r0 (so the sweep covers every window even before the first and after
--   the last work), step window edges (inside a window; ds: that window's step number, windows
--   never overlap), DataLoader fetch edges.
-- Work edges and sentinels are the sweep's points; an idle gap runs from one point to the next,
-- and window and DataLoader edges only cut it into pieces.
-- q packs three running counts into 32 + 8 + 24 bits: the points so far (gap_id, which numbers
-- the points: the segments from one point to the next share it), inside a window (0 or 1) and
-- inside a DataLoader fetch; no field is ever negative, since the cutting edges that add sort
-- before those that remove at an instant.
-- o orders the edges of one instant: work starts first (o = 0 for a graph replay, so the first
-- start carries one if any does, else 1 ordered by launch: the smallest, NULL if any launch is
-- unknown), ends (2), r1 (3), r0 (4), then the cutting edges (5 that add, 6 that remove).
edges AS (
  SELECT rr, start_ns AS t, CASE WHEN graph THEN 0 ELSE 1 END AS o, c0, c1, c2, 1 AS q, 0::BIGINT AS ds, launch_ns AS launch
  FROM work
  UNION ALL SELECT rr, end_ns, 2, -c0, -c1, -c2, 1, 0, NULL FROM work
  UNION ALL SELECT rr, r1, 3, 0, 0, 0, 1, 0, NULL FROM bounds
  UNION ALL SELECT rr, r0, 4, 0, 0, 0, 1, 0, NULL FROM bounds
  UNION ALL SELECT rr, ws, 5, 0, 0, 0, 4294967296, step, NULL FROM wins
  UNION ALL SELECT rr, we, 6, 0, 0, 0, -4294967296, -step, NULL FROM wins
  UNION ALL SELECT rr, start_ns, 5, 0, 0, 0, 1099511627776, 0, NULL FROM loader_ev
  UNION ALL SELECT rr, end_ns, 6, 0, 0, 0, -1099511627776, 0, NULL FROM loader_ev
),
-- The running sums of one sort of all edges in (rr, t) order (every rank's deltas sum to zero,
-- so they are the rank's own; gap_id counts on across ranks), computed a bucket at a time so
-- that memory does not grow with the rank's work (issue 40: one window over every edge of a
-- 3.5 M-kernel rank needed 0.6-1 GB and cannot spill): a rank's timeline is cut into buckets of
-- about getvariable('sweep_bucket_rows') (default 262,144) work intervals each (b, by time: the
-- buckets follow the sort order), each bucket is swept in a window partition of its own, and
-- each bucket's sums start from the sums of every bucket before it (boff). Edges at one
-- instant leave zero-length segments between them, so only the last edge of an instant carries
-- a segment, with the counts after every change there; its lead() is the first edge of the next
-- instant, for a bucket's last edge the first edge of the next bucket (bnext). A segment running
-- from a rank's last edge into the next rank has nothing active and lies outside every window,
-- so it is never counted.
width AS (
  SELECT b.rr, b.r0, greatest(1, floor((b.r1 - b.r0)::DOUBLE * coalesce(getvariable('sweep_bucket_rows'), 262144)
    / greatest(1, coalesce(w.n, 0))))::BIGINT AS bw
  FROM bounds b LEFT JOIN (SELECT rr, count(*) AS n FROM work GROUP BY rr) w USING (rr)
),
bucketed AS (
  SELECT e.*, greatest(e.t - w.r0, 0) // w.bw AS b,
    -- the sweep's order after t as one BIGINT (DuckDB 2.0's window sorted 600k edges on (t, ok)
    -- in 0.13 s, on (t, o, launch) in 0.22 s): o in the top bits, then the launch, NULL first;
    -- only starts at one instant are told apart by it, so it is taken relative to t and held
    -- within +-2^59 ns (18 years: a launch further away is garbage, and on the same side of every
    -- gap start either way)
    o * 1152921504606846976 + CASE WHEN e.launch IS NULL THEN 0
      ELSE greatest(1, least(1152921504606846975, e.launch::HUGEINT - e.t + 576460752303423488))::BIGINT END AS ok,
    -- c0 and c1, and q and c2, summed as one HUGEINT each (the low 64 bits and the high 64): one
    -- running sum in the window instead of two (sweep below reads them back)
    c0::HUGEINT + c1::HUGEINT * 18446744073709551616 AS h01,
    q::HUGEINT + c2::HUGEINT * 18446744073709551616 AS hq2
  FROM edges e JOIN width w USING (rr)
),
bsum AS (
  SELECT rr, b, sum(c0) AS c0, sum(c1) AS c1, sum(c2) AS c2, sum(q) AS q, sum(ds) AS ds FROM bucketed GROUP BY ALL
),
boff AS (
  SELECT rr, b, coalesce(sum(c0) OVER p, 0) + coalesce(sum(c1) OVER p, 0) * 18446744073709551616 AS o01,
    coalesce(sum(q) OVER p, 0) + coalesce(sum(c2) OVER p, 0) * 18446744073709551616 AS oq2,
    coalesce(sum(ds) OVER p, 0) AS ods
  FROM bsum WINDOW p AS (ORDER BY rr, b ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
swept AS (
  SELECT rr, b, t, o, sum(h01) OVER g AS h01, sum(hq2) OVER g AS hq2, sum(ds) OVER g AS cur_step,
    lead(t) OVER g AS nt, lead(o) OVER g AS no, lead(launch) OVER g AS nl, launch, row_number() OVER g = 1 AS first_row
  FROM bucketed
  WINDOW g AS (PARTITION BY rr, b ORDER BY t, ok ROWS UNBOUNDED PRECEDING)
),
bnext AS (  -- the first edge of the next bucket
  SELECT rr, b, lead(t) OVER n AS bt, lead(o) OVER n AS bo, lead(launch) OVER n AS bl
  FROM swept WHERE first_row WINDOW n AS (ORDER BY rr, b)
),
sweep AS (
  SELECT rr, t, o <= 4 AS pt, seg, next_o, next_launch,
    s0 = 0 AND s1 = 0 AND s2 = 0 AS idle, lo32(s0) > 0 AS c, hi32(s0) > 0 AS m, s2 > 0 AS wt, lo32(s1) > 0 AS y,
    hi32(s1) > 0 AS u, lo32(q) AS gap_id, q // 4294967296 % 256 > 0 AS inw, q // 1099511627776 > 0 AS inl, cur_step
  FROM (
    SELECT s.rr, s.t, s.o, lo64(s.h01 + f.o01) AS s0, hi64(s.h01 + f.o01) AS s1, hi64(s.hq2 + f.oq2) AS s2,
      lo64(s.hq2 + f.oq2) AS q, s.cur_step + f.ods AS cur_step,
      CASE WHEN s.nt IS NULL THEN coalesce(n.bt, s.t) ELSE s.nt END - s.t AS seg,
      CASE WHEN s.nt IS NULL THEN n.bo ELSE s.no END AS next_o,
      CASE WHEN s.nt IS NULL THEN n.bl ELSE s.nl END AS next_launch
    FROM swept s JOIN boff f USING (rr, b) JOIN bnext n USING (rr, b))
),
-- idle pieces inside a window, each with its gap: start g0, length glen, and the first edge at
-- its end (next_o, next_launch)
idle_fast AS (  -- pieces that are a whole gap: from one point straight to the next (nearly all)
  SELECT rr, cur_step, inl, seg, t AS g0, seg AS glen, next_o, next_launch
  FROM sweep WHERE idle AND seg > 0 AND inw AND pt AND next_o <= 4
),
cut AS (  -- gaps a window or DataLoader edge cuts (a few per step)
  SELECT DISTINCT rr, gap_id FROM sweep WHERE NOT pt AND idle
),
cut_rows AS (
  SELECT s.* FROM sweep s SEMI JOIN cut c ON c.rr = s.rr AND c.gap_id = s.gap_id
  WHERE s.idle
),
cut_gaps AS (
  SELECT g.rr, g.gap_id, g.g0, g.glen, e.next_o, e.next_launch
  FROM (SELECT rr, gap_id, min(t) AS g0, sum(seg) AS glen FROM cut_rows GROUP BY ALL) g
  -- the first edge at the gap's end is what the gap's last row sees with lead()
  JOIN (SELECT rr, gap_id, arg_max(next_o, t) AS next_o, arg_max(next_launch, t) AS next_launch
        FROM cut_rows WHERE seg > 0 GROUP BY ALL) e
    ON e.rr = g.rr AND e.gap_id = g.gap_id
),
-- the cause of a gap: work starting at its end (graph replay; else host wait when launched after
-- g0); none, at r1: no more work was launched before the windows ended (host wait); else kernel
-- wait if short, else other
idle_pieces AS (
  SELECT rr, cur_step, inl, seg, CASE
      WHEN next_o = 0 THEN 'unreliable'
      WHEN CASE next_o WHEN 1 THEN next_launch WHEN 3 THEN 9223372036854775807 END > g0 THEN 'host_wait'
      WHEN glen < coalesce(getvariable('kernel_wait_threshold_ns'), 30000) THEN 'kernel_wait'
      ELSE 'other' END AS part
  FROM (
    SELECT * FROM idle_fast
    UNION ALL
    SELECT r.rr, r.cur_step, r.inl, r.seg, c.g0, c.glen, c.next_o, c.next_launch
    FROM cut_rows r JOIN cut_gaps c ON c.rr = r.rr AND c.gap_id = r.gap_id
    WHERE r.seg > 0 AND r.inw)
),
-- the sweep's segments inside a step window
pieces AS (SELECT * FROM sweep WHERE inw AND seg > 0),
agg AS (
  SELECT rr, cur_step AS step,
    sum(seg) FILTER (WHERE NOT idle)::BIGINT AS gpu_busy_ns,
    sum(seg) FILTER (WHERE c)::BIGINT AS compute_ns,
    sum(seg) FILTER (WHERE m OR wt)::BIGINT AS comm_ns,
    sum(seg) FILTER (WHERE y)::BIGINT AS memory_ns,  -- copies under compute or communication too
    sum(seg) FILTER (WHERE c AND (m OR wt))::BIGINT AS overlap_ns,
    sum(seg) FILTER (WHERE NOT c AND (m OR wt))::BIGINT AS exposed_comm_ns,
    sum(seg) FILTER (WHERE NOT c AND NOT m AND wt)::BIGINT AS exposed_comm_wait_ns,
    sum(seg) FILTER (WHERE NOT c AND m)::BIGINT AS exposed_comm_transfer_ns,
    sum(seg) FILTER (WHERE NOT c AND NOT m AND NOT wt AND y)::BIGINT AS exposed_memory_ns,
    sum(seg) FILTER (WHERE NOT c AND NOT m AND NOT wt AND NOT y AND u)::BIGINT AS exposed_unknown_ns
  FROM pieces GROUP BY ALL
),
idle_agg AS (
  SELECT rr, cur_step AS step,
    sum(seg) FILTER (WHERE inl)::BIGINT AS idle_input_ns,
    sum(seg) FILTER (WHERE NOT inl AND part = 'unreliable')::BIGINT AS idle_unreliable_ns,
    sum(seg) FILTER (WHERE NOT inl AND part = 'host_wait')::BIGINT AS idle_host_wait_ns,
    sum(seg) FILTER (WHERE NOT inl AND part = 'kernel_wait')::BIGINT AS idle_kernel_wait_ns,
    sum(seg) FILTER (WHERE NOT inl AND part = 'other')::BIGINT AS idle_other_ns
  FROM idle_pieces GROUP BY ALL
)
SELECT w.run_id, w.rank, w.step,
  w.ws AS step_start_ns, w.we AS step_end_ns, w.we - w.ws AS step_ns,
  w.host_start_ns, w.host_end_ns, w.host_step_ns, w.activities, w.gpu_span_ns,
  coalesce(a.gpu_busy_ns, 0) AS gpu_busy_ns, coalesce(a.compute_ns, 0) AS compute_ns, coalesce(a.comm_ns, 0) AS comm_ns,
  coalesce(a.memory_ns, 0) AS memory_ns, coalesce(a.overlap_ns, 0) AS overlap_ns,
  coalesce(a.exposed_comm_ns, 0) AS exposed_comm_ns, coalesce(a.exposed_comm_wait_ns, 0) AS exposed_comm_wait_ns,
  coalesce(a.exposed_comm_transfer_ns, 0) AS exposed_comm_transfer_ns, coalesce(a.exposed_memory_ns, 0) AS exposed_memory_ns,
  coalesce(a.exposed_unknown_ns, 0) AS exposed_unknown_ns,
  (w.we - w.ws) - coalesce(a.gpu_busy_ns, 0) AS idle_ns,
  coalesce(i.idle_input_ns, 0) AS idle_input_ns, coalesce(i.idle_unreliable_ns, 0) AS idle_unreliable_ns,
  coalesce(i.idle_host_wait_ns, 0) AS idle_host_wait_ns, coalesce(i.idle_kernel_wait_ns, 0) AS idle_kernel_wait_ns,
  coalesce(i.idle_other_ns, 0) AS idle_other_ns
FROM win w
JOIN bounds b USING (run_id, rank)
LEFT JOIN agg a ON a.rr = b.rr AND a.step = w.step
LEFT JOIN idle_agg i ON i.rr = b.rr AND i.step = w.step
ORDER BY w.run_id, w.rank, w.step;
