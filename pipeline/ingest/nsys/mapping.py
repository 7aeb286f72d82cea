"""Staging -> schema v3: the mapping SQL that streams the lake tables out of the DuckDB staging
database (GPU_SQL, CPU_SQL, NVTX_SQL, COUNTER_SQL), FLOPs of PyTorch NVTX op ranges (_op_flops),
and the collectives rows built from the communication kernels (_collectives). Used by
Export.tables()."""

from __future__ import annotations

import polars as pl

from ... import catalog
from ...flops import MODELLED_OPS, op_flops
from ...ncclname import kernel_meta

_GP = "coalesce(g.globalPid, getvariable('single_gp'))"
GPU_SQL = f"""
WITH g AS (
  SELECT 'kernel' AS kind, k.start, k."end", k.deviceId, k.streamId, k.contextId, k.correlationId,
         k.globalPid, coalesce(d.value, s.value, '[unnamed kernel]') AS name,
         k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, k.registersPerThread,
         k.staticSharedMemory + coalesce(k.dynamicSharedMemory, 0) AS shared_memory_bytes,
         NULL::BIGINT AS bytes, NULL::VARCHAR AS copy_kind, NULL::VARCHAR AS src_kind,
         NULL::VARCHAR AS dst_kind, NULL::VARCHAR AS sync_kind, k.graphId AS graph_id, k.rowid AS idx
  FROM kernel k LEFT JOIN strings d ON d.id = k.demangledName LEFT JOIN strings s ON s.id = k.shortName
  UNION ALL BY NAME
  SELECT 'memcpy' AS kind, m.start, m."end", m.deviceId, m.streamId, m.contextId, m.correlationId,
         m.globalPid,
         'Memcpy ' || coalesce(ck.label, 'Unknown') || ' (' || coalesce(sk.label, 'Unknown') || ' -> '
           || coalesce(dk.label, 'Unknown') || ')' AS name,
         m.bytes, ck.label AS copy_kind, sk.label AS src_kind, dk.label AS dst_kind,
         m.rowid + (SELECT count(*) FROM kernel) AS idx
  FROM memcpy m LEFT JOIN copy_kinds ck ON ck.id = m.copyKind LEFT JOIN mem_kinds sk ON sk.id = m.srcKind
  LEFT JOIN mem_kinds dk ON dk.id = m.dstKind
  UNION ALL BY NAME
  SELECT 'memset' AS kind, m.start, m."end", m.deviceId, m.streamId, m.contextId, m.correlationId,
         m.globalPid, 'Memset (' || coalesce(mk.label, 'Unknown') || ')' AS name, m.bytes,
         mk.label AS dst_kind, m.rowid + (SELECT count(*) FROM kernel) + (SELECT count(*) FROM memcpy) AS idx
  FROM memset m LEFT JOIN mem_kinds mk ON mk.id = m.memKind
  UNION ALL BY NAME
  SELECT 'sync' AS kind, y.start, y."end", y.deviceId, y.streamId, y.contextId, y.correlationId, y.globalPid,
         coalesce(st.label, 'Unknown Sync') AS name, st.sync_kind,
         y.rowid + (SELECT count(*) FROM kernel) + (SELECT count(*) FROM memcpy)
           + (SELECT count(*) FROM memset) AS idx
  FROM sync y LEFT JOIN sync_types st ON st.id = y.syncType
)
SELECT r.rank, g.deviceId::INTEGER AS device, g.streamId AS stream, g.kind, g.name,
       g.start + getvariable('base_ns') AS start_ns,
       g.start + getvariable('base_ns') + greatest(g."end" - g.start, 0) AS end_ns,
       greatest(g."end" - g.start, 0) AS dur_ns, g.correlationId AS correlation, g.contextId AS context,
       g.gridX::INTEGER AS grid_x, g.gridY::INTEGER AS grid_y,
       g.gridZ::INTEGER AS grid_z, g.blockX::INTEGER AS block_x,
       g.blockY::INTEGER AS block_y, g.blockZ::INTEGER AS block_z,
       g.registersPerThread::INTEGER AS registers_per_thread, g.shared_memory_bytes, g.bytes,
       g.copy_kind,
       g.src_kind, g.dst_kind, g.sync_kind, g.graph_id, ({_GP} >> 24) & 16777215 AS pid,
       NULL::BIGINT AS tid, g.idx AS event_index, c.gp IS NOT NULL AS comm_launch
FROM g JOIN rank_map r ON r.gp = {_GP}
LEFT JOIN comm_launch c ON c.gp = {_GP} AND c.correlationId = g.correlationId
WHERE g.start IS NOT NULL
ORDER BY r.rank, start_ns, event_index
"""

