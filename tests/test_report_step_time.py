"""queries/step_time.sql and queries/idle_gaps.sql against brute-force references.

- A property test walks every nanosecond of small random traces (host steps, launches, GPU work
  of every category, graph replays, DataLoader fetches) with the rules written out plainly in
  Python: torch-tb-profiler's step-window loop (event_parser.py _update_steps_duration), the
  priority compute > communication > memory > unknown > idle, and the idle causes.
- On real corpus traces (tb_plugin's resnet50 with num_workers=0, the 2-rank sample traces), the
  same quantities by interval arithmetic over the lake's rows.
"""

from __future__ import annotations

import tempfile

import polars as pl
import pytest
from conftest import REPO, corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect, run

CATS = ["compute", "communication", "memory", "unknown"]
KIND = {"compute": "kernel", "communication": "kernel", "memory": "memcpy", "unknown": "unknown"}
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
THRESHOLD = 5  # kernel-wait threshold (ns) for the random traces

activity = st.tuples(
    st.integers(0, 100),
    st.integers(1, 15),
    st.sampled_from(CATS),
    st.one_of(st.none(), st.integers(0, 100)),
    st.booleans(),
)
step = st.tuples(st.integers(0, 10), st.integers(1, 40))


def tb_windows(steps, act_end_by_step):
    """torch-tb-profiler's loop: start = max(previous end, host start); end = max(host end, end of
    the GPU work launched in the step), never before the start."""
    out, prev = [], steps[0][1] if steps else None
    for num, hs, he in steps:
        s = max(prev, hs)
        e = max(he, act_end_by_step.get(num, he))
        e = max(e, s)
        out.append((num, s, e))
        prev = e
    return out


def brute(steps, acts, loaders, threshold):
    """steps: [(num, host_start, host_end)]; acts: [dict(start, end, cat, launch, graph)]."""

    def step_of(launch):
        if launch is None:
            return None
        cand = [(hs, num, he) for num, hs, he in steps if hs <= launch]
        if not cand:
            return None
        hs, num, he = max(cand)
        return num if launch < he else None

    ends: dict[int, int] = {}
    for a in acts:
        k = step_of(a["launch"])
        if k is not None:
            ends[k] = max(ends.get(k, a["end"]), a["end"])
    wins = tb_windows(steps, ends)
    r0, r1 = min(w[1] for w in wins), max(w[2] for w in wins)
    kept = [a for a in acts if a["end"] > r0 and a["start"] < r1]
    rows = {}
    for num, ws, we in wins:
        r = dict.fromkeys(
            [
                "compute",
                "comm",
                "overlap",
                "exposed_comm",
                "memory",
                "exposed_memory",
                "exposed_unknown",
                "idle",
                "input",
                "host_wait",
                "kernel_wait",
                "other",
                "unreliable",
            ],
            0,
        )
        for t in range(ws, we):
            active = {a["cat"] for a in kept if a["start"] <= t < a["end"]}
            r["comm"] += "communication" in active
            r["memory"] += "memory" in active
            r["overlap"] += "compute" in active and "communication" in active
            if "compute" in active:
                r["compute"] += 1
            elif "communication" in active:
                r["exposed_comm"] += 1
            elif "memory" in active:
                r["exposed_memory"] += 1
            elif "unknown" in active:
                r["exposed_unknown"] += 1
            else:
                r["idle"] += 1
                if any(a <= t < b for a, b in loaders):
                    r["input"] += 1
                    continue
                g0 = max([a["end"] for a in kept if a["end"] <= t] + [r0])
                later = [a["start"] for a in kept if a["start"] > t]
                g1 = min(later) if later else None
                if g1 is None:
                    r["host_wait"] += 1  # nothing more launched before the windows end
                    continue
                starting = [a for a in kept if a["start"] == g1]
                if any(a["graph"] for a in starting):
                    r["unreliable"] += 1
                elif (
                    all(a["launch"] is not None for a in starting) and min(a["launch"] for a in starting) > g0
                ):
                    r["host_wait"] += 1
                elif g1 - g0 < threshold:
                    r["kernel_wait"] += 1
                else:
                    r["other"] += 1
        rows[num] = (ws, we, r)
    return rows


