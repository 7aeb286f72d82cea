"""`tracelake diff` and its gate (pipeline/diagnosis/diff.py): a hand-made regression whose numbers
are worked out by hand, a self-diff, PARAM's DLRM with one rank's compute slowed by
tests/slow_rank.py (the waiting it causes replayed through the collectives), two different
models, and nsys-ai's real before/after pair, against what the files themselves say."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CORPUS, corpus
from nsys_handmade import MS, export

from pipeline.analyze import analyze
from pipeline.diagnosis.diff import diff
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

DLRM = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
NSYS_AI = CORPUS / "nsys" / "nsys-ai"
ROOT = Path(__file__).resolve().parent.parent


def _cli(*args) -> subprocess.CompletedProcess:
    """`tracelake diff ARGS -q` in this process (typer's runner: the command's exit code, standard
    output and error apart); test_a_cancelled_diff_leaves_no_temporary_lake runs a real process."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    r = CliRunner().invoke(app, ["diff", *map(str, args), "-q"])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def _idle(k: int) -> int:
    return 2 * MS + (k % 2) * 20_000  # 2.00 / 2.02 ms of data loading, alternating


@pytest.fixture(scope="module")
def loop_pair(tmp_path_factory):
    """A GPU-bound loop of 6 iterations (5 complete steps): baseline with kernel C of 1 ms, the
    candidate with C of 2 ms."""
    d = tmp_path_factory.mktemp("loop")
    base, cand = d / "base.sqlite", d / "cand.sqlite"
    export(base, 6, period_ns=None, idle_ns=_idle)
    export(cand, 6, period_ns=None, idle_ns=_idle, dur_ns={"C": 2 * MS})
    return base, cand


def test_handmade_regression_numbers_by_hand(loop_pair, tmp_path):
    """Step k runs from the launch of A_k to that of A_{k+1}: its kernels (A B C B D: 4 ms + C) and
    the next iteration's data loading, idle(k+1) for k = 0..4 = 2.02, 2.00, 2.02, 2.00, 2.02 ms.
    Baseline mean 5 + 2.012 = 7.012 ms, candidate 8.012 ms: +1.000 ms (+14.26 %), all of it compute.
    Welch by hand: both sides' steps deviate from their mean by +8, -12, +8, -12, +8 us, so
    s^2 = (3 * 64 + 2 * 144) / 4 = 120 us^2, se = sqrt(2 * 120 / 5) = 6.928 us, df = 2 * (5 - 1) = 8,
    t(0.975, 8) = 2.306: the interval is 1000 +- 15.98 us."""
    docs = []
    for f in loop_pair:
        lake = Lake(tmp_path / f.stem)
        assert ingest_paths([f], lake)[0].status == "ok"
        docs.append(analyze(lake, top_n=None))
    (b, bid), (c, cid) = [(d, d["runs"][0]["run_id"]) for d in docs]
    d = diff(b, bid, c, cid, fail_on_regression_pct=10.0)
    st = d["step_time"]
    assert st["baseline_ns"] == pytest.approx(7.012 * MS) and st["candidate_ns"] == pytest.approx(8.012 * MS)
    assert st["change_ns"] == pytest.approx(1.000 * MS)
    assert st["change_pct"] == pytest.approx(100 / 7.012)
    half = 2.306 * math.sqrt(2 * 120e6 / 5)
    assert st["ci_low_ns"] == pytest.approx(1.000 * MS - half) and st["ci_high_ns"] == pytest.approx(
        MS + half
    )
    assert st["df"] == pytest.approx(8) and st["samples"] == [5, 5]
    assert d["verdict"] == "regression" and d["comparability"]["comparable"]
    comps = {x["key"]: x["delta_ns"] for x in d["components"]}
    assert comps["compute"] == pytest.approx(MS)
    assert sum(comps.values()) == pytest.approx(st["change_ns"])  # the components add up to the change
    assert all(v == pytest.approx(0) for k, v in comps.items() if k != "compute")
    assert d["kernels"][0]["name"] == "C" and d["kernels"][0]["delta_ns"] == pytest.approx(MS)
    assert d["gate"]["failed"] and d["exit_code"] == 1


