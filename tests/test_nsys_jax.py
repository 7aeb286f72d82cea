"""nsys-jax archives (NVIDIA JAX-Toolbox test data: a 4-process PAXML FSDP run, one A100 each).

Expected numbers are computed here straight from each archive's members with zipfile, pyarrow
and DuckDB (never through pipeline.ingest.nsys.jax), then compared with what the ingest put in
the lake and with the metric queries.
"""

from __future__ import annotations

import csv
import io
import lzma
import re
import shutil
import zipfile
from functools import cache
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import corpus, union_ns

from pipeline import classify, query
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

N = 4
TRACE = "nvtx_gpu_proj_trace/trace.parquet"
# HLO opcode -> tracelake op, as an ML engineer reads them (XLA HLO opcodes vs nccl-tests names)
OPS = {
    "all-reduce": "all_reduce",
    "all-gather": "all_gather",
    "reduce-scatter": "reduce_scatter",
    "all-to-all": "all_to_all",
    "collective-permute": "send_recv",
}
COMM_RE = (
    r"hlo_op=(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start|-done)?(\.\d+)?#"
)
STEP_MODULE = "TSL:XlaModule:#hlo_module=pjit__wrapped_step_fn,program_id=40#"  # PAXML's jitted train step


def archive(i: int) -> Path:
    return corpus("nsys", "jax-toolbox", f"pax_fsdp4_4proc_proc{i}.zip")


def member_table(i: int, name: str) -> pa.Table:
    with zipfile.ZipFile(archive(i)) as z:
        return pq.ParquetFile(io.BytesIO(z.read(name))).read()


@cache
def expected(i: int) -> dict:
    t = member_table(i, TRACE)
    con = duckdb.connect()
    con.register("t", t)
    q = lambda sql: rows(con, sql)  # noqa: E731
    # GPU work: named ranges with no child except NCCL API ranges; NCCL ranges inside a range are folded
    work = q(f"""
        SELECT "Projected Start", "Projected Start" + "Projected Duration", regexp_matches(Name, '{COMM_RE}')
        FROM t p WHERE Name IS NOT NULL AND NOT (Name LIKE 'NCCL:%' AND ParentId IS NOT NULL)
          AND NOT EXISTS (SELECT 1 FROM t c WHERE c.ParentId = p.RangeId AND c.Name NOT LIKE 'NCCL:%')""")
    comm = q(f"""SELECT regexp_extract(Name, '{COMM_RE}', 1), "Projected Start", "Projected Duration"
                 FROM t WHERE Name LIKE 'TSL:Thunk:%' AND regexp_matches(Name, '{COMM_RE}')
                 ORDER BY "Projected Start", RangeId""")
    steps = q(f"""SELECT "Orig Start"::BIGINT, ("Orig Start" + "Orig Duration")::BIGINT, NumChild FROM t
                  WHERE Name = '{STEP_MODULE}' AND ParentId IS NULL ORDER BY "Orig Start" """)
    dev = member_table(i, "device-metadata.parquet").to_pylist()
    assert len(dev) == 1
    dev = dev[0]
    with zipfile.ZipFile(archive(i)) as z:
        names = [
            r["Name"]
            for r in csv.DictReader(
                io.StringIO(lzma.decompress(z.read("report_nvtx_pushpop_trace.csv.xz")).decode())
            )
        ]
    return {
        "work": len(work),
        "work_ns": sum(e - s for s, e, _ in work),
        "busy": union_ns((s, e) for s, e, _ in work),
        "comm_union": union_ns((s, e) for s, e, c in work if c),
        "compute_union": union_ns((s, e) for s, e, c in work if not c),
        "thunks": q("SELECT count(*) FROM t WHERE Name LIKE 'TSL:Thunk:%'")[0][0],
        "comm": len(comm),
        "comm_ns": sum(d for _, _, d in comm),
        "comm_durs": [d for _, _, d in comm],
        "comm_ops": {OPS[o]: sum(1 for x, _, _ in comm if x == o) for o in {x for x, _, _ in comm}},
        "comm_names": [
            n
            for (n,) in q(f"""SELECT regexp_extract(Name, 'hlo_op=([^#]*)#', 1) FROM t
                                          WHERE Name LIKE 'TSL:Thunk:%' AND regexp_matches(Name, '{COMM_RE}')
                                          ORDER BY "Projected Start", RangeId""")
        ],
        "steps": [(s, e) for s, e, _ in steps],
        "step_thunks": [n for _, _, n in steps],
        "rank": int(re.search(r"process=(\d+)", dev["('TARGET_INFO_NVTX_CUDA_DEVICE', 'name')"]).group(1)),
        "device": dev["cuDevice"],
        "device_name": dev["('TARGET_INFO_GPU', 'name')"],
        "bus_id": dev["('TARGET_INFO_GPU', 'busLocation')"],
        "sms": dev["('TARGET_INFO_GPU', 'smCount')"],
        "memory": dev["('TARGET_INFO_GPU', 'totalMemory')"],
        "annotations": len(names),
        "nccl_annotations": sum(n.startswith("NCCL:") for n in names),
        "host": {r["name"]: r["value"] for r in member_table(i, "system-metadata.parquet").to_pylist()}[
            "Hostname"
        ],
    }