def make_acts(raw):
    """Random activities: a flagged one shares the launch (correlation) of the one before it, as the
    kernels of one CUDA graph replay do; graph_replay marks kernels whose correlation is shared
    (pipeline/derive.py), and every activity of a correlation has that correlation's launch."""
    acts = []
    for i, (s, d, c, launch, share) in enumerate(raw):
        corr = acts[-1]["corr"] if share and i > 0 else i + 1
        acts.append({"start": s, "end": s + d, "cat": c, "launch": launch, "corr": corr})
    first_launch = {}
    for a in acts:
        first_launch.setdefault(a["corr"], a["launch"])
    count = {}
    for a in acts:
        count[a["corr"]] = count.get(a["corr"], 0) + 1
    for a in acts:
        a["launch"] = first_launch[a["corr"]]
        a["graph"] = count[a["corr"]] > 1 and KIND[a["cat"]] == "kernel"
    return acts


def _source_row(sid="s"):
    return {
        "source_id": sid,
        "run_id": "r",
        "path": "/x",
        "format": "kineto_json",
        "content_sha256": "0",
        "size_bytes": 0,
        "status": "ok",
        "schema_version": 1,
        "tracelake_version": "t",
        "ingested_at_ns": 0,
    }


def write_lake(root, steps, acts, loaders, shifts=(0,)) -> Lake:
    """acts: [dict(start, end, cat, launch, graph, corr)] as made by make_acts. shifts: one rank per
    entry (rank k, source s<k>), its times shifted by shifts[k] ns."""
    lake = Lake(root)
    lake.ensure()
    for rank, dt in enumerate(shifts):
        _write_rank(lake, rank, f"s{rank}" if rank else "s", steps, acts, loaders, dt)
    return lake


def _write_rank(lake, rank, sid, steps, acts, loaders, dt):
    acts = [
        {
            **a,
            "start": a["start"] + dt,
            "end": a["end"] + dt,
            "launch": None if a["launch"] is None else a["launch"] + dt,
        }
        for a in acts
    ]
    steps = [(k, a + dt, b + dt) for k, a, b in steps]
    loaders = [(a + dt, b + dt) for a, b in loaders]
    n = len(acts)
    gpu = {
        "run_id": ["r"] * n,
        "source_id": [sid] * n,
        "rank": [rank] * n,
        "device": [0] * n,
        "stream": [7] * n,
        "kind": [KIND[a["cat"]] for a in acts],
        "category": [a["cat"] for a in acts],
        "classified_by": ["default"] * n,
        "name": ["k"] * n,
        "start_ns": [a["start"] for a in acts],
        "end_ns": [a["end"] for a in acts],
        "dur_ns": [a["end"] - a["start"] for a in acts],
        "event_index": list(range(n)),
        "correlation": [a["corr"] for a in acts],
    }
    launches = {a["corr"]: a["launch"] for a in acts if a["launch"] is not None}
    ops = [("runtime", "cudaLaunchKernel", t, t + 1, c) for c, t in launches.items()] + [
        ("op", LOADER, a, b, None) for a, b in loaders
    ]
    cpu = {
        "run_id": ["r"] * len(ops),
        "source_id": [sid] * len(ops),
        "rank": [rank] * len(ops),
        "kind": [o[0] for o in ops],
        "name": [o[1] for o in ops],
        "start_ns": [o[2] for o in ops],
        "end_ns": [o[3] for o in ops],
        "dur_ns": [o[3] - o[2] for o in ops],
        "correlation": [o[4] for o in ops],
        "event_index": list(range(len(ops))),
    }
    stp = {
        "run_id": ["r"] * len(steps),
        "source_id": [sid] * len(steps),
        "rank": [rank] * len(steps),
        "step": [s[0] for s in steps],
        "name": [f"ProfilerStep#{s[0]}" for s in steps],
        "start_ns": [s[1] for s in steps],
        "end_ns": [s[2] for s in steps],
        "dur_ns": [s[2] - s[1] for s in steps],
        "source": ["profiler_step"] * len(steps),
    }
    lake.write_source("r", sid, {"gpu_activities": gpu, "cpu_ops": cpu, "steps": stp}, _source_row(sid))


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(activity, min_size=1, max_size=10),
    st.lists(step, min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(0, 100), st.integers(1, 30)), max_size=2),
    st.integers(-150, 150),
    st.booleans(),
)
def test_step_time_matches_brute_force(raw_acts, raw_steps, raw_loaders, shift, materialize):
    """Two ranks with the same trace, the second shifted in time (before, overlapping or after
    the first: the sweep runs over all ranks in one sort), on plain and materialized views."""
    acts = make_acts(raw_acts)
    steps, t = [], 0
    for k, (gap, dur) in enumerate(raw_steps):
        steps.append((k + 1, t + gap, t + gap + dur))
        t += gap + dur
    loaders = [(a, a + d) for a, d in raw_loaders]
    with tempfile.TemporaryDirectory() as d:
        lake = write_lake(d, steps, acts, loaders, shifts=(0, shift))
        con = connect(lake, kernel_wait_threshold_ns=THRESHOLD, materialize=materialize)
        got = {(r["rank"], r["step"]): r for r in run(con, "step_time").to_dicts()}
    _agrees(got, brute(steps, acts, loaders, THRESHOLD), shift)