def test_gate_exit_codes_and_formats(loop_pair, tmp_path):
    base, cand = loop_pair
    r = _cli(base, cand, "--fail-on-regression", "10")
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith("REGRESSION") and "gate FAILED: step time +14.3 % (at least 10 %)" in r.stdout
    assert _cli(base, cand, "--fail-on-regression", "20").returncode == 0  # +14.3 % is under 20 %
    assert _cli(base, cand, "--fail-on", "compute=10").returncode == 1  # compute grew 14.3 % of the step
    assert _cli(base, cand, "--fail-on", "host_idle=1").returncode == 0
    bad = _cli(base, cand, "--fail-on", "network=1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "COMPONENT=PCT" in bad.stderr
    js = _cli(base, cand, "--format", "json", "--fail-on-regression", "10")
    doc = json.loads(js.stdout)
    assert doc["schema"] == "tracelake.diff/1" and doc["exit_code"] == js.returncode == 1
    md = tmp_path / "comment.md"
    assert _cli(base, cand, "--format", "md", "-o", md).returncode == 0
    text = md.read_text()
    assert (
        text.startswith("### tracelake diff: **regression**")
        and "| step time | 7.012 | 8.012 | +1.000 |" in text
    )
    # the candidate against itself: no change; a missing side is a usage error
    same = _cli(cand, cand, "--fail-on-regression", "0")
    assert same.returncode == 0 and same.stdout.startswith("NO CHANGE")
    missing = _cli(base, tmp_path / "nope")
    assert missing.returncode == 2 and "nope: no such file or directory" in missing.stderr


@pytest.fixture(scope="module")
def dlrm_pair(tmp_path_factory):
    """PARAM's DLRM job (8 ranks, one profiled step) and a copy with rank 3's compute kernels 10x
    longer (tests/slow_rank.py)."""
    d = tmp_path_factory.mktemp("dlrm")
    slow = d / "slow_rank3"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "slow_rank.py"),
            str(DLRM),
            str(slow),
            "--rank",
            "3",
            "--factor",
            "10",
        ],
        check=True,
    )
    lakes = []
    for name, src in (("base", DLRM), ("slow", slow)):
        lake = Lake(d / name)
        assert {r.status for r in ingest_paths([src], lake)} == {"ok"}
        lakes.append(lake)
    return lakes, slow


