"""Run names (pipeline/ingest/runs.py, rule 1 and 2 of docs/usage.md "Runs"): a directory path is
stored with '.' between its parts, a moved run is named by the UTC second it starts, `--run` wins
and names a run the same way, and `--run` given as a path finds runs stored before (safe_run_id's
id). Expected names are written out by hand from the directory and file names and the times the
hand-made traces hold."""

from __future__ import annotations

import json
import tarfile

import pytest
from conftest import CORPUS, X, write_trace
from typer.testing import CliRunner

from pipeline.cli import EXIT_OK, app
from pipeline.cli.options import _resolve_runs
from pipeline.ingest import ingest_paths
from pipeline.ingest.jobid import job_of_metadata, job_of_name, with_job
from pipeline.ingest.runs import moved_run, run_for, run_id_of
from pipeline.lake import Lake, safe_run_id

runner = CliRunner()


def _h(name: str) -> str:
    """6 hex digits of a name's SHA-1, computed here (the id's suffix)."""
    import hashlib

    return hashlib.sha1(name.encode()).hexdigest()[:6]


# 2026-11-04 03:00:00 UTC in µs (Kineto's ts unit): 1,793,761,200 s since the epoch
T0_US = 1_793_761_200 * 10**6


@pytest.mark.parametrize(
    ("name", "run_id"),
    [
        ("job1/traces", "job1.traces"),
        ("2026-11-04/job-4711/profiler", "2026-11-04.job-4711.profiler"),
        ("job1/traces/", "job1.traces"),  # a trailing '/' is dropped
        ("dlrm_kineto", "dlrm_kineto"),  # one directory: its name, as before
    ],
)
def test_directory_paths_are_joined_with_dots(name, run_id):
    assert run_id_of(name) == run_id == run_for(name, None)


@pytest.mark.parametrize(
    ("name", "run_id"),
    [
        # a '.' in an id stands for a '/': a directory holding a '.' of its own gets its hash
        ("a/b", "a.b"),
        ("a.b", "a.b-" + _h("a.b")),
        ("v1.2", "v1.2-" + _h("v1.2")),
        ("a.b/c", f"a.b-{_h('a.b')}.c"),
        ("a/b.c", f"a.b.c-{_h('b.c')}"),
        ("a/b/c", "a.b.c"),
        ("traces/llama-8b.exp3", f"traces.llama-8b.exp3-{_h('llama-8b.exp3')}"),  # a job value
        ("über.v2/x", f"über.v2-{_h('über.v2')}.x"),
        ("a.b-" + _h("a.b"), "a.b-" + _h("a.b")),  # an id given back stays as it is
    ],
)
def test_a_dot_of_a_directory_never_reads_as_a_slash(name, run_id):
    assert run_id_of(name) == run_id


def test_run_values_name_an_id_as_printed_or_a_path():
    """--run takes a run id as `tracelake runs` prints it, or a directory path (given_run_id)."""
    assert run_for("x", "a.b") == "a.b"  # the id of a/b
    assert run_for("x", "a.b/") == "a.b-" + _h("a.b")  # the directory a.b
    assert run_for("x", "job1/traces") == "job1.traces"
    assert run_for("x", "v1.2-" + _h("v1.2")) == "v1.2-" + _h("v1.2")
    assert run_for("x", "my job") == "my_job-" + _h("my job")
    # found by analyze's --run too: the exact id first, then the directory's
    known = {"a.b", "a.b-" + _h("a.b")}
    assert _resolve_runs(["a.b", "a.b/", "a/b"], known) == ["a.b", "a.b-" + _h("a.b"), "a.b"]


def test_dotted_and_nested_directories_are_two_runs(tmp_path):
    """The tester's case: a.b/ and a/b/ (rank 0 and rank 1, at the same time) were one run a.b."""
    root = tmp_path / "root"
    _rank(root / "a.b" / "rank0.json", 0, T0_US)
    _rank(root / "a" / "b" / "rank1.json", 1, T0_US + 1)
    lake = tmp_path / "lake"
    for _ in range(2):  # the second ingest skips both files: same names, no new run
        r = runner.invoke(app, ["ingest", str(root), "--lake", str(lake), "-j", "1", "-q"])
        assert r.exit_code == EXIT_OK, r.output
        src = Lake(lake).sources().sort("path")
        assert src["run_id"].to_list() == ["a.b-" + _h("a.b"), "a.b"]
        assert src["path"].to_list() == [
            str(root / "a.b" / "rank0.json"),
            str(root / "a" / "b" / "rank1.json"),
        ]
    # --run a.b (the id as printed) adds to a/b's run; --run a.b/ (the directory) to a.b/'s
    _rank(tmp_path / "late" / "rank2.json", 2, T0_US + 2)
    _rank(tmp_path / "late2" / "rank3.json", 3, T0_US + 3)
    for f, run in (("late/rank2.json", "a.b"), ("late2/rank3.json", "a.b/")):
        r = runner.invoke(app, ["ingest", str(tmp_path / f), "--run", run, "--lake", str(lake), "-q"])
        assert r.exit_code == EXIT_OK, r.output
    by_run = {k: sorted(g["rank"].to_list()) for (k,), g in Lake(lake).sources().group_by("run_id")}
    assert by_run == {"a.b": [1, 2], "a.b-" + _h("a.b"): [0, 3]}


