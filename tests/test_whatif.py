"""What-if (pipeline/whatif/): the graph, the replay, the critical path and the changes.

Expected values come from outside the code under test:
- a hand-made 2-rank step whose every replay is worked out by hand below;
- the corpus: the identity replay must give back each step's measured time (step_window);
- PARAM's DLRM: rank 7's arrivals read from the lake's collectives (cited per call);
- the nsys-ai before/after pair: the measured step of "after" (step_window) and its host steps.
"""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from conftest import X, corpus, write_trace
from typer.testing import CliRunner

from pipeline import query
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.whatif import build, changes, measured, run_replay, whatif

# ---------------------------------------------------------------- a hand-made step, by hand
#
# Both ranks, host thread (pid 10, tid 10), one stream (7), times in µs:
#   ProfilerStep#1 [1000, 2300)
#   launches at 1010 (gemm_a), 1030 (the all-reduce), 1040 (gemm_c), each 5 µs
#   cudaDeviceSynchronize [1050, 2230)
# rank 0: gemm_a [1020, 1520)  all-reduce [1520, 2120)  gemm_c [2120, 2220)
# rank 1: gemm_a [1020, 2020)  all-reduce [2020, 2120)  gemm_c [2120, 2220)
# Rank 1 arrives last at the all-reduce (2020); its transfer is 100 µs; both end at 2120.
# Measured step: [1000, 2300) = 1300 µs on both ranks.
# Critical path (rank 1, the last rank on ties): host 1000-1010, launch 1010-1020, gemm_a
# 1020-2020, all-reduce 2020-2120, gemm_c 2120-2220, sync 2220-2230 (the call returns 10 µs after
# the work), host 2230-2300.

H100 = [
    {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "totalGlobalMem": 85e9}
]
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMM = {
    "Collective name": "allreduce",
    "In msg nelems": 1 << 20,
    "Out msg nelems": 1 << 20,
    "Group size": 2,
    "dtype": "Float",
    "Process Group Name": "0",
    "Process Group Description": "default_pg",
    "Process Group Ranks": "[0, 1]",
}


def _gpu(name, ts, dur, corr, **extra):
    return X("kernel", name, ts, dur, pid=0, tid=7, device=0, stream=7, correlation=corr, **extra)


def _rank(gemm_a_us: int, host_us: int = 0) -> list[dict]:
    """One rank's step; `host_us` more host work before the first launch delays everything after
    it by that much (the step is 1300 + host_us µs; the all-reduce ends at 2120 + host_us)."""
    h = host_us
    a_end = 1020 + h + gemm_a_us
    return [
        X("user_annotation", "ProfilerStep#1", 1000, 1300 + h, pid=10, tid=10),
        X("cuda_runtime", "cudaLaunchKernel", 1010 + h, 5, pid=10, tid=10, correlation=1),
        X("cuda_runtime", "cudaLaunchKernel", 1030 + h, 5, pid=10, tid=10, correlation=2),
        X("cuda_runtime", "cudaLaunchKernel", 1040 + h, 5, pid=10, tid=10, correlation=3),
        X("cuda_runtime", "cudaDeviceSynchronize", 1050 + h, 1180, pid=10, tid=10, correlation=4),
        _gpu("gemm_a", 1020 + h, gemm_a_us, 1),
        _gpu(NCCL, a_end, 2120 + h - a_end, 2, **COMM),
        _gpu("gemm_c", 2120 + h, 100, 3),
    ]


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif")
    for r, a in ((0, 500), (1, 1000)):
        write_trace(
            d / "job" / f"r{r}.json",
            _rank(a),
            distributedInfo={"backend": "nccl", "rank": r, "world_size": 2},
            deviceProperties=H100,
        )
    lk = Lake(d / "lake")
    assert [r.status for r in ingest_paths([d / "job"], lk)] == ["ok", "ok"]
    con = query.connect(lk)
    return lk, con, build(con, "job")


def _steps_us(g, change=None) -> dict[int, float]:
    d = measured(g) if change is None else change.apply(g, measured(g))
    r = run_replay(g, d)
    return {rank: ns / 1000 for rank, ns in zip(r.steps["rank"], r.steps["step_ns"])}


