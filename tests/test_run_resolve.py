"""Which run a directory and a `--run` value name (the tester's third round of run-name findings):
a directory inside the inputs is named by its own path whatever links lead to it; `--run` means
one run in ingest and in the read commands (pipeline/ingest/runid.resolve_run); a path value is
normalised ('./', '..'); a directory whose traces state a job finds that job's run. Expected run
ids are written by hand from the directory names (hashes computed here with hashlib)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from conftest import X, write_trace
from typer.testing import CliRunner

from pipeline.cli import EXIT_OK, app
from pipeline.cli.options import _resolve_runs
from pipeline.ingest.runid import given_run_id, resolve_run
from pipeline.lake import Lake

runner = CliRunner()

T0_US = 1_793_761_200 * 10**6  # 2026-11-04 03:00:00 UTC


def _h(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:6]


def _rank(path, rank: int, start_us: int = T0_US, **top):
    """A one-kernel trace of `rank` (of world size 4) starting at start_us."""
    return write_trace(
        path,
        [X("kernel", "k", start_us, 50, pid=0, tid=7, device=0, stream=7, correlation=1)],
        distributedInfo={"rank": rank, "world_size": 4},
        **top,
    )


def _ingest(*args) -> None:
    r = runner.invoke(app, ["ingest", *map(str, args), "-j", "1", "-q"])
    assert r.exit_code == EXIT_OK, r.output


def _by_run(lake) -> dict:
    src = Lake(lake).sources()
    return {k: sorted(g["rank"].to_list()) for (k,), g in src.group_by("run_id")}


def test_a_directory_is_named_by_its_own_path_not_a_link_to_it(tmp_path):
    """arch/real/ with arch/linkA and arch/linkB linking to it was run linkA; a link aaa added
    later put real's new rank in run aaa. A link to a directory outside the inputs is followed
    and named by the link."""
    arch = tmp_path / "arch"
    _rank(arch / "real" / "rank0.json", 0)
    os.symlink("real", arch / "linkA")
    os.symlink("real", arch / "linkB")
    _rank(tmp_path / "outside" / "x" / "rank0.json", 0, T0_US + 3_600 * 10**6)
    os.symlink(tmp_path / "outside" / "x", arch / "ext")
    lake = tmp_path / "lake"
    _ingest(arch, "--lake", lake)
    assert _by_run(lake) == {"real": [0], "ext": [0]}
    os.symlink("real", arch / "aaa")
    _rank(arch / "real" / "rank1.json", 1, T0_US + 1)
    _ingest(arch, "--lake", lake)
    assert _by_run(lake) == {"real": [0, 1], "ext": [0]}
    src = Lake(lake).sources().sort("path")
    assert src["path"].to_list() == [
        str(arch / "ext" / "rank0.json"),
        str(arch / "real" / "rank0.json"),
        str(arch / "real" / "rank1.json"),
    ]


def test_ingest_run_names_the_run_the_read_commands_read(tmp_path):
    """`--run v1.2` read v1.2/'s run v1.2-<hash> in `runs` but started a run v1.2 in ingest."""
    _rank(tmp_path / "v1.2" / "rank0.json", 0)
    lake = tmp_path / "lake"
    _ingest(tmp_path / "v1.2", "--lake", lake)
    _rank(tmp_path / "extra" / "rank1.json", 1, T0_US + 1)
    r = runner.invoke(
        app,
        ["ingest", str(tmp_path / "extra" / "rank1.json"), "--lake", str(lake), "--run", "v1.2", "-j", "1"],
    )
    assert r.exit_code == EXIT_OK, r.output
    assert f"note: --run v1.2 is run v1.2-{_h('v1.2')} of the lake" in r.stderr
    assert _by_run(lake) == {f"v1.2-{_h('v1.2')}": [0, 1]}
    # a lake without that directory's run: --run v1.2 starts run v1.2, as before, and names it
    lake2 = tmp_path / "lake2"
    _ingest(tmp_path / "extra" / "rank1.json", "--lake", lake2, "--run", "v1.2")
    assert _by_run(lake2) == {"v1.2": [1]}
    r = runner.invoke(app, ["runs", "--lake", str(lake2), "--run", "v1.2", "--format", "json"])
    assert r.exit_code == EXIT_OK, r.output
    assert [x["run_id"] for x in json.loads(r.stdout)] == ["v1.2"]