@pytest.mark.parametrize(
    "name",
    [
        "my job/traces",  # a space is not an id character: safe_run_id's name with its hash
        "a/../b",
        "/",
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
    # a run id in any script stays as it is; a long one is cut before its suffix, which stays
    assert moved_run("日本語_run", "0c0119f3deadbeef", t0) == "日本語_run_20230428T235238"
    stored = "x" * 100 + "-abcdef"  # a shortened id: 100 + 7; the suffix takes 16 of the 100
    want = "x" * 84 + "_20230428T235238-" + _h(stored + "_20230428T235238")
    assert moved_run(stored, "0c0119f3deadbeef", t0) == want


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


# ------------------------------------------------------------------ job ids (pipeline/ingest/jobid.py)


@pytest.mark.parametrize(
    ("name", "job"),
    [
        ("job-12345_rank3.json", "job-12345"),  # SLURM-style
        ("llama_slurm-12345.3.pt.trace.json", "job-12345"),  # <jobname>_<keyword><id>.<rank>
        ("jobid=12345.rank0.json", "job-12345"),
        ("JOB_ID_77.json.gz", "job-77"),  # any case; '_' between keyword and digits
        ("slurm-job-id-5_worker1.json", "job-5"),
        ("trainer_job7.pt.trace.json", "job-7"),
        # no job keyword, or one glued to a word: no job (the digits are a pid, a time, a rank)
        ("myjob123.json", None),
        ("jobs_12.json", None),
        ("rank0.json", None),
        ("llama_12345.3.pt.trace.json", None),
        ("node01_4567.1694128201545.pt.trace.json", None),  # tensorboard_trace_handler's default
    ],
)
def test_job_from_a_file_name(name, job):
    assert job_of_name(name) == job


def test_no_corpus_file_name_states_a_job():
    """The real traces' names (HTA's, Kineto's, PARAM's, TraceLens', the NCCL logs and Nsight
    exports) carry pids, times, ranks and test names, never a job keyword: read by hand, e.g.
    worker0_step_12.1694128201545.pt.trace.json, benchmark_result_2869224_1695835535_trace.json.gz,
    rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz. None of them may be split off by a job."""
    names = [p.name for p in CORPUS.rglob("*") if p.is_file() and p.name != "PROVENANCE.md"]
    assert len(names) >= 89  # the corpus as PROVENANCE.md lists it
    assert "worker0_step_12.1694128201545.pt.trace.json" in names
    assert {n: job_of_name(n) for n in names if job_of_name(n)} == {}


@pytest.mark.parametrize(
    ("name", "job", "out"),
    [
        ("traces", "job-4711", "traces/job-4711"),
        ("2026-11-04/traces/", "job-4711", "2026-11-04/traces/job-4711"),
        ("job-4711", "job-4711", "job-4711"),  # the directory already names the job
        ("slurm_4711", "job-4711", "slurm_4711"),  # ... in its own spelling
        ("job-4711/traces", "job-4711", "job-4711/traces"),  # a parent names it: not twice
        ("2026/slurm-4711/traces", "job-4711", "2026/slurm-4711/traces"),
        ("job-4711/traces", "job-4712", "job-4711/traces/job-4712"),  # another job: both
        ("exp-a", "exp-a", "exp-a"),
        ("/", "job-1", "job-1"),  # the root directory has no name of its own
        ("traces", None, "traces"),
    ],
)
def test_with_job(name, job, out):
    assert with_job(name, job) == out


@pytest.mark.parametrize(
    ("meta", "job", "noted"),
    [
        ({"job_id": 4711}, "job-4711", False),
        ({"job_id": "0042"}, "job-42", False),
        ({"JOBID": "4711"}, "job-4711", False),  # keys compared ignoring case
        ({"run_id": "llama-8b.exp3"}, "llama-8b.exp3", False),
        (
            {"group_trace_id": "6e4c5d49-31d6-410f-83cf-8827e227851d"},
            "6e4c5d49-31d6-410f-83cf-8827e227851d",
            False,
        ),
        ({"run_id": "x", "job_id": 9}, "job-9", False),  # job_id before run_id
        ({"job_id": "my job"}, None, True),  # not an id: a note, no job
        ({"job_id": {"a": 1}}, None, True),
        ({"job_id": True}, None, True),
        ({"run_id": "none"}, None, False),  # TORCHELASTIC's default: no job, nothing to say
        ({"trace_id": "D84EEAE1F7B4478F9F2D86023BDD9BA9"}, None, False),  # per process: not a job
        # a job keyword and digits, as a file name states them (tester's third round, finding 11)
        ({"job_id": "slurm-4711"}, "job-4711", False),
        ({"job_id": "JOB-4711"}, "job-4711", False),
        ({"run_id": "job_id=0042"}, "job-42", False),
        ({"run_id": "myjob-3"}, "myjob-3", False),  # a keyword glued to a word: text, as in a name
    ],
)
def test_job_from_metadata(meta, job, noted):
    got, note = job_of_metadata(meta)
    assert got == job
    assert (note is not None) == noted


def test_runs_named_by_the_jobs_files_state(tmp_path):
    """One directory holding the files of four jobs, all at the same time with the same ranks: two
    named in the file name, one in the trace's job_id metadata, one by group_trace_id; plus a .tar
    whose members name a job and a broken link named like a rank of job 4711. Each job is a run
    `traces.<job>` (without the job ids, the same ranks at the same time would have given moved
    runs traces_<start>), the broken link's failed row is in its job's run, and a second ingest
    (and a --force one) names every file the same. Expected ids written out by hand from the names."""
    d = tmp_path / "traces"
    _rank(d / "job-4711_rank0.json", 0, T0_US)
    _rank(d / "job-4711_rank1.json", 1, T0_US + 1)
    _rank(d / "slurm_4712.rank0.json", 0, T0_US + 2)  # other bytes (the same would be skipped)
    ev = [X("kernel", "k", T0_US, 50, pid=0, tid=7, device=0, stream=7, correlation=1)]
    write_trace(d / "a" / "rank0.json", ev, distributedInfo={"rank": 0, "world_size": 2}, job_id=4713)
    write_trace(d / "a" / "rank1.json", ev, distributedInfo={"rank": 1, "world_size": 2}, job_id="4713")
    write_trace(d / "b" / "rank0.json", ev, distributedInfo={"rank": 0}, group_trace_id="6e4c5d49-31d6")
    tar_dir = tmp_path / "m"
    _rank(tar_dir / "jobid-4714.rank0.json", 0, T0_US + 3)
    with tarfile.open(d / "more.tar", "w") as tf:
        tf.add(tar_dir / "jobid-4714.rank0.json", arcname="jobid-4714.rank0.json")
    (d / "job-4711_rank2.json").symlink_to(tmp_path / "missing.json")
    lake = Lake(tmp_path / "lake")

    def runs_of():
        src = Lake(lake.root).sources()
        return sorted(
            (r, -1 if k is None else int(k), s)
            for r, k, s in src.select("run_id", "rank", "status").iter_rows()
        )

    # files directly in the directory given are named by its own name (rule 1): traces.<job>
    want = [
        ("a.job-4713", 0, "ok"),
        ("a.job-4713", 1, "ok"),
        ("b.6e4c5d49-31d6", 0, "ok"),
        ("traces.job-4711", -1, "failed"),  # the broken link: no rank
        ("traces.job-4711", 0, "ok"),
        ("traces.job-4711", 1, "ok"),
        ("traces.job-4712", 0, "ok"),
        ("traces.job-4714", 0, "ok"),  # more.tar's top member: as if unpacked in traces/ (rule 1)
    ]
    res = ingest_paths([d], lake, jobs=1)
    assert runs_of() == want, [(r.path, r.run_id, r.status, r.notes) for r in res]
    again = ingest_paths([d], lake, jobs=1)
    assert sorted(r.status for r in again) == ["failed"] + ["skipped"] * 7  # the link fails again
    # each skipped file is in its own run (the one its contents named), not "held elsewhere"
    assert [r.held_in for r in again if r.status == "skipped"] == [None] * 7
    assert runs_of() == want
    ingest_paths([d], lake, jobs=1, force=True)
    assert runs_of() == want


def test_objects_and_archive_members_name_their_job():
    """An object's and an archive member's run name take the job of their own name, as a file's
    does (no server needed: the names alone)."""
    from pipeline.ingest.archive import member_run_name
    from pipeline.ingest.objects import ObjectInput

    assert ObjectInput("s3://b/archive/traces/job-7_rank0.json").run_name == "traces/job-7"
    assert ObjectInput("s3://b/archive/traces/rank0.json", "04/traces").run_name == "04/traces"
    assert ObjectInput("s3://b/archive/job-7/job-7_rank0.json").run_name == "job-7"
    assert member_run_name("/x/a.tar.gz", "d/slurm-9.rank1.json", "job") == "job/d/job-9"
    # a member at the archive's top that states a job: the archive's directory's name with it
    assert member_run_name("/x/job-9.tar.gz", "job-9.rank1.json") == "x/job-9"
    assert member_run_name("/x/job-9.tar.gz", "job-9.rank1.json", "job") == "job/job-9"
    assert member_run_name("/x/job-9/a.tar.gz", "slurm-9.rank1.json") == "job-9"  # names it already
    # without a job, the archive's name stands for its top members' directory (as before today)
    assert member_run_name("/x/rank0.tar.gz", "rank0.json") == "rank0"
    assert member_run_name("/x/rank0.tar.gz", "rank0.json", "job") == "job/rank0"


def _nsys_with_env(path, *values: str):
    """nsightful's power_iteration__baseline.sqlite (a real Nsight Systems export whose capture
    recorded its process's environment in META_DATA_CAPTURE) with these environment rows added."""
    import shutil
    import sqlite3

    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(CORPUS / "nsys" / "nsightful" / "power_iteration__baseline.sqlite", path)
    path.chmod(0o644)
    con = sqlite3.connect(path)
    con.executemany(
        "INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
        [(v,) for v in values],
    )
    con.commit()
    con.close()
    return path


def test_an_nsight_export_is_named_by_the_job_its_capture_environment_states(tmp_path):
    """SLURM_JOB_ID in the capture's environment names the job (the export's own rows say
    LD_PRELOAD, NV_LIBNCCL_PACKAGE_VERSION, ...: no job); TORCHELASTIC_RUN_ID's default `none`
    names none; a job in the file's name wins over the environment."""
    d = tmp_path / "traces"
    _nsys_with_env(d / "a" / "profile.sqlite", 'SLURM_JOB_ID="4711"', 'TORCHELASTIC_RUN_ID="none"')
    _nsys_with_env(d / "b" / "profile.sqlite", 'TORCHELASTIC_RUN_ID="none"', 'SLURM_JOB_NAME="x"')
    _nsys_with_env(d / "c" / "slurm-99.sqlite", 'SLURM_JOB_ID="4711"', "PATH=/usr/bin")
    res = ingest_paths([d], Lake(tmp_path / "lake"), jobs=1)
    assert sorted((r.path.split("traces/")[1], r.run_id, r.status) for r in res) == [
        ("a/profile.sqlite", "a.job-4711", "ok"),
        ("b/profile.sqlite", "b", "ok"),
        ("c/slurm-99.sqlite", "c.job-99", "ok"),
    ]


def test_a_real_trace_named_by_its_group_trace_id(tmp_path):
    """HTA's MTIA inference trace states `group_trace_id` 6e4c5d49-31d6-410f-83cf-8827e227851d
    at its top level (read by hand from the file; its per-process `trace_id` 13072646111613355758
    and its `tw_job` name are not used): ingested from its directory, it is that job's run."""
    d = CORPUS / "hta" / "tests" / "data" / "mtia_inference_trace"
    (r,) = ingest_paths([d], Lake(tmp_path / "lake"), jobs=1)
    assert (r.status, r.run_id) == ("ok", "mtia_inference_trace.6e4c5d49-31d6-410f-83cf-8827e227851d")


# ------------------------------------------------------------------ logs beside traces, archives

DLRM = CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto"
# a real NCCL_DEBUG log (two TP ranks of torchtitan) standing in for a job's SLURM output
TORCHTITAN_LOG = CORPUS / "nccl" / "torchtitan-issue-1369-coll-allgather-reducescatter-tp2.log"


def _dlrm(rank: int):
    """DLRM's real rank file (distributedInfo rank `rank` of 8, read by hand; no job metadata)."""
    (f,) = DLRM.glob(f"worker{rank}_step_12.*.pt.trace.json")
    return f


def _copy(src, dst):
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def _runs(lake):
    """(file name, run_id, named_run_id, status) of every sources row, by file name."""
    src = Lake(lake.root).sources()
    rows = src.select("path", "run_id", "named_run_id", "status").iter_rows()
    return sorted((p.rsplit("/", 1)[-1], r, n, s) for p, r, n, s in rows)


def test_a_slurm_log_beside_traces_that_state_no_job_joins_them(tmp_path):
    """The tester's case: two DLRM ranks (their names and contents state no job) and a SLURM
    output named slurm-4711.out in n2/train. All three are run `train` (n2's subdirectory; the
    log's own name would give train.job-4711, which its sources row keeps as named_run_id), so the
    analysis matches the log against the traced ranks; a second ingest skips all three quietly;
    the log ingested alone into a lake that holds the traces lands in the same run."""
    d = tmp_path / "n2" / "train"
    t0, t1 = _copy(_dlrm(0), d / _dlrm(0).name), _copy(_dlrm(1), d / _dlrm(1).name)
    log = _copy(TORCHTITAN_LOG, d / "slurm-4711.out")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([tmp_path / "n2"], lake, jobs=1)
    assert sorted((r.status, r.run_id) for r in res) == [("ok", "train")] * 3
    (note,) = [n for r in res if r.path.endswith(".out") for n in r.notes]
    assert note == "the traces beside it are named train; this file was put in run train"
    assert _runs(lake) == [
        ("slurm-4711.out", "train", "train.job-4711", "ok"),
        (t0.name, "train", "train", "ok"),
        (t1.name, "train", "train", "ok"),
    ]
    (run,) = lake_analysis(lake)["runs"]
    assert run["run_id"] == "train" and run["nccl_matching"] is not None
    assert [g["file"] for g in run["nccl_matching"]["logs"]] == ["slurm-4711.out"]
    again = ingest_paths([tmp_path / "n2"], lake, jobs=1)
    assert [(r.status, r.run_id, r.held_in) for r in again] == [("skipped", "train", None)] * 3
    # traces first (given by name: their directory's own name), the log alone later
    alone = Lake(tmp_path / "alone")
    assert {r.run_id for r in ingest_paths([t0, t1], alone, jobs=1)} == {"train"}
    (r,) = ingest_paths([log], alone, jobs=1)
    assert (r.status, r.run_id) == ("ok", "train")
    assert _runs(alone) == _runs(lake)


def test_traces_that_state_a_job_take_the_log_beside_them(tmp_path):
    """The reverse: DLRM's ranks renamed job-4711_rank<N>.json (run traces.job-4711) and a
    per-process NCCL log nccl.host1.123.log (its name states no job: run `traces`) in one
    directory: the log joins traces.job-4711, also when ingested alone after the traces, and
    with the traces given before the log in one batch of files given by name."""
    d = tmp_path / "traces"
    ranks = [_copy(_dlrm(k), d / f"job-4711_rank{k}.json") for k in (0, 1)]
    log = _copy(TORCHTITAN_LOG, d / "nccl.host1.123.log")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([d], lake, jobs=1)
    assert sorted((r.status, r.run_id) for r in res) == [("ok", "traces.job-4711")] * 3
    assert _runs(lake) == [
        ("job-4711_rank0.json", "traces.job-4711", "traces.job-4711", "ok"),
        ("job-4711_rank1.json", "traces.job-4711", "traces.job-4711", "ok"),
        ("nccl.host1.123.log", "traces.job-4711", "traces", "ok"),
    ]
    alone = Lake(tmp_path / "alone")
    ingest_paths(ranks, alone, jobs=1)
    (r,) = ingest_paths([log], alone, jobs=1)
    assert (r.status, r.run_id) == ("ok", "traces.job-4711")
    together = Lake(tmp_path / "together")
    assert {r.run_id for r in ingest_paths([log, *ranks], together, jobs=1)} == {"traces.job-4711"}


def lake_analysis(lake):
    from pipeline import open_lake

    return open_lake(lake.root).analysis()


@pytest.mark.parametrize(
    ("beside", "named", "job", "out"),
    [
        ([], "train.job-4711", "job-4711", "train.job-4711"),  # no traces beside it: its own name
        (["train"], "train.job-4711", "job-4711", "train"),  # traces of no job: never left
        (["traces.job-4711"], "traces", None, "traces.job-4711"),  # the one job its traces state
        (["t.job-1"], "t.job-2", "job-2", "t.job-1"),  # one job beside it: the log takes it
        (["t.job-1", "t.job-2"], "t.job-2", "job-2", "t.job-2"),  # its own job among several
        (["t.job-1", "t.job-2"], "t", None, "t"),  # several jobs, it states none: its own name
        (["t.job-1", "t.job-3"], "t.job-2", "job-2", "t.job-2"),  # several, not its job
        (["t.job-1", "t"], "t.job-2", "job-2", "t"),  # not its job, and traces of no job
        (["t.job-1", "t"], "t", None, "t"),
        (["job1.traces", "x"], "job1.traces.job-1", "job-1", "job1.traces"),  # a dotted directory
    ],
)
def test_the_run_a_log_is_named_for(beside, named, job, out):
    from pipeline.ingest.runs import log_name

    assert log_name(beside, named, job) == out


def test_what_lies_beside_what():
    from pipeline.ingest.runs import beside_key

    assert beside_key("/a/b/slurm-1.out") == "/a/b"
    assert beside_key("/a/x.tar!t/rank0.json") == "/a/x.tar!t"  # a directory inside the archive
    assert beside_key("/a/x.tar!rank0.json") == "/a"  # at its top: as if unpacked where it lies
    assert beside_key("s3://b/p/rank0.json") == "s3://b/p"


def test_per_rank_archives_of_one_job_are_one_run(tmp_path):
    """ar4 holds one archive per rank (a .tar.gz, read front to back, and a .tar, read in place),
    each with DLRM's rank file named job-4711_rank<N>.json at its top: one run ar4.job-4711, as
    the files unpacked in ar4 would be (rule 1). Without a job in the members' names each archive
    names its own run by its name (rank0, rank1: the rule since archives were read). A top member
    whose metadata states its job (job_id 4712), and an Nsight export at the top of a zip whose
    capture states SLURM_JOB_ID=4713, are named by the archive's directory with that job too."""
    import zipfile

    m, ar4, plain = tmp_path / "m", tmp_path / "ar4", tmp_path / "plain"
    for k in (0, 1):
        _copy(_dlrm(k), m / f"job-4711_rank{k}.json")
    ar4.mkdir()
    plain.mkdir()
    with tarfile.open(ar4 / "rank0.tar.gz", "w:gz") as t:
        t.add(m / "job-4711_rank0.json", arcname="job-4711_rank0.json")
    with tarfile.open(ar4 / "rank1.tar", "w") as t:
        t.add(m / "job-4711_rank1.json", arcname="job-4711_rank1.json")
    for k in (0, 1):
        with tarfile.open(plain / f"rank{k}.tar.gz", "w:gz") as t:
            t.add(_dlrm(k), arcname=_dlrm(k).name)
    ev = [X("kernel", "k", T0_US, 50, pid=0, tid=7, device=0, stream=7, correlation=1)]
    write_trace(m / "rank0.json", ev, distributedInfo={"rank": 0, "world_size": 1}, job_id=4712)
    (tmp_path / "meta").mkdir()
    with tarfile.open(tmp_path / "meta" / "w.tar", "w") as t:
        t.add(m / "rank0.json", arcname="rank0.json")
    sqlite = _nsys_with_env(m / "profile.sqlite", 'SLURM_JOB_ID="4713"')
    (tmp_path / "nsys").mkdir()
    with zipfile.ZipFile(tmp_path / "nsys" / "exports.zip", "w") as z:
        z.write(sqlite, arcname="profile.sqlite")
    res = ingest_paths([ar4, tmp_path / "meta", tmp_path / "nsys"], Lake(tmp_path / "lake"), jobs=1)
    # the same DLRM bytes without a job: another lake (one lake would skip them as already in it)
    res += ingest_paths([plain], Lake(tmp_path / "plain_lake"), jobs=1)
    got = sorted((r.path.split(str(tmp_path) + "/")[1], r.run_id, r.status) for r in res)
    assert got == [
        ("ar4/rank0.tar.gz!job-4711_rank0.json", "ar4.job-4711", "ok"),
        ("ar4/rank1.tar!job-4711_rank1.json", "ar4.job-4711", "ok"),
        ("meta/w.tar!rank0.json", "meta.job-4712", "ok"),
        ("nsys/exports.zip!profile.sqlite", "nsys.job-4713", "ok"),
        (f"plain/rank0.tar.gz!{_dlrm(0).name}", "rank0", "ok"),
        (f"plain/rank1.tar.gz!{_dlrm(1).name}", "rank1", "ok"),
    ]


def test_per_rank_archives_without_a_job_get_no_job_note(tmp_path):
    """The tester's finding 3: rank0.tar.gz and rank1.tar.gz in one directory, no file stating a
    job, are runs rank0 and rank1 (each archive a directory of its own): the second got the note
    "the traces beside it are in run rank0: this one states another job (or none)". An archive
    whose member states a job beside them still gets it (a job against none)."""
    src, ar = tmp_path / "src", tmp_path / "ar"
    ar.mkdir()
    for k in (0, 1):
        _rank(src / f"rank{k}.json", k, T0_US + k)
        with tarfile.open(ar / f"rank{k}.tar.gz", "w:gz") as t:
            t.add(src / f"rank{k}.json", arcname=f"rank{k}.json")
    _rank(src / "job-4711_rank2.json", 2, T0_US + 2)
    with tarfile.open(ar / "x2.tar", "w") as t:
        t.add(src / "job-4711_rank2.json", arcname="job-4711_rank2.json")
    res = ingest_paths([ar], Lake(tmp_path / "lake"), jobs=1)
    got = sorted((r.path.rsplit("/", 1)[1], r.run_id, r.notes) for r in res)
    assert got == [
        ("rank0.tar.gz!rank0.json", "rank0", []),
        ("rank1.tar.gz!rank1.json", "rank1", []),
        (
            "x2.tar!job-4711_rank2.json",
            "ar.job-4711",
            [
                "the traces beside it are in run rank0 and 1 more: this one states another job (or none), "
                "so it starts run ar.job-4711 (one run per job; --run names one run for all)"
            ],
        ),
    ]


# ------------------------------------------------------------------ run ids (pipeline/ingest/runid.py)

LONG = "nightly_llama70b_pretrain_" * 4 + "x"  # 105 characters, one directory


@pytest.mark.parametrize(
    ("name", "run_id"),
    [
        # 105 + '.' + 8 = 114 > 100: the directory loses 14 characters, the job none
        (
            f"{LONG}/job-4711",
            "nightly_llama70b_pretrain_" * 3 + "nightly_llama" + ".job-4711-" + _h(f"{LONG}/job-4711"),
        ),
        # a directory naming the job is kept whole, as is the last part: 8+1+1+6 = 16, 84 left
        # for the long one (its first 78 + 6)
        (
            f"job-4711/{LONG}/traces",
            "job-4711."
            + "nightly_llama70b_pretrain_" * 3
            + "nightl"
            + ".traces-"
            + _h(f"job-4711/{LONG}/traces"),
        ),
        # two long directories share the 88 characters left: 44 each (the first 26 + 18)
        (
            f"a/{LONG}/{LONG}/job-4711",
            "a."
            + ("nightly_llama70b_pretrain_nightly_llama70b_p." * 2)
            + "job-4711-"
            + _h(f"a/{LONG}/{LONG}/job-4711"),
        ),
        ("x" * 60 + "/" + "y" * 60, "x" * 39 + "." + "y" * 60 + "-" + _h("x" * 60 + "/" + "y" * 60)),
        (LONG, LONG[:100] + "-" + _h(LONG)),  # one directory alone: its first 100, as before
        # UTF-8 bytes are counted (a directory name holds 255 of them): 日本語 is 9 bytes
        ("日本語" * 40 + "/job-4711", "日本語" * 10 + ".job-4711-" + _h("日本語" * 40 + "/job-4711")),
        ("a/" + "日本語" * 30, "a." + "日本語" * 10 + "日本-" + _h("a/" + "日本語" * 30)),  # 98 bytes
        # a directory's own '.' keeps its marker when shortened (the tester's third round, finding
        # 10: `deeper.dir` read as two directories): 15 + 1 + 17 + 1 + 64 = 98 bytes, the first
        # part cut last below 18 (the longest above its floor), the last kept at 64
        (
            "日本語" * 20 + "/deeper.dir/" + "y" * 70,
            "日本語日本.deeper.dir-"
            + _h("deeper.dir")
            + "."
            + "y" * 64
            + "-"
            + _h("日本語" * 20 + "/deeper.dir/" + "y" * 70),
        ),
    ],
)
def test_long_names_are_shortened_in_their_directories_keeping_the_job(name, run_id):
    assert run_id_of(name) == run_id
    assert run_for("x", run_id) == run_id  # a stored id given back (--run) names the same run


@pytest.mark.parametrize(
    ("name", "run_id"),
    [
        ("über-job", "über-job"),
        ("u\u0308ber-job", "über-job"),  # decomposed (macOS): the same run
        ("日本語_run", "日本語_run"),
        ("2026-11-04/日本語", "2026-11-04.日本語"),
        ("हिन्दी_run", "हिन्दी_run"),  # its vowel signs are combining marks: kept
        ("naïve/\u202etxt", "naïve_txt-" + _h("naïve/\u202etxt")),  # a bidi control: replaced
        ("日本語 run", "日本語_run-" + _h("日本語 run")),  # a space: replaced, with the hash
        ("😀", "run-" + _h("😀")),  # no letter or digit left
    ],
)
def test_letters_of_every_script_are_kept(name, run_id):
    assert run_id_of(name) == run_id
    assert run_for("x", run_id) == run_id  # given back to --run


def test_ids_that_disagree_are_noted():
    from pipeline.ingest.jobid import stated_job

    # the file name's job wins (read before the file); the metadata's other one is said
    job, notes = stated_job("job-4711_rank1.json", "traces", {"job_id": "4712"})
    assert job is None and len(notes) == 1
    assert "job-4711" in notes[0] and "job_id job-4712" in notes[0]
    # the same job both ways, or only one stated: nothing to say
    assert stated_job("job-4711_rank1.json", "traces", {"job_id": 4711}) == (None, [])
    assert stated_job("rank1.json", "traces", {"job_id": 4712}) == ("job-4712", [])
    assert stated_job("job-4711_rank1.json", "traces", {}) == (None, [])
    # the directory names another job than the file: the run name holds both, and says so
    job, notes = stated_job("rank0.json", "job-4711", {"run_id": "4712"})
    assert job == "job-4712" and len(notes) == 1 and "(job-4711/job-4712)" in notes[0]
    assert stated_job("job-4711_rank0.json", "slurm_4711/traces", {}) == (None, [])
    # an id of other text (a collection's group_trace_id, a run_id) is not a job to compare
    uuid = {"group_trace_id": "6e4c5d49-31d6"}
    assert stated_job("job-4711_rank0.json", "traces", uuid) == (None, [])
    assert stated_job("rank0.json", "job-4711", uuid) == ("6e4c5d49-31d6", [])
    # the note names the key the job was read from: job_id "none" is passed over for run_id
    job, notes = stated_job("job-4711_rank1.json", "traces", {"job_id": "none", "run_id": 4712})
    assert job is None and len(notes) == 1 and "its metadata run_id job-4712" in notes[0]


def test_runs_of_real_ranks_in_hand_made_layouts(tmp_path):
    """PARAM's DLRM ranks (real Kineto traces of 2023-09-07 23:10 UTC, ranks 0-7) copied into the
    layouts the tester reported (issue 37 item 3: 6, 7, 9, 10); expected ids written by hand."""
    src = sorted((CORPUS / "param/et_replay/tests/inputs/dlrm_kineto").glob("worker*.json"))
    a = tmp_path / "archive"

    def put(i: int, rel: str, **meta) -> None:
        (a / rel).parent.mkdir(parents=True, exist_ok=True)
        doc = json.loads(src[i].read_bytes())
        (a / rel).write_text(json.dumps({**doc, **meta}))

    put(0, f"{LONG}/job-4711_rank0.pt.trace.json")  # 6: a long directory
    put(1, "job-4712/traces/job-4712_rank1.pt.trace.json")  # 7: the job in a parent directory
    put(2, "日本語_run/rank2.pt.trace.json")  # 9: not ASCII
    put(3, "u\u0308ber-job/rank3.pt.trace.json")
    put(4, "t/job-4713_rank4.pt.trace.json", job_id="4714")  # 10: name and metadata disagree
    put(5, "t/rank5.pt.trace.json", job_id="4714")  # ... and the traces of one directory
    # a real NCCL log beside the traces of its job, the job in its name and a parent directory
    log = CORPUS / "nccl" / "nccl-issue-1412-init-complete-and-init-timings-16rank.log"
    (a / "job-4712/traces/slurm-4712.log").write_bytes(log.read_bytes())
    res = ingest_paths([a], Lake(tmp_path / "lake"), jobs=1)
    got = {r.path.split("/archive/", 1)[1]: r.run_id for r in res}
    assert got == {
        f"{LONG}/job-4711_rank0.pt.trace.json": "nightly_llama70b_pretrain_" * 3
        + "nightly_llama.job-4711-"
        + _h(f"{LONG}/job-4711"),
        "job-4712/traces/job-4712_rank1.pt.trace.json": "job-4712.traces",
        "job-4712/traces/slurm-4712.log": "job-4712.traces",  # joins its job's traces
        "日本語_run/rank2.pt.trace.json": "日本語_run",
        "u\u0308ber-job/rank3.pt.trace.json": "über-job",
        "t/job-4713_rank4.pt.trace.json": "t.job-4713",  # the file name's job
        "t/rank5.pt.trace.json": "t.job-4714",  # its metadata's
    }
    notes = {r.path.rsplit("/", 1)[1]: r.notes for r in res}
    assert [n for n in notes["job-4713_rank4.pt.trace.json"] if "job_id job-4714" in n] != []
    (split,) = [n for n in notes["rank5.pt.trace.json"] if "beside it" in n]
    assert "run t.job-4713" in split and "starts run t.job-4714" in split
    assert [notes[k] for k in notes if k.endswith(("rank0.pt.trace.json", "rank1.pt.trace.json"))] == [[], []]
    # the ids are partition values the lake's SQL reads back (run=日本語_run/ on disk)
    from pipeline import open_lake

    assert (tmp_path / "lake" / "gpu_activities" / "run=日本語_run").is_dir()
    rows = open_lake(tmp_path / "lake").sql("select distinct run_id from gpu_activities")
    assert sorted(rows["run_id"].to_list()) == sorted(set(got.values()))  # the log's run has traces


def test_windows_of_one_name_whatever_batches_bring_them(tmp_path):
    """Two profiling cycles in one directory (ranks 0 and 1 at 03:00 and at 04:00 UTC, hand-made):
    one batch listed in any order, the two cycles in two batches in time order, or the ranks in
    two batches in either order, give the same names (the earliest cycle `prof`, the later one
    named by its start); a cycle ingested after the later one is named by its start, and a note
    says why."""
    d = tmp_path / "prof"
    c1 = [_rank(d / f"c1_rank{r}.json", r, T0_US + r) for r in (0, 1)]
    c2 = [_rank(d / f"c2_rank{r}.json", r, T0_US + 3_600 * 10**6 + r) for r in (0, 1)]
    want = {"c1_rank0.json": "prof", "c1_rank1.json": "prof"}
    want |= {"c2_rank0.json": "prof_20261104T040000", "c2_rank1.json": "prof_20261104T040000"}

    def names(*batches, lake="lake"):
        out, notes = {}, {}
        for batch in batches:
            for r in ingest_paths(batch, Lake(tmp_path / lake), jobs=1):
                out[r.path.rsplit("/", 1)[1]] = r.run_id
                notes[r.path.rsplit("/", 1)[1]] = r.notes
        return out, notes

    assert names(c1 + c2, lake="one")[0] == want
    assert names(c1, c2, lake="in_time_order")[0] == want
    assert names([c1[0], c2[0]], [c1[1], c2[1]], lake="rank0_first")[0] == want
    assert names([c1[1], c2[1]], [c1[0], c2[0]], lake="rank1_first")[0] == want
    # a batch is taken sorted by path, however it was listed
    assert names(c2[::-1] + c1[::-1], lake="listed_backwards")[0] == want
    assert names([c2[1], c1[1]], [c2[0], c1[0]], lake="halves_listed_backwards")[0] == want
    late, notes = names(c2, c1, lake="reversed")
    assert late == {"c2_rank0.json": "prof", "c2_rank1.json": "prof"} | {
        "c1_rank0.json": "prof_20261104T030000",
        "c1_rank1.json": "prof_20261104T030000",
    }
    (note,) = notes["c1_rank0.json"]
    assert "ends before run prof starts, which was ingested first" in note and "prof_20261104T030000" in note


def test_a_log_of_another_job_beside_traces_is_noted(tmp_path):
    """The tester's finding 10: slurm-4712.out beside job-4711_rank0.json joins the only traces
    beside it, run d.job-4711, and now says that their jobs disagree; slurm-4711.out beside
    them gets no such note."""
    d = tmp_path / "d"
    _rank(d / "job-4711_rank0.json", 0, T0_US)
    log = CORPUS / "nccl" / "nccl-issue-1412-init-complete-and-init-timings-16rank.log"
    (d / "slurm-4712.out").write_bytes(log.read_bytes())
    (tmp_path / "e").mkdir()
    _rank(tmp_path / "e" / "job-4711_rank0.json", 0, T0_US + 5)
    (tmp_path / "e" / "slurm-4711.out").write_bytes(log.read_bytes() + b"\n")  # other bytes: not skipped
    res = ingest_paths([d], Lake(tmp_path / "lake"), jobs=1)
    res += ingest_paths([tmp_path / "e"], Lake(tmp_path / "lake2"), jobs=1)
    got = {r.path.rsplit("/", 2)[-2] + "/" + r.path.rsplit("/", 1)[1]: (r.run_id, r.notes) for r in res}
    assert got == {
        "d/job-4711_rank0.json": ("d.job-4711", []),
        "d/slurm-4712.out": (
            "d.job-4711",
            [
                "the traces beside it are named d.job-4711; this file was put in run d.job-4711",
                "its file name states job-4712 and the traces beside it job-4711: it joins them in run "
                "d.job-4711 (the only traces beside it); --run names another run",
            ],
        ),
        "e/job-4711_rank0.json": ("e.job-4711", []),
        "e/slurm-4711.out": ("e.job-4711", []),
    }


def test_a_file_named_by_run_gets_no_job_note(tmp_path):
    """A file put in --run x lying beside traces of run d states no job: when x's rank 0 is taken
    and it moves on, its only note is the move's (it was also told it "states another job")."""
    _rank(tmp_path / "d" / "rank0.json", 0, T0_US)
    _rank(tmp_path / "other" / "rank0.json", 0, T0_US + 1)
    _rank(tmp_path / "d" / "late.json", 0, T0_US + 2)
    lake = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "d" / "rank0.json"], lake, jobs=1)
    ingest_paths([tmp_path / "other" / "rank0.json"], lake, jobs=1, run="x")
    (res,) = ingest_paths([tmp_path / "d" / "late.json"], lake, jobs=1, run="x")
    assert res.run_id == "x_20261104T030000"  # its first event: 03:00:00.000002 UTC
    held = lake.sources().filter(run_id="x")["source_id"].item()
    assert res.notes == [
        f"rank 0 of run x is already held by source {held}; this file was put in run {res.run_id}"
    ]