def test_hand_identity_and_path(hand):
    _, con, g = hand
    assert _steps_us(g) == {0: 1300, 1: 1300}
    doc = whatif(con, "job", [])
    assert doc["baseline_step_ns"] == doc["identity_step_ns"] == 1_300_000
    assert doc["identity_error_pct"] == 0
    r = run_replay(g, measured(g))
    p = r.path
    assert p["end_rank"].unique().to_list() == [1]
    t0 = g.t0  # the run's first event: the step start, 1000 µs on the trace's clock
    assert [
        (k, (s + t0) // 1000, (e + t0) // 1000) for k, s, e in zip(p["kind"], p["start_ns"], p["end_ns"])
    ] == [
        ("host", 1000, 1010),
        ("launch", 1010, 1020),
        ("compute", 1020, 2020),
        ("communication", 2020, 2120),
        ("compute", 2120, 2220),
        ("sync", 2220, 2230),
        ("host", 2230, 2300),
    ]
    assert p["dur_ns"].sum() == 1_300_000


def test_hand_changes(hand):
    _, _, g = hand
    # gemm_a halved: rank 1's ends at 1520, the all-reduce at 1620, gemm_c at 1720, the sync
    # returns at 1730, the step's host window ends 70 µs later: 1800 - 1000 = 800 on both ranks
    assert _steps_us(g, changes.scale("kernel:gemm_a=0.5")) == {0: 800, 1: 800}
    # rank 1 on time: rank 0 does not wait for it: its all-reduce ends 100 µs after its own
    # arrival (1520 + 100), gemm_c at 1720, sync 1730, end 1800 -> 800; rank 1's own step is
    # what it was (its gemm_a still ends at 2020): 1300
    assert _steps_us(g, changes.on_time(1)) == {0: 800, 1: 1300}
    # collectives free: rank 0 gemm_c [1520, 1620), sync 1630, end 1700 -> 700;
    # rank 1 gemm_c [2020, 2120), sync 2130, end 2200 -> 1200
    assert _steps_us(g, changes.collectives_overlapped()) == {0: 700, 1: 1200}
    # no launch gaps: gemm_a starts with its launch (1010, not 1020): everything 10 µs earlier
    assert _steps_us(g, changes.no_launch_gaps()) == {0: 1290, 1: 1290}
    # compute x2 on both: rank 1 gemm_a ends 3020, all-reduce 3120, gemm_c [3120, 3320), sync
    # 3330, end 3400 -> 2400
    assert _steps_us(g, changes.scale("category:compute=2")) == {0: 2400, 1: 2400}


def test_hand_cli(hand, tmp_path):
    lk, _, _ = hand
    res = CliRunner().invoke(
        app, ["whatif", "--lake", str(lk.root), "--scale", "kernel:gemm_a=0.5", "-f", "json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["contract"] == "tracelake.whatif/1"
    (c,) = doc["changes"]
    assert (c["predicted_step_ns"], c["gain_ns"]) == (800_000, 500_000)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root)])
    assert res.exit_code == 0
    assert "rank 1 on time at every collective" in res.stdout
    # every projection says what it does not model
    assert "  leaves out: what made rank 1 late: its own step keeps its time" in res.stdout
    assert "measured step 1.300 ms; identity replay 1.300 ms (error 0.000 %)" in res.stdout
    bad_args = (["--scale", "kernel:gemm_a"], ["--collectives", "fast"], ["--run", "nope"])
    factors = ("nan", "-1", "inf", "1e999", "x", "1_0", "0x10", "1e300")  # 1e300: past int64 ns
    bad_factors = (["--scale", f"kernel:gemm_a={f}"] for f in factors)
    for bad in (*bad_args, *bad_factors):
        res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root), *bad])
        assert res.exit_code == 2
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    bad_values = (["--on-time", "5"], ["--scale", "category:nonsense=0.5"])
    for bad, says in zip(bad_values, ("no rank 5", "category is one of compute, communication, memory")):
        res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root), *bad])
        assert res.exit_code == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1
    # a glob that names no kernel of the run changes nothing, and says so
    res = CliRunner().invoke(
        app, ["whatif", "--lake", str(lk.root), "--scale", "kernel:nomatch*=0.5", "-f", "json"]
    )
    doc = json.loads(res.stdout)
    assert doc["changes"][0]["gain_ns"] == 0
    assert (
        "kernels nomatch* x0.5: no GPU work of run job matches kernel:nomatch*: nothing changed"
        in doc["notes"]
    )
    # the text output's notes go to stderr, one line each, as analyze's; a factor in exponent form
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root), "--scale", "kernel:nomatch*=1e2"])
    assert res.exit_code == 0 and "note:" not in res.stdout and "kernels nomatch* x100" in res.stdout
    assert res.stderr.splitlines() == [
        "note: kernels nomatch* x100: no GPU work of run job matches kernel:nomatch*: nothing changed"
    ]
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root), "--scale", "kernel:gemm_a=1e300"])
    assert "x1e+300 makes the matched work of run job add up to" in res.stderr  # 1,500 µs x 1e300
    res = CliRunner().invoke(
        app, ["whatif", "--lake", str(lk.root), "--scale", "kernel:gemm_a=5e-1", "-f", "json"]
    )
    assert json.loads(res.stdout)["changes"][0]["predicted_step_ns"] == 800_000  # as =0.5 above


def test_step_notes_name_the_steps_together():
    """A graph's notes, one line per text with its steps (consecutive steps as a range), worked out
    by hand."""
    from types import SimpleNamespace

    from pipeline.whatif.graph import step_notes

    g = SimpleNamespace(notes={5: ["a", "b"], 6: ["a"], 7: ["a"], 9: ["a", "c"], 10: ["b"]})
    assert step_notes(g) == ["steps 5-7, 9: a", "steps 5, 10: b", "step 9: c"]
    assert step_notes(SimpleNamespace(notes={})) == []


