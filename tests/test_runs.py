"""Which run each file lands in, on real traces (docs/usage.md, Runs).

- Archives of many jobs with the same inner layout (<job>/traces/rank*.json): one run per job,
  named by the directory's path below the directory given (TensorBoard's rule for runs), the
  same on disk and inside a .tar.
- Kineto's tensorboard_trace_handler with a repeating schedule writes one file per worker per
  profiling cycle into one directory: each cycle is one run with all its ranks (their time
  windows overlap), whatever the order the files come in, and re-running ingest skips them all.
- Moved runs are known from sources.named_run_id (old lakes: the collision note), never from a
  run id's shape; --force re-ingests in place; --run keeps files with free ranks together; of
  overlapping directories given, the outer one names the run; archives found in a job's
  directory keep the job in their members' run names.
The traces are HTA's sampled ranks 0 and 1 (sample_traces/NOTICE) and two ranks of PARAM's DLRM
job (../shared/corpus/param); a second cycle is the same events with every timestamp moved
later, which is all that distinguishes two cycles of one job.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tarfile
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
from conftest import REPO, corpus
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.ingest.runs import run_id_of
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
    a, b = run_id_of("jobA/traces"), run_id_of("jobB/traces")
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
    # the moved run is named by the second its first file (jobB's rank 0, DLRM's worker0) starts
    assert sorted(runs) == ["dlrm_kineto", "traces", _moved(lake, "traces", "jobB", 0)]
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
    # host_0's second cycle was the first to collide: its run is named by its start, HTA's first
    # event (2023-04-28 23:51:38.079 UTC, read from the file) 60 s later
    second = "prof_20230428T235238"
    assert res[1].run_id == second
    assert _runs(lake) == {
        "prof": [(names[0][0], 0), (names[1][0], 1)],
        second: [(names[0][1], 0), (names[1][1], 1)],
    }
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
    assert t.run_id == "prof_20230428T235338" != second  # 120 s after the first cycle
    (late,) = ingest_paths([d / names[1][1]], lake2, jobs=1)
    assert late.run_id == second
    assert _runs(lake2)[second] == _runs(lake)[second]


def _moved(lake: Lake, run: str, job: str, rank: int) -> str:
    """The name rule 2 gives a run moved from `run`: `<run>_<the UTC second its first file starts>`,
    here the file of `job`'s `rank` (its first event read from the file itself)."""
    path = lake.sources().filter(pl.col("path").str.contains(job) & (pl.col("rank") == rank))["path"][0]
    events = json.loads(Path(path).read_bytes())["traceEvents"]
    t0 = min(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") != "Trace")  # µs
    return f"{run}_{datetime.fromtimestamp(t0 // 10**6, timezone.utc):%Y%m%dT%H%M%S}"


def _cycles(d: Path, n: int = 2) -> dict[tuple[int, int], Path]:
    """(cycle, rank) -> file in d: cycle c is HTA's ranks 0 and 1 moved c * 60 s later."""
    d.mkdir(parents=True, exist_ok=True)
    return {
        (c, r): _shifted(HTA[r], d / f"c{c}_rank-{r}.json", c * 60_000_000) for c in range(n) for r in (0, 1)
    }


def _partition(lake: Lake, files: dict) -> set[frozenset]:
    """The files of each run, as sets of (cycle, rank)."""
    key = {f.name: k for k, f in files.items()}
    by_run: dict[str, set] = {}
    for run, path in zip(lake.sources()["run_id"], lake.sources()["path"]):
        by_run.setdefault(run, set()).add(key[Path(path).name])
    return {frozenset(v) for v in by_run.values()}


CYCLES = {frozenset({(0, 0), (0, 1)}), frozenset({(1, 0), (1, 1)})}


def test_cycles_are_grouped_whatever_the_order(tmp_path):
    files = _cycles(tmp_path / "prof")
    orders = [
        [(0, 0), (0, 1), (1, 0), (1, 1)],
        [(1, 0), (0, 0), (0, 1), (1, 1)],
        [(0, 0), (1, 1), (1, 0), (0, 1)],
        [(1, 1), (1, 0), (0, 1), (0, 0)],
    ]
    key = {f.name: k for k, f in files.items()}
    for i, order in enumerate(orders):
        lake = Lake(tmp_path / f"lake{i}")
        res = ingest_paths([files[k] for k in order], lake, jobs=1)
        assert [r.status for r in res] == ["ok"] * 4
        assert _partition(lake, files) == CYCLES, order
        # and the same names, whatever the order the files were given in: cycle 0 (listed first
        # by path) holds the directory's name, cycle 1 is named by its start, 60 s later
        got = {key[Path(r.path).name]: r.run_id for r in res}
        assert got == {(0, 0): "prof", (0, 1): "prof"} | dict.fromkeys(
            [(1, 0), (1, 1)], "prof_20230428T235238"
        )
    # a growing archive: cycle 0's rank 1 arrives after cycle 1 is in the lake
    lake = Lake(tmp_path / "grow")
    ingest_paths([files[(0, 0)], files[(1, 0)], files[(1, 1)]], lake, jobs=1)
    (late,) = ingest_paths([files[(0, 1)]], lake, jobs=1)
    assert _partition(lake, files) == CYCLES and late.run_id == "prof"


def test_moved_runs_are_known_by_their_name_not_a_pattern(tmp_path):
    # a directory that merely looks like a moved run ("<name>_<8 hex>") is its own run
    a = tmp_path / "a"
    files = _cycles(a / "job_deadbeef", 1)
    (a / "job").mkdir()
    _shifted(HTA[0], a / "job" / "x.json", 1)  # rank 0 again, at (nearly) the same time
    lake = Lake(tmp_path / "lake")
    ingest_paths([a / "job_deadbeef"], lake, jobs=1)
    (r,) = ingest_paths([a / "job"], lake, jobs=1)
    assert (r.status, r.run_id, r.notes) == ("ok", "job", [])
    # a long run name (safe_run_id shortens the moved run's id): cycles still group, re-ingest skips
    deep = (
        tmp_path
        / "b"
        / ("outputs/2024-06-01/12-30-45/llama3_70b_fsdp_tp8_pp4_seq8192/tensorboard/plugins/profile/x" * 2)
    )
    files = _cycles(deep)
    lake = Lake(tmp_path / "lake2")
    res = ingest_paths([tmp_path / "b"], lake, jobs=1)
    assert [r.status for r in res] == ["ok"] * 4 and _partition(lake, files) == CYCLES
    assert [r.status for r in ingest_paths([tmp_path / "b"], lake, jobs=1)] == ["skipped"] * 4


def test_a_lake_from_before_named_run_id_still_skips_moved_files(tmp_path):
    files = _cycles(tmp_path / "prof")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([tmp_path / "prof"], lake, jobs=1)
    for p in (tmp_path / "lake" / "sources").rglob("*.parquet"):  # as an older tracelake wrote it
        pl.read_parquet(p).drop("named_run_id").write_parquet(p)
    assert lake.sources()["named_run_id"].to_list() == [None] * 4
    again = ingest_paths([tmp_path / "prof"], lake, jobs=1)  # the same bytes, in whichever run
    assert [(r.status, r.run_id) for r in again] == [("skipped", r.run_id) for r in res]
    assert _partition(lake, files) == CYCLES


def test_overlapping_directories_name_runs_from_the_outer_one(tmp_path):
    root = _archive(tmp_path / "A")
    l1, l2 = Lake(tmp_path / "l1"), Lake(tmp_path / "l2")
    ingest_paths([root, root / "jobA"], l1, jobs=1)
    ingest_paths([root / "jobA", root], l2, jobs=1)
    assert _runs(l1) == _runs(l2) == _runs_of_archive(tmp_path)
    assert [r.status for r in ingest_paths([root / "jobA", root], l1, jobs=1)] == ["skipped"] * 4


def _runs_of_archive(tmp_path: Path) -> dict:
    lake = Lake(tmp_path / "plain")
    ingest_paths([tmp_path / "A"], lake, jobs=1)
    return _runs(lake)


def _variant(src: Path, dst: Path, by_us: int, rank: int) -> Path:
    """src's trace moved by_us later, as rank `rank` (distributedInfo.rank)."""
    _shifted(src, dst, by_us)
    doc = json.loads(dst.read_text())
    doc["distributedInfo"]["rank"] = rank
    dst.write_text(json.dumps(doc))
    return dst


def _listing(lake: Lake) -> list[tuple]:
    s = lake.sources().sort("path")
    return list(
        zip(*(s[c].to_list() for c in ("path", "run_id", "named_run_id", "rank", "notes", "source_id")))
    )


def test_force_reingests_in_place(tmp_path):
    files = _cycles(tmp_path / "prof")
    lake = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "prof"], lake, jobs=1)
    before = _listing(lake)
    assert [r.status for r in ingest_paths([tmp_path / "prof"], lake, force=True, jobs=2)] == ["ok"] * 4
    assert _listing(lake) == before and _partition(lake, files) == CYCLES
    # a file that bridges two others (HTA rank 0's span is 1.24 s): r0 at 0, r2 at +1.6 s (no
    # overlap: moved), r1 at +0.8 s (overlaps both: joins r0's run). --force on r2 must leave it in
    # its run, not add a second copy to r0's run, which it now overlaps
    d = tmp_path / "chain"
    d.mkdir()
    r0 = _variant(HTA[0], d / "a_r0.json", 0, 0)
    r2 = _variant(HTA[0], d / "b_r2.json", 1_600_000, 2)
    r1 = _variant(HTA[0], d / "c_r1.json", 800_000, 1)
    lake = Lake(tmp_path / "lake2")
    res = ingest_paths([r0, r2, r1], lake, jobs=1)
    assert [r.run_id == "chain" for r in res] == [True, False, True]
    before = _listing(lake)
    (again,) = ingest_paths([r2], lake, force=True, jobs=1)
    assert again.run_id == res[1].run_id and _listing(lake) == before


