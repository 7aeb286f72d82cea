"""`tracelake forget`: removing sources leaves exactly the lake that ingesting the other files
alone gives (every table read straight from its Parquet files, as tests/test_crash_safety.py
does), a removed file is ingested again afterwards, and a forget killed with SIGKILL right after
removing a `sources` row hides that source from readers at once and is finished by the next
command that takes the lock."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import REPO, corpus
from test_crash_safety import assert_clean, snapshot
from typer.testing import CliRunner

from pipeline.cli import EXIT_OK, app
from pipeline.lake import Lake
from pipeline.query import connect

runner = CliRunner()
HTA = corpus("hta", "tests", "data", "trace_filter")


def _dirs(root):
    """Two runs (job_a: two ranks of a real HTA trace; job_b: another HTA trace, rank 1 by its
    name) and a config.json that fails."""
    a, b = root / "job_a", root / "job_b"
    a.mkdir(parents=True)
    b.mkdir()
    for f in sorted(HTA.glob("sampled_rank-*.json.gz")):
        shutil.copy(f, a / f.name)
    shutil.copy(
        corpus("hta", "tests", "data", "rank_unavailable", "rank_not_found.json.gz"), b / "rank1.json.gz"
    )
    (a / "config.json").write_text('{"lr": 0.1}')
    return a, b


def _ingest(lake, *paths, **kw):
    args = ["ingest", *map(str, paths), "--lake", str(lake), "--jobs", "1"]
    for x in kw.get("exclude", ()):
        args += ["--exclude", x]
    return runner.invoke(app, args)


def _ingest_as_parts(lake, a, *more):
    """job_a's two ranks one ingest each, then `more`: each source gets parts of its own (the
    layout a killed forget leaves half removed), where one ingest of both would write them as one
    compacted generation (pipeline/ingest/hold.py)."""
    for f in sorted(a.glob("sampled_rank-*.json.gz")):
        assert _ingest(lake, f).exit_code == EXIT_OK
    if more:
        assert _ingest(lake, *more).exit_code == EXIT_OK
    assert sorted(Lake(lake).sources()["run_id"].to_list())[:2] == ["job_a", "job_a"]
    return EXIT_OK


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return _dirs(tmp_path_factory.mktemp("in"))


def test_forget_failed_run_and_source_leave_the_lake_of_the_other_files(dirs, tmp_path):
    a, b = dirs
    lake = tmp_path / "lake"
    assert _ingest(lake, a.parent).exit_code == 3  # config.json failed
    # --failed: as if config.json had been left out
    clean = tmp_path / "clean"
    assert _ingest(clean, a.parent, exclude=["config.json"]).exit_code == EXIT_OK
    r = runner.invoke(app, ["forget", "--lake", str(lake), "--failed", "--dry-run"])
    assert (
        r.exit_code == EXIT_OK
        and "would remove 1 source(s)" in r.output
        and "config.json (failed)" in r.stdout  # the listing is the result: stdout
        and "would remove 1 source(s)" not in r.stdout
    )
    assert snapshot(lake) != snapshot(clean)  # the dry run changed nothing
    r = runner.invoke(app, ["forget", "--lake", str(lake), "--failed"])
    assert r.exit_code == EXIT_OK and "removed 1 source(s)" in r.output, r.output
    assert snapshot(lake) == snapshot(clean)
    # --run: as if only job_b had been ingested
    only_b = tmp_path / "only_b"
    assert _ingest(only_b, b).exit_code == EXIT_OK
    r = runner.invoke(app, ["forget", "--lake", str(lake), "--run", "job_a"])
    assert r.exit_code == EXIT_OK and "removed 2 source(s)" in r.output, r.output
    assert snapshot(lake) == snapshot(only_b)
    assert not list((lake / "gpu_activities" / "run=job_a").glob("*"))
    # a forgotten file is ingested again, not skipped
    r = _ingest(lake, a, exclude=["config.json"])
    assert r.exit_code == EXIT_OK and "ingested 2, failed 0, skipped 0" in r.output, r.output
    assert snapshot(lake) == snapshot(clean)
    # --source narrowed by --run: the same bytes stored again with --run are one source id in both runs
    one = a / "sampled_rank-0.json.gz"
    assert (
        runner.invoke(app, ["ingest", str(one), "--lake", str(lake), "--run", "job_b"]).exit_code == EXIT_OK
    )
    sid = (
        connect(Lake(lake))
        .execute("SELECT source_id FROM sources WHERE run_id = 'job_b' AND rank = 0")
        .fetchone()[0]
    )
    assert (
        connect(Lake(lake)).execute(f"SELECT count(*) FROM sources WHERE source_id = '{sid}'").fetchone()[0]
        == 2
    )
    r = runner.invoke(app, ["forget", "--lake", str(lake), "--source", sid, "--run", "job_b"])
    assert r.exit_code == EXIT_OK and "removed 1 source(s)" in r.output
    assert snapshot(lake) == snapshot(clean)


def test_forget_usage_errors(dirs, tmp_path):
    a, _ = dirs
    lake = tmp_path / "lake"
    _ingest(lake, a)
    before = snapshot(lake)
    for args, why in (
        (["forget"], "give --run, --source or --failed"),
        (["forget", "--run", "nope"], "--run nope: not in the lake (runs: job_a)"),
        (["forget", "--source", "0123"], "--source 0123: not in the lake"),
    ):
        r = runner.invoke(app, [*args, "--lake", str(lake)])
        assert r.exit_code == 2 and why in r.output, r.output
    r = runner.invoke(app, ["forget", "--lake", str(tmp_path / "none"), "--failed"])
    assert r.exit_code == 2 and "not a tracelake lake" in r.output and not (tmp_path / "none").exists()
    assert snapshot(lake) == before


def test_forget_killed_after_a_sources_row_then_finished(dirs, tmp_path):
    a, b = dirs
    lake, only_b = tmp_path / "lake", tmp_path / "only_b"
    assert _ingest_as_parts(lake, a, b) == EXIT_OK
    assert _ingest(only_b, b).exit_code == EXIT_OK
    env = {
        **{k: v for k, v in os.environ.items() if k != "TRACELAKE_CRASH_AT"},
        "TRACELAKE_CRASH_AT": "forget:1",
    }
    p = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "forget", "--lake", str(lake), "--run", "job_a"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    # one sources row is gone, its parts are still there: readers no longer see that source
    assert snapshot(lake) != snapshot(only_b)
    con = connect(Lake(lake))
    n_sources = con.execute("SELECT count(*) FROM sources WHERE run_id = 'job_a'").fetchone()[0]
    assert n_sources == 1
    assert (
        con.execute("SELECT count(DISTINCT source_id) FROM gpu_activities WHERE run_id = 'job_a'").fetchone()[
            0
        ]
        == 1
    )
    # the next command under the lock repairs, then removes the rest
    r = runner.invoke(app, ["forget", "--lake", str(lake), "--run", "job_a"])
    assert r.exit_code == EXIT_OK and "removed 1 source(s)" in r.output and "no sources row" in r.output, (
        r.output
    )
    assert_clean(lake)
    assert snapshot(lake) == snapshot(only_b)


def test_a_lake_path_with_glob_characters_is_read_literally(dirs, tmp_path):
    """'[' and '*' in the lake path are literal: no error, and no sibling lake's rows."""
    a, b = dirs
    odd, sibling = tmp_path / "lk[1]*", tmp_path / "lk1x"
    assert _ingest(odd, a, exclude=["config.json"]).exit_code == EXIT_OK
    assert _ingest(sibling, b).exit_code == EXIT_OK
    assert Lake(odd).sources()["run_id"].to_list() == ["job_a", "job_a"]
    r = runner.invoke(app, ["forget", "--lake", str(odd), "--run", "job_a", "--dry-run"])
    assert r.exit_code == EXIT_OK and "would remove 2 source(s)" in r.output, r.output
    r = runner.invoke(app, ["analyze", "--lake", str(odd), "--json"])
    assert r.exit_code == EXIT_OK and [x["run_id"] for x in json.loads(r.stdout)["runs"]] == ["job_a"]