def _last_into_calls(trace_dir: Path) -> dict[int, int]:
    """From the raw JSON: for each NCCL kernel call k (the k-th NCCL kernel of every rank), the
    rank whose kernel starts last; rank -> number of calls it was last into."""
    starts = {}
    for f in sorted(trace_dir.glob("*.json")):
        doc = json.loads(f.read_bytes())
        starts[doc["distributedInfo"]["rank"]] = [
            e["ts"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()
        ]
    counts: dict[int, int] = {}
    for k in range(len(starts[0])):
        last = max(starts, key=lambda r: starts[r][k])
        counts[last] = counts.get(last, 0) + 1
    return counts


def test_self_diff_is_no_change(dlrm_pair):
    (base, _), _ = dlrm_pair
    doc = analyze(base, top_n=None)
    rid = doc["runs"][0]["run_id"]
    d = diff(doc, rid, doc, rid, fail_on_regression_pct=0.0)
    assert d["verdict"] == "no change" and d["exit_code"] == 0
    assert d["step_time"]["change_ns"] == 0 and d["step_time"]["ci_low_ns"] == -d["step_time"]["ci_high_ns"]
    # one profiled step per rank: the samples are the 8 (rank, step) rows, and the document says so
    assert d["baseline"]["unit"] == "rank and step" and d["step_time"]["samples"] == [8, 8]


def test_dlrm_with_one_rank_slowed_is_a_regression_of_waiting_for_that_rank(dlrm_pair):
    (base, slow), slow_dir = dlrm_pair
    b, c = analyze(base, top_n=None), analyze(slow, top_n=None)
    d = diff(b, b["runs"][0]["run_id"], c, c["runs"][0]["run_id"], fail_on={"peer_wait": 20.0})
    assert d["verdict"] == "regression"
    # who waited for whom, from the raw events of the slowed copy: rank 3 starts last into most calls
    last = _last_into_calls(slow_dir)
    assert max(last, key=last.get) == 3
    assert d["who_waited_for"]["rank"] == 3 and d["who_waited_for"]["times_last"] == last[3]
    # in the original, rank 7 was the late one (test_dlrm_verdict): the slowing made rank 3 late
    assert max(_last_into_calls(DLRM).items(), key=lambda kv: kv[1])[0] == 7
    comps = {x["key"]: x["delta_ns"] for x in d["components"]}
    assert max(comps, key=comps.get) == "peer_wait"
    assert sum(comps.values()) == pytest.approx(d["step_time"]["change_ns"])
    assert d["gate"]["failed"] and d["gate"]["reasons"][0].startswith("waiting for peers +")


def test_ops_that_moved_are_the_launching_ops(dlrm_pair):
    """The slowed copy's communication kernels are launched inside record_param_comms (PyTorch's
    c10d op; the raw JSON nests each NCCL launch in it): the op whose GPU time grew most, by as
    much as the NCCL kernels did."""
    from pipeline import query

    (base, slow), _ = dlrm_pair
    b, c = analyze(base, top_n=None), analyze(slow, top_n=None)
    rows = [query.run(query.connect(lake), "step_ops").to_dicts() for lake in (base, slow)]
    d = diff(b, b["runs"][0]["run_id"], c, c["runs"][0]["run_id"], ops=(rows[0], rows[1]))
    assert d["ops"][0]["op"] == "record_param_comms"
    nccl = sum(k["delta_ns"] for k in d["kernels"] if k["category"] == "communication")
    assert d["ops"][0]["delta_ns"] == pytest.approx(nccl, rel=0.01)


def test_two_models_are_not_comparable(loop_pair, tmp_path):
    """The hand-made loop (kernels A-D) against nsightful's CuPy power iteration: one rank each, no
    kernel name in common: not comparable, exit 5, and the reason says so."""
    r = _cli(loop_pair[0], CORPUS / "nsys" / "nsightful" / "power_iteration__baseline.sqlite")
    assert r.returncode == 5, r.stderr
    assert r.stdout.startswith("NOT COMPARABLE") and "different kernel mix: 0.0 %" in r.stdout
    # its steps are nsightful's own 'Step N to M' ranges, the loop's a kernel period: said too
    assert "steps defined differently: 'kernel period ##' (kernel_period) against 'Step # to #'" in r.stdout


def test_nsys_ai_pair_per_block_and_why_nsys_ai_reads_an_improvement(tmp_path):
    """nsys-ai's before/after pair, compared per step (one transformer block of 119 kernels: the
    exports' steps, tests/test_nsys_steps.py). Its kernels did not change (flash_fwd_kernel 4.0 ms
    on both sides, PROVENANCE's counts 68 -> 60 over both GPUs are 17 -> 15 blocks per window) while
    the GPU waits more for the host: per block a regression, mostly host-bound idle.
    nsys-ai's "iteration 0: 482.87 -> 340.77 ms (-29.4 %)" is its gap heuristic (no 'sample_0'
    marker: the first kernel gap over 2 ms on GPU 0, nsys_ai/overlap.py detect_iterations): worked
    out here from the files, that window holds 14 blocks before and 9 after, so it compares
    different amounts of work (docs/usage.md)."""
    r = _cli(NSYS_AI / "mfu_2gpu_before.sqlite", NSYS_AI / "mfu_2gpu_after.sqlite", "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["verdict"] == "regression" and d["comparability"]["shared_kernel_pct"] == [100.0, 100.0]
    comps = {x["key"]: x["delta_ns"] for x in d["components"]}
    assert max(comps, key=lambda k: abs(comps[k])) == "host_idle"
    # the same kernel time per block: compute moved by under 1 %, no kernel by 0.4 ms
    compute = next(x for x in d["components"] if x["key"] == "compute")
    assert abs(compute["delta_ns"]) < 0.01 * compute["baseline_ns"]
    assert all(abs(k["delta_ns"]) < 0.4 * 1e6 for k in d["kernels"])
    blocks = {}
    for side in ("before", "after"):
        c = sqlite3.connect(f"file:{NSYS_AI / f'mfu_2gpu_{side}.sqlite'}?mode=ro&immutable=1", uri=True)
        ks = c.execute(
            'SELECT k.start, k."end", s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s '
            "ON s.id = k.shortName WHERE deviceId = 0 ORDER BY k.start"
        ).fetchall()
        last, cut = ks[0][1], None
        for s, e, _ in ks[1:]:
            if s - last > 2_000_000:
                cut = last
                break
            last = max(last, e)
        blocks[side] = sum(1 for s, _, n in ks if n.startswith("nvjet_tst_192x208") and s < cut)
    assert blocks == {"before": 14, "after": 9}


def test_what_a_ci_user_gets_wrong_is_said_in_one_line(loop_pair, tmp_path):
    """A bad --step-range is a usage error (exit 2, not the gate's 1); an empty directory says so;
    --fail-on COMPONENT=0 does not fail a component that did not grow; two exports of one
    directory are named by their files."""
    base, cand = loop_pair
    bad = _cli(base, cand, "--step-range", "(")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--step-range '('" in bad.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _cli(empty, cand)
    assert r.returncode == 2 and "no trace, export or NCCL log found there" in r.stderr
    assert _cli(cand, cand, "--fail-on", "compute=0", "--fail-on", "input_idle=0").returncode == 0
    r = _cli(base, cand)
    assert r.stdout.startswith("REGRESSION: cand.sqlite against base.sqlite")
    assert "5 sample(s) from 5 steps (0 to 4) against 5 from 5 steps (0 to 4)" in r.stdout


def test_steps_defined_differently_are_not_comparable(tmp_path):
    """nsightful's power iteration ingested twice: steps from its 'Step N to M' ranges and from its
    'Compute & Residual N' ranges. The same data, but a step of one is not a step of the other: not
    comparable (it read as a 41.6 % improvement before this check)."""
    f = CORPUS / "nsys" / "nsightful" / "power_iteration__baseline.sqlite"
    lakes = []
    for name, rx in (("steps", r"^Step \d+ to \d+$"), ("compute", r"^Compute & Residual \d+$")):
        lake = Lake(tmp_path / name)
        assert ingest_paths([f], lake, step_regex=rx)[0].status == "ok"
        lakes.append(lake.root)
    r = _cli(*lakes)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "steps defined differently: 'Step # to #' (nvtx) against 'Compute & Residual #' (nvtx)" in r.stdout


def test_a_recurring_stall_is_a_regression_and_said_so(tmp_path):
    """22 iterations of the GPU-bound loop; in the candidate every 4th waits 30 ms more for data.
    The verdict leaves those steps out as outliers (over 3x the median), but a gate must see them:
    the candidate's mean step is (4 x 7.012 + 30 + ...) / 4 by hand, far above the baseline's."""
    base, cand = tmp_path / "base.sqlite", tmp_path / "stall.sqlite"
    export(base, 22, period_ns=None, idle_ns=_idle)
    export(cand, 22, period_ns=None, idle_ns=lambda k: _idle(k) + (30 * MS if k % 4 == 0 else 0))
    r = _cli(base, cand, "--format", "json", "--fail-on-regression", "5")
    d = json.loads(r.stdout)
    assert d["verdict"] == "regression" and r.returncode == 1
    # step k holds idle(k + 1): the steps ending before iterations 4, 8, ..., 20 hold the stall
    stalled = [k for k in range(21) if (k + 1) % 4 == 0]
    assert len(stalled) == 5 and d["step_time"]["change_ns"] == pytest.approx(5 * 30 * MS / 21)
    assert any("5 slow step(s)" in w for w in d["comparability"]["warnings"])


def test_an_iteration_against_a_layer_is_not_comparable(tmp_path):
    """Both sides' steps are 'train_step N' ranges, but the candidate's wrap three iterations: 15
    GPU activities per step against 5."""

    def ranges(every: int) -> list[tuple[int, int, str]]:
        return [(k * 10 * MS + 1, (k + every) * 10 * MS, f"train_step {k}") for k in range(0, 12, every)]

    base, cand = tmp_path / "one.sqlite", tmp_path / "three.sqlite"
    export(base, 12, nvtx=ranges(1))
    export(cand, 12, nvtx=ranges(3))
    r = _cli(base, cand)
    assert (
        r.returncode == 5 and "steps hold different amounts of work: 5 against 15 GPU activities" in r.stdout
    )


def test_bad_arguments_and_odd_sides(loop_pair, tmp_path):
    base, cand = loop_pair
    assert _cli("", cand).returncode == 2  # an empty argument is not the current directory
    for bad in (("--fail-on-regression", "inf"), ("--min-change", "inf"), ("--fail-on", "compute=inf")):
        r = _cli(base, cand, *bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, bad
    assert _cli(base, cand, "--min-change", "nan").returncode == 2  # click's own check
    r = _cli(base, cand, "--fail-on", "compute=5", "--fail-on", "compute=100")
    assert r.returncode == 2 and "given twice" in r.stderr
    # -o onto an input is refused before any work, and the input is left as it was
    before = base.read_bytes()
    r = _cli(base, cand, "-o", base)
    assert r.returncode == 2 and "is one of the inputs" in r.stderr and base.read_bytes() == before
    # a CPU-only trace has nothing to compare: not comparable, exit 5
    cpu = next((CORPUS / "hta" / "tests" / "data" / "cpu_only").rglob("*.json*"))
    assert _cli(cpu, cand).returncode == 5
    # one lake of two runs, the candidate's not named: asked for, not a run against itself
    lake = Lake(tmp_path / "two")
    ingest_paths([base], lake, run="a")
    ingest_paths([cand], lake, run="b")
    r = _cli(lake.root, lake.root, "--baseline-run", "a")
    assert r.returncode == 2 and "--candidate-run" in r.stderr


def test_a_cancelled_diff_leaves_no_temporary_lake(tmp_path):
    """CI cancels a job with SIGTERM: the temporary lakes are removed all the same."""
    import os
    import signal
    import time

    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "diff", str(DLRM), str(DLRM), "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob("tracelake-diff-*")):
        time.sleep(0.05)
    assert list(tmp_path.glob("tracelake-diff-*")), "the diff made no temporary lake"
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    assert rc in (143, 0) and not list(tmp_path.glob("tracelake-diff-*"))


def test_nvtx_times_out_of_range_are_ignored(tmp_path):
    """A damaged export: one NVTX range starting at -2^63, beside a session start time; the range
    is passed over (times are ns since the session), ingest and analyze go on."""
    f = tmp_path / "neg.sqlite"
    export(f, 6, nvtx=[(-(2**63), 5 * MS, "train_step 0")])
    c = sqlite3.connect(f)
    c.executescript(
        "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT, utcTime TEXT, localTime TEXT);"
        "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '');"
    )
    c.commit()
    c.close()
    lake = Lake(tmp_path / "lake")
    assert ingest_paths([f], lake)[0].status == "ok"
    doc = analyze(lake)
    assert doc["runs"][0]["steps_found_by"] == ["kernel_period"]


def test_a_diff_of_two_runs_of_a_lake_analyses_only_them_and_reads_kept_results(tmp_path, monkeypatch):
    """`tracelake diff RUN_A RUN_B --lake L` on a lake of three runs (nsys-ai's pair and PARAM's
    DLRM) analyses the two runs named, not the third; and once `tracelake analyze` has kept every
    run's result, the same diff computes nothing and prints the same comparison (it used to
    analyse the whole lake, with options no other command kept results under: 36 s on a lake of
    36 runs, found by a new user)."""
    from typer.testing import CliRunner

    import pipeline.analyze_compute as ac
    from pipeline.cli import app

    lake = tmp_path / "lake"
    ingest_paths([NSYS_AI], Lake(lake), jobs=1)
    ingest_paths([DLRM], Lake(lake), jobs=1)
    runs = sorted(set(Lake(lake).sources()["run_id"].to_list()))
    pair = sorted(r for r in runs if r.startswith("nsys-ai"))
    assert len(runs) == 3 and len(pair) == 2, runs
    computed: list = []
    real = ac.compute

    def counting(lake_, runs=None, **kw):
        computed.append(sorted(runs) if runs is not None else "every run")
        return real(lake_, runs=runs, **kw)

    monkeypatch.setattr(ac, "compute", counting)
    first = _cli(pair[0], pair[1], "--lake", lake, "--format", "json")
    assert first.returncode == 0, first.stderr
    assert computed == [pair]  # the two runs named, not DLRM's
    assert CliRunner().invoke(app, ["analyze", "--lake", str(lake), "-q"]).exit_code == 0
    computed.clear()
    again = _cli(pair[0], pair[1], "--lake", lake, "--format", "json")
    assert again.returncode == 0 and computed == []  # every result read back
    assert json.loads(again.stdout) == json.loads(first.stdout)