def test_run_given_keeps_free_ranks_together(tmp_path):
    files = _cycles(tmp_path / "prof")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([files[(0, 0)], files[(1, 1)], files[(1, 0)]], lake, run="X", jobs=1)
    # --run: rank 1 of cycle 1 is free in X, so it joins X although it is another window;
    # rank 0 of cycle 1 is taken there and goes to a run of its own (files are committed sorted
    # by path: c0_rank-0, c1_rank-0, c1_rank-1)
    key = {f.name: k for k, f in files.items()}
    got = {key[Path(r.path).name]: r.run_id for r in res}
    assert got == {(0, 0): "X", (1, 1): "X", (1, 0): "X_20230428T235238"}


def test_archives_in_job_directories_keep_the_job(tmp_path):
    root = tmp_path / "arcs"
    for k, job in enumerate(("job1", "job2")):  # job2: the same traces 10 minutes later
        (root / job).mkdir(parents=True)
        with tarfile.open(root / job / "a.tar.gz", "w:gz") as t:
            for f in HTA:
                t.add(
                    _shifted(f, tmp_path / f"{job}_{f.name}.json", k * 600_000_000),
                    arcname=f"traces/{f.name}",
                )
        with tarfile.open(root / job / "flat.tar", "w") as t:
            t.add(_shifted(_dlrm(0), tmp_path / f"{job}_dlrm.json", k * 600_000_000), arcname=_dlrm(0).name)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([root], lake, jobs=1)
    assert [r.status for r in res] == ["ok"] * 6
    assert sorted(_runs(lake)) == sorted(
        ["job1.flat", "job1.traces", "job2.flat", "job2.traces"]  # directories joined by '.' (rule 1)
    )
    # given by name, an archive is named by itself, as before
    (r,) = ingest_paths([root / "job1" / "flat.tar"], Lake(tmp_path / "lake2"), jobs=1)
    assert r.run_id == "flat"