CPU_SQL = r"""
SELECT m.rank, (rt.globalTid >> 24) & 16777215 AS pid, rt.globalTid & 16777215 AS tid,
       CASE WHEN rt.eventClass IN (SELECT unnest(getvariable('driver_classes'))) THEN 'driver'
            ELSE 'runtime' END AS kind,
       'CUPTI_ACTIVITY_KIND_RUNTIME' AS category,
       regexp_replace(coalesce(s.value, '[unnamed call]'), '_v\d{4,5}$', '') AS name,
       rt.start + getvariable('base_ns') AS start_ns,
       rt.start + getvariable('base_ns') + greatest(rt."end" - rt.start, 0) AS end_ns,
       greatest(rt."end" - rt.start, 0) AS dur_ns, rt.correlationId AS correlation,
       NULL::BIGINT AS sequence_number, NULL::VARCHAR AS input_dims, rt.rowid AS event_index
FROM runtime rt JOIN rank_map m ON m.gp = rt.globalTid & ~16777215 LEFT JOIN strings s ON s.id = rt.nameId
WHERE rt.start IS NOT NULL
UNION ALL BY NAME
SELECT m.rank, (n.globalTid >> 24) & 16777215 AS pid, n.globalTid & 16777215 AS tid, 'op' AS kind,
       'NVTX_EVENTS' AS category,
       regexp_extract(n.text, '^([A-Za-z_][\w.]*::[\w.]+)', 1) AS name,
       n.start + getvariable('base_ns') AS start_ns,
       n.start + getvariable('base_ns') + greatest(n."end" - n.start, 0) AS end_ns,
       greatest(n."end" - n.start, 0) AS dur_ns, NULL::BIGINT AS correlation,
       TRY_CAST(nullif(regexp_extract(n.text, ',\s*seq\s*=\s*(\d+)', 1), '') AS BIGINT) AS sequence_number,
       nullif(regexp_extract(n.text, ',\s*sizes\s*=\s*(\[.*?\]\])', 1), '') AS input_dims,
       n.rowid + (SELECT count(*) FROM runtime) AS event_index
FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215
WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND coalesce(n.domainId, 0) = 0
  AND n."end" IS NOT NULL AND regexp_matches(n.text, '^[A-Za-z_][\w.]*::[\w.]+(,|$)')
UNION ALL BY NAME
-- the step's phase markers under torch.autograd.profiler.emit_nvtx (queries/views/70_phases.sql):
-- the autograd engine's evaluate_function ranges (an op, as Kineto records them) and
-- torch.optim's Optimizer.step# / zero_grad# record_function ranges (an annotation), their
-- names up to emit_nvtx's ", seq = N, op_id = M" suffix
SELECT m.rank, (n.globalTid >> 24) & 16777215 AS pid, n.globalTid & 16777215 AS tid,
       CASE WHEN n.text LIKE 'autograd::%' THEN 'op' ELSE 'annotation' END AS kind,
       'NVTX_EVENTS' AS category,
       regexp_extract(
         n.text, '^(autograd::engine::evaluate_function: [^,]+|Optimizer\.(?:step|zero_grad)#[^,]+)', 1
       ) AS name,
       n.start + getvariable('base_ns') AS start_ns,
       n.start + getvariable('base_ns') + greatest(n."end" - n.start, 0) AS end_ns,
       greatest(n."end" - n.start, 0) AS dur_ns, NULL::BIGINT AS correlation,
       NULL::BIGINT AS sequence_number, NULL::VARCHAR AS input_dims,
       n.rowid + (SELECT count(*) FROM runtime) AS event_index
FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215
WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND coalesce(n.domainId, 0) = 0
  AND n."end" IS NOT NULL
  AND regexp_matches(n.text, '^(autograd::engine::evaluate_function: [^,]|Optimizer\.(step|zero_grad)#)')
ORDER BY rank, start_ns, event_index
"""

NVTX_SQL = """
SELECT m.rank, 'nvtx' AS kind,
       CASE WHEN coalesce(n.domainId, 0) = 0 THEN NULL
            ELSE coalesce(d.domain, 'domain ' || n.domainId) END AS domain,
       coalesce(n.text, s.value, '') AS name, n.start + getvariable('base_ns') AS start_ns,
       coalesce(n."end", n.start) + getvariable('base_ns') AS end_ns, NULL::INTEGER AS device,
       NULL::BIGINT AS stream, (n.globalTid >> 24) & 16777215 AS pid, n.globalTid & 16777215 AS tid
FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215
LEFT JOIN strings s ON s.id = n.textId LEFT JOIN domains d ON d.domainId = n.domainId
WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_ranges'))) AND n.start IS NOT NULL
ORDER BY m.rank, start_ns
"""