def test_step_time_with_epoch_times_and_launches_far_away(tmp_path):
    """The sweep's order key (step_time.sql's ok: o, then the launch relative to the instant, held
    within +-2^59 ns) on epoch nanoseconds and on launches decades away: two starts at one instant
    with launches before and after each other, one launch 54 years early and one 100 years late
    (garbage a trace can hold), the second rank at 1.7e18 ns (2023); the brute-force reference
    orders by the launches themselves."""
    far_past, far_future = -1_700_000_000_000_000_000, 3_200_000_000_000_000_000
    acts = make_acts(
        [
            (10, 5, "compute", 8, False),
            (10, 3, "memory", 6, False),  # same instant, launched earlier: carries the start
            (20, 4, "compute", far_past, False),
            (20, 2, "memory", 19, False),
            (30, 6, "compute", far_future, False),
            (30, 2, "unknown", far_future, False),
            (45, 3, "communication", 40, False),
            (60, 5, "compute", None, False),
            (60, 5, "memory", far_past, False),
        ]
    )
    steps = [(1, 0, 40), (2, 40, 70)]
    shift = 1_700_000_000_000_000_000
    lake = write_lake(tmp_path, steps, acts, [(42, 44)], shifts=(0, shift))
    got = {
        (r["rank"], r["step"]): r
        for r in run(connect(lake, kernel_wait_threshold_ns=THRESHOLD), "step_time").to_dicts()
    }
    want = brute(steps, acts, [(42, 44)], THRESHOLD)
    assert sum(w["host_wait"] + w["kernel_wait"] + w["other"] for _, _, w in want.values()) > 0
    _agrees(got, want, shift)


def _agrees(got, want, shift):
    """step_time's rows (rank, step) -> row agree with brute()'s for both ranks (rank 1 shifted)."""
    assert set(got) == {(rank, num) for rank in (0, 1) for num in want}
    for (rank, num), g in got.items():
        ws, we, w = want[num]
        dt = shift if rank else 0
        assert (g["step_start_ns"] - dt, g["step_end_ns"] - dt, g["step_ns"]) == (ws, we, we - ws)
        assert (g["compute_ns"], g["comm_ns"], g["overlap_ns"], g["exposed_comm_ns"]) == (
            w["compute"],
            w["comm"],
            w["overlap"],
            w["exposed_comm"],
        )
        assert (g["memory_ns"], g["exposed_memory_ns"], g["exposed_unknown_ns"], g["idle_ns"]) == (
            w["memory"],
            w["exposed_memory"],
            w["exposed_unknown"],
            w["idle"],
        )
        assert (
            g["idle_input_ns"],
            g["idle_host_wait_ns"],
            g["idle_kernel_wait_ns"],
            g["idle_other_ns"],
            g["idle_unreliable_ns"],
        ) == (w["input"], w["host_wait"], w["kernel_wait"], w["other"], w["unreliable"])


def test_no_rows_without_gpu_work(tmp_path):
    lake = write_lake(tmp_path, [(1, 0, 10)], [], [])
    assert run(connect(lake), "step_time").height == 0


# ---- corpus traces, by interval arithmetic ----


def _union(ivs):
    out = []
    for a, b in sorted(ivs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _measure_within(ivs, lo, hi):
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in ivs)


def _reference(lake: Lake) -> dict:
    """(rank, step) -> (window, busy, idle, idle during DataLoader) from the lake's rows."""
    con = connect(lake)
    work = pl.from_arrow(con.sql("SELECT rank, start_ns, end_ns, step FROM scope").to_arrow_table())
    steps = pl.from_arrow(
        con.sql("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY rank, start_ns").to_arrow_table()
    )
    loaders = pl.from_arrow(
        con.sql(
            "SELECT rank, start_ns, end_ns FROM cpu_ops WHERE name LIKE 'enumerate(DataLoader)#%'"
        ).to_arrow_table()
    )
    out = {}
    for rank in work["rank"].unique().to_list():
        w = work.filter(pl.col("rank") == rank)
        ends = {
            r["step"]: r["end_ns"]
            for r in w.filter(pl.col("step").is_not_null())
            .group_by("step")
            .agg(pl.col("end_ns").max())
            .to_dicts()
        }
        st_rows = [
            (r["step"], r["start_ns"], r["end_ns"]) for r in steps.filter(pl.col("rank") == rank).to_dicts()
        ]
        busy = _union(list(zip(w["start_ns"].to_list(), w["end_ns"].to_list())))
        dl = _union([(r["start_ns"], r["end_ns"]) for r in loaders.filter(pl.col("rank") == rank).to_dicts()])
        for num, ws, we in tb_windows(st_rows, ends):
            b = _measure_within(busy, ws, we)
            # idle during loading = |window ∩ loader| - |window ∩ loader ∩ busy|
            inter = [(max(a, c), min(bb, d)) for a, bb in dl for c, d in busy if max(a, c) < min(bb, d)]
            out[(rank, num)] = (
                (ws, we),
                b,
                (we - ws) - b,
                _measure_within(dl, ws, we) - _measure_within(inter, ws, we),
            )
    return out