def test_whatif_on_a_lake_of_failed_sources(tmp_path):
    """Every source failed: whatif says so as analyze does (exit 4), not as a usage error."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "r0.json").write_text('{"traceEvents": [')
    lk = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "t"], lk)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root)])
    assert res.exit_code == 4, res.output
    assert (
        "every source failed to ingest (1 file(s))" in res.stderr
        and len(res.stderr.strip().splitlines()) == 1
    )


def test_hand_durations_from(hand, tmp_path):
    """Durations from another run: "other" is the hand-made job with gemm_a taking 300 µs on rank 0
    and 400 µs on rank 1, and 100 µs more host work before the first launch (its step: 1400 µs,
    its all-reduce waiting until 2220 on both ranks). Kernel durations by name and occurrence are
    the mean over other's ranks (gemm_a 350 µs): rank 1's gemm_a ends at 1020 + 350 = 1370, the all-reduce at
    1470, gemm_c 1570, the sync returns 1580, end 1650 -> 650 on both ranks. With the host's
    durations too, the first launch comes at 1110: everything 100 µs later -> 750."""
    _, _, g = hand
    d = tmp_path / "other"
    for r, a in ((0, 300), (1, 400)):
        write_trace(
            d / f"r{r}.json",
            _rank(a, host_us=100),
            distributedInfo={"backend": "nccl", "rank": r, "world_size": 2},
            deviceProperties=H100,
        )
    lk = Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([d], lk)] == ["ok", "ok"]
    con = query.connect(lk)
    (measured_other,) = con.execute("SELECT DISTINCT step_ns FROM step_window").fetchall()[0]
    assert measured_other == 1_400_000
    other = build(con, "other")
    assert _steps_us(g, changes.durations_from(other)) == {0: 650, 1: 650}
    # how much found its kernel: gemm_a and gemm_c on both ranks (the all-reduce keeps its
    # transfer), all of their 500 + 100 + 1000 + 100 µs
    ch = changes.durations_from(other)
    ch.apply(g, measured(g))
    assert ch.note() == (
        "4 of 4 activities (100.0 % of their time) found their name in run other; the others keep their time"
    )
    # a run whose gemm_a has another name: only gemm_c, 200 of 1,700 µs (11.8 %)
    rows = [dict(e, name="gemm_z") if e.get("name") == "gemm_a" else e for e in _rank(300)]
    write_trace(tmp_path / "renamed" / "r0.json", rows, deviceProperties=H100)
    assert [r.status for r in ingest_paths([tmp_path / "renamed"], lk)] == ["ok"]
    ch = changes.durations_from(build(query.connect(lk), "renamed"))
    ch.apply(g, measured(g))
    assert ch.note() == (
        "2 of 4 activities (11.8 % of their time) found their name in run renamed; the others keep their time"
    )
    assert _steps_us(g, changes.durations_from(other, host=True)) == {0: 750, 1: 750}
    # a change with nothing to act on says so: "renamed" is one rank, its all-reduce matched with
    # no other rank's
    one = build(query.connect(lk), "renamed")
    for ch, says in (
        (
            changes.on_time(0),
            "rank 0 takes part in no collective call matched across ranks: nothing "
            "waits for it, nothing changed",
        ),
        (
            changes.collectives_at_peak(),
            "the run has no collective call matched across ranks: nothing changed",
        ),
    ):
        ch.apply(one, measured(one))
        assert ch.note() == says
    ch = changes.on_time(1)
    ch.apply(g, measured(g))
    assert ch.note() is None  # rank 1 of the hand-made job is waited for
    # the other run with its own means: gemm_a 350 µs on both ranks, so rank 1 arrives at 1470,
    # 50 µs earlier than measured, and its all-reduce keeps its 700 µs transfer: 2350 - 1000
    assert _steps_us(other, changes.durations_from(other, host=True)) == {0: 1350, 1: 1350}


def test_no_steps_says_why(tmp_path):
    write_trace(
        tmp_path / "t" / "r0.json",
        [X("cuda_runtime", "cudaLaunchKernel", 10, 5, pid=1, tid=1, correlation=1), _gpu("k", 20, 5, 1)],
    )
    lk = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "t"], lk)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root)])
    assert res.exit_code == 4
    assert "no steps to replay" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    # durations taken from a run with no GPU work: a usage error naming the option, exit 2
    write_trace(tmp_path / "cpu" / "r0.json", [X("cpu_op", "aten::mm", 10, 5, pid=1, tid=1)])
    ingest_paths([tmp_path / "cpu"], lk)
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root), "--run", "t", "--durations-from", "cpu"])
    assert res.exit_code == 2, res.output
    assert "--durations-from cpu: run cpu: no GPU work to replay" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- real traces


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    lk = Lake(tmp_path_factory.mktemp("dlrm") / "lake")
    ingest_paths([corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")], lk)
    return query.connect(lk)


def test_identity_replay_on_the_corpus(tmp_path):
    """The identity replay gives back every measured step (step_window) within 2 % (here: exactly)
    on the corpus's multi-step and multi-rank traces."""
    cases = [
        corpus("hta", "tests", "data", "trace_filter"),
        corpus("hta", "tests", "data", "trace_diff", "control"),
        corpus("tracelens", "tests", "traces", "mi300", "resnet_act_checkpoint.json.gz"),
        corpus("tracelens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz"),
        corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite"),
        corpus("nsys", "nsys-ai", "mfu_2gpu_after.sqlite"),
    ]
    for i, p in enumerate(cases):
        lk = Lake(tmp_path / f"l{i}")
        ingest_paths([p], lk)
        con = query.connect(lk)
        (run,) = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM step_window").fetchall()]
        g = build(con, run)
        r = run_replay(g, measured(g))
        m = con.execute("SELECT rank, step, step_ns FROM step_window ORDER BY rank, step").fetchall()
        got = sorted(zip(r.steps["rank"].to_list(), r.steps["step"].to_list(), r.steps["step_ns"].to_list()))
        assert len(got) == len(m) >= 1, p
        for (r0, s0, ns0), (r1, s1, ns1) in zip(got, m):
            assert (r0, s0) == (r1, s1)
            assert abs(ns0 - ns1) <= 0.02 * ns1, (p, r0, s0, ns0, ns1)
        # the critical path of every step adds up to the step time of its last rank
        for step, end_rank, total in (
            r.path.group_by("step", "end_rank").agg(pl.col("dur_ns").sum()).iter_rows()
        ):
            w = r.steps.filter((pl.col("step") == step) & (pl.col("rank") == end_rank))
            assert w["end_ns"][0] == r.steps.filter(pl.col("step") == step)["end_ns"].max()
            assert total == w["step_ns"][0]