def test_the_same_bytes_are_one_trace_whichever_directory_is_given(tmp_path):
    root = _archive(tmp_path / "archive")
    lake = Lake(tmp_path / "lake")
    ingest_paths([root], lake, jobs=1)
    a, b = run_id_of("jobA/traces"), run_id_of("jobB/traces")
    before = _listing(lake)
    # jobA given itself names its files "traces"; their bytes are already in the lake (in run
    # jobA/traces), so they are skipped, and the note says where they are
    # under another name (run "traces"), which therefore does not hold them: the note says so
    res = ingest_paths([root / "jobA"], lake, jobs=1)
    assert [(r.status, r.run_id, r.held_in) for r in res] == [("skipped", a, a)] * 2
    assert res[0].notes == [
        f"same content already in the lake in run {a}, so run traces does not hold it; "
        "--run traces ingests it into that run too"
    ]
    # a copy of them in another directory: the same bytes are the same trace, skipped too
    shutil.copytree(root / "jobA" / "traces", tmp_path / "copyA")
    res = ingest_paths([tmp_path / "copyA"], lake, jobs=1)
    assert [(r.status, r.run_id, r.held_in) for r in res] == [("skipped", a, a)] * 2
    assert "so run copyA does not hold it; --run copyA ingests it" in res[0].notes[0]
    # given as the same directory again they are in the run they name: the plain note, no held_in
    res = ingest_paths([root], lake, jobs=1)
    assert {(r.status, r.held_in) for r in res} == {("skipped", None)}
    assert res[0].notes == ["already in the lake (same content); --force re-ingests"]
    # --force re-ingests them where they are
    assert [r.run_id for r in ingest_paths([root / "jobA"], lake, force=True, jobs=1)] == [a, a]
    assert _listing(lake) == before
    # a new rank file given by name is named by its directory, whatever the lake holds (rule 1,
    # pipeline/ingest/runs.py); --run puts it in the run of the files beside it
    new = shutil.copy(_dlrm(2), root / "jobB" / "traces")
    (r,) = ingest_paths([new], Lake(tmp_path / "lake2"), jobs=1)
    assert (r.status, r.run_id, r.rank) == ("ok", "traces", 2)
    (r,) = ingest_paths([new], lake, run="jobB/traces", jobs=1)
    assert (r.status, r.run_id, r.rank) == ("ok", b, 2)
    # --run says where a file goes: the same bytes are stored again there, with a note
    (r,) = ingest_paths([root / "jobA" / "traces" / HTA[0].name], lake, run="copy", jobs=1)
    assert (r.status, r.run_id) == ("ok", "copy") and f"the same content is already in run {a}" in r.notes[0]
    # analyze takes the directory path, also with a trailing slash (shell completion adds it)
    out = CliRunner().invoke(app, ["analyze", "--lake", str(lake.root), "--json", "--run", "jobB/traces/"])
    assert out.exit_code == 0, out.output
    assert [(x["run_id"], x["ranks"]) for x in json.loads(out.output)["runs"]] == [(b, [0, 1, 2])]