def rows(con, sql: str, params=None) -> list[tuple]:
    return con.execute(
        sql, params or []
    ).fetchall()  # fetch everything: DuckDB refuses a new query on a half-read one


def check_rank(con, i: int, rank: int, breakdown: pl.DataFrame) -> None:
    exp = expected(i)
    one = lambda sql: rows(con, sql, [rank])[0]  # noqa: E731
    assert one(
        "SELECT count(*), sum(dur_ns), count(DISTINCT kind), any_value(kind) FROM gpu_activities WHERE rank "
        "= ?"
    ) == (exp["work"], exp["work_ns"], 1, "kernel")
    assert (
        one("SELECT count(*) FROM gpu_activities WHERE rank = ? AND name LIKE 'Thunk:%'")[0] == exp["thunks"]
    )
    assert one(
        "SELECT count(*), sum(dur_ns) FROM gpu_activities WHERE rank = ? AND category = 'communication'"
    ) == (exp["comm"], exp["comm_ns"])
    assert one(
        "SELECT count(*), sum(dur_ns), count(msg_bytes), count(msg_bytes_note) FROM collectives WHERE rank "
        "= ?"
    ) == (exp["comm"], exp["comm_ns"], 0, exp["comm"])
    ops = dict(rows(con, "SELECT op, count(*) FROM collectives WHERE rank = ? GROUP BY op", [rank]))
    assert ops == exp["comm_ops"]
    # every work range has its host-side launch, and it lies in a step when the work belongs to one
    assert one("SELECT count(*), count(launch_ns) FROM gpu_work WHERE rank = ?") == (exp["work"], exp["work"])
    steps = rows(con, "SELECT step, start_ns, end_ns, source FROM steps WHERE rank = ? ORDER BY step", [rank])
    assert [(s, e) for _, s, e, _ in steps] == exp["steps"] and len(steps) == 5
    assert [n for n, *_ in steps] == list(range(5)) and {src for *_, src in steps} == {"nvtx"}
    b = breakdown.filter(pl.col("rank") == rank)
    r = b.filter(pl.col("level") == "rank").row(0, named=True)
    assert (r["gpu_busy_ns"], r["comm_ns"], r["compute_ns"], r["kernels"]) == (
        exp["busy"],
        exp["comm_union"],
        exp["compute_union"],
        exp["work"],
    )
    # each step holds exactly the thunks of its module execution (NumChild of the XlaModule range)
    assert b.filter(pl.col("level") == "step").sort("step")["kernels"].to_list() == exp["step_thunks"]
    dev = rows(
        con,
        "SELECT device, name, bus_id, num_sms, total_memory_bytes, used, compute_major FROM devices "
        "WHERE rank = ?",
        [rank],
    )
    assert dev == [(exp["device"], exp["device_name"], exp["bus_id"], exp["sms"], exp["memory"], True, 8)]
    assert one("SELECT count(DISTINCT device), min(device) FROM gpu_activities WHERE rank = ?") == (
        1,
        exp["device"],
    )
    assert one(
        "SELECT count(*), count(*) FILTER (WHERE domain = 'NCCL'), count(*) FILTER (WHERE kind <> 'nvtx') "
        "FROM annotations WHERE rank = ?"
    ) == (exp["annotations"], exp["nccl_annotations"], 0)
    src = one(
        "SELECT format, rank, ranks, rank_source, host, base_time_ns, status, notes, tool_versions "
        "FROM sources WHERE rank = ?"
    )
    assert src[:7] == ("nsys_jax", exp["rank"], [exp["rank"]], "xla_process", exp["host"], None, "ok")
    assert any("relative to this process's capture start" in n for n in src[7])
    assert '"nsys_recipe": "nvtx_gpu_proj_trace"' in src[8]