def test_dlrm_straggler_replayed(dlrm):
    """Rank 7 arrives last at DLRM's first all-to-all: 7,624 µs after rank 1, 505 µs after the
    second-last (rank 6 at 7,119 µs; collective_ranks.start_ns). With rank 7 on time that call ends
    about 505 µs earlier on every other rank (worked out per rank below); the step gains at most
    what rank 7's late step entry costs (it enters 626 µs after ranks 2 and 6:
    step_window.step_start_ns), far less than the 5.66 ms of waiting the straggler finding used
    to count."""
    run = "dlrm_kineto"
    rows = dlrm.execute(
        "SELECT rank, start_ns, end_ns FROM collective_ranks WHERE run_id = ? AND call_key = 0", [run]
    ).fetchall()
    arr = {r: s for r, s, _ in rows}
    late = arr[7] - max(v for r, v in arr.items() if r != 7)
    assert late == 505_000
    # by hand: without rank 7 the call's last arrival is x1 = rank 6's; each other rank's kernel
    # then ends (its end - the old last arrival) after x1, and never before its own start plus the
    # call's transfer (its shortest kernel, 10 µs: collective_calls.transfer_ns)
    x0, x1 = arr[7], max(v for r, v in arr.items() if r != 7)
    transfer = min(e - s for _, s, e in rows)
    assert transfer == 10_000
    expected = {r: max(x1 + (e - x0), s + transfer) for r, s, e in rows if r != 7}
    assert max(e for r, s, e in rows if r != 7) - max(expected.values()) == late
    g = build(dlrm, run)
    on = run_replay(g, changes.on_time(7).apply(g, measured(g)))
    first = [i for i in range(len(g.g_s)) if g.g_coll[i] >= 0 and g.c_key[g.g_coll[i]][1] == 0]
    assert len(first) == 8
    got = {int(g.g_rank[i]): int(on.timing.g_end[i]) + g.t0 for i in first if g.g_rank[i] != 7}
    assert got == expected
    base = run_replay(g, measured(g))
    gain = base.step_ns() - on.step_ns()
    entry = dict(
        dlrm.execute("SELECT rank, step_start_ns FROM step_window WHERE run_id = ?", [run]).fetchall()
    )
    assert entry[7] - max(entry[2], entry[6]) == 626_000
    assert 0 < gain <= 626_000


def test_nsys_before_after(tmp_path):
    """Replaying nsys-ai's "before" with "after"'s kernel durations: the kernels of the pair take
    the same time (the replay changes the mean step by under 1 %), while "after"'s measured step is
    12 % longer because its host is slower (its host step, step_window.host_step_ns, grew as
    much): what a replay of kernel durations leaves out, and why it misses "after" by 11 %.
    Replaying "before"'s graph with "after"'s kernel and host durations predicts "after"'s measured
    step within 10 % (2.6 % measured): the dependencies of "before" carry over."""
    cons = {}
    for side in ("before", "after"):
        lk = Lake(tmp_path / side)
        ingest_paths([corpus("nsys", "nsys-ai", f"mfu_2gpu_{side}.sqlite")], lk)
        cons[side] = query.connect(lk)
    after = build(cons["after"], "nsys-ai")
    doc = whatif(
        cons["before"], "nsys-ai", [changes.durations_from(after), changes.durations_from(after, host=True)]
    )
    pred = doc["changes"][0]["predicted_step_ns"]
    pred_host = doc["changes"][1]["predicted_step_ns"]
    base = doc["baseline_step_ns"]
    (meas_after, host_after) = (
        cons["after"].execute("SELECT avg(step_ns), avg(host_step_ns) FROM step_window").fetchall()[0]
    )
    (host_before,) = cons["before"].execute("SELECT avg(host_step_ns) FROM step_window").fetchall()[0]
    assert abs(pred - base) / base < 0.01
    miss = (meas_after - pred) / meas_after
    assert 0.09 < miss < 0.13
    # the miss is the host's: "after"'s host step is longer by about what the replay misses
    assert abs((host_after - host_before) - (meas_after - pred)) < 0.05 * meas_after
    assert abs(pred_host - meas_after) / meas_after < 0.10


