"""Archives of traces (.tar, .tar.gz, .zip) built here from corpus files are read in place: their
members land in the lake exactly as the same files ingested from a directory (table by table),
with path `archive!member`, the run of the member's directory and the rank of the member's own
file name. Unsafe member names are refused, decompression is bounded (bombs fail cleanly, alone),
and a second run over an archive skips what is already in the lake."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import corpus

from pipeline import schema as sch
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

# member name -> corpus file; "job" is the run, rank_not_found holds no rank (the name gives 5)
MEMBERS = {
    "job/sampled_rank-0.json.gz": ("hta", "tests", "data", "trace_filter", "sampled_rank-0.json.gz"),
    "job/sampled_rank-1.json.gz": ("hta", "tests", "data", "trace_filter", "sampled_rank-1.json.gz"),
    "job/worker5.json.gz": ("hta", "tests", "data", "rank_unavailable", "rank_not_found.json.gz"),
    "job/worker2.json": (
        "param",
        "et_replay",
        "tests",
        "inputs",
        "dlrm_kineto",
        "worker2_step_12.1694128201554.pt.trace.json",
    ),
    "job/nccl.log": ("nccl", "aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"),
    "job/notes.txt": None,  # not a log: left out, as a directory search would
}
NOTES = b"just some notes\n"


def member_bytes(name: str) -> bytes:
    return NOTES if MEMBERS[name] is None else corpus(*MEMBERS[name]).read_bytes()


@pytest.fixture(scope="module")
def direct(tmp_path_factory):
    """The same files ingested from a directory: the expected lake."""
    d = tmp_path_factory.mktemp("direct")
    for name in MEMBERS:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(member_bytes(name))
    lake = Lake(d / "lake")
    res = ingest_paths([d / "job"], lake)
    assert sorted(r.status for r in res) == ["ok"] * 5
    return lake


def make_archive(path: Path, members: dict[str, bytes]) -> Path:
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for n, data in members.items():
                z.writestr(n, data)
    else:
        with tarfile.open(path, "w:gz" if path.name.endswith(".tar.gz") else "w") as t:
            for n, data in members.items():
                info = tarfile.TarInfo(n)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return path


def rows(lake: Lake, table: str) -> list[str]:
    drop = {"sources": ["ingested_at_ns", "path"]}.get(table, [])
    out = []
    for f in sorted((lake.root / table).glob("run=*/*.parquet")):
        out += [repr(r) for r in pq.read_table(f).drop(drop).to_pylist()]
    return sorted(out)


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".zip"])
def test_members_ingest_like_the_same_files(suffix, direct, tmp_path):
    a = make_archive(tmp_path / f"traces{suffix}", {n: member_bytes(n) for n in MEMBERS})
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([a], lake)
    assert sorted((r.path, r.status) for r in res) == sorted(
        (f"{a.absolute()}!{n}", "ok") for n in MEMBERS if MEMBERS[n] is not None
    )
    for t in sch.tables():
        assert rows(lake, t) == rows(direct, t), t
    con = connect(lake)
    got = dict(con.execute("SELECT path, rank FROM sources").fetchall())
    assert got[f"{a.absolute()}!job/worker5.json.gz"] == 5
    assert con.execute("SELECT rank_source FROM sources WHERE rank = 5").fetchone()[0] == "file_name"
    # the two HTA ranks are one profiling window, run "job"; worker5 and worker2 come from other
    # jobs (their time spans overlap neither it nor each other), so each is a run of its own
    runs = dict(
        con.execute(
            "SELECT regexp_extract(path, '[^/!]*$'), run_id FROM sources WHERE rank IS NOT NULL"
        ).fetchall()
    )
    assert runs["sampled_rank-0.json.gz"] == runs["sampled_rank-1.json.gz"] == "job"
    assert len({runs["worker5.json.gz"], runs["worker2.json"], "job"}) == 3
    # a second run reads each member once to hash it and skips it
    again = ingest_paths([a], lake)
    assert [r.status for r in again] == ["skipped"] * 5
    for t in sch.tables():
        assert rows(lake, t) == rows(direct, t), t


def test_members_at_the_top_take_the_archive_name_as_run(tmp_path):
    a = make_archive(tmp_path / "run42.tar.gz", {"rank3.json.gz": member_bytes("job/worker5.json.gz")})
    (r,) = ingest_paths([a], Lake(tmp_path / "lake"))
    assert (r.status, r.run_id, r.rank) == ("ok", "run42", 3)


def test_an_nsys_export_inside_a_zip(tmp_path):
    sqlite = corpus("nsys", "nsightful", "power_iteration__baseline.sqlite")
    a = make_archive(tmp_path / "exports.zip", {"p/power.sqlite": sqlite.read_bytes()})
    lake, ref = Lake(tmp_path / "lake"), Lake(tmp_path / "ref")
    (r,) = ingest_paths([a], lake, run="p")
    (d,) = ingest_paths([sqlite], ref, run="p")
    assert r.status == d.status == "ok" and r.path.endswith("exports.zip!p/power.sqlite")
    for t in ("gpu_activities", "cpu_ops", "steps"):
        assert rows(lake, t) == rows(ref, t), t


def test_unsafe_members_are_refused_and_nothing_is_written_outside(tmp_path):
    good = member_bytes("job/sampled_rank-1.json.gz")
    for suffix in (".tar", ".zip"):
        a = make_archive(
            tmp_path / f"evil{suffix}",
            {"../escape.json": good, "/abs/escape.json": good, "ok/sampled_rank-1.json.gz": good},
        )
        res = {r.path.split("!", 1)[1]: r for r in ingest_paths([a], Lake(tmp_path / f"lake{suffix}"))}
        assert res["ok/sampled_rank-1.json.gz"].status == "ok"
        for bad in ("../escape.json", "/abs/escape.json"):
            assert res[bad].status == "failed" and "refused" in res[bad].error and "\n" not in res[bad].error
    assert not list(tmp_path.parent.rglob("escape.json")) and not Path("/abs/escape.json").exists()


def test_bombs_fail_cleanly_and_alone(tmp_path, monkeypatch):
    good = member_bytes("job/sampled_rank-1.json.gz")
    # 80 MB of spaces in ~80 KB: beyond the default 200:1 ratio once past 64 MB
    bomb = gzip.compress(b"[" + b" " * 80_000_000 + b"]", compresslevel=9)
    a = make_archive(tmp_path / "b.tar", {"x/bomb.json.gz": bomb, "x/sampled_rank-1.json.gz": good})
    res = {r.path.split("!", 1)[1]: r for r in ingest_paths([a], Lake(tmp_path / "l1"))}
    assert res["x/bomb.json.gz"].status == "failed" and "gzip bomb" in res["x/bomb.json.gz"].error
    assert res["x/sampled_rank-1.json.gz"].status == "ok"
    # a zip member that declares more than the limit is refused before it is inflated
    monkeypatch.setenv("TRACELAKE_MAX_UNCOMPRESSED_BYTES", str(10_000_000))
    z = make_archive(tmp_path / "b.zip", {"x/big.json": b" " * 20_000_000, "x/sampled_rank-1.json.gz": good})
    res = {r.path.split("!", 1)[1]: r for r in ingest_paths([z], Lake(tmp_path / "l2"))}
    assert (
        res["x/big.json"].status == "failed" and "TRACELAKE_MAX_UNCOMPRESSED_BYTES" in res["x/big.json"].error
    )
    assert res["x/sampled_rank-1.json.gz"].status == "ok"
    # a tar.gz whose own stream expands beyond the limit: the archive fails, other inputs go on
    (tmp_path / "in").mkdir()
    t = make_archive(tmp_path / "in" / "b.tar.gz", {"x/pad.json": b"\0" * 30_000_000})
    (tmp_path / "in" / "sampled_rank-1.json.gz").write_bytes(good)
    res = {Path(r.path).name: r for r in ingest_paths([tmp_path / "in"], Lake(tmp_path / "l3"))}
    assert res[t.name].status == "failed" and "gzip bomb" in res[t.name].error
    assert res["sampled_rank-1.json.gz"].status == "ok"
    assert os.environ["TRACELAKE_MAX_UNCOMPRESSED_BYTES"] == "10000000"


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_tar_gz_cut_inside_a_member_fails_alone(tmp_path, jobs):
    """A .tar.gz cut short (the copy was interrupted) inside a member's data: that archive gets one
    failed row naming the cut; the files beside it are still ingested (found by a new-user trial:
    the member's read raised past the batch)."""
    good = member_bytes("job/sampled_rank-1.json.gz")
    whole = make_archive(tmp_path / "whole.tar.gz", {"x/worker2.json": member_bytes("job/worker2.json")})
    (tmp_path / "in").mkdir()
    raw = whole.read_bytes()
    (tmp_path / "in" / "cut.tar.gz").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "in" / "sampled_rank-1.json.gz").write_bytes(good)
    res = {Path(r.path).name: r for r in ingest_paths([tmp_path / "in"], Lake(tmp_path / "l"), jobs=jobs)}
    assert sorted(res) == ["sampled_rank-1.json.gz", "worker2.json"]  # the member cut short, failed
    assert res["worker2.json"].path == str(tmp_path / "in" / "cut.tar.gz") + "!x/worker2.json"
    assert res["worker2.json"].status == "failed"
    assert res["worker2.json"].error == (
        "corrupt or truncated tar.gz (unexpected end of data): the archive ends inside this member; "
        "no member before it"
    )
    assert res["sampled_rank-1.json.gz"].status == "ok"


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_tar_gz_cut_inside_its_second_member_keeps_the_first(tmp_path, jobs):
    """The tester's cut.tar.gz (the first 60 KB of 83 KB, its first member whole) failed whole:
    the complete member is ingested, the one cut short fails with its own line (as a truncated
    .json.gz keeps its complete events). The second member is incompressible, so the cut, 20,000
    bytes before the end, lies inside it."""
    first = member_bytes("job/sampled_rank-1.json.gz")
    pad = json.dumps({"schemaVersion": 1, "pad": os.urandom(60_000).hex(), "traceEvents": []}).encode()
    whole = make_archive(tmp_path / "whole.tar.gz", {"a/first.json.gz": first, "a/second.json": pad})
    assert len(whole.read_bytes()) > len(first) + 60_000  # the second member's 120,000 hex digits
    (tmp_path / "in").mkdir()
    cut = tmp_path / "in" / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[:-20_000])
    lake = Lake(tmp_path / "l")
    res = ingest_paths([tmp_path / "in"], lake, jobs=jobs)
    assert [(r.path, r.status) for r in res] == [
        (f"{cut}!a/first.json.gz", "ok"),
        (f"{cut}!a/second.json", "failed"),
    ]
    assert res[1].error == (
        "corrupt or truncated tar.gz (unexpected end of data): the archive ends inside this member; "
        "the 1 complete member(s) before it were kept"
    )
    src = lake.sources()
    assert src.filter(src["status"] == "ok")["path"].to_list() == [f"{cut}!a/first.json.gz"]