def test_reaching_the_same_directory_another_way_keeps_its_run(tmp_path):
    # the directory through a symlink and through '..', a name past 100 characters, and --force
    # from a copy: forcing keeps the stored path and name; a new rank file joins the run with
    # --run, and without it is named by its directory's own name, links and '..' resolved
    long = (
        "llama70b_fsdp_tp8_pp4_seq4096_bs512_lr3e-4_warmup2000_zero3_"
        "activation_checkpointing_selective_node03_profiler_traces"
    )
    root = tmp_path / "arch"
    d = root / "jobA" / long
    d.mkdir(parents=True)
    for r in (0, 1):
        shutil.copy(_dlrm(r), d)
    (tmp_path / "cur").symlink_to(d)
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([root], lake, jobs=1)
    run = res[0].run_id
    # 4 + 1 + 117 > 100: the longest part is cut to 95 (its '_' at the cut dropped), the hash of
    # the whole name after it
    sha = hashlib.sha1(f"jobA/{long}".encode()).hexdigest()[:6]
    cut = "llama70b_fsdp_tp8_pp4_seq4096_bs512_lr3e-4_warmup2000_zero3_activation_checkpointing_selective"
    assert res[1].run_id == run == f"jobA.{cut}-{sha}"
    assert run_id_of(run) == run  # a stored id given back is itself
    before = _listing(lake)
    shutil.copytree(d, tmp_path / "copy")
    assert [r.run_id for r in ingest_paths([tmp_path / "copy"], lake, force=True, jobs=1)] == [run, run]
    assert _listing(lake) == before  # in place: path and named_run_id as they were stored
    for k, via, named, want in (
        (2, tmp_path / "cur", run, run),
        (3, root / "jobA" / ".." / "jobA" / long, None, safe_run_id(long)),
    ):
        new = shutil.copy(_dlrm(k), d)
        (r,) = ingest_paths([via / Path(new).name], lake, run=named, jobs=1)
        assert (r.status, r.run_id, r.rank) == ("ok", want, k)
    # the same bytes twice in one forced batch are ingested once
    twice = ingest_paths([d, tmp_path / "copy"], lake, force=True, jobs=1)
    assert sorted(r.status for r in twice) == ["ok"] * 4 + ["skipped"] * 2
    assert lake.sources().height == 4