@pytest.fixture(scope="module")
def corpus_lakes(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    lakes = {}
    for name, path in (
        (
            "resnet",
            corpus("kineto", "tb_plugin", "samples", "resnet50_num_workers_0", "worker0.pt.trace.json.gz"),
        ),
        ("sample", REPO / "sample_traces"),
    ):
        lk = Lake(d / name)
        assert all(r.status == "ok" for r in ingest_paths([path], lk, run=name))
        lakes[name] = lk
    return lakes


@pytest.mark.parametrize("name", ["resnet", "sample"])
def test_step_time_on_corpus_equals_interval_arithmetic(corpus_lakes, name):
    lake = corpus_lakes[name]
    got = {(r["rank"], r["step"]): r for r in run(connect(lake), "step_time").to_dicts()}
    want = _reference(lake)
    assert set(got) == set(want) and len(got) >= 4
    for k, ((ws, we), busy, idle, inp) in want.items():
        g = got[k]
        assert (g["step_start_ns"], g["step_end_ns"]) == (ws, we)
        assert g["gpu_busy_ns"] == busy and g["idle_ns"] == idle and g["idle_input_ns"] == inp
        assert (
            g["compute_ns"]
            + g["exposed_comm_ns"]
            + g["exposed_memory_ns"]
            + g["exposed_unknown_ns"]
            + g["idle_ns"]
            == g["step_ns"]
        )
        assert (
            g["idle_input_ns"]
            + g["idle_host_wait_ns"]
            + g["idle_kernel_wait_ns"]
            + g["idle_other_ns"]
            + g["idle_unreliable_ns"]
            == g["idle_ns"]
        )
    if name == "resnet":
        # num_workers=0: the DataLoader runs on the training thread inside every step
        assert all(g["idle_input_ns"] > 0 for g in got.values())


def _brute_gaps(lake: Lake, threshold: int) -> dict:
    con = connect(lake)
    w = pl.from_arrow(
        con.sql(
            "SELECT rank, start_ns, end_ns, launch_ns, graph_replay FROM scope ORDER BY rank, start_ns"
        ).to_arrow_table()
    )
    out: dict = {}
    for rank in w["rank"].unique().to_list():
        rows = w.filter(pl.col("rank") == rank).to_dicts()
        by_start: dict[int, list] = {}
        for r in rows:
            by_start.setdefault(r["start_ns"], []).append(r)
        latest = None
        for s in sorted(by_start):
            group = by_start[s]
            if latest is not None and s > latest:
                gap = s - latest
                launches = [r["launch_ns"] for r in group]
                if any(r["graph_replay"] for r in group):
                    cause = "unreliable"
                elif None not in launches and min(launches) > latest:
                    cause = "host_wait"
                elif gap < threshold:
                    cause = "kernel_wait"
                else:
                    cause = "other"
                lo = 1 << (gap.bit_length() - 1)
                c = out.setdefault((lo, cause), [0, 0])
                c[0] += 1
                c[1] += gap
            latest = max(latest or s, max(r["end_ns"] for r in group))
    return out


@pytest.mark.parametrize("name", ["resnet", "sample"])
def test_idle_gap_histogram_matches_brute_force(corpus_lakes, name):
    got = {
        (r["bucket_lo_ns"], r["cause"]): [r["gaps"], r["total_ns"]]
        for r in run(connect(corpus_lakes[name]), "idle_gaps").to_dicts()
    }
    assert got == _brute_gaps(corpus_lakes[name], 30_000)
    assert all(
        r["bucket_hi_ns"] == 2 * r["bucket_lo_ns"]
        for r in run(connect(corpus_lakes[name]), "idle_gaps").to_dicts()
    )