@pytest.mark.parametrize("value", ["a/b", "a/b/", "./a/b", "./a/b/", "a/./b", "a//b", "a/c/../b"])
def test_run_paths_are_normalised(value):
    assert resolve_run(value, {"a.b", "a.b-" + _h("a.b"), "b"}) == ["a.b"]
    assert given_run_id(value) == "a.b"


def test_a_directory_finds_the_runs_of_the_jobs_its_traces_state():
    known = {"meta.job-4712", "a.b", "other.job-1", "meta2.job-5"}
    assert resolve_run("meta", known) == ["meta.job-4712"]
    assert resolve_run("meta/", known) == ["meta.job-4712"]
    assert resolve_run("a", known) == []  # a/b is a directory below a, not a job of a's
    two = {"meta.job-4711", "meta.job-4712", "meta.job-4712_20261104T041000"}
    assert resolve_run("meta", two) == sorted(two)
    assert resolve_run("meta.job-4711", two) == ["meta.job-4711"]  # an id as printed: itself
    with pytest.raises(Exception) as e:
        _resolve_runs(["meta"], two)
    assert "--run meta: names 3 runs (one per job): meta.job-4711, meta.job-4712, " in str(e.value.message)


def test_run_meta_finds_the_job_run_from_the_cli(tmp_path):
    d = tmp_path / "meta"
    _rank(d / "rank0.json", 0, job_id="4712")
    _rank(d / "rank1.json", 1, T0_US + 1, job_id="4712")
    lake = tmp_path / "lake"
    _ingest(d, "--lake", lake)
    assert _by_run(lake) == {"meta.job-4712": [0, 1]}
    r = runner.invoke(app, ["runs", "--lake", str(lake), "--run", "./meta/", "--format", "json"])
    assert r.exit_code == EXIT_OK, r.output
    assert [x["run_id"] for x in json.loads(r.stdout)] == ["meta.job-4712"]
    # a second job in the same directory: the path names two runs, a usage error listing them
    _rank(d / "rank0_b.json", 0, T0_US + 7_200 * 10**6, job_id="4713")
    _ingest(d, "--lake", lake)
    r = runner.invoke(app, ["runs", "--lake", str(lake), "--run", "meta"])
    assert r.exit_code == 2  # a usage error (click)
    assert "--run meta: names 2 runs (one per job): meta.job-4712, meta.job-4713; give one" in r.stderr


def test_an_archive_that_fails_whole_is_in_its_directorys_run(tmp_path):
    """The tester's third round, finding 9 (docs/usage.md "Runs" now says so): an archive with no
    members to name a run by is recorded in its directory's run, beside the files it lay with."""
    root = tmp_path / "in"
    _rank(root / "zz" / "rank0.json", 0)
    (root / "zz" / "empty.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty zip's end record
    (root / "zz2" / "sub").mkdir(parents=True)
    (root / "zz2" / "sub" / "fake.tar.gz").write_bytes(b"not gzip")
    lake = tmp_path / "lake"
    r = runner.invoke(app, ["ingest", str(root), "--lake", str(lake), "-j", "1", "-q"])
    assert r.exit_code == 3, r.output  # some files failed
    src = Lake(lake).sources().sort("path")
    assert list(zip(src["path"].to_list(), src["run_id"].to_list(), src["status"].to_list())) == [
        (str(root / "zz" / "empty.zip"), "zz", "failed"),
        (str(root / "zz" / "rank0.json"), "zz", "ok"),
        (str(root / "zz2" / "sub" / "fake.tar.gz"), "zz2.sub", "failed"),
    ]