def test_an_empty_run_id_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(app, ["ingest", str(HTA[0]), "--lake", str(tmp_path / "lake"), "--run", " "])
    assert r.exit_code == 2 and "empty run id" in r.output
    assert not (tmp_path / "lake").exists()


def test_a_rank_whose_content_another_run_holds_is_named_and_can_be_added(tmp_path):
    """Ranks 0-1 of PARAM's DLRM job ingested from one directory, then all 8 from another: the
    second run lacks ranks 0 and 1 (their bytes are stored once, in the first run). ingest says
    so for those two files, on stderr, and --run puts them in the second run, which then holds
    the 8 ranks the files' distributedInfo names (rank 0-7)."""
    part, full = tmp_path / "part", tmp_path / "full"
    part.mkdir()
    for r in (0, 1):
        shutil.copy(_dlrm(r), part)
    shutil.copytree(_dlrm(0).parent, full)
    lake = str(tmp_path / "lake")
    assert CliRunner().invoke(app, ["ingest", str(part), "--lake", lake]).exit_code == 0
    out = CliRunner().invoke(app, ["ingest", str(full), "--lake", lake])
    assert out.exit_code == 0, out.output
    notes = [ln for ln in out.stderr.splitlines() if ln.startswith("note ")]
    assert sorted(ln.split(":")[0] for ln in notes) == [f"note {full / _dlrm(r).name}" for r in (0, 1)]
    assert all("in run part, so run full does not hold it; --run full ingests it" in ln for ln in notes)
    ranks = lambda: {  # noqa: E731
        x["run_id"]: x["ranks"]
        for x in json.loads(CliRunner().invoke(app, ["analyze", "--lake", lake, "--json"]).output)["runs"]
    }
    assert ranks() == {"part": [0, 1], "full": [2, 3, 4, 5, 6, 7]}
    # re-ingesting the directory says it again (still true); --run full adds the two ranks
    again = CliRunner().invoke(app, ["ingest", str(full), "--lake", lake])
    assert sum(ln.startswith("note ") for ln in again.stderr.splitlines()) == 2
    assert CliRunner().invoke(app, ["ingest", str(full), "--lake", lake, "--run", "full"]).exit_code == 0
    assert ranks() == {"part": [0, 1], "full": list(range(8))}
    # a directory given again whose content is in its own run: nothing said
    quiet = CliRunner().invoke(app, ["ingest", str(part), "--lake", lake])
    assert not [ln for ln in quiet.stderr.splitlines() if ln.startswith("note ")]


def test_symlinked_files_are_named_by_the_directory_given(tmp_path):
    """Rule 1 (docs/usage.md): files lying directly in the directory given are in the run of
    that directory's name, also when they are symbolic links to files elsewhere (here to
    PARAM's DLRM ranks 0-1 in .../dlrm_kineto): the run is 'job', not 'dlrm_kineto'. A link
    given by name is named by the directory holding the link."""
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        (job / _dlrm(r).name).symlink_to(_dlrm(r))
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([job], lake, jobs=1)
    assert [(r.status, r.run_id) for r in res] == [("ok", "job")] * 2
    (r,) = ingest_paths([job / _dlrm(0).name], Lake(tmp_path / "lake2"), jobs=1)
    assert (r.status, r.run_id) == ("ok", "job")