# GPU metric samples: GPU = typeId & 0xFF (Analysis Guide, nvlink_sum recipe); metric names carry
# their unit in brackets ("SM Active [Throughput %]").
COUNTER_SQL = r"""
SELECT u.rank, (g.typeId & 255)::INTEGER AS device, coalesce(n.metricName, 'metric ' || g.metricId) AS name,
       nullif(regexp_extract(n.metricName, '\[(?:Throughput )?([^\]]*)\]\s*$', 1), '') AS unit,
       g.timestamp + getvariable('base_ns') AS ts_ns, g.value
FROM gpu_metrics g LEFT JOIN gpu_metric_names n ON n.typeId = g.typeId AND n.metricId = g.metricId
LEFT JOIN (SELECT device, min(rank) AS rank FROM gpu_device_rank GROUP BY ALL) u
  ON u.device = (g.typeId & 255)
WHERE g.timestamp IS NOT NULL AND g.value IS NOT NULL
ORDER BY device, ts_ns
"""


def _op_flops(df: pl.DataFrame) -> pl.DataFrame:
    """FLOPs of PyTorch NVTX op ranges whose text carries `sizes = [...]` (emit_nvtx(record_shapes=True))."""
    flops = [None] * df.height
    src = [None] * df.height
    cand = df.with_row_index("_i").filter(
        pl.col("input_dims").is_not_null() & pl.col("name").is_in(list(MODELLED_OPS))
    )
    for i, name, dims in zip(cand["_i"], cand["name"], cand["input_dims"]):
        v, _ = op_flops(name, dims, None)
        if v is not None:
            flops[i], src[i] = v, "shapes"
    return df.with_columns(
        flops=pl.Series(flops, dtype=pl.Float64), flops_source=pl.Series(src, dtype=pl.String)
    )


_COLL_SCHEMA = {
    "rank": pl.Int32,
    "op": pl.String,
    "op_raw": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "timing_source": pl.String,
    "device": pl.Int32,
    "stream": pl.Int64,
    "correlation": pl.Int64,
    "dtype": pl.String,
    "dtype_bytes": pl.Int32,
    "msg_bytes": pl.Int64,
    "msg_bytes_note": pl.String,
    "reduction": pl.String,
    "algorithm": pl.String,
    "protocol": pl.String,
    "comm_id": pl.String,
    "group_size": pl.Int32,
}


_COMM_COLS = ["rank", "name", "start_ns", "end_ns", "dur_ns", "device", "stream", "correlation"]


def _collectives(comm_rows: list[dict], con) -> pl.DataFrame:
    """One collectives row per communication kernel; op/reduction/dtype/algorithm/protocol from
    its name (ncclname.kernel_meta). Message size, communicator and group size from the NCCL NVTX
    payload of the API call that launched the kernel (launch_payload) when the export carries
    payload blobs; nccl-tests' S is the payload's bytes, times the group size for all_gather and
    reduce_scatter (NCCL passes "the size of one message", sendcount / recvcount x type size:
    src/collectives.cc). Otherwise msg_bytes is null with the reason."""
    if not comm_rows:
        return pl.DataFrame(schema=_COLL_SCHEMA)
    payload = {
        (r, c): (b, comm, n)
        for r, c, b, comm, n in con.execute(
            "SELECT rank, correlation, bytes, comm_id, nranks FROM launch_payload"
        ).fetchall()
    }
    n_payloads = con.execute("SELECT count(*) FROM nccl_payload").fetchone()[0]
    has_nccl_nvtx = con.execute("SELECT count(*) FROM domains WHERE domain = 'NCCL'").fetchone()[0] > 0
    note = (
        "message size not in the export: the kernel was not launched inside an NCCL API range with a payload "
        "(grouped calls launch in ncclGroupEnd)"
        if n_payloads
        else (
            "message size not in the export: NCCL NVTX ranges without payload blobs "
            "(export with --include-blobs=true)"
        )
        if has_nccl_nvtx
        else "message size not in the export: no NCCL NVTX ranges (kernel name only)"
    )
    rows = []
    for r in comm_rows:
        km = kernel_meta(r["name"])
        op = catalog.normalize_op(km["op"] or r["name"])
        b, comm, n = payload.get((r["rank"], r["correlation"]), (None, None, None))
        msg = b * n if b is not None and n and op in ("all_gather", "reduce_scatter") else b
        if b is not None and op in ("all_gather", "reduce_scatter") and not n:
            msg = None
        rows.append(
            {
                **r,
                "op": op,
                "op_raw": r.pop("name"),
                "timing_source": "gpu_kernel",
                "dtype": km["dtype"],
                "dtype_bytes": catalog.dtype_bytes(km["dtype"]),
                "msg_bytes": msg,
                "msg_bytes_note": None
                if msg is not None
                else ("group size unknown: the payload gives one rank's bytes" if b is not None else note),
                "reduction": km["reduction"],
                "algorithm": km["algorithm"],
                "protocol": km["protocol"],
                "comm_id": comm,
                "group_size": n,
            }
        )
    return pl.DataFrame(rows, schema=_COLL_SCHEMA)