CONFIG = b'{"lr": 0.1, "batch_size": 32}'  # a run's config.json kept beside its traces: not a trace


@pytest.mark.parametrize("suffix", ["", ".tar", ".tar.gz", ".zip"])
def test_exclude_leaves_out_files_directories_and_members(suffix, direct, tmp_path):
    """--exclude by name (config.json) and by path (a checkpoints directory): what is left lands
    exactly as the directory of the same traces without them; without --exclude config.json fails
    alone and the checkpoint traces are read (and skipped: copies of traces beside them)."""
    members = {n: member_bytes(n) for n in MEMBERS}
    members["job/config.json"] = CONFIG
    members["job/checkpoints/sampled_rank-9.json.gz"] = member_bytes("job/sampled_rank-0.json.gz")
    members["checkpoints/deep/sampled_rank-8.json.gz"] = member_bytes("job/sampled_rank-1.json.gz")
    members["job/old.tar.gz"] = make_archive(tmp_path / "old.tar.gz", {"x.json": CONFIG}).read_bytes()
    if suffix:
        src = make_archive(tmp_path / f"traces{suffix}", members)
    else:
        src = tmp_path / "traces"
        for n, data in members.items():
            (src / n).parent.mkdir(parents=True, exist_ok=True)
            (src / n).write_bytes(data)
    lake = Lake(tmp_path / "lake")
    # a directory by its name at any depth (trailing slash as in .gitignore), a file by its name,
    # an archive inside the archive (on disk: a tar.gz in the directory) by a glob
    res = ingest_paths([src], lake, exclude=["config.json", "checkpoints/", "old.tar*"])
    assert sorted(r.status for r in res) == ["ok"] * 5
    for t in sch.tables():
        assert rows(lake, t) == rows(direct, t), t
    plain = ingest_paths([src], Lake(tmp_path / "plain"))
    got = {Path(r.path.split("!")[-1]).name: (r.status, r.error) for r in plain}
    assert got["config.json"] == ("failed", "not a Kineto trace: JSON object without 'traceEvents'")
    # the checkpoint traces are found (not left out); they are copies of job's ranks 0 and 1, and
    # the same bytes are the same trace: of each pair, the one read first is ingested, the other
    # skipped as already ingested in this batch
    assert got["sampled_rank-9.json.gz"][0] in ("ok", "skipped") and got["sampled_rank-8.json.gz"][0] in (
        "ok",
        "skipped",
    )
    assert sorted(r.status for r in plain) == ["failed"] * 2 + ["ok"] * 5 + ["skipped"] * 2
    # on disk the inner tar.gz is read as an archive (its config-like member fails); inside an
    # archive it is refused
    assert (got["x.json"] if not suffix else got["old.tar.gz"])[0] == "failed"
    assert len(plain) == 9
    # a path pattern leaves out only that directory
    some = ingest_paths(
        [src], Lake(tmp_path / "some"), exclude=["config.json", "old.tar*", "job/checkpoints"]
    )
    # (sampled_rank-8 is a copy of sampled_rank-1: whichever is read first is ingested)
    assert sorted(Path(r.path.split("!")[-1]).name for r in some if r.status in ("ok", "skipped")) == sorted(
        [Path(n).name for n in MEMBERS if MEMBERS[n] is not None] + ["sampled_rank-8.json.gz"]
    )
    assert sorted(r.status for r in some) == ["ok"] * 5 + ["skipped"]


