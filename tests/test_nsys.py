"""Nsight Systems exports: every corpus SQLite file against numbers computed here with plain SQL
on the file itself (sqlite3, read-only), a parquetdir export of the same data, .nsys-rep
handling, GPU metrics, steps from NVTX, privacy, bad input, and the report end to end.

Corpus: ../shared/corpus/nsys (PROVENANCE.md there gives row counts, versions and licences).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CORPUS, union_ns

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

NSYS = CORPUS / "nsys"
FILES = {
    "mfu": NSYS / "nsys-ai" / "mfu_2gpu_before.sqlite",  # 2026.2.1, schema 3.25.0, 2 processes
    "power": NSYS / "nsightful" / "power_iteration__baseline.sqlite",  # 2025.3.1, schema 3.20.2
    "saxpy": NSYS / "pipit" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite",  # 2022.2.1, schema 2.9.1
    "clover": NSYS / "pipit" / "perlmutter-cloverleaf-cuda.sqlite",  # 2024.5.1, schema 3.13.2
}
# ENUM_CUDA_MEMCPY_OPER ids as the Post-Collection Analysis Guide lists them (nsys.md section 1.1)
COPY_KIND = {0: "Unknown", 1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}


def ro(path: Path) -> sqlite3.Connection:
    c = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    c.text_factory = lambda b: b.decode("utf-8", "replace")
    return c


def tables_of(c) -> set[str]:
    return {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def process_order(c) -> dict[int, int]:
    """pid -> rank as the documented rule says: processes with GPU work ordered by lowest device, then pid."""
    rows = c.execute("""SELECT globalPid / 16777216 % 16777216 AS pid, min(deviceId) FROM (
        SELECT globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL
        UNION ALL SELECT globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_MEMCPY)
        GROUP BY 1 ORDER BY 2, 1""").fetchall()
    return {pid: i for i, (pid, _) in enumerate(rows)}


@pytest.fixture(scope="module")
def lakes(tmp_path_factory):
    out = {}
    for key, f in FILES.items():
        lake = Lake(tmp_path_factory.mktemp(key))
        res = ingest_paths([f], lake, run=key)
        assert [r.status for r in res] == ["ok"], [r.error for r in res]
        out[key] = lake
    return out


def lake_sql(lake, q):
    con = connect(lake)
    return con.execute(q).fetchall()


@pytest.mark.parametrize("key", list(FILES))
def test_kernels_per_device_and_busy_time(lakes, key):
    """Per process/device: kernel count, and GPU busy time = union of kernel, memcpy and memset
    intervals, computed here from the SQLite rows; the lake and the breakdown query must agree."""
    c = ro(FILES[key])
    tabs = tables_of(c)
    gpu_tabs = [
        t
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
        if t in tabs
    ]
    ranks = process_order(c)
    if len(ranks) == 1:
        ranks = {p: 0 for p in ranks}
    want_count = {
        (ranks[pid], dev): n
        for pid, dev, n in c.execute(
            "SELECT globalPid / 16777216 % 16777216, deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL "
            "GROUP BY 1, 2"
        )
    }
    got_count = {
        (r, d): n
        for r, d, n in lake_sql(
            lakes[key], "SELECT rank, device, count(*) FROM gpu_activities WHERE kind = 'kernel' GROUP BY ALL"
        )
    }
    assert got_count == want_count
    busy = {}
    for t in gpu_tabs:
        for pid, s, e in c.execute(f'SELECT globalPid / 16777216 % 16777216, start, "end" FROM {t}'):
            busy.setdefault(ranks[pid], []).append((s, e))
    con = connect(lakes[key])
    bd = run(con, "breakdown").filter(pl.col("level") == "rank")
    assert dict(zip(bd["rank"], bd["gpu_busy_ns"])) == {r: union_ns(v) for r, v in busy.items()}


@pytest.mark.parametrize("key", list(FILES))
def test_absolute_time_and_row_counts(lakes, key):
    c = ro(FILES[key])
    utc = c.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    k0 = c.execute("SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert (
        lake_sql(lakes[key], "SELECT min(start_ns) FROM gpu_activities WHERE kind = 'kernel'")[0][0]
        == utc + k0
    )
    n_rt = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    n_sync = (
        c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION").fetchone()[0]
        if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables_of(c)
        else 0
    )
    got = dict(
        lake_sql(
            lakes[key], "SELECT kind, count(*) FROM cpu_ops WHERE kind IN ('runtime', 'driver') GROUP BY ALL"
        )
    )
    assert sum(got.values()) == n_rt
    assert lake_sql(lakes[key], "SELECT count(*) FROM gpu_activities WHERE kind = 'sync'")[0][0] == n_sync
    src = lake_sql(lakes[key], "SELECT base_time_ns, status, format FROM sources")[0]
    assert src == (utc, "ok", "nsys_sqlite")


@pytest.mark.parametrize("key", list(FILES))
def test_memcpy_bytes_by_kind(lakes, key):
    c = ro(FILES[key])
    want = {}
    for kind, src, dst, b in c.execute(
        "SELECT copyKind, srcKind, dstKind, sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1, 2, 3"
    ):
        want[COPY_KIND[kind]] = want.get(COPY_KIND[kind], 0) + b
    got = dict(
        lake_sql(
            lakes[key], "SELECT copy_kind, sum(bytes) FROM gpu_activities WHERE kind = 'memcpy' GROUP BY ALL"
        )
    )
    assert got == want
    # pageable vs pinned is kept: srcKind 0 = Pageable, 1 = Pinned (ENUM_CUDA_MEM_KIND)
    pageable = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE srcKind = 0").fetchone()[0]
    assert (
        lake_sql(lakes[key], "SELECT count(*) FROM gpu_activities WHERE src_kind = 'Pageable'")[0][0]
        == pageable
    )


def test_nccl_kernels_become_collectives_and_match_across_ranks(lakes):
    """mfu_2gpu_before: 66 ncclDevKernel_SendRecv kernels, 33 per process (PROVENANCE.md), on
    different stream ids in the two processes; their time per rank equals the SQLite sum."""
    c = ro(FILES["mfu"])
    ranks = process_order(c)
    want = {
        ranks[pid]: (n, t)
        for pid, n, t in c.execute("""
        SELECT k.globalPid / 16777216 % 16777216, count(*), sum(k."end" - k.start)
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%' GROUP BY 1""")
    }
    assert sorted(n for n, _ in want.values()) == [33, 33]
    got = {
        r: (n, t)
        for r, n, t in lake_sql(
            lakes["mfu"], "SELECT rank, count(*), sum(dur_ns) FROM collectives GROUP BY ALL"
        )
    }
    assert got == want
    rows = lake_sql(
        lakes["mfu"], "SELECT DISTINCT op, algorithm, protocol, msg_bytes, msg_bytes_note FROM collectives"
    )
    # the export was written without --include-blobs (META_DATA_EXPORT EXPORT_PARAM_INCLUDE_BLOBS false)
    assert rows == [
        (
            "send_recv",
            None,
            None,
            None,
            "message size not in the export: NCCL NVTX ranges without payload blobs "
            "(export with --include-blobs=true)",
        )
    ]
    # classified from the data too: kernels whose launching call (same process, same correlationId)
    # lies inside an NVTX range of the NCCL domain (domainId 1) on the same thread
    by_nvtx = c.execute("""SELECT count(DISTINCT k.rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            AND r.globalTid / 16777216 = k.globalPid / 16777216
        JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND r.start >= n.start AND r.start < n."end"
            AND n.domainId = 1""").fetchone()[0]
    assert by_nvtx == 64  # the other 2 were launched before the exported window
    assert lake_sql(
        lakes["mfu"],
        "SELECT count(*), count(*) FILTER (WHERE classified_by = 'correlation') FROM gpu_activities WHERE "
        "category = 'communication'",
    )[0] == (66, by_nvtx)
    calls = lake_sql(
        lakes["mfu"],
        "SELECT count(*), count(*) FILTER (WHERE complete AND ranks_seen = 2) FROM collective_calls",
    )[0]
    assert calls == (33, 33)
    con = connect(lakes["mfu"])
    bd = run(con, "breakdown").filter(pl.col("level") == "rank").sort("rank")
    comm = {}
    for (
        pid,
        s,
        e,
    ) in c.execute("""SELECT k.globalPid / 16777216 % 16777216, k.start, k."end"
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%'"""):
        comm.setdefault(ranks[pid], []).append((s, e))
    assert bd["comm_ns"].to_list() == [union_ns(comm[0]), union_ns(comm[1])]