def test_api_and_sql_views(hand):
    """The Python API returns the CLI's document; `critical_path` and `critical_path_summary` are
    queryable in `tracelake sql` (the hand-made step's path, worked out at the top)."""
    import pipeline

    lk, con, _ = hand
    with pipeline.open_lake(lk.root) as api:
        doc = api.whatif(changes=[changes.scale("kernel:gemm_a=0.5")])
        assert doc == whatif(con, "job", [changes.scale("kernel:gemm_a=0.5")])
        # the CLI's options as text give the CLI's changes (a new user passed '--on-time 7' and got
        # AttributeError); a rank the run lacks, or text that is no option, is a ValueError
        as_text = ["--scale kernel:gemm_a=0.5", "kernel:gemm_a=0.5", "--on-time 0", "--collectives overlap"]
        half = changes.scale("kernel:gemm_a=0.5")
        made = [half, half, changes.on_time(0), changes.collectives_overlapped()]
        assert api.whatif(changes=as_text) == whatif(con, "job", made)
        # one change alone, not in a list, and the shell's --option=value form
        assert api.whatif(changes="--on-time=0") == whatif(con, "job", [changes.on_time(0)])
        for bad, says in (
            ("--on-time 7", "no rank 7"),
            ("--scale", "give one of"),
            ("--on-time x", "'--on-time x'"),
            ("--collectives fast", "'--collectives fast'"),
            ("on_time(7)", "give one of"),
            (7, "not a pipeline.whatif.changes object"),
        ):
            with pytest.raises(ValueError, match=re.escape(says)):
                api.whatif(changes=[bad])
        assert api.critical_path()["dur_ns"].sum() == 1_300_000
    res = CliRunner().invoke(
        app,
        [
            "sql",
            "--lake",
            str(lk.root),
            "SELECT kind, sum(ns)::BIGINT AS ns FROM critical_path_summary GROUP BY kind "
            "ORDER BY ns DESC, kind",
            "-f",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["kind"], r["ns"]) for r in rows] == [
        ("compute", 1_100_000),
        ("communication", 100_000),
        ("host", 80_000),
        ("launch", 10_000),
        ("sync", 10_000),
    ]


def test_analysis_and_report_chart(hand):
    """analyze --json carries the hand-made step's critical path (by kind and rank) and the report
    draws it: one bar, step 1 ending on rank 1, its parts the path worked out at the top."""
    from pipeline.analyze import analyze
    from pipeline.report.charts import critical_path_chart

    lk, _, _ = hand
    doc = analyze(lk)
    rows = [r for r in doc["critical_path"] if r["run_id"] == "job"]
    assert {(r["kind"], r["rank"], r["ns"]) for r in rows} == {
        ("compute", 1, 1_100_000),
        ("communication", 1, 100_000),
        ("host", 1, 80_000),
        ("launch", 1, 10_000),
        ("sync", 1, 10_000),
    }
    (wi,) = doc["whatif"]
    assert (wi["baseline_step_ns"], wi["identity_error_pct"]) == (1_300_000, 0.0)
    chart, note = critical_path_chart(rows)
    assert note is None
    vals = chart.to_dict(validate=False)["data"]["values"]
    assert {v["bar"] for v in vals} == {"step 1 · ends on rank 1"}
    assert {v["part"]: v["ms"] for v in vals if v["ms"]} == {
        "compute": 1.1,
        "communication": 0.1,
        "host": 0.08,
        "launch": 0.01,
        "sync": 0.01,
    }


def test_analyze_leaves_a_large_run_unreplayed(hand, monkeypatch):
    """Past the replay's size limit analyze keeps the additive estimates and says so."""
    from pipeline.analyze import analyze
    from pipeline.whatif import analysis

    lk, _, _ = hand
    monkeypatch.setattr(analysis, "MAX_NODES", 5)  # the hand-made run has 6 activities
    doc = analyze(lk, keep=False)  # computed under the patch, not a kept result
    assert doc["whatif"] == [] and doc["critical_path"] == []
    assert any(
        "the findings' gains are not replayed (6 GPU activities, over the limit of 5" in n
        for n in doc["notes"]
    )
    assert all("replay" not in f for f in doc["findings"])


def test_gpu_only_trace_has_no_host_to_replay(tmp_path):
    """A trace of GPU events only (no host event at all): analyze still works (nothing to replay,
    no steps) and whatif says why in one line."""
    from pipeline.analyze import analyze

    write_trace(tmp_path / "t" / "r0.json", [_gpu("k1", 100, 50, 1), _gpu("k2", 200, 50, 2)])
    lk = Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([tmp_path / "t"], lk)] == ["ok"]
    doc = analyze(lk)
    assert doc["whatif"] == [] and doc["critical_path"] == []
    con = query.connect(lk)
    (run,) = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM gpu_activities").fetchall()]
    g = build(con, run)
    assert len(g.h_s) == 0 and len(g.g_s) == 2
    assert run_replay(g, measured(g)).steps.height == 0
    res = CliRunner().invoke(app, ["whatif", "--lake", str(lk.root)])
    assert res.exit_code == 4 and "no steps to replay" in res.stderr


