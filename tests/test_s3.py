"""Object storage (issue 37 item 4): inputs and the lake at s3:// URLs, against a real S3
protocol server (moto's standalone server on 127.0.0.1, started here), with credentials from the
AWS environment only.

Expected values come from the same inputs ingested from and into a local directory (whose answers
the rest of the suite checks against hand values and HTA): the same sources (content hashes,
sizes, ranks, runs), the same metric rows and the same analysis document, the lake's path aside.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO, corpus
from moto.server import ThreadedMotoServer  # the test extra's moto[server]
from typer.testing import CliRunner

from pipeline import objstore, query
from pipeline.analyze import analyze
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake, LakeBusy, LakeError
from pipeline.lake_s3_files import split_stem

runner = CliRunner()
SECRET = "s3cr3t-Wq8ZpL0vN4kT"  # the secret key: must appear in no object, report or log
KEY_ID = "AKIATRACELAKETEST"


def _tree(root: Path) -> Path:
    """Two jobs as a team's bucket holds them: 2026-11-04/job-a (HTA's two sampled ranks),
    2026-11-05/job-b (HTA's simple_add trace and a torchtitan NCCL_DEBUG log), and a text file
    that is no log."""
    a = root / "2026-11-04" / "job-a"
    b = root / "2026-11-05" / "job-b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    for f in sorted((REPO / "sample_traces" / "hta_trace_filter").glob("*.json.gz")):
        shutil.copy(f, a / f.name)
    shutil.copy(
        corpus("hta", "tests", "data", "critical_path", "end_to_end", "simple_add", "input", "trace.json.gz"),
        b,
    )
    shutil.copy(corpus("nccl", "torchtitan-issue-1369-coll-allgather-reducescatter-tp2.log"), b / "nccl.log")
    (b / "notes.txt").write_text("nothing of NCCL here\n")
    return root


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 with bucket `traces` holding _tree() under archive/, and an
    empty bucket `lakes`; the AWS environment points at it."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    mp = pytest.MonkeyPatch()
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        mp.delenv(k, raising=False)
    mp.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    mp.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mp.setenv("TRACELAKE_S3_LOCK_TTL_S", "30")
    objstore._fs.cache_clear()
    local = _tree(tmp_path_factory.mktemp("traces") / "archive")
    fs = objstore.filesystem()
    fs.mkdir("traces")
    fs.mkdir("lakes")
    fs.put(str(local) + "/", "traces/archive/", recursive=True)
    yield local
    objstore._fs.cache_clear()
    mp.undo()
    server.stop()


@pytest.fixture(scope="module")
def reference(s3, tmp_path_factory):
    """The local run: the tree ingested from a local directory into a local lake, analysed."""
    lake = Lake(tmp_path_factory.mktemp("ref") / "lake")
    res = ingest_paths([s3], lake)
    assert sorted(r.status for r in res) == ["ok"] * 4
    return lake, analyze(lake, keep=False)


def _same_sources(a: Lake, b: Lake, runs: list[str] | None = None) -> None:
    cols = ["run_id", "source_id", "content_sha256", "size_bytes", "rank", "format", "status"]
    got = a.sources(runs).select(cols).sort("source_id").to_dicts()
    assert got == b.sources(runs).select(cols).sort("source_id").to_dicts()


def _doc(doc: dict, lake) -> str:
    return json.dumps(doc, sort_keys=True, default=str).replace(str(lake.root), "<LAKE>")


def test_inputs_from_a_bucket_into_a_local_lake(s3, reference, tmp_path):
    ref_lake, ref_doc = reference
    lake = Lake(tmp_path / "lake")
    res = ingest_paths(["s3://traces/archive/"], lake)
    got = sorted((r.path, r.run_id, r.status) for r in res)
    assert got == [
        ("s3://traces/archive/2026-11-04/job-a/sampled_rank-0.json.gz", "2026-11-04.job-a", "ok"),
        ("s3://traces/archive/2026-11-04/job-a/sampled_rank-1.json.gz", "2026-11-04.job-a", "ok"),
        ("s3://traces/archive/2026-11-05/job-b/nccl.log", "2026-11-05.job-b", "ok"),
        ("s3://traces/archive/2026-11-05/job-b/trace.json.gz", "2026-11-05.job-b", "ok"),
    ]
    _same_sources(lake, ref_lake)
    assert sorted(lake.sources()["path"].to_list()) == [g[0] for g in got]  # the URL, no credentials
    assert _doc(analyze(lake, keep=False), lake) == _doc(ref_doc, ref_lake)


def test_a_lake_in_a_bucket_answers_as_a_local_one(s3, reference):
    ref_lake, ref_doc = reference
    lake = Lake("s3://lakes/nightly")
    assert type(lake).__name__ == "S3Lake"
    res = ingest_paths(["s3://traces/archive/"], lake)
    assert sorted(r.status for r in res) == ["ok"] * 4
    _same_sources(lake, ref_lake)
    assert ingest_paths(["s3://traces/archive/"], lake)[0].status == "skipped"  # content already there
    # the metric rows DuckDB computes through the registered file system
    want = query.run(query.connect(ref_lake), "step_time").sort(["run_id", "rank", "step"]).to_dicts()
    assert query.run(query.connect(lake), "step_time").sort(["run_id", "rank", "step"]).to_dicts() == want
    first = analyze(lake)
    assert _doc(first, lake) == _doc(ref_doc, ref_lake)
    kept = objstore.filesystem().find("lakes/nightly/results")
    assert any(k.endswith(".json") and "/2026-11-04.job-a/" in k for k in kept)
    assert analyze(lake) == first  # read back from the kept results in the bucket
    con = query.connect(lake)
    assert sorted(con.sql("SELECT run_id, current FROM runs_overview").fetchall()) == [
        ("2026-11-04.job-a", True),
        ("2026-11-05.job-b", True),
    ]
    assert not objstore.filesystem().exists("lakes/nightly/.lock")  # released


def test_a_nightly_ingest_fetches_only_new_or_replaced_objects(s3, monkeypatch):
    import time

    from pipeline.ingest import objects

    fs = objstore.filesystem()
    fs.put(str(s3 / "2026-11-04") + "/", "traces/nightly/2026-11-04/", recursive=True)
    time.sleep(objects.MODIFIED_MARGIN_S + 0.1)  # written before this first ingest, by the margin
    lake = Lake("s3://lakes/nightly-skips")
    assert [r.status for r in ingest_paths(["s3://traces/nightly/"], lake)] == ["ok", "ok"]
    fetched, real_open = [], objects.ObjectInput.open
    monkeypatch.setattr(objects.ObjectInput, "open", lambda self: fetched.append(self.url) or real_open(self))
    res = ingest_paths(["s3://traces/nightly/"], lake)
    assert [r.status for r in res] == ["skipped", "skipped"] and fetched == []
    # a rank file written again (other bytes) is read again; the unchanged one still is not
    rank1 = "traces/nightly/2026-11-04/job-a/sampled_rank-1.json.gz"
    fs.pipe_file(rank1, fs.cat_file("traces/nightly/2026-11-04/job-a/sampled_rank-0.json.gz"))
    res = ingest_paths(["s3://traces/nightly/"], lake)
    assert fetched == [f"s3://{rank1}"]  # hashed; its new bytes are rank 0's, already held: not parsed
    assert [r.status for r in res] == ["skipped", "skipped"]
    assert "already in the lake" in " ".join(res[1].notes)


def _cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_cli_over_a_bucket_and_no_credentials_stored(s3, tmp_path):
    lake = "s3://lakes/cli"
    out = []
    for args in (
        ["ingest", "s3://traces/archive/2026-11-04/", "--lake", lake],
        ["report", "--lake", lake, "-o", str(tmp_path / "report.html")],
        ["sql", "--lake", lake, "--format", "csv", "SELECT count(*) AS n FROM gpu_activities"],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        out.append(r.output)
    assert out[2].split() == ["n", "2358"]  # HTA's two sampled ranks: 1204 + 1154 (test_cli)
    fs = objstore.filesystem()
    stored = b"".join(fs.cat_file(k) for k in fs.find("lakes/cli"))
    assert b"s3://traces/archive/2026-11-04/job-a/sampled_rank-0.json.gz" in stored  # the path, as a URL
    report = (tmp_path / "report.html").read_text()
    assert "job-a" in report  # the run, named by its prefix below the one given
    for secret in (SECRET, KEY_ID):
        assert secret.encode() not in stored
        assert secret not in report
        assert secret not in "".join(out)


def test_bad_urls_give_one_line_naming_them(s3, tmp_path):
    for args, url in (
        (["ingest", "s3://no-such-bucket/x/", "--lake", str(tmp_path / "l")], "s3://no-such-bucket/x"),
        (
            ["ingest", "s3://traces/archive/no-such-day/", "--lake", str(tmp_path / "l")],
            "s3://traces/archive/no-such-day",
        ),
        (["ingest", str(s3), "--lake", "s3://no-such-bucket/lake"], "s3://no-such-bucket/lake"),
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and url in lines[0], r.output
    assert not (tmp_path / "l").exists()
    for lake, what in (
        ("s3://lakes/none", "not a tracelake lake"),
        ("s3://no-such-bucket/l", "not a tracelake"),
    ):
        r = runner.invoke(app, ["analyze", "--lake", lake])
        assert r.exit_code == 2 and r.output.strip().splitlines() == [r.output.strip()], r.output
        assert r.output.startswith(f"error: {lake}: {what}")
    with pytest.raises(
        LakeError, match=r"^s3://traces/archive: a non-empty prefix that is not a tracelake lake"
    ):
        Lake("s3://traces/archive").ensure()
    with pytest.raises(objstore.ObjectStoreError, match="credentials"):
        Lake("s3://KEY:SECRET@bucket/lake")


def test_without_s3fs_the_error_names_the_extra(s3, monkeypatch):
    objstore._fs.cache_clear()  # a process that has not made its file system yet
    monkeypatch.setitem(sys.modules, "s3fs", None)
    try:
        with pytest.raises(LakeError, match=r"^s3:// paths need the s3 extra: pip install 'tracelake\[s3\]'"):
            Lake("s3://lakes/x").exists()
    finally:
        objstore._fs.cache_clear()


def test_one_writer_at_a_time(s3):
    lake = Lake("s3://lakes/locked")
    with lake.lock():
        holder = json.loads(objstore.filesystem().cat_file("lakes/locked/.lock"))
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(LakeBusy, match=rf"pid {os.getpid()} on {socket.gethostname()}"):
            with Lake("s3://lakes/locked").lock():
                pass
    with lake.lock():  # released: taken again
        pass
    # a holder on another machine that stopped renewing its lease: taken over once it expired
    fs = objstore.filesystem()
    stale = {"pid": 1, "host": "gpu-node-17", "since": "2026-11-04T02:00:00+00:00", "expires": 0}
    fs.pipe_file("lakes/locked/.lock", json.dumps(stale).encode())
    with lake.lock():
        assert json.loads(fs.cat_file("lakes/locked/.lock"))["pid"] == os.getpid()
    # one whose lease has not expired is not
    fs.pipe_file("lakes/locked/.lock", json.dumps({**stale, "expires": 4e9}).encode())
    with pytest.raises(LakeBusy, match="pid 1 on gpu-node-17, since 2026-11-04T02:00:00"):
        with lake.lock():
            pass
    fs.rm("lakes/locked/.lock")


def test_the_lock_lease_is_renewed_while_held(s3, monkeypatch):
    import time

    monkeypatch.setenv("TRACELAKE_S3_LOCK_TTL_S", "0.9")  # renewed every 0.3 s
    fs = objstore.filesystem()
    with Lake("s3://lakes/renewed").lock():
        first = json.loads(fs.cat_file("lakes/renewed/.lock"))["expires"]
        time.sleep(1.2)  # past the first lease
        now = json.loads(fs.cat_file("lakes/renewed/.lock"))["expires"]
        assert now > first and now > time.time()
        with pytest.raises(LakeBusy):  # still held: not taken over
            with Lake("s3://lakes/renewed").lock():
                pass


def test_a_writer_whose_lock_was_taken_over_commits_nothing(s3, monkeypatch):
    import time

    monkeypatch.setenv("TRACELAKE_S3_LOCK_TTL_S", "0.9")
    fs = objstore.filesystem()
    lake = Lake("s3://lakes/taken")
    with lake.lock():
        other = {"pid": 7, "host": "gpu-node-3", "since": "now", "expires": time.time() + 60}
        fs.pipe_file("lakes/taken/.lock", json.dumps(other).encode())  # another writer took it
        time.sleep(0.7)  # a renewal has failed on the new ETag
        with pytest.raises(LakeError, match="^s3://lakes/taken: this ingest lost the lake's lock"):
            lake.commit(lake.stage("r", "s", {}), {"run_id": "r", "source_id": "s"})
    assert json.loads(fs.cat_file("lakes/taken/.lock"))["host"] == "gpu-node-3"  # theirs, left alone
    assert not fs.find("lakes/taken/sources")


def _objects_per_source(lake_url: str) -> Counter:
    """(table, run directory, source id) -> how many objects of that source the bucket holds
    (versions of a replaced source counted together)."""
    fs = objstore.filesystem()
    fs.invalidate_cache()
    keys = [
        k.split("/")[-3:] for k in fs.find(objstore.key(lake_url)) if "/run=" in k and k.endswith(".parquet")
    ]
    return Counter((t, r, split_stem(name[:-8])[0]) for t, r, name in keys)


@pytest.mark.parametrize(
    ("point", "force"), [("s3-parts:2", False), ("s3-parts:1", True), ("s3-replace:1", True)]
)
def test_a_killed_ingest_leaves_whole_sources_only(s3, reference, point, force, tmp_path):
    """SIGKILL after the second source's parts are uploaded but before its `sources` row: readers
    see one whole source. With --force over both sources, killed before the first replacement's row
    (s3-parts:1) or after it, before the replaced version is deleted (s3-replace:1): readers still
    see both sources, each once and whole (the earlier version until the new row is up). The next
    ingest takes over the dead holder's lock, removes what no reader sees (one object per source
    and table is left) and ends equal to the local lake."""
    ref_lake, _ = reference
    lake_url = f"s3://lakes/killed-{point.split(':')[0]}-{force}"
    src = "s3://traces/archive/"  # job-a only: its run named as in the local lake
    lake = Lake(lake_url)
    if force:
        assert [r.status for r in ingest_paths([src], lake, exclude=["2026-11-05"])] == ["ok", "ok"]
        before = _objects_per_source(lake_url)
    args = ["ingest", src, "--exclude", "2026-11-05", "--lake", lake_url, "--jobs", "1"]
    r = _cli(*args, *(["--force"] if force else []), env={"TRACELAKE_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL, r.stderr
    fs = objstore.filesystem()
    assert fs.exists(objstore.key(lake_url) + "/.lock")  # left by the dead process
    src_rows = lake.sources()
    assert src_rows.height == (2 if force else 1)  # whole sources only, none lost to --force
    sids = src_rows["source_id"].to_list()
    assert _counts(lake) == {k: n for k, n in _counts(ref_lake).items() if k[1] in sids}
    # what no reader reads is there: the other source's parts, a replacement's parts, or the
    # replaced version's objects beside the new ones
    left = _objects_per_source(lake_url)
    assert max(left.values()) == 2 if force else len(left) > len(set((t, r) for t, r, _ in left))
    res = ingest_paths([src], lake, exclude=["2026-11-05"])  # takes over the dead process's lock
    assert sorted(r.status for r in res) == (["skipped", "skipped"] if force else ["ok", "skipped"])
    _same_sources(lake, ref_lake, ["2026-11-04.job-a"])
    assert set(_objects_per_source(lake_url).values()) == {1}
    if force:
        assert _objects_per_source(lake_url).keys() == before.keys()
    assert not fs.exists(objstore.key(lake_url) + "/.lock")


def _counts(lake) -> dict:
    """(table, source id) -> rows, through a query connection (tables only: no metric views)."""
    con = query.connect(lake, metric_views=False, derived_views=False, fleet=False)
    out = {}
    for t in ("gpu_activities", "cpu_ops", "steps", "nccl_events"):
        for sid, n in con.execute(f"SELECT source_id, count(*) FROM {t} GROUP BY ALL").fetchall():
            out[(t, sid)] = n
    return out


def test_compaction_forget_and_force_in_a_bucket(s3, reference):
    """`tracelake compact` of a lake in a bucket merges each run's sources into c-<gen>-<k> files
    named by the run's manifest (no source keeps objects of its own), and the lake still answers
    as the local, uncompacted one: the same sources, rows and (at the end, job-b still compacted)
    analysis document. A kill right after the switch leaves every row visible once; the next
    command removes the superseded objects. `forget` of a source inside the generation, then
    `ingest --force` of the run (one source held by the generation, one forgotten) end equal to
    the local lake again. Row counts per source come from the local lake read by DuckDB."""
    ref_lake, ref_doc = reference
    ref_counts = _counts(ref_lake)
    url = "s3://lakes/compacted"
    lake = Lake(url)
    assert sorted(r.status for r in ingest_paths(["s3://traces/archive/"], lake, compact=False)) == ["ok"] * 4
    r = _cli("compact", "--lake", url, env={"TRACELAKE_CRASH_AT": "compact-switched:1"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    _same_sources(lake, ref_lake)  # one run switched, its old objects still there: read once
    assert _counts(lake) == ref_counts
    with lake.lock():  # what `tracelake compact` does
        assert lake.recover()  # what the kill left (a line per object)
        assert [d[0] for d in lake.compact()] == ["2026-11-05.job-b"]  # the run the kill left
    fs = objstore.filesystem()
    fs.invalidate_cache()
    assert sorted(k.rsplit("/", 1)[-1] for k in fs.find("lakes/compacted/_compacted")) == [
        "run=2026-11-04.job-a.json",
        "run=2026-11-05.job-b.json",
    ]
    left = _objects_per_source(url)
    assert left and all(sid.startswith("c-") for _, _, sid in left)  # only compacted files
    assert set(left.values()) == {1}
    _same_sources(lake, ref_lake)
    assert _counts(lake) == ref_counts
    # forget one of job-a's two sources: the generation is rewritten without it
    ref_src = ref_lake.sources(["2026-11-04.job-a"]).sort("rank")
    gone, kept = ref_src["source_id"].to_list()
    with lake.lock():
        assert lake.forget([("2026-11-04.job-a", gone)]) == 1
    assert sorted(lake.sources(["2026-11-04.job-a"])["source_id"].to_list()) == [kept]
    assert _counts(lake) == {k: n for k, n in ref_counts.items() if k[1] != gone}
    # --force: the forgotten source comes back, the held one is replaced (out of the generation)
    res = ingest_paths(["s3://traces/archive/2026-11-04/"], lake, run="2026-11-04/job-a", force=True)
    assert sorted(r.status for r in res) == ["ok", "ok"]
    _same_sources(lake, ref_lake)
    assert _counts(lake) == ref_counts
    fs.invalidate_cache()  # job-a's generation held only the replaced source: its manifest is gone
    assert [k.rsplit("/", 1)[-1] for k in fs.find("lakes/compacted/_compacted")] == [
        "run=2026-11-05.job-b.json"
    ]
    with lake.lock():
        assert lake.recover() == []  # nothing left over
    assert set(_objects_per_source(url).values()) == {1}
    assert _doc(analyze(lake, keep=False), lake) == _doc(ref_doc, ref_lake)


def test_an_ingest_of_many_small_files_compacts_their_run_in_the_bucket(s3, tmp_path):
    """An ingest compacts a run it wrote 16 or more small sources to (AUTO_MIN_SOURCES), in a
    bucket as on a local disk: 16 one-kernel ranks of one job end as one compacted file per table,
    named by the run's manifest, holding the 16 sources' rows (one kernel each, written by hand)."""
    from conftest import X, write_trace

    from pipeline.lake_compact import AUTO_MIN_SOURCES

    d = tmp_path / "job-small"
    for r in range(AUTO_MIN_SOURCES):
        ev = [X("kernel", f"k{r}", 1_000 + r, 50, pid=0, tid=7, device=0, stream=7, correlation=1)]
        write_trace(d / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": AUTO_MIN_SOURCES})
    url = "s3://lakes/small"
    lake = Lake(url)
    assert [r.status for r in ingest_paths([d], lake, jobs=1)] == ["ok"] * AUTO_MIN_SOURCES
    fs = objstore.filesystem()
    fs.invalidate_cache()
    assert [k.rsplit("/", 1)[-1] for k in fs.find("lakes/small/_compacted")] == ["run=job-small.json"]
    left = _objects_per_source(url)
    assert all(sid.startswith("c-") for _, _, sid in left) and set(left.values()) == {1}
    assert {t for t, _, _ in left} >= {"sources", "gpu_activities"}
    con = query.connect(lake, metric_views=False, derived_views=False, fleet=False)
    got = con.sql("SELECT rank, name, dur_ns FROM gpu_activities ORDER BY rank").fetchall()
    assert got == [(r, f"k{r}", 50_000) for r in range(AUTO_MIN_SOURCES)]
    assert lake.sources().height == AUTO_MIN_SOURCES


def test_a_lake_of_an_older_schema_copied_into_a_bucket_is_upgraded(s3, reference, tmp_path):
    """A local schema v1 lake (gpu_activities without the derived columns, cpu_ops without the
    traffic columns: test_derive's _make_old) copied into a bucket as `aws s3 sync` would (its
    .lock file too) is upgraded on first read: the same gpu_activities rows (derived columns
    included) and cpu_ops traffic columns as the current local lake, every part of the current
    schema, the marker at the current version."""
    from test_derive import _make_old

    from pipeline import derive, upgrade

    ref_lake, _ = reference
    old = tmp_path / "old"
    shutil.copytree(ref_lake.root, old)
    _make_old(Lake(old), 1)
    fs = objstore.filesystem()
    fs.put(str(old) + "/", "lakes/old/", recursive=True)
    lake = Lake("s3://lakes/old")
    assert upgrade.marker_version(lake) == 1

    def rows(lk, sql):  # through a connection of tables only: it upgrades the lake first
        con = query.connect(lk, metric_views=False, derived_views=False, fleet=False)
        return con.sql(sql).fetchall()

    for sql in (
        "SELECT * EXCLUDE (run_id) FROM gpu_activities ORDER BY ALL",
        "SELECT source_id, name, start_ns, mem_bytes, vector_flops FROM cpu_ops ORDER BY ALL",
    ):
        assert rows(lake, sql) == rows(ref_lake, sql)
    assert upgrade.marker_version(lake) == upgrade.sch.SCHEMA_VERSION
    for url in lake.table_files("gpu_activities"):
        with fs.open(objstore.key(url), "rb") as f:
            assert set(derive.DERIVED) <= set(pq.ParquetFile(f).schema_arrow.names)
    for t in ("cpu_ops", "gpu_activities", "sources"):
        for url in lake.table_files(t):
            with fs.open(objstore.key(url), "rb") as f:
                assert pq.ParquetFile(f).schema_arrow.names == upgrade.sch.arrow_schema(t).names


@pytest.fixture(scope="module")
def cluster(s3):
    """Two worker processes (their own file systems and staging directories); they get the AWS
    environment as any process of the machine does, and from this process only URLs."""
    import distributed

    with distributed.LocalCluster(
        processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None
    ) as c:
        yield c


def test_dask_workers_share_only_the_bucket(s3, reference, cluster, monkeypatch):
    from pipeline.analyze_cluster import analyze_on_cluster

    ref_lake, ref_doc = reference
    lake = Lake("s3://lakes/fleet")
    # every staged source reaches this process as an object in the bucket, not a worker's path
    from pipeline.lake_s3 import S3Lake

    handed, localize = [], S3Lake._localize
    monkeypatch.setattr(S3Lake, "_localize", lambda self, st: handed.append(st.dir) or localize(self, st))
    res = ingest_paths(["s3://traces/archive/"], lake, scheduler=cluster.scheduler_address)
    assert sorted(r.status for r in res) == ["ok"] * 4, [r.error for r in res]
    assert len(handed) == 4 and all(d.startswith("s3://lakes/fleet/.tmp/") for d in handed)
    _same_sources(lake, ref_lake)
    assert not objstore.filesystem().find("lakes/fleet/.tmp")  # every published source committed
    doc, failures = analyze_on_cluster(lake, cluster.scheduler_address)
    assert failures == []
    assert _doc(doc, lake) == _doc(ref_doc, ref_lake)
    # the workers kept each run's result in the bucket: read back here
    kept = objstore.filesystem().find("lakes/fleet/results")
    assert sum(k.endswith(".json") and "_state" not in k for k in kept) == 2
    assert _doc(analyze(lake), lake) == _doc(ref_doc, ref_lake)


def test_archives_in_a_bucket_are_read_as_local_ones(s3, tmp_path):
    """job-a's two ranks as a .tar.gz and a .zip in the bucket: the members' rows, runs and hashes
    are those of the same archives read from a local directory, named by the object's URL."""
    import tarfile
    import zipfile

    local = tmp_path / "archives" / "2026-11-06"
    local.mkdir(parents=True)
    ranks = sorted((s3 / "2026-11-04" / "job-a").glob("*.json.gz"))
    with tarfile.open(local / "job-c.tar.gz", "w:gz") as t:
        t.add(ranks[0], arcname=ranks[0].name)
    with zipfile.ZipFile(local / "job-d.zip", "w") as z:
        z.write(ranks[1], arcname=f"traces/{ranks[1].name}")
    shutil.copy(ranks[0], local / "job-e.tgz")  # named as an archive, a gzipped trace inside
    objstore.filesystem().put(str(tmp_path / "archives") + "/", "traces/archives/", recursive=True)
    want = ingest_paths([tmp_path / "archives"], Lake(tmp_path / "ref"))
    got = ingest_paths(["s3://traces/archives/"], Lake(tmp_path / "lake"))
    assert [(r.status, r.run_id) for r in got] == [
        ("ok", "2026-11-06.job-c"),
        ("ok", "2026-11-06.traces"),  # its directory inside the zip (archive.member_run_name)
        ("skipped", "2026-11-06.job-c"),  # job-c's member's bytes, already in that run
    ]
    assert [(r.status, r.run_id) for r in got] == [(r.status, r.run_id) for r in want]
    assert [r.path for r in got] == [
        "s3://traces/archives/2026-11-06/job-c.tar.gz!sampled_rank-0.json.gz",
        "s3://traces/archives/2026-11-06/job-d.zip!traces/sampled_rank-1.json.gz",
        "s3://traces/archives/2026-11-06/job-e.tgz",
    ]
    _same_sources(Lake(tmp_path / "lake"), Lake(tmp_path / "ref"))