@pytest.mark.parametrize("i", range(N))
def test_single_archive(tmp_path, i):
    lake = Lake(tmp_path / "lake")
    [res] = ingest_paths([archive(i)], lake)
    assert res.status == "ok", res.error
    assert res.rank == expected(i)["rank"] == i
    con = query.connect(lake)
    check_rank(con, i, res.rank, query.run(con, "breakdown"))


@pytest.fixture(scope="module")
def combined(tmp_path_factory):
    lake = Lake(tmp_path_factory.mktemp("jax") / "lake")
    res = ingest_paths([archive(i) for i in range(N)], lake, run="pax")
    assert [r.status for r in res] == ["ok"] * N, [r.error for r in res]
    return lake, query.connect(lake)


def test_four_archives_one_run(combined):
    lake, con = combined
    assert rows(con, "SELECT count(DISTINCT rank), count(DISTINCT run_id) FROM sources") == [(N, 1)]
    breakdown = query.run(con, "breakdown")
    for i in range(N):
        check_rank(con, i, expected(i)["rank"], breakdown)


def test_collectives_match_across_ranks(combined):
    _, con = combined
    m = query.run(con, "collective_matching")
    n = expected(0)["comm"]
    assert all(expected(i)["comm"] == n for i in range(N))
    assert m.height == n
    assert set(m["ranks_seen"]) == {N} and m["complete"].all()
    # the k-th call is the same HLO instruction on every rank
    names = rows(
        con,
        "SELECT call_key, count(DISTINCT regexp_extract(op_raw, 'hlo_op=([^#]*)#', 1)), "
        "any_value(regexp_extract(op_raw, 'hlo_op=([^#]*)#', 1)) FROM collective_ranks "
        "GROUP BY call_key ORDER BY call_key",
    )
    assert [c for _, c, _ in names] == [1] * n
    assert [x for *_, x in names] == expected(0)["comm_names"]
    # transfer time = the shortest duration among the ranks (offset-free despite per-process clocks)
    want = [min(expected(i)["comm_durs"][k] for i in range(N)) for k in range(n)]
    assert m.sort("call_key")["transfer_ns"].to_list() == want


def test_capture_environment_stays_out(combined):
    lake, _ = combined
    secrets = set()
    for i in range(N):
        env = {r["name"]: r["value"] for r in member_table(i, "system-metadata.parquet").to_pylist()}
        for k in (
            "KernelVersion",
            "OsDescription",
            "CpuDescription",
            "TargetInstallDir",
            "InjectionFilesStoragePath",
        ):
            if env.get(k) and len(env[k]) >= 8:
                secrets.add(env[k])
        secrets |= {e for e in env["DeviceEnvironment"].split(";") if "=" in e and len(e) >= 16}
        threads = member_table(i, "thread-metadata.parquet")
        # host threads' names (other processes on the capture host): the 20 longest
        secrets |= set(
            sorted({n for n in threads["Name"].to_pylist() if n and not n.startswith("Xla")}, key=len)[-20:]
        )
        assert env["Hostname"] and env["NvDriverVersion"]  # allow-listed: may be in the lake
    assert len(secrets) > 20
    values: list[str] = []
    for f in sorted(Path(lake.root).rglob("*.parquet")):
        t = pq.ParquetFile(f).read()
        for name in t.column_names:
            col = t.column(name)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                values += set(col.drop_null().to_pylist())
            elif pa.types.is_list(col.type) and pa.types.is_string(col.type.value_type):
                values += {v for lst in col.drop_null().to_pylist() for v in lst if v}
    text = "\x00".join(values)  # every string cell of every table the ingest wrote
    assert len(values) > 10_000 and "nvtx_gpu_proj_trace" in text
    assert [s[:20] for s in secrets if s in text] == []