def test_one_job_in_file_names_and_metadata_is_one_run(tmp_path):
    """The tester's mix2/: JOB-4711_rank0.json and slurm-4711.rank3.json (job in the file name)
    were in mix2.job-4711, r1.json (job_id "slurm-4711") in mix2.slurm-4711 and r2.json (job_id
    "JOB-4711") in mix2.JOB-4711: one job, three runs."""
    d = tmp_path / "mix2"
    _rank(d / "JOB-4711_rank0.json", 0, T0_US)
    _rank(d / "slurm-4711.rank3.json", 3, T0_US + 3)
    write_trace(
        d / "r1.json",
        [X("kernel", "k", T0_US + 1, 50, pid=0, tid=7, device=0, stream=7, correlation=1)],
        distributedInfo={"rank": 1, "world_size": 4},
        job_id="slurm-4711",
    )
    write_trace(
        d / "r2.json",
        [X("kernel", "k", T0_US + 2, 50, pid=0, tid=7, device=0, stream=7, correlation=1)],
        distributedInfo={"rank": 2, "world_size": 4},
        job_id="JOB-4711",
    )
    lake = tmp_path / "lake"
    r = runner.invoke(app, ["ingest", str(d), "--lake", str(lake), "-j", "1", "-q"])
    assert r.exit_code == EXIT_OK, r.output
    src = Lake(lake).sources()
    assert {k: sorted(g["rank"].to_list()) for (k,), g in src.group_by("run_id")} == {
        "mix2.job-4711": [0, 1, 2, 3]
    }