def test_windowed_replay_equals_rounds_over_every_node(dlrm, tmp_path, monkeypatch):
    """A large run is replayed level by level (replay.levels), or window by window (replay.windows)
    where no levels are found: on PARAM's DLRM job and nsys-ai's "before" export, with each path
    forced, every change gives the same times as the plain rounds over every node until none
    changes (the brute-force reference); every edge of the graph points to the same or a later
    window; and the levels keep their rules (a strictly later level across a cross-stream edge,
    into a collective member, and after a waiting host node)."""
    import importlib

    import numpy as np

    rp = importlib.import_module("pipeline.whatif.replay")
    lk = Lake(tmp_path / "nsys")
    ingest_paths([corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")], lk)
    for con, run in ((dlrm, "dlrm_kineto"), (query.connect(lk), "nsys-ai")):
        g = build(con, run)
        gw, hw = rp.windows(g)
        assert gw.max() > 3  # the steps give windows
        chain_g = np.nonzero(~g.g_first)[0]
        assert (gw[chain_g] >= gw[chain_g - 1]).all()
        chain_h = np.nonzero(~g.h_chain_first)[0]
        assert (hw[chain_h] >= hw[chain_h - 1]).all()
        for src, w_src, w_dst in ((g.g_launch, hw, gw), (g.g_cross, gw, gw), (g.h_dep, gw, hw)):
            has = src >= 0
            assert (w_dst[has] >= w_src[src[has]]).all()
        members = g.g_coll >= 0
        per_call = (
            pl.DataFrame({"c": g.g_coll[members], "w": gw[members]}).group_by("c").agg(pl.col("w").n_unique())
        )
        assert (per_call["w"] == 1).all()
        gl, hl = rp.levels(g)
        assert len(np.unique(gl)) > len(np.unique(gw))  # finer than the windows
        assert (gl[chain_g] >= gl[chain_g - 1]).all() and (hl[chain_h] >= hl[chain_h - 1]).all()
        has = g.g_launch >= 0
        assert (gl[has] >= hl[g.g_launch[has]]).all()
        has = g.g_cross >= 0
        assert (gl[has] > gl[g.g_cross[has]]).all()
        inner = members & ~g.g_first
        assert (gl[inner] > gl[np.nonzero(inner)[0] - 1]).all()
        after = np.nonzero(g.h_dep[:-1] >= 0)[0]
        after = after[~g.h_chain_first[after + 1]]
        assert len(after) and (hl[after + 1] > gl[g.h_dep[after]]).all()
        per_call = (
            pl.DataFrame({"c": g.g_coll[members], "w": gl[members]}).group_by("c").agg(pl.col("w").n_unique())
        )
        assert (per_call["w"] == 1).all()
        wanted = changes.defaults(g) + [
            changes.scale("category:compute=0.5"),
            changes.scale("category:compute=2"),
        ]
        assert len(wanted) >= 4
        # the identity replay of a large run checks a block of ranks at a time: nothing moves
        monkeypatch.setattr(rp, "BLOCK_NODES", 0)
        monkeypatch.setattr(rp, "CHECK_BLOCK_NODES", 1)  # one rank a block
        ident = rp.replay(g, measured(g))
        assert ident.rounds == 1 and np.array_equal(ident.g_end, g.g_e) and np.array_equal(ident.h_end, g.h_e)
        # recorded times that are not the fixed point (a kernel recorded 5 us late): the check
        # copies the recorded times it shares at its first change, then goes by levels, and
        # ends where rounds over every node end; the graph's own times are left as they were
        import dataclasses

        k = int(np.nonzero(~g.g_first & (g.g_launch >= 0))[0][len(g.g_s) // 3])
        late = dataclasses.replace(g, g_s=g.g_s.copy(), g_e=g.g_e.copy(), levels=None, windows=None)
        late.g_s[k] += 5000
        late.g_e[k] += 5000
        kept = late.g_e.copy()
        moved = rp.replay(late, measured(late))
        monkeypatch.setattr(rp, "BLOCK_NODES", 10**12)
        plain = rp.replay(late, measured(late))
        monkeypatch.setattr(rp, "BLOCK_NODES", 0)
        for key in ("g_start", "g_end", "h_start", "h_end", "g_x", "g_last"):
            assert np.array_equal(getattr(plain, key), getattr(moved, key)), (run, key)
        assert moved.rounds > 1 and not np.array_equal(moved.g_end, kept) and np.array_equal(late.g_e, kept)
        for ch in wanted:
            d = ch.apply(g, measured(g))
            monkeypatch.setattr(rp, "BLOCK_NODES", 10**12)
            plain = rp.replay(g, d)
            monkeypatch.setattr(rp, "BLOCK_NODES", 0)
            for path in ("levels", "windows"):
                g.levels = False if path == "windows" else None  # False: no levels, go by windows
                big = rp.replay(g, d)
                for k in ("g_start", "g_end", "h_start", "h_end", "g_x", "g_last"):
                    assert np.array_equal(getattr(plain, k), getattr(big, k)), (run, ch.key, path, k)
            assert plain.rounds > 1  # the change moved something
        # whatif() of a large run finds its levels in a thread beside the identity replay: the
        # same document as the small-run path
        monkeypatch.setattr(rp, "BLOCK_NODES", 10**12)
        small = whatif(con, run, wanted, graph=build(con, run))
        monkeypatch.setattr(rp, "BLOCK_NODES", 0)
        g2 = build(con, run)
        big = whatif(con, run, wanted, graph=g2)
        assert big == small and g2.levels  # levels were found (and used)


def test_large_whatif_raises_what_its_thread_or_identity_raised(dlrm, monkeypatch):
    """whatif() of a large run replays its first change in a thread beside the identity replay:
    an error in a change reaches the caller as itself, and an error before the changes are taken
    (here the identity replay's) ends whatif() promptly."""
    import importlib
    import time

    rp = importlib.import_module("pipeline.whatif.replay")
    face = importlib.import_module("pipeline.whatif.face")
    monkeypatch.setattr(rp, "BLOCK_NODES", 0)  # DLRM counts as large: the threaded path
    g = build(dlrm, "dlrm_kineto")

    def broken(graph, d):
        raise ValueError("broken change")

    wanted = changes.defaults(g) + [changes.Change("broken", "broken", broken)] + changes.defaults(g)
    with pytest.raises(ValueError, match="broken change"):
        whatif(dlrm, "dlrm_kineto", wanted, graph=g)

    def no_identity(*a, **k):
        time.sleep(0.3)  # the thread replays the first change meanwhile
        raise ValueError("identity failed")

    monkeypatch.setattr(face, "_identity", no_identity)
    t = time.perf_counter()
    with pytest.raises(ValueError, match="identity failed"):
        whatif(dlrm, "dlrm_kineto", changes.defaults(g) * 3, graph=build(dlrm, "dlrm_kineto"))
    assert time.perf_counter() - t < 30


def test_launch_lookup_equals_the_join(dlrm, monkeypatch):
    """Each GPU activity's launch is found by a sorted lookup of (rank, correlation) packed in one
    integer; where a value does not fit (a correlation of 2**40 or more) the graph joins on the two
    columns instead. On DLRM both give the same graph, and every launch edge links a call and an
    activity of the same rank and correlation (read back from the lake, not from the graph)."""
    import importlib

    import numpy as np

    gr = importlib.import_module("pipeline.whatif.rows")
    setting = "SELECT current_setting('memory_limit')"
    cap = dlrm.execute(setting).fetchall()
    packed = build(dlrm, "dlrm_kineto")
    assert dlrm.execute(setting).fetchall() == cap  # the reads ran uncapped; the cap is back
    monkeypatch.setattr(gr, "_keys", lambda *a: None)
    joined = build(dlrm, "dlrm_kineto")
    for k in ("g_launch", "h_what", "h_s", "h_dep", "g_s", "g_cross", "g_coll"):
        assert np.array_equal(getattr(packed, k), getattr(joined, k)), k
    has = packed.g_launch >= 0
    assert has.sum() > 2000  # DLRM's 2,244 activities, nearly all launched from the host
    # (rank, start) of the call and of its activity, relative to t0 -> the lake's rows
    calls = dlrm.execute(
        "SELECT rank, start_ns, correlation FROM cpu_ops WHERE run_id = 'dlrm_kineto' AND kind = 'runtime'"
    ).fetchall()
    by_start = {(r, s - packed.t0): c for r, s, c in calls}
    acts = dlrm.execute(
        "SELECT rank, start_ns, correlation FROM gpu_activities "
        "WHERE run_id = 'dlrm_kineto' AND kind <> 'sync'"
    ).fetchall()
    act_corr = {(r, s - packed.t0): c for r, s, c in acts}
    gi = np.nonzero(has)[0]
    hi = packed.g_launch[gi]
    for g_i, h_i in zip(gi[::50], hi[::50]):
        r = int(packed.g_rank[g_i])
        assert packed.h_rank[h_i] == r
        assert by_start[(r, int(packed.h_s[h_i]))] == act_corr[(r, int(packed.g_s[g_i]))]


def test_packed_order_equals_lexsort(dlrm, monkeypatch):
    """The chains are ordered by one stable argsort of the sort columns packed in an int64, the
    rows that tie on them by the tie-breakers (rows._order); np.lexsort of every column (what
    _order falls back to where the packed columns do not fit in 63 bits) gives the same graph on
    DLRM, and on random columns with many ties the same order."""
    import importlib

    import numpy as np

    gr = importlib.import_module("pipeline.whatif.rows")
    rng = np.random.default_rng(7)
    a, b, c = (rng.integers(lo, hi, 5000) for lo, hi in ((-3, 4), (0, 50), (10**12, 10**12 + 40)))
    d = rng.integers(0, 3, 5000)
    assert np.array_equal(gr._order([a, b, c], [d, -c]), np.lexsort((-c, d, c, b, a)))
    assert np.array_equal(gr._order([a, b], []), np.lexsort((b, a)))
    packed = build(dlrm, "dlrm_kineto")
    monkeypatch.setattr(
        gr, "_order", lambda parts, ties: np.lexsort(tuple(reversed(ties)) + tuple(reversed(parts)))
    )
    lex = build(dlrm, "dlrm_kineto")
    for k, v in vars(lex).items():
        if isinstance(v, np.ndarray):
            assert np.array_equal(getattr(packed, k), v), k
    assert packed.frame.equals(lex.frame) and packed.h_name.equals(lex.h_name)


def test_last_work_of_each_step_by_brute_force():
    """Each step end mark's last-ending GPU work of its rank and step (sync._last_work; the
    latest-placed of those that end together), by the small (rank, step) index and by the
    group_by used where that index would be large, against a loop over every row."""
    import importlib

    import numpy as np

    gr = importlib.import_module("pipeline.whatif.sync")
    rng = np.random.default_rng(3)
    for rank_scale in (1, 10**6):  # ranks 0..3, or far apart (the group_by path)
        n = 400
        g_rank = rng.integers(0, 4, n) * rank_scale
        g_step = rng.integers(-1, 6, n)
        g_e = rng.integers(0, 30, n)  # many ends tie
        ends = np.arange(0, 40, 2)
        e_rank = rng.integers(0, 5, len(ends)) * rank_scale  # rank 4: no work
        e_step = rng.integers(0, 7, len(ends))  # step 6: no work
        hi, gi, ge = gr._last_work(ends, e_rank, e_step, g_rank, g_step, g_e)
        got = {int(h): (int(a), int(b)) for h, a, b in zip(hi, gi, ge)}
        want = {}
        for h, r, st in zip(ends, e_rank, e_step):
            rows = [i for i in range(n) if g_rank[i] == r and g_step[i] == st]
            if rows:
                top = max(g_e[i] for i in rows)
                want[int(h)] = (max(i for i in rows if g_e[i] == top), int(top))
        assert got == want and len(want) > 5


def test_kinds_without_the_replay():
    """The report reads the critical path's segment kinds without importing the replay's polars
    or DuckDB (a fresh interpreter; the package loads its rooms on first use)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom pipeline.whatif import KINDS\n"
        "print(len(KINDS), 'polars' in sys.modules, 'duckdb' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["12", "False", "False", "False"]


def test_launch_is_the_first_call_of_its_key_in_chain_order():
    """rows.host_rows links the calls to their GPU rows on the host rows' first order (in a thread
    beside the chain order); a GPU row's launch is the first call of its (rank, correlation) in
    chain order even where the file lists the later call first. Hand-made rows, expected launches
    written by hand; the join on the two columns (where keys do not fit) gives the same."""
    import importlib

    import numpy as np

    rows = importlib.import_module("pipeline.whatif.rows")
    # first order as a query may return it: rank 1's rows first, and for (0, 7) the call at 50
    # before the call at 20 (both launched it); (0, 9) is a call nothing on the GPU has
    host = pl.DataFrame(
        {
            "rank": [1, 0, 0, 0, 0, 1, 0],
            "what": pl.Series([0, 0, 0, 0, 2, 0, 3], dtype=pl.Int8),
            "name": ["cudaLaunchKernel"] * 4 + ["1", "cudaLaunchKernel", "1"],
            "start_ns": [15, 50, 20, 30, 10, 40, 90],
            "end_ns": [18, 55, 25, 35, 10, 45, 90],
            "correlation": [7, 7, 7, 9, None, 8, None],
            "step": [None, None, None, None, 1, None, 1],
        }
    )
    host = host.with_columns(pl.col("name").cast(pl.Enum(sorted(set(host["name"])))))
    g_rank = np.array([0, 1, 1], dtype=np.int64)
    g_corr = np.array([7, 8, 7], dtype=np.int64)
    # kept, chain order: rank 0: step mark 10, call 20 (corr 7), call 50 (corr 7), end mark 90;
    # rank 1: call 15 (corr 7), call 40 (corr 8). The call at 30 (corr 9) launched nothing.
    want_s = [10, 20, 50, 90, 15, 40]
    want_launch = [1, 5, 4]  # (0, 7) -> the call at 20; (1, 8) -> 40; (1, 7) -> 15
    got = rows.host_rows([host.clone()], 0, ["cudaDeviceSynchronize"], g_rank, g_corr)
    assert got.s.tolist() == want_s
    assert got.g_launch0.tolist() == want_launch
    assert got.what.tolist() == [
        rows.STEP_START,
        rows.LAUNCH,
        rows.LAUNCH,
        rows.STEP_END,
        rows.LAUNCH,
        rows.LAUNCH,
    ]
    joined = rows._join_index(got.rank, got.corr, got.what == rows.LAUNCH, g_rank, g_corr)
    assert joined.tolist() == want_launch
