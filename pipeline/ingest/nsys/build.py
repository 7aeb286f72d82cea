"""The SQLite / parquetdir builder: copies an opened export (a reader of .readers) into the
DuckDB staging database in chunks and derives what the mapping SQL needs: clock base, process
-> rank map, NVTX domains and NCCL ranges, enum tables, NCCL payloads (.payloads), devices and
steps (.steps). _build runs these steps in order and returns the Export."""

from __future__ import annotations

from ... import catalog
from ..jobid import ENV_KEYS
from .export import Export, NsysError
from .payloads import _nccl_payloads
from .readers import _small
from .stage import _DUCK, GPU_TABLES, REQUIRED, STAGE
from .steps import _devices, _steps


def _meta(ex) -> dict[str, str]:
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t in ex.tables():
            return {r["name"]: r["value"] for r in _small(ex, t, ["name", "value"])}
    return {}


def _job_env(ex) -> dict[str, str]:
    """The job variables (jobid.ENV_KEYS) of the environment the capture recorded for its
    processes (META_DATA_CAPTURE rows PROCESS_<n>:ENVIRONMENT_VARIABLE, values `NAME="value"`);
    no other variable is read (an environment can hold credentials)."""
    like = " OR ".join(f"value LIKE '{k}=%'" for k in ENV_KEYS)
    where = f"WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE' AND ({like})"
    out: dict[str, str] = {}
    for r in _small(ex, "META_DATA_CAPTURE", ["name", "value"], where):
        k, _, v = (r["value"] or "").partition("=")
        if k in ENV_KEYS:
            out.setdefault(k, v.strip().strip('"'))
    return out


def _build(ex, con, notes, file_rank, cli_rank, step_regex, comm_patterns) -> Export:
    meta = _meta(ex)
    _check_tables(ex, meta)
    event_count = _stage_tables(ex, con)
    if ex.bad_utf8:
        notes.append(f"invalid UTF-8 replaced by U+FFFD in {ex.bad_utf8} strings")
    for col, n in sorted(ex.bad_values.items()):
        if n:
            what = "are not of the column's type (REAL out of range, TEXT or BLOB)"
            notes.append(f"{n} value(s) of {col} {what} and were read as NULL")
    _int32_to_null(con, notes)
    n_rt = _check_rows(con)
    base, normalized = _clock(ex, con, meta, notes)
    ranks, rsrc = _ranks(con, n_rt, file_rank, cli_rank, notes)
    _nvtx_domains(con, notes)
    _nccl_ranges(con)
    host, versions = _host_versions(ex, meta)
    devices = _devices(ex, con, ranks, host, notes)
    if not meta.get("EXPORT_SCHEMA_VERSION"):
        notes.append("export schema version unknown (no META_DATA_EXPORT / EXPORT_META_DATA)")

    # ---- steps
    steps = _steps(con, step_regex, notes)
    if step_regex and steps.height == 0:
        notes.append(f"--step-range {step_regex!r} matched no NVTX range of a rank process")

    t0, t1 = _span(con, notes)
    _enum_tables(con)
    _nccl_payloads(ex, con, notes)
    return Export(
        format=ex.kind,
        ranks=ranks,
        rank_source=rsrc,
        host=host,
        tool_versions=versions,
        base_time_ns=None if normalized else base,
        event_count=event_count,
        trace_start_ns=None if t0 is None else t0 + base,
        trace_end_ns=None if t1 is None else t1 + base,
        notes=notes,
        con=con,
        comm_patterns=comm_patterns,
        step_regex=step_regex,
        devices=devices,
        _steps=steps,
        job_env=_job_env(ex),
    )


def _check_tables(ex, meta: dict[str, str]) -> None:
    """NsysError unless the export looks like an Nsight Systems export with the required columns
    and no views (Nsight Systems writes none; a view is never read: it could run for ever)."""
    if ex.views:
        n, first = len(ex.views), ex.views[0]
        what = f"1 view ({first})" if n == 1 else f"{n} views ({first}, ...)"
        raise NsysError(
            f"the SQLite file holds {what}: Nsight Systems exports hold tables only, and views are not read"
        )
    tabs = ex.tables()
    if not meta and not (tabs & {STAGE[t][0] for t in GPU_TABLES}) and "NVTX_EVENTS" not in tabs:
        raise NsysError(
            "not an Nsight Systems export: no META_DATA_EXPORT/EXPORT_META_DATA, CUPTI_ACTIVITY_KIND_* "
            "or NVTX_EVENTS table"
        )
    for t, req in REQUIRED.items():
        src = STAGE[t][0]
        if src in tabs:
            missing = [c for c in req if c not in ex.columns(src)]
            if missing:
                raise NsysError(f"{src} lacks required columns {missing}")