def test_launch_join_is_per_process(lakes):
    """correlationId repeats across the two processes (4010 kernels, 3932 distinct ids); a kernel's
    launch is the runtime call with its correlationId in its own process. 24 kernels were launched
    before the 300 ms window (PROVENANCE.md) and have none."""
    c = ro(FILES["mfu"])
    want = c.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE NOT EXISTS (
        SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId
        AND r.globalTid / 16777216 = k.globalPid / 16777216)""").fetchone()[0]
    assert want == 24
    assert (
        lake_sql(lakes["mfu"], "SELECT count(*) FROM gpu_work WHERE kind = 'kernel' AND launch_ns IS NULL")[
            0
        ][0]
        == 24
    )


def test_ranks_hosts_devices_and_versions(lakes):
    src = lake_sql(lakes["mfu"], "SELECT rank, ranks, rank_source, host, tool_versions FROM sources")[0]
    assert src[:4] == (None, [0, 1], "process_order", "modal")
    assert '"nsys_version": "2026.2.1.210"' in src[4] and '"nvidia_driver_version": "580.95.05"' in src[4]
    # saxpy: rank from the "MPI Rank 0" NVTX thread name nsys's MPI tracing writes
    assert lake_sql(lakes["saxpy"], "SELECT rank, rank_source FROM sources")[0] == (0, "mpi")
    # cloverleaf: TARGET_INFO_GPU lists 4 A100-SXM4-80GB, kernels ran on device 0 only
    devs = lake_sql(lakes["clover"], "SELECT device, name, used, num_sms FROM devices ORDER BY device")
    assert devs == [(0, "NVIDIA A100-SXM4-80GB", True, 108)] + [
        (d, "NVIDIA A100-SXM4-80GB", False, 108) for d in (1, 2, 3)
    ]
    assert lake_sql(lakes["clover"], "SELECT catalog_key FROM rank_device")[0][0] is not None
    assert lake_sql(lakes["power"], "SELECT name, total_memory_bytes FROM devices")[0][0] == "Tesla T4"


def test_nvtx_annotations_and_pytorch_ops(lakes):
    c = ro(FILES["mfu"])
    n = c.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (34, 59, 60)").fetchone()[0]
    assert lake_sql(lakes["mfu"], "SELECT count(*) FROM annotations")[0][0] == n
    assert lake_sql(lakes["mfu"], "SELECT count(*) FROM annotations WHERE domain = 'NCCL'")[0][0] == 462
    ops = c.execute(
        r"SELECT count(*) FROM NVTX_EVENTS WHERE domainId = 0 AND eventType = 59 AND text LIKE 'aten::%'"
    ).fetchone()[0]
    assert (
        lake_sql(lakes["mfu"], "SELECT count(*) FROM cpu_ops WHERE kind = 'op' AND name LIKE 'aten::%'")[0][0]
        == ops
    )
    # the first range in the file, read by hand: 'aten::empty, op_id = 990346' on pid 145
    first = lake_sql(
        lakes["mfu"], "SELECT name, pid FROM cpu_ops WHERE kind = 'op' ORDER BY start_ns LIMIT 1"
    )[0]
    assert first == ("aten::empty", 145)


def test_step_range(tmp_path):
    """power_iteration has NVTX ranges 'Compute & Residual 0', '... 10', ...: --step-range makes
    them steps."""
    c = ro(FILES["power"])
    want = sorted(
        int(t.rsplit(" ", 1)[1])
        for (t,) in c.execute(
            "SELECT coalesce(n.text, s.value) AS t FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = "
            "n.textId WHERE t LIKE 'Compute & Residual %'"
        )
    )
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([FILES["power"]], lake, step_regex=r"^Compute & Residual \d+$")
    assert res[0].status == "ok"
    got = [r[0] for r in lake_sql(lake, "SELECT step FROM steps ORDER BY step")]
    assert got == want and len(want) > 10
    bd = run(connect(lake), "breakdown").filter(pl.col("level") == "step")
    assert bd.height == len(want)


def to_parquetdir(src: Path, dest: Path) -> Path:
    """What `nsys export --type parquetdir` lays out: one <TABLE>.parquet per table (here copied
    from the SQLite export of the same report, column by column)."""
    dest.mkdir()
    c = ro(src)
    for t in tables_of(c):
        cols = [r[1] for r in c.execute(f'PRAGMA table_info("{t}")')]
        rows = c.execute(f'SELECT * FROM "{t}"').fetchall()
        arrays = []
        for i, name in enumerate(cols):
            vals = [r[i] for r in rows]
            kinds = {type(v) for v in vals if v is not None}
            typ = pa.string() if kinds & {str, bytes} else pa.float64() if float in kinds else pa.int64()
            arrays.append(
                pa.array(
                    [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in vals], type=typ
                )
            )
        pq.write_table(pa.Table.from_arrays(arrays, names=cols), dest / f"{t}.parquet")
    return dest


def test_parquetdir_equals_sqlite(tmp_path, lakes):
    d = to_parquetdir(FILES["mfu"], tmp_path / "mfu_pqtdir")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([tmp_path], lake, run="mfu")  # found by directory search, ingested as one source
    assert [(r.status, r.path) for r in res] == [("ok", str(d.absolute()))]
    assert lake_sql(lake, "SELECT format FROM sources")[0][0] == "nsys_parquetdir"
    for table in ("gpu_activities", "cpu_ops", "annotations", "collectives", "devices"):
        q = f"SELECT * EXCLUDE (source_id) FROM {table} ORDER BY ALL"
        assert lake_sql(lake, q) == lake_sql(lakes["mfu"], q), table


def test_gpu_metrics_become_counters(tmp_path):
    """GPU_METRICS + TARGET_INFO_GPU_METRICS (schema per the Analysis Guide; no corpus file has
    them, so three samples are added to a copy of a real export): GPU = typeId & 0xFF."""
    f = tmp_path / "power_metrics.sqlite"
    shutil.copy(FILES["power"], f)
    os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)
    c = sqlite3.connect(f)
    c.executescript("""
        CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT,
            metricId INTEGER, metricName TEXT);
        CREATE TABLE GPU_METRICS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER,
            metricId INTEGER, value INTEGER);
        INSERT INTO TARGET_INFO_GPU_METRICS VALUES (65536, 0, 'GPU', 1, 'SM Active [Throughput %]'),
            (65536, 0, 'GPU', 2, 'Tensor Active [Throughput %]');
        INSERT INTO GPU_METRICS VALUES (0, 1000, 65536, 1, 40), (0, 2000, 65536, 1, 60),
            (0, 1000, 65536, 2, 7);
    """)
    c.commit()
    c.close()
    utc = ro(f).execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([f], lake)[0].status == "ok"
    rows = lake_sql(lake, "SELECT rank, device, name, unit, ts_ns, value FROM counters ORDER BY name, ts_ns")
    assert rows == [
        (0, 0, "SM Active [Throughput %]", "%", utc + 1000, 40.0),
        (0, 0, "SM Active [Throughput %]", "%", utc + 2000, 60.0),
        (0, 0, "Tensor Active [Throughput %]", "%", utc + 1000, 7.0),
    ]


def _all_strings(lake: Lake) -> list[str]:
    out = []
    for p in lake.root.rglob("*.parquet"):
        t = pq.read_table(p)
        for col in t.columns:
            if pa.types.is_string(col.type):
                out.extend(v for v in col.to_pylist() if v)
            elif pa.types.is_list(col.type) and pa.types.is_string(col.type.value_type):
                out.extend(x for v in col.to_pylist() if v for x in v if x)
    return out


@pytest.mark.parametrize("key", list(FILES))
def test_privacy_only_allow_listed_environment(lakes, key, tmp_path):
    """No capture-environment value other than the allow-listed ones reaches the lake or the report."""
    c = ro(FILES[key])
    secrets = []
    for name, value in c.execute(
        "SELECT name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name NOT IN ('Hostname', 'NvDriverVersion', "
        "'CudaDriverVersion')"
    ):
        secrets += [v for v in str(value).split(";") if "=" in v and len(v) >= 12]
    if "META_DATA_CAPTURE" in tables_of(c):
        secrets += [
            v
            for (v,) in c.execute("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'")
            if v and "=" in v and len(v) >= 12
        ]
    assert secrets, "the file carries an environment to protect"
    if key == "clover":
        assert any(s.startswith("PMI_SHARED_SECRET=") for s in secrets)
    strings = "\n".join(_all_strings(lakes[key]))
    leaked = [s for s in secrets if s in strings]
    assert not leaked
    out = tmp_path / "r.html"
    r = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "report", "--lake", str(lakes[key].root), "-o", str(out)],
        capture_output=True,
    )
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert not [s for s in secrets if s in html]


def test_report_end_to_end_on_mfu_2gpu(tmp_path):
    out = tmp_path / "report.html"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "run",
            str(FILES["mfu"]),
            "--lake",
            str(tmp_path / "lake"),
            "-o",
            str(out),
            "--peak-tflops",
            "989",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "2 rank(s) ingested" in html and "nsys-ai" in html
    js = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "analyze",
            "--lake",
            str(tmp_path / "lake"),
            "--json",
            "--peak-tflops",
            "989",
        ],
        capture_output=True,
        text=True,
    )
    import json

    doc = json.loads(js.stdout)
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1]
    assert doc["verdicts"][0]["verdict"] in ("compute-bound", "network-bound", "host-bound", "balanced")


def test_nsys_rep_needs_nsys(tmp_path, monkeypatch):
    rep = tmp_path / "run" / "job.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"NVIDIA Tegra Profiler Report 1.\n" + b"\x00" * 64)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([rep], lake)
    assert res[0].status == "failed"
    assert (
        "nsys export --type sqlite" in res[0].error and str(rep) in res[0].error and "\n" not in res[0].error
    )


def test_nsys_rep_converted_with_nsys_on_path(tmp_path, monkeypatch):
    """A stand-in `nsys` that writes the SQLite export of the same report (the corpus file) where
    the real `nsys export --output X` would."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "nsys"
    fake.write_text(
        '#!/bin/sh\nwhile [ $# -gt 1 ]; do if [ "$1" = --output ]; then out=$2; fi; shift; done\n'
        f"cp '{FILES['saxpy']}' \"$out\"\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    rep = tmp_path / "saxpy.nsys-rep"
    rep.write_bytes(b"NVIDIA Tegra Profiler Report 1.\n" + b"\x01" * 64)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([rep], lake)
    assert res[0].status == "ok", res[0].error
    assert any(n.startswith("converted with: nsys export --type sqlite") for n in res[0].notes)
    assert (
        lake_sql(lake, "SELECT count(*) FROM gpu_activities WHERE kind = 'kernel'")[0][0] == 5
    )  # saxpy x5 (PROVENANCE.md)


def test_bad_exports_fail_cleanly_and_never_stop_a_batch(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "text.sqlite").write_text("this is not a database\n")
    trunc = bad / "truncated.sqlite"
    trunc.write_bytes(FILES["power"].read_bytes()[:65536])
    other = bad / "other.sqlite"
    c = sqlite3.connect(other)
    c.execute("CREATE TABLE t (x INTEGER)")
    c.commit()
    c.close()
    (bad / "empty_pqtdir").mkdir()
    shutil.copy(FILES["saxpy"], bad / "good.sqlite")
    lake = Lake(tmp_path / "lake")
    before = other.read_bytes()
    res = {Path(r.path).name: r for r in ingest_paths([bad], lake, run="b")}
    assert res["good.sqlite"].status == "ok"
    for name in ("text.sqlite", "truncated.sqlite", "other.sqlite", "empty_pqtdir"):
        assert res[name].status == "failed", name
        assert res[name].error and "\n" not in res[name].error
    assert "not an Nsight Systems export" in res["other.sqlite"].error
    assert other.read_bytes() == before  # opened read-only
    assert lake_sql(lake, "SELECT count(*) FROM gpu_activities")[0][0] == 20


def test_pytorch_nvtx_op_with_sizes_gets_flops(tmp_path):
    """torch.autograd.profiler.emit_nvtx(record_shapes=True) names ranges
    '<op>, seq = N, op_id = M, sizes = [[...], ...]' (torch/csrc/autograd/profiler_legacy.cpp
    getNvtxStr). One such range is added to a copy of a real export, on the thread of its first
    CUDA call: aten::mm of [64, 128] x [128, 32] is 2*64*128*32 FLOPs."""
    f = tmp_path / "power_ops.sqlite"
    shutil.copy(FILES["power"], f)
    os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)
    c = sqlite3.connect(f)
    tid, s = c.execute(
        "SELECT globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start LIMIT 1"
    ).fetchone()
    c.execute(
        'INSERT INTO NVTX_EVENTS (start, "end", eventType, text, globalTid, domainId) VALUES (?, ?, 59, ?, '
        "?, 0)",
        (
            s,
            s + 1000,
            "aten::mm, seq = 12, op_id = 7, sizes = [[64, 128], [128, 32]], input_op_ids = [5, 6]",
            tid,
        ),
    )
    c.commit()
    c.close()
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([f], lake)[0].status == "ok"
    rows = lake_sql(
        lake, "SELECT name, sequence_number, input_dims, flops, flops_source FROM cpu_ops WHERE kind = 'op'"
    )
    assert rows == [("aten::mm", 12, "[[64, 128], [128, 32]]", 2.0 * 64 * 128 * 32, "shapes")]


