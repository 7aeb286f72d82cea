"""Devices and steps of a staged export: every GPU of the report's host once per rank
(_devices, from TARGET_INFO_GPU else TARGET_INFO_CUDA_DEVICE else the device ids seen) and the
step ranges (_steps: ProfilerStep#N NVTX ranges or a --step-range regex)."""

from __future__ import annotations

import polars as pl

from .export import _STEP_SCHEMA, step_number
from .readers import _small
from .step_detect import detect

_I32 = (-(2**31), 2**31 - 1)


def _bounded(v, lim, dropped: list[str], what: str):
    """v when it is an integer within lim (the lake column's range), else None, noted."""
    if v is None or (isinstance(v, int) and lim[0] <= v <= lim[1]):
        return v
    dropped.append(what)
    return None


def _devices(ex, con, ranks: dict[int, int], host, notes: list[str] | None = None) -> list[dict]:
    """Every GPU of the report's host, listed once per rank (used = the rank ran work on it).
    A device property out of its lake column's range (a damaged export: smCount 2^62) is read as
    NULL with a note; a GPU whose id is out of range is left out."""
    dropped: list[str] = []
    used = {}
    for gp, dev in con.execute("""SELECT DISTINCT gp, deviceId FROM (
            SELECT coalesce(globalPid, getvariable('single_gp')) AS gp, deviceId FROM kernel
            UNION ALL SELECT coalesce(globalPid, getvariable('single_gp')), deviceId FROM memcpy
            UNION ALL SELECT coalesce(globalPid, getvariable('single_gp')), deviceId FROM memset)
            WHERE deviceId IS NOT NULL""").fetchall():
        if gp in ranks:  # within int32: build.py's _int32_to_null
            used.setdefault(ranks[gp], set()).add(int(dev))
    gpus = {}
    for r in _small(
        ex,
        "TARGET_INFO_GPU",
        ["id", "name", "busLocation", "totalMemory", "smCount", "computeMajor", "computeMinor"],
    ):
        gid = _bounded(r["id"], _I32, dropped, "TARGET_INFO_GPU.id")
        if gid is not None:
            gpus[gid] = {
                "name": r["name"],
                "bus_id": r["busLocation"],
                "total_memory_bytes": r["totalMemory"],  # int64 already (readers.py _array)
                "num_sms": _bounded(r["smCount"], _I32, dropped, "TARGET_INFO_GPU.smCount"),
                "compute_major": _bounded(r["computeMajor"], _I32, dropped, "TARGET_INFO_GPU.computeMajor"),
                "compute_minor": _bounded(r["computeMinor"], _I32, dropped, "TARGET_INFO_GPU.computeMinor"),
            }
    if not gpus:
        for r in _small(ex, "TARGET_INFO_CUDA_DEVICE", ["gpuId", "cudaId", "numMultiprocessors"]):
            cid = _bounded(r["cudaId"], _I32, dropped, "TARGET_INFO_CUDA_DEVICE.cudaId")
            if cid is not None:
                gpus[cid] = {
                    "num_sms": _bounded(
                        r["numMultiprocessors"], _I32, dropped, "TARGET_INFO_CUDA_DEVICE.numMultiprocessors"
                    )
                }
    if dropped and notes is not None:
        for col in sorted(set(dropped)):
            notes.append(f"{dropped.count(col)} value(s) of {col} out of range, read as NULL")
    all_devs = set(gpus) | {d for s in used.values() for d in s}
    rows = []
    for rank in sorted(set(ranks.values())):
        for d in sorted(all_devs):
            g = gpus.get(d, {})
            rows.append(
                {
                    "rank": rank,
                    "host": host,
                    "device": d,
                    "name": g.get("name"),
                    "vendor": "nvidia",
                    "compute_major": g.get("compute_major"),
                    "compute_minor": g.get("compute_minor"),
                    "total_memory_bytes": g.get("total_memory_bytes"),
                    "num_sms": g.get("num_sms"),
                    "bus_id": g.get("bus_id"),
                    "used": d in used.get(rank, set()),
                }
            )
    return rows


_STEP_RE = r"^ProfilerStep\s*#\s*\d+$"


def _steps(con, step_regex: str | None, notes: list[str] | None = None) -> pl.DataFrame:
    """Steps: NVTX ranges of rank processes named ProfilerStep#N, or matching step_regex; step
    number = the last integer in the name, else the range's order; ranges nested inside another
    matching range of the same rank are dropped (outermost wins). Without step_regex and without
    ProfilerStep ranges, the steps step_detect.detect finds from the data (notes say how)."""
    rx = step_regex or _STEP_RE
    con.execute("SET VARIABLE step_regex = ?", [rx])
    df = pl.from_arrow(
        con.sql("""
        SELECT m.rank, coalesce(n.text, s.value) AS name, n.start + getvariable('base_ns') AS start_ns,
               n."end" + getvariable('base_ns') AS end_ns, (n.globalTid >> 24) & 16777215 AS pid,
               n.globalTid & 16777215 AS tid
        FROM nvtx n JOIN rank_map m ON m.gp = n.globalTid & ~16777215 LEFT JOIN strings s ON s.id = n.textId
        WHERE n.eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND n."end" IS NOT NULL
          AND regexp_matches(coalesce(n.text, s.value), getvariable('step_regex'))
        ORDER BY m.rank, start_ns, end_ns DESC""").to_arrow_table()
    )
    if df.height == 0:
        if step_regex is None:
            return detect(con, [] if notes is None else notes)
        return pl.DataFrame(schema=_STEP_SCHEMA)
    rows = []
    for (rank,), g in df.group_by(["rank"], maintain_order=True):
        outer_end = None
        order = 0
        mine = []
        for r in g.iter_rows(named=True):
            if outer_end is not None and r["end_ns"] <= outer_end:
                continue
            outer_end = r["end_ns"]
            n = step_number(r["name"])
            mine.append(
                {
                    **r,
                    "step": order if n is None else n,
                    "order": order,
                    "dur_ns": max(r["end_ns"] - r["start_ns"], 0),
                    "source": "nvtx",
                }
            )
            order += 1
        # a step number names one step of a rank: ranges whose names repeat one (47 ranges named
        # ProfilerStep#1: every per-step join multiplied them, and the analysis of a 2.6 MB export
        # took 23 GB) are numbered in their order from the first range's number (0 when it has
        # none), so a repeated name does not shift the rank's steps against the other ranks'
        # (ProfilerStep#10, #11, #11 beside another rank's #10, #11, #12: 10, 11, 12 on both)
        if len({r["step"] for r in mine}) < len(mine):
            same = len(mine) - len({r["step"] for r in mine})
            first = step_number(mine[0]["name"]) or 0
            if notes is not None:
                notes.append(
                    f"rank {rank}: {same} step range(s) repeat another's step number (the last integer "
                    f"of the name): the rank's steps are numbered in their order from {first}"
                )
            for r in mine:
                r["step"] = first + r["order"]
        rows += [{k: v for k, v in r.items() if k != "order"} for r in mine]
    return pl.DataFrame(rows, schema=_STEP_SCHEMA)
