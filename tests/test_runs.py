"""Which run each file lands in, on real traces (README, Ingest: Runs).

- Archives of many jobs with the same inner layout (<job>/traces/rank*.json): one run per job,
  named by the directory's path below the directory given (TensorBoard's rule for runs), the
  same on disk and inside a .tar.
- Kineto's tensorboard_trace_handler with a repeating schedule writes one file per worker per
  profiling cycle into one directory: the ranks of the second cycle form one run (their time
  windows overlap), not one run per file, and re-running ingest skips them all.
The traces are HTA's sampled ranks 0 and 1 (sample_traces/NOTICE) and two ranks of PARAM's DLRM
job (../shared/corpus/param); a second cycle is the same events with every timestamp moved
later, which is all that distinguishes two cycles of one job.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tarfile
from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from conftest import REPO, corpus
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake, safe_run_id

HTA = [REPO / "sample_traces" / "hta_trace_filter" / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
DLRM = "param/et_replay/tests/inputs/dlrm_kineto"


def _dlrm(rank: int) -> Path:
    (f,) = corpus(*DLRM.split("/")).glob(f"worker{rank}_step_12.*.pt.trace.json")
    return f


def _archive(root: Path) -> Path:
    """root/jobA/traces: the two HTA ranks; root/jobB/traces: two DLRM ranks (ranks 0 and 1 both)."""
    for job, files in (("jobA", HTA), ("jobB", [_dlrm(0), _dlrm(1)])):
        d = root / job / "traces"
        d.mkdir(parents=True)
        for f in files:
            shutil.copy(f, d / f.name)
    return root


def _runs(lake: Lake) -> dict[str, list[tuple[str, int]]]:
    s = lake.sources()
    out: dict[str, list] = {}
    for run, path, rank in zip(s["run_id"], s["path"], s["rank"]):
        out.setdefault(run, []).append((Path(path.split("!")[-1]).name, rank))
    return {k: sorted(v) for k, v in out.items()}


def _shifted(src: Path, dst: Path, by_us: int) -> Path:
    """src's trace with every event's ts moved by_us later (a later profiling cycle)."""
    raw = src.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += by_us
    dst.write_text(json.dumps(doc))
    return dst


def test_jobs_with_the_same_layout_get_one_run_each(tmp_path):
    root = _archive(tmp_path / "archive")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([root], lake, jobs=1)
    assert [r.status for r in res] == ["ok"] * 4
    a, b = safe_run_id("jobA/traces"), safe_run_id("jobB/traces")
    assert a != b
    assert _runs(lake) == {
        a: [("sampled_rank-0.json.gz", 0), ("sampled_rank-1.json.gz", 1)],
        b: [(_dlrm(0).name, 0), (_dlrm(1).name, 1)],
    }
    assert all(not r.notes for r in res)  # no rank collision: nothing was moved
    # the same archive as a .tar: members are named by their directory inside it
    tar = tmp_path / "archive.tar"
    with tarfile.open(tar, "w") as t:
        t.add(root / "jobA", arcname="jobA")
        t.add(root / "jobB", arcname="jobB")
    lake2 = Lake(tmp_path / "lake2")
    assert [r.status for r in ingest_paths([tar], lake2, jobs=1)] == ["ok"] * 4
    assert _runs(lake2) == _runs(lake)
    # analyze and report take the run as the path it was named by
    r = CliRunner().invoke(app, ["analyze", "--lake", str(lake.root), "--json", "--run", "jobB/traces"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [x["run_id"] for x in doc["runs"]] == [b] and doc["runs"][0]["ranks"] == [0, 1]


def test_a_directory_given_names_its_own_files(tmp_path):
    root = _archive(tmp_path / "archive")
    lake = Lake(tmp_path / "lake")
    ingest_paths([root / "jobA" / "traces"], lake, jobs=1)
    ingest_paths([root / "jobB"], lake, jobs=1)  # jobB/traces is one level down: its path, "traces"
    ingest_paths([_dlrm(2)], lake, jobs=1)  # a file given: the name of its directory
    runs = _runs(lake)
    assert sorted(runs) == ["dlrm_kineto", "traces", "traces_" + lake.sources().filter(
        pl.col("path").str.contains("jobB") & (pl.col("rank") == 0))["source_id"][0][:8]]
    # jobB's ranks 0 and 1 are held by jobA's files in "traces": they were moved, together
    moved = [k for k in runs if k.startswith("traces_")][0]
    assert runs[moved] == [(_dlrm(0).name, 0), (_dlrm(1).name, 1)]


def test_a_second_profiling_cycle_is_one_run(tmp_path):
    # tensorboard_trace_handler names: <worker>.<time ms>.pt.trace.json, all in one directory
    d = tmp_path / "prof"
    d.mkdir()
    names = {}
    for rank, src in enumerate(HTA):
        c1 = d / f"host_{rank}.1000.pt.trace.json.gz"
        shutil.copy(src, c1)
        c2 = _shifted(src, d / f"host_{rank}.2000.pt.trace.json", 60_000_000)  # 60 s later
        names[rank] = (c1.name, c2.name)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([d], lake, jobs=1)
    assert [r.status for r in res] == ["ok"] * 4
    second = safe_run_id(f"prof_{res[1].source_id[:8]}")  # host_0's second cycle was the first to collide
    assert _runs(lake) == {"prof": [(names[0][0], 0), (names[1][0], 1)],
                           second: [(names[0][1], 0), (names[1][1], 1)]}
    assert "with the files of the same time window" in res[3].notes[0]
    # ingest again: every file is already in the lake, in the run it was put in
    again = ingest_paths([d], lake, jobs=1)
    assert [(r.status, r.run_id) for r in again] == [("skipped", r.run_id) for r in res]
    # in later ingests the lake's time spans decide: a rank-1 file of a third cycle finds rank 1
    # free in the second cycle's run but does not overlap it in time, so it gets a run of its own;
    # cycle 2's rank 1, arriving last, still joins its cycle
    lake2 = Lake(tmp_path / "lake2")
    ingest_paths([d / names[0][0], d / names[1][0], d / names[0][1]], lake2, jobs=1)
    third = _shifted(HTA[1], tmp_path / "host_1.3000.pt.trace.json", 120_000_000)
    (t,) = ingest_paths([third], lake2, run="prof", jobs=1)
    assert t.run_id == safe_run_id(f"prof_{t.source_id[:8]}") != second
    (late,) = ingest_paths([d / names[1][1]], lake2, jobs=1)
    assert late.run_id == second
    assert _runs(lake2)[second] == _runs(lake)[second]
