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

-- nccl_family(format): whether a sources.format is an NCCL-family input (NCCL_DEBUG log, nccl-tests
-- output, watchdog, flight recorder, RAS, profiler plugin, torchfrtrace): such a file's world
-- size is its job's, which may not be the traced job's (pipeline/ingest/runs.py). Defined by
-- pipeline/query.py from pipeline/schema.py NCCL_FORMATS, the one list of those formats.

-- group_ranks(group_size, process_group, world_size): how many ranks a collective's group has:
-- its recorded group size, else the run's world size when the call names no process group (the
-- default group spans the world), else NULL. Used for busbw's n (collective_bandwidth.sql) and a
-- matched call's expected ranks (views/40_collective_calls.sql).
CREATE OR REPLACE MACRO group_ranks(group_size, process_group, world_size) AS
  coalesce(group_size, CASE WHEN process_group IS NULL THEN world_size END);

-- Interval sweeps (breakdown.sql, step_time.sql) carry the four GPU work categories' running
-- counts in two BIGINTs of two 32-bit fields: pack_compute_comm(category) is 1 for compute and
-- 2^32 for communication, pack_memory_unknown(category) 1 for memory and 2^32 for unknown (0
-- otherwise). A running sum of these deltas (+ at a start, - at an end) holds each category's
-- count in its field as long as no count is negative (starts sort before ends at an instant) or
-- reaches 2^31; lo32(s) and hi32(s) read the fields back.
CREATE OR REPLACE MACRO pack_compute_comm(category) AS
  CASE category WHEN 'compute' THEN 1 WHEN 'communication' THEN 4294967296 ELSE 0 END;
CREATE OR REPLACE MACRO pack_memory_unknown(category) AS
  CASE category WHEN 'memory' THEN 1 WHEN 'unknown' THEN 4294967296 ELSE 0 END;
-- A host event that is a DataLoader fetch: the names torch-tb-profiler counts as DataLoader
-- time (kineto tb_plugin torch_tb_profiler/profiler/event_parser.py _parse_step):
-- 'enumerate(DataLoader)#...__next__' and 'enumerate(DataPipe)#...'. The common prefix is tested
-- first: most names fail it at once (a scan of 20 M ops: 0.8 -> 0.1 CPU-s).
CREATE OR REPLACE MACRO is_data_loading(name) AS
  prefix(name, 'enumerate(Data') AND ((name LIKE 'enumerate(DataLoader)#%' AND name LIKE '%.\_\_next\_\_' ESCAPE '\') OR name LIKE 'enumerate(DataPipe)#%');
CREATE OR REPLACE MACRO lo32(s) AS s % 4294967296;
CREATE OR REPLACE MACRO hi32(s) AS s // 4294967296;
-- Two such running sums can travel as one HUGEINT, a + b * 2^64 (a window computes one running
-- sum instead of two: step_time.sql): lo64(h) and hi64(h) read them back, as BIGINTs, where
-- neither is negative and a is under 2^63.
CREATE OR REPLACE MACRO lo64(h) AS (h % 18446744073709551616)::BIGINT;
CREATE OR REPLACE MACRO hi64(h) AS (h // 18446744073709551616)::BIGINT;

-- "The latest earlier end" per stream or rank as one running max over a global order (a window
-- per partition is several times slower in DuckDB): keyed_ns(id, ns) puts the partition's dense
-- integer id in the high 64 bits of a HUGEINT and ns + 2^63 (never negative) in the low 64, so
-- max() over rows ordered by id keeps each partition's maximum its own; keyed_ns_value(k, id) is
-- that ns back, or NULL when k belongs to an earlier id (no earlier row in the partition).
CREATE OR REPLACE MACRO keyed_ns(id, ns) AS (id::HUGEINT << 64) + (ns::HUGEINT + 9223372036854775808);
CREATE OR REPLACE MACRO keyed_ns_value(k, id) AS
  CASE WHEN k >> 64 = id THEN ((k & 18446744073709551615) - 9223372036854775808)::BIGINT END;

-- The roofline (Williams, Waterman, Patterson, CACM 52(4), 2009), shared by
-- views/80_kernel_roofline.sql (per kernel) and roofline.sql (per kernel group):
-- intensity(flops, bytes) FLOP/byte, NULL without bytes; achieved_tflops(flops, dur_ns) TFLOP/s
-- and achieved_gbps(bytes, dur_ns) GB/s (1e9 B/s), NULL for a zero duration;
-- roof_tflops(intensity, peak_tflops, memory_gbps) = min(peak, intensity x bandwidth) TFLOP/s,
-- the peak when the intensity is unknown (a NULL peak or bandwidth leaves the other roof).
CREATE OR REPLACE MACRO intensity(flops, bytes) AS CASE WHEN bytes > 0 THEN flops / bytes END;
CREATE OR REPLACE MACRO achieved_tflops(flops, dur_ns) AS CASE WHEN dur_ns > 0 THEN flops / dur_ns / 1e3 END;
CREATE OR REPLACE MACRO achieved_gbps(bytes, dur_ns) AS CASE WHEN dur_ns > 0 THEN bytes / dur_ns END;
CREATE OR REPLACE MACRO roof_tflops(intensity, peak_tflops, memory_gbps) AS
  CASE WHEN intensity IS NULL THEN peak_tflops ELSE least(peak_tflops, intensity * memory_gbps / 1e3) END;