def _stage_tables(ex, con) -> int:
    """Copy the STAGE tables into DuckDB in chunks; returns the number of event rows copied."""
    tabs = ex.tables()
    event_count = 0
    for name, (src, cols) in STAGE.items():
        con.execute(f"CREATE TABLE {name} (" + ", ".join(f'"{c}" {_DUCK[t]}' for c, t in cols.items()) + ")")
        if src not in tabs:
            continue
        for b in ex.batches(src, cols):
            con.register("_chunk", b)
            con.execute(f"INSERT INTO {name} SELECT * FROM _chunk")
            con.unregister("_chunk")
            if name not in ("strings", "gpu_metric_names"):
                event_count += b.num_rows
    return event_count


def _check_rows(con) -> int:
    """NsysError when nothing was captured; returns the number of CUDA API rows."""
    n_gpu = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in GPU_TABLES)
    n_nvtx = con.execute("SELECT count(*) FROM nvtx").fetchone()[0]
    n_rt = con.execute("SELECT count(*) FROM runtime").fetchone()[0]
    if n_gpu + n_nvtx + n_rt == 0:
        raise NsysError(
            "export has no CUDA kernel, memcpy, memset, CUDA API or NVTX rows "
            "(captured without -t cuda,nvtx?)"
        )
    return n_rt


def _clock(ex, con, meta: dict[str, str], notes: list[str]) -> tuple[int, bool]:
    """Set variable base_ns (added to every timestamp); returns (base, written with --ts-normalize)."""
    start_rows = _small(ex, "TARGET_INFO_SESSION_START_TIME", ["utcEpochNs"])
    utc = start_rows[0]["utcEpochNs"] if start_rows else None
    normalized = meta.get("EXPORT_PARAM_TIME_NORMALIZE", "false").lower() == "true"
    shift = _int(meta.get("EXPORT_PARAM_TIME_SHIFT")) or 0
    if normalized:
        base = 0 - shift
        notes.append("export was written with --ts-normalize: timestamps are already UTC epoch ns")
    elif utc is not None:
        base = utc - shift
    else:
        base = 0 - shift
        notes.append(
            "no TARGET_INFO_SESSION_START_TIME.utcEpochNs: times are relative to the capture start, "
            "not absolute"
        )
    if shift:
        notes.append(f"export was written with --ts-shift {shift}: shift undone")
    if meta.get("EXPORT_PARAM_TIMES_TO_EXPORT") or meta.get("DERIVED_WINDOW_NS"):
        notes.append(
            "windowed export ("
            + (meta.get("EXPORT_PARAM_TIMES_TO_EXPORT") or meta.get("DERIVED_WINDOW_NS"))
            + "): work whose launch fell outside the window has no launch"
        )
    con.execute(f"SET VARIABLE base_ns = {int(base)}::BIGINT")
    return base, normalized


def _processes(con, n_rt: int) -> tuple[list[tuple], str]:
    """(globalPid, lowest device, pid) of the processes that become ranks, and what they ran."""
    procs = con.execute("""
        SELECT gp, min(deviceId) AS dev, ((gp >> 24) & 16777215) AS pid FROM (
          SELECT globalPid AS gp, deviceId FROM kernel UNION ALL SELECT globalPid, deviceId FROM memcpy
          UNION ALL SELECT globalPid, deviceId FROM memset)
        WHERE gp IS NOT NULL GROUP BY gp ORDER BY dev, pid""").fetchall()
    kind_of_procs = "GPU work"
    if not procs:
        kind_of_procs = "CUDA calls" if n_rt else "NVTX ranges"
        procs = con.execute(f"""SELECT gp, NULL, ((gp >> 24) & 16777215) FROM (
            SELECT DISTINCT globalTid & ~16777215 AS gp FROM {"runtime" if n_rt else "nvtx"}
            WHERE globalTid IS NOT NULL)
            ORDER BY 3""").fetchall()
    if not procs:
        raise NsysError("no process of the export has GPU work, CUDA calls or NVTX ranges with a process id")
    return procs, kind_of_procs