def test_nccl_payload_gives_message_size(tmp_path):
    """An export with NVTX payload blobs (`--include-blobs=true`): a copy of mfu_2gpu_before with one
    ncclSend range added around the launch of rank 0's first NCCL kernel, carrying a blob laid out
    as nsys stores it (32-byte header [domainId][schemaId][payloadSize][payloadOffset], u64 LE, then
    the payload) for the file's own schema 16777220 (NVTX_PAYLOAD_SCHEMA_ENTRIES: 'NCCL communicator
    ID' at 0, 'Message size [bytes]' at 8; payloadSize 16). The kernel's collectives row gets
    msg_bytes 1048576 and communicator 0x00000000deadbeef; every other NCCL kernel keeps a null size."""
    import struct

    f = tmp_path / "mfu_blobs.sqlite"
    shutil.copy(FILES["mfu"], f)
    os.chmod(f, stat.S_IRUSR | stat.S_IWUSR)
    c = sqlite3.connect(f)
    tid, rs, re_, corr = c.execute("""
        SELECT r.globalTid, r.start, r."end", r.correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds s ON s.id = k.shortName
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            AND r.globalTid / 16777216 = k.globalPid / 16777216
        WHERE s.value LIKE 'nccl%' AND k.globalPid / 16777216 % 16777216 = 144
        ORDER BY k.start LIMIT 1""").fetchone()
    sid = c.execute("SELECT max(id) + 1 FROM StringIds").fetchone()[0]
    c.execute("INSERT INTO StringIds VALUES (?, 'ncclSend')", (sid,))
    payload = struct.pack("<QQ", 0xDEADBEEF, 1 << 20)
    blob = struct.pack("<QQQQ", 1, 16777220, len(payload), 32) + payload
    c.execute(
        'INSERT INTO NVTX_EVENTS (start, "end", eventType, textId, globalTid, domainId, binaryData) VALUES '
        "(?, ?, 59, ?, ?, 1, ?)",
        (rs - 100, re_ + 100, sid, tid, blob),
    )
    c.commit()
    c.close()
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([f], lake)[0].status == "ok"
    sized = lake_sql(
        lake, "SELECT rank, correlation, op, msg_bytes, comm_id FROM collectives WHERE msg_bytes IS NOT NULL"
    )
    assert sized == [(0, corr, "send_recv", 1 << 20, "0x00000000deadbeef")]
    notes = lake_sql(lake, "SELECT DISTINCT msg_bytes_note FROM collectives WHERE msg_bytes IS NULL")
    assert notes == [
        (
            "message size not in the export: the kernel was not launched inside an NCCL API range with a "
            "payload "
            "(grouped calls launch in ncclGroupEnd)",
        )
    ]