def test_an_unreadable_sources_part_gives_one_line(dirs, tmp_path):
    a, _ = dirs
    lake = tmp_path / "lake"
    _ingest(lake, a, exclude=["config.json"])
    bad = next((lake / "sources" / "run=job_a").glob("*.parquet"))
    bad.write_bytes(b"garbage")
    for args in (
        ["analyze"],
        ["sql", "SELECT count(*) FROM sources"],
        ["forget", "--failed"],
        ["report", "-o", str(tmp_path / "r.html")],
    ):
        r = runner.invoke(app, [*args, "--lake", str(lake)])
        assert r.exit_code == 4, (args, r.output)
        assert str(bad.name) in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)


def test_dry_run_repairs_nothing(dirs, tmp_path):
    """--dry-run only reads: a part left without its sources row by a killed writer stays for the
    next real command to remove."""
    a, _ = dirs
    lake = tmp_path / "lake"
    _ingest_as_parts(lake, a)
    row = next((lake / "sources" / "run=job_a").glob("*.parquet"))
    orphan = lake / "gpu_activities" / "run=job_a" / row.name
    row.unlink()  # as a forget killed after removing the sources row leaves it
    r = runner.invoke(app, ["forget", "--lake", str(lake), "--run", "job_a", "--dry-run"])
    assert (
        r.exit_code == EXIT_OK and "would remove 1 source(s)" in r.output and "no sources row" not in r.output
    )
    assert orphan.exists()
    r = runner.invoke(app, ["forget", "--lake", str(lake), "--run", "job_a"])
    assert r.exit_code == EXIT_OK and "no sources row" in r.output and not orphan.exists()