def _ranks(con, n_rt: int, file_rank, cli_rank, notes: list[str]) -> tuple[dict[int, int], str]:
    """processes -> ranks: table rank_map and variable single_gp; returns ({globalPid: rank}, rank_source)."""
    procs, kind_of_procs = _processes(con, n_rt)
    gps = [p[0] for p in procs]
    mpi = dict(con.execute("SELECT globalTid & ~16777215, min(rank) FROM mpi_ranks GROUP BY 1").fetchall())
    if not mpi:
        mpi = {
            gp: int(r)
            for gp, r in con.execute(
                r"""
            SELECT globalTid & ~16777215, min(regexp_extract(text, 'MPI Rank (\d+)', 1)::BIGINT) FROM nvtx
            WHERE eventType = ? AND regexp_matches(text, 'MPI Rank \d+') GROUP BY 1""",
                [catalog.nsys()["nvtx_event_type"]["thread_name"]],
            ).fetchall()
        }
    if mpi and all(gp in mpi for gp in gps):
        ranks, rsrc = {gp: int(mpi[gp]) for gp in gps}, "mpi"
    elif len(gps) == 1 and file_rank is not None:
        ranks, rsrc = {gps[0]: file_rank}, "file_name"
    elif len(gps) == 1 and cli_rank is not None:
        ranks, rsrc = {gps[0]: cli_rank}, "cli"
    elif len(gps) == 1:
        ranks, rsrc = {gps[0]: 0}, "default"
    else:
        ranks, rsrc = {gp: i for i, gp in enumerate(gps)}, "process_order"
        notes.append(
            f"{len(gps)} processes with {kind_of_procs}; ranks assigned in order of lowest CUDA device, "
            "then pid: " + ", ".join(f"pid {p[2]} -> rank {ranks[p[0]]}" for p in procs)
        )
    if len(set(ranks.values())) != len(ranks):
        raise NsysError("two processes of the export claim the same MPI rank")
    con.execute("CREATE TABLE rank_map (gp BIGINT, rank INTEGER)")
    con.executemany("INSERT INTO rank_map VALUES (?, ?)", list(ranks.items()))
    orphan = con.execute(
        "SELECT " + " + ".join(f"(SELECT count(*) FROM {t} WHERE globalPid IS NULL)" for t in GPU_TABLES)
    ).fetchone()[0]
    con.execute(f"SET VARIABLE single_gp = {gps[0] if len(gps) == 1 else 'NULL'}::BIGINT")
    if orphan and len(gps) > 1:
        notes.append(
            f"{orphan} GPU activities without a process id were dropped (several processes in the report)"
        )
    return ranks, rsrc


def _nvtx_domains(con, notes: list[str]) -> None:
    """NVTX event-type variables and table domains (domainId -> name; a domain without a
    domain-create row whose ranges are all nccl* calls is NCCL)."""
    et = catalog.nsys()["nvtx_event_type"]
    con.execute(f"SET VARIABLE nvtx_ranges = {et['ranges'] + et['marks']}::BIGINT[]")
    con.execute(f"SET VARIABLE nvtx_range_only = {et['ranges']}::BIGINT[]")
    domains = dict(
        con.execute(
            "SELECT domainId, any_value(text) FROM nvtx "
            "WHERE eventType = ? AND domainId IS NOT NULL GROUP BY 1",
            [et["domain_create"]],
        ).fetchall()
    )
    for d, n_all, n_nccl in con.execute("""
            SELECT n.domainId, count(*), count(*) FILTER (WHERE coalesce(n.text, s.value) ILIKE 'nccl%')
            FROM nvtx n LEFT JOIN strings s ON s.id = n.textId
            WHERE n.domainId IS NOT NULL AND n.domainId <> 0
              AND n.eventType IN (SELECT unnest(getvariable('nvtx_ranges')))
            GROUP BY 1""").fetchall():
        if d not in domains:
            if n_all and n_nccl == n_all:
                domains[d] = "NCCL"
                notes.append(
                    f"NVTX domain {d} has no domain-create row (windowed export); "
                    f"named NCCL because all its {n_all} ranges are nccl* calls"
                )
            else:
                domains[d] = f"domain {d}"
    con.execute("CREATE TABLE domains (domainId BIGINT, domain VARCHAR)")
    if domains:
        con.executemany("INSERT INTO domains VALUES (?, ?)", list(domains.items()))


def _nccl_ranges(con) -> None:
    """Tables nccl_iv and comm_launch: the CUDA calls made inside an NCCL NVTX range."""
    # NCCL ranges merged per thread into disjoint intervals (gaps and islands), so one ASOF join
    # finds the interval holding each CUDA call (a range join on the thread alone is quadratic)
    con.execute("""CREATE TABLE nccl_iv AS
        WITH r AS (
          SELECT globalTid, start, "end" FROM nvtx
          WHERE domainId IN (SELECT domainId FROM domains WHERE domain = 'NCCL') AND "end" IS NOT NULL
            AND eventType IN (SELECT unnest(getvariable('nvtx_range_only'))) AND globalTid IS NOT NULL),
        m AS (SELECT *, max("end") OVER (PARTITION BY globalTid ORDER BY start, "end"
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
              FROM r),
        g AS (SELECT *, sum(CASE WHEN prev_end IS NULL OR start > prev_end THEN 1 ELSE 0 END)
                          OVER (PARTITION BY globalTid ORDER BY start, "end" ROWS UNBOUNDED PRECEDING) AS grp
              FROM m)
        SELECT globalTid, min(start) AS s, max("end") AS e FROM g GROUP BY globalTid, grp""")
    con.execute("""CREATE TABLE comm_launch AS
        SELECT DISTINCT rt.globalTid & ~16777215 AS gp, rt.correlationId
        FROM (SELECT globalTid, start, correlationId FROM runtime WHERE correlationId IS NOT NULL) rt
        ASOF JOIN nccl_iv n ON n.globalTid = rt.globalTid AND rt.start >= n.s
        WHERE rt.start < n.e""")