def test_exclude_on_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, app

    d = tmp_path / "job"
    d.mkdir()
    (d / "sampled_rank-0.json.gz").write_bytes(member_bytes("job/sampled_rank-0.json.gz"))
    (d / "config.json").write_bytes(CONFIG)
    r = CliRunner().invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "a")])
    assert r.exit_code == EXIT_PARTIAL
    assert (
        "hint: 1 file(s) are not traces (e.g. config.json); leave such files out with --exclude PATTERN"
        in r.output
    )
    r = CliRunner().invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "b"), "--exclude", "config.json"])
    assert r.exit_code == EXIT_OK, r.output
    assert "ingested 1, failed 0, skipped 0" in r.output and "hint" not in r.output
    # the directory given is searched even when its own name matches
    r = CliRunner().invoke(
        app, ["ingest", str(d), "--lake", str(tmp_path / "c"), "--exclude", "job", "-x", "config.json"]
    )
    assert r.exit_code == EXIT_OK and "ingested 1, failed 0" in r.output, r.output
    r = CliRunner().invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "d"), "--exclude", "*.json*"])
    assert r.exit_code == EXIT_FAILED and "(2 left out by --exclude)" in r.output, r.output
    r = CliRunner().invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "e"), "--exclude", "/"])
    assert r.exit_code == 2 and "empty pattern" in r.output, r.output


