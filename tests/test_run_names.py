"""Run names (pipeline/ingest/runs.py, rule 1 and 2 of docs/usage.md "Runs"): a directory path is
stored with '.' between its parts, a moved run is named by the UTC second it starts, `--run` wins
and names a run the same way, and `--run` given as a path finds runs stored before (safe_run_id's
id). Expected names are written out by hand from the directory and file names and the times the
hand-made traces hold."""

from __future__ import annotations

import json

import pytest
from conftest import X, write_trace
from typer.testing import CliRunner

from pipeline.cli import EXIT_OK, app
from pipeline.cli.options import _resolve_runs
from pipeline.ingest import ingest_paths
from pipeline.ingest.runs import moved_run, run_for, run_id_of
from pipeline.lake import Lake, safe_run_id

runner = CliRunner()

# 2026-11-04 03:00:00 UTC in µs (Kineto's ts unit): 1,793,761,200 s since the epoch
T0_US = 1_793_761_200 * 10**6


@pytest.mark.parametrize(
    ("name", "run_id"),
    [
        ("job1/traces", "job1.traces"),
        ("2026-11-04/job-4711/profiler", "2026-11-04.job-4711.profiler"),
        ("job1/traces/", "job1.traces"),  # a trailing '/' is dropped
        ("dlrm_kineto", "dlrm_kineto"),  # one directory: its name, as before
        ("v1.2", "v1.2"),
    ],
)
def test_directory_paths_are_joined_with_dots(name, run_id):
    assert run_id_of(name) == run_id == run_for(name, None)


@pytest.mark.parametrize(
    "name",
    [
        "my job/traces",  # a space is not an id character: safe_run_id's name with its hash
        "a/../b",
        "/",
        "x" * 60 + "/" + "y" * 60,  # past 100 characters joined
    ],
)
def test_other_names_keep_safe_run_ids_hash(name):
    assert run_id_of(name) == safe_run_id(name.rstrip("/") or name)
    assert run_id_of(name) != name.replace("/", ".")


def test_run_given_wins_and_is_named_like_a_directory():
    assert run_for("traces", "nightly/job-4711") == "nightly.job-4711"
    assert run_for("traces", "X") == "X"


def test_moved_runs_are_named_by_their_start():
    # 1,682,725,958.079 s = 2023-04-28 23:52:38 UTC
    t0 = 1_682_725_958_079_292_000
    assert moved_run("prof", "0c0119f3deadbeef", t0) == "prof_20230428T235238"
    # that id already taken (another cycle in the same second), or no epoch time: 8 hex digits
    assert moved_run("prof", "0c0119f3deadbeef", t0, {"prof_20230428T235238"}) == "prof_0c0119f3"
    assert moved_run("prof", "0c0119f3deadbeef", 5_000) == "prof_0c0119f3"
    assert moved_run("prof", "0c0119f3deadbeef", None) == "prof_0c0119f3"


def _rank(path, rank: int, start_us: int):
    """A one-kernel trace of `rank` (of world size 4) starting at start_us."""
    return write_trace(
        path,
        [X("kernel", "k", start_us, 50, pid=0, tid=7, device=0, stream=7, correlation=1)],
        distributedInfo={"rank": rank, "world_size": 4},
    )


def test_an_archive_of_jobs_gets_readable_run_names(tmp_path):
    bucket = tmp_path / "bucket"
    for r in (0, 1):
        _rank(bucket / "2026-11-04" / "job-4711" / f"rank{r}.json", r, T0_US + r)
        _rank(bucket / "2026-11-04" / "job-4712" / f"rank{r}.json", r, T0_US + 3_600 * 10**6 + r)
    # a second cycle of job-4712 in the same directory, 10 minutes later
    for r in (0, 1):
        _rank(bucket / "2026-11-04" / "job-4712" / f"second_rank{r}.json", r, T0_US + 4_200 * 10**6 + r)
    lake = tmp_path / "lake"
    r = runner.invoke(app, ["ingest", str(bucket), "--lake", str(lake), "-j", "1", "-q"])
    assert r.exit_code == EXIT_OK, r.output
    runs = sorted(set(Lake(lake).sources()["run_id"].to_list()))
    # 04:00:00 + 10 min = 04:10:00 UTC: the second cycle's first file, second_rank0.json, starts then
    assert runs == ["2026-11-04.job-4711", "2026-11-04.job-4712", "2026-11-04.job-4712_20261104T041000"]
    # --run given as the path finds the run (ingest adds a rank to it, analyze reads it)
    _rank(tmp_path / "late" / "rank2.json", 2, T0_US + 2)
    r = runner.invoke(
        app,
        [
            "ingest",
            str(tmp_path / "late" / "rank2.json"),
            "--run",
            "2026-11-04/job-4711",
            "--lake",
            str(lake),
        ],
    )
    assert r.exit_code == EXIT_OK, r.output
    ranks = Lake(lake).sources().filter(run_id="2026-11-04.job-4711")["rank"].sort().to_list()
    assert ranks == [0, 1, 2]
    r = runner.invoke(app, ["analyze", "--lake", str(lake), "--run", "2026-11-04/job-4711/", "--json", "-q"])
    assert r.exit_code == EXIT_OK, r.output
    assert [x["run_id"] for x in json.loads(r.stdout)["runs"]] == ["2026-11-04.job-4711"]


def test_run_paths_find_runs_stored_before_the_dots():
    """A lake written before stores job1/traces as safe_run_id's job1_traces-<hash>: --run
    job1/traces still names it there."""
    old = safe_run_id("job1/traces")
    assert old.startswith("job1_traces-")
    assert _resolve_runs(["job1/traces"], {old, "other"}) == [old]
    assert _resolve_runs(["job1/traces"], {"job1.traces", old}) == ["job1.traces"]


def test_ingest_paths_names_a_nested_directory(tmp_path):
    d = tmp_path / "root" / "team" / "llama-8b"
    _rank(d / "rank0.json", 0, T0_US)
    (res,) = ingest_paths([tmp_path / "root"], Lake(tmp_path / "lake"), jobs=1)
    assert res.run_id == "team.llama-8b"