def test_xla_collective_names_are_communication_by_name():
    names = [
        "Thunk:#hlo_op=all-gather-start.2#",
        "Thunk:#name=x/psum,hlo_op=all-reduce-start#",
        "Thunk:#hlo_op=reduce-scatter.131#",
        "Thunk:#hlo_op=all-to-all.3#",
        "Thunk:#hlo_op=collective-permute-done#",
        "Thunk:#hlo_op=reduce-scatter-fusion.2#",
        "Thunk:#hlo_op=gemm_fusion_dot.411#",
        "Thunk:#hlo_op=all-reduce-scatter#",
    ]
    df = pl.DataFrame(
        {
            "kind": ["kernel"] * len(names),
            "name": names,
            "external_id": [None] * len(names),
            "has_comm_args": [False] * len(names),
        },
        schema_overrides={"external_id": pl.Int64},
    )
    out = classify.classify(df, None, None)
    assert out["category"].to_list() == ["communication"] * 5 + ["compute"] * 3
    assert out["classified_by"].to_list()[:5] == ["name"] * 5


def _zip_with(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_bad_archives_fail_alone(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    raw = archive(0).read_bytes()
    (d / "truncated.zip").write_bytes(raw[: len(raw) // 2])
    with zipfile.ZipFile(archive(0)) as z:
        meta = z.read("device-metadata.parquet")
    _zip_with(d / "no_trace.zip", {"device-metadata.parquet": meta})
    _zip_with(d / "not_parquet.zip", {TRACE: b"this is not parquet"})
    shutil.copy(archive(1), d / "good.zip")
    res = {Path(r.path).name: r for r in ingest_paths([d], Lake(tmp_path / "lake"), run="bad")}
    assert res["good.zip"].status == "ok" and res["good.zip"].rank == 1
    for name, words in (
        ("truncated.zip", "corrupt or truncated zip"),
        ("no_trace.zip", f"without {TRACE}"),
        ("not_parquet.zip", "not readable Parquet"),
    ):
        r = res[name]
        assert r.status == "failed" and words in r.error and "\n" not in r.error, (name, r.error)
    src = rows(
        query.connect(Lake(tmp_path / "lake")),
        "SELECT count(*) FILTER (WHERE status = 'failed'), count(*) FILTER (WHERE status = 'ok') "
        "FROM sources",
    )
    assert src == [(3, 1)]
    # a file that cannot be opened as a zip at all was not detected as anything: format unknown
    # (schemas/v3.toml sources.format); the two real zips stay nsys-jax archives that failed
    formats = dict(
        rows(
            query.connect(Lake(tmp_path / "lake")),
            "SELECT regexp_extract(path, '[^/]+$'), format FROM sources WHERE status = 'failed'",
        )
    )
    assert formats == {"truncated.zip": "unknown", "no_trace.zip": "nsys_jax", "not_parquet.zip": "nsys_jax"}


def test_unsafe_member_names_and_decompression_limit(tmp_path, monkeypatch):
    with zipfile.ZipFile(archive(2)) as z:
        members = {n: z.read(n) for n in (TRACE, "device-metadata.parquet", "system-metadata.parquet")}
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    evil = _zip_with(work / "evil.zip", {"../../escaped.txt": b"x", "/tmp_abs_escaped.txt": b"x", **members})
    monkeypatch.chdir(work)
    [r] = ingest_paths([evil], Lake(tmp_path / "lake"), run="evil")
    assert r.status == "ok" and r.rank == 2
    assert not list(tmp_path.rglob("*escaped.txt")) and not Path("/tmp_abs_escaped.txt").exists()
    # a member larger than the limit is refused before it is decompressed
    monkeypatch.setenv("TRACELAKE_MAX_UNCOMPRESSED_BYTES", str(len(members[TRACE]) - 1))
    [r] = ingest_paths([evil], Lake(tmp_path / "lake2"), run="evil")
    assert r.status == "failed" and "TRACELAKE_MAX_UNCOMPRESSED_BYTES" in r.error and "\n" not in r.error