def _host_versions(ex, meta: dict[str, str]) -> tuple[str | None, dict]:
    """Host name and tool versions, from the allow-listed TARGET_INFO_SYSTEM_ENV names only."""
    allow = catalog.nsys()["privacy"]["system_env_allow"]
    env = {}
    if "TARGET_INFO_SYSTEM_ENV" in ex.tables():
        where = "WHERE name IN (" + ", ".join("'" + a + "'" for a in allow) + ")"
        env = {r["name"]: r["value"] for r in _small(ex, "TARGET_INFO_SYSTEM_ENV", ["name", "value"], where)}
    host = env.get("Hostname") or None
    versions = {
        k: v
        for k, v in {
            "nsys_version": meta.get("EXPORT_PRODUCT_VERSION"),
            "nsys_export_schema": meta.get("EXPORT_SCHEMA_VERSION"),
            "nvidia_driver_version": env.get("NvDriverVersion"),
            "cuda_driver_version": env.get("CudaDriverVersion"),
        }.items()
        if v
    }
    return host, versions


def _span(con, notes: list[str]) -> tuple[int | None, int | None]:
    """(first start, last end) of the staged GPU work and CUDA calls, in export time."""
    t0, t1 = con.execute("""SELECT min(s), max(e) FROM (
        SELECT min(start) s, max("end") e FROM kernel UNION ALL SELECT min(start), max("end") FROM memcpy
        UNION ALL SELECT min(start), max("end") FROM memset
        UNION ALL SELECT min(start), max("end") FROM runtime)""").fetchone()
    neg = con.execute(
        "SELECT "
        + " + ".join(f'(SELECT count(*) FROM {t} WHERE "end" < start)' for t in GPU_TABLES + ("runtime",))
    ).fetchone()[0]
    if neg:
        notes.append(f"{neg} events with end before start given dur 0")
    return t0, t1


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _enum_tables(con) -> None:
    cat = catalog.nsys()
    con.execute("CREATE TABLE copy_kinds (id BIGINT, label VARCHAR)")
    con.executemany(
        "INSERT INTO copy_kinds VALUES (?, ?)", [(int(k), v) for k, v in cat["copy_kind"].items()]
    )
    con.execute("CREATE TABLE mem_kinds (id BIGINT, label VARCHAR)")
    con.executemany("INSERT INTO mem_kinds VALUES (?, ?)", [(int(k), v) for k, v in cat["mem_kind"].items()])
    con.execute("CREATE TABLE sync_types (id BIGINT, label VARCHAR, sync_kind VARCHAR)")
    con.executemany(
        "INSERT INTO sync_types VALUES (?, ?, ?)", [(int(k), v[0], v[1]) for k, v in cat["sync_type"].items()]
    )
    con.execute(f"SET VARIABLE driver_classes = {cat['event_class']['driver']}::BIGINT[]")
    con.execute("""CREATE TABLE gpu_device_rank AS
        SELECT DISTINCT g.deviceId::INTEGER AS device, r.rank FROM (
        SELECT globalPid, deviceId FROM kernel UNION ALL SELECT globalPid, deviceId FROM memcpy) g
        JOIN rank_map r ON r.gp = coalesce(g.globalPid, getvariable('single_gp'))""")


# staged columns the lake keeps as int32 (gpu_activities.device, grid_*, block_*,
# registers_per_thread; the device also keys devices and the enum tables): a value out of that
# range (a damaged export) is set to NULL in the staging table, once, with a note, so that every
# later cast of it (mapping.py, _enum_tables, steps.py _devices) can rely on the range
_INT32_COLUMNS = {
    "kernel": ("deviceId", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread"),
    "memcpy": ("deviceId",),
    "memset": ("deviceId",),
    "sync": ("deviceId",),
}
_OUT_OF_INT32 = '"{c}" NOT BETWEEN -2147483648 AND 2147483647'


def _int32_to_null(con, notes: list[str]) -> None:
    for table, cols in _INT32_COLUMNS.items():
        counts = con.execute(
            "SELECT "
            + ", ".join(f"count(*) FILTER (WHERE {_OUT_OF_INT32.format(c=c)})" for c in cols)
            + f" FROM {table}"
        ).fetchone()
        for c, n in zip(cols, counts):
            if n:
                con.execute(f'UPDATE {table} SET "{c}" = NULL WHERE {_OUT_OF_INT32.format(c=c)}')
                notes.append(f"{n} value(s) of {table}.{c} out of the INT32 range, read as NULL")