def test_a_zip_with_two_members_of_one_name_refuses_the_name_once_and_says_why(tmp_path):
    """A zip whose entries job/rank0.json are PARAM's DLRM worker0 and then worker1 (zipfile
    writes both; it opens a name as its last entry): both used to be read as worker1, the first
    then skipped as 'already in the lake', so worker0's rank was lost unsaid. The name is refused
    once (one result, one line, one `sources` row: both would be archive!job/rank0.json), saying
    how many entries hold it; the other member of the zip is ingested."""
    import warnings

    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    src = sorted(corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto").glob("worker*.json"))
    z = tmp_path / "a.zip"
    with zipfile.ZipFile(z, "w") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it writes
        f.write(src[0], "job/rank0.json")
        f.write(src[1], "job/rank0.json")
        f.write(src[2], "job/rank2.json")
    res = ingest_paths([z], Lake(tmp_path / "lake"), jobs=1)
    assert sorted((r.status, r.path.rsplit("!", 1)[-1]) for r in res) == [
        ("failed", "job/rank0.json"),
        ("ok", "job/rank2.json"),
    ]
    for r in res:
        if r.status == "failed":
            assert r.error == ("the zip holds 2 members of this name: which one is meant is unclear; refused")


def test_a_zip_of_200_entries_of_one_name_is_one_line_and_counted_once(tmp_path):
    """200 entries named rank0.json (issue 39 item 13): 200 identical 'failed' lines and 'failed
    200' for what is one `sources` row; now one line, failed 1, exit 4."""
    import warnings

    from typer.testing import CliRunner

    from pipeline.cli import app

    z = tmp_path / "dup.zip"
    with zipfile.ZipFile(z, "w") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(200):
            f.writestr("rank0.json", b'{"traceEvents": []}')
    r = CliRunner().invoke(app, ["ingest", str(z), "--lake", str(tmp_path / "lake"), "-j", "1"])
    assert r.exit_code == 4, r.output
    assert r.output.splitlines() == [
        f"failed {z}!rank0.json: the zip holds 200 members of this name: which one is meant is "
        "unclear; refused",
        f"ingested 0, failed 1, skipped 0 (already in the lake) -> {tmp_path / 'lake'}",
    ]
    rows = connect(Lake(tmp_path / "lake")).execute("SELECT path, status FROM sources").fetchall()
    assert rows == [(f"{z}!rank0.json", "failed")]


def test_an_archive_that_holds_no_files_says_so(tmp_path):
    """An empty .tar (10240 zero bytes) failed as 'not a Kineto trace, Nsight Systems export or
    NCCL-family log', an empty .zip as 'not an nsys-jax archive' and an empty .tar.gz as not a
    trace (issue 39 item 13): each fails with 'archive holds no files', as does a tar of a
    directory alone; the trace beside them is ingested (exit 3)."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    d = tmp_path / "in"
    d.mkdir()
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    (d / "empty.tar").write_bytes(buf.getvalue())
    (d / "empty.tar.gz").write_bytes(gzip.compress(buf.getvalue()))
    with zipfile.ZipFile(d / "empty.zip", "w"):
        pass
    with tarfile.open(d / "dirs.tar", "w") as t:
        info = tarfile.TarInfo("job")
        info.type = tarfile.DIRTYPE
        t.addfile(info)
    (d / "rank0.json").write_bytes(corpus(*MEMBERS["job/worker2.json"]).read_bytes())
    lake = tmp_path / "lake"
    r = CliRunner().invoke(app, ["ingest", str(d), "--lake", str(lake), "-j", "1"])
    assert r.exit_code == 3, r.output
    failed = sorted(line for line in r.output.splitlines() if line.startswith("failed "))
    assert failed == sorted(
        f"failed {d / n}: archive holds no files"
        for n in ("dirs.tar", "empty.tar", "empty.tar.gz", "empty.zip")
    )
    rows = (
        connect(Lake(lake)).execute("SELECT status, count(*) FROM sources GROUP BY 1 ORDER BY 1").fetchall()
    )
    assert rows == [("failed", 4), ("ok", 1)]