def test_analyze_says_when_every_source_was_forgotten(dirs, tmp_path):
    _, b = dirs
    lake = tmp_path / "lake"
    _ingest(lake, b)
    assert runner.invoke(app, ["forget", "--lake", str(lake), "--run", "job_b"]).exit_code == EXIT_OK
    r = runner.invoke(app, ["analyze", "--lake", str(lake)])
    assert r.exit_code == EXIT_OK and "the lake holds no runs" in r.output, r.output


def test_a_source_named_as_dry_run_lists_it(tmp_path):
    """`forget --dry-run` lists sources as RUN/SOURCE_ID; that form is accepted by --source (it
    was 'not in the lake') and names the source in that run only: the same bytes stored in two
    runs (here HTA's sampled_rank-0 in run a and, with --run b, in run b) keep the other copy."""
    f = REPO / "sample_traces" / "hta_trace_filter" / "sampled_rank-0.json.gz"
    lake = str(tmp_path / "lake")
    runner = CliRunner()
    for run in ("a", "b"):
        assert runner.invoke(app, ["ingest", str(f), "--lake", lake, "--run", run]).exit_code == EXIT_OK
    (sid,) = {s for s in Lake(lake).sources()["source_id"].to_list()}
    dry = runner.invoke(app, ["forget", "--lake", lake, "--run", "a", "--dry-run"])
    assert dry.stdout.split()[:3] == ["would", "remove", f"a/{sid}"]
    r = runner.invoke(app, ["forget", "--lake", lake, "--source", f"a/{sid}"])
    assert r.exit_code == EXIT_OK, r.output
    assert sorted(Lake(lake).sources()["run_id"].to_list()) == ["b"]
    r = runner.invoke(app, ["forget", "--lake", lake, "--source", f"a/{sid}"])
    assert r.exit_code == 2 and f"--source a/{sid}: not in the lake" in r.output
