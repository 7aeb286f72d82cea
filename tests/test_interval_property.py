"""Property test: the interval SQL (queries/breakdown.sql) against a brute-force reference that
walks every nanosecond of small random interval sets."""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.lake import Lake
from pipeline.query import connect, run

CATS = ["compute", "communication", "memory", "unknown"]
KIND = {"compute": "kernel", "communication": "kernel", "memory": "memcpy", "unknown": "unknown"}

interval = st.tuples(st.integers(0, 60), st.integers(0, 15), st.sampled_from(CATS), st.integers(0, 2))


def brute(ivs):
    t0 = min(s for s, _, _, _ in ivs)
    t1 = max(s + d for s, d, _, _ in ivs)
    out = dict(span=t1 - t0, busy=0, compute=0, comm=0, memory=0, overlap=0, exposed_comm=0, exposed_memory=0)
    for t in range(t0, t1):
        active = {c for s, d, c, _ in ivs if s <= t < s + d}
        out["busy"] += bool(active)
        out["compute"] += "compute" in active
        out["comm"] += "communication" in active
        out["memory"] += "memory" in active
        out["overlap"] += "compute" in active and "communication" in active
        out["exposed_comm"] += "communication" in active and "compute" not in active
        out["exposed_memory"] += "memory" in active and not active & {"compute", "communication"}
    return out


def _gpu_table(sid, rank, ivs, dt, correlation=None) -> dict:
    """gpu_activities columns for (start, duration, category, stream) intervals shifted by dt."""
    n = len(ivs)
    t = {
        "run_id": ["r"] * n,
        "source_id": [sid] * n,
        "rank": [rank] * n,
        "device": [0] * n,
        "stream": [st_ for _, _, _, st_ in ivs],
        "kind": [KIND[c] for _, _, c, _ in ivs],
        "category": [c for _, _, c, _ in ivs],
        "classified_by": ["default"] * n,
        "name": ["k"] * n,
        "start_ns": [s + dt for s, _, _, _ in ivs],
        "end_ns": [s + du + dt for s, du, _, _ in ivs],
        "dur_ns": [du for _, du, _, _ in ivs],
        "event_index": list(range(n)),
    }
    if correlation is not None:
        t["correlation"] = correlation
    return t


def _source_row(sid, rank) -> dict:
    return {
        "source_id": sid,
        "run_id": "r",
        "path": f"/x{rank}",
        "format": "kineto_json",
        "content_sha256": "0",
        "size_bytes": 0,
        "status": "ok",
        "schema_version": 2,
        "tracelake_version": "t",
        "ingested_at_ns": 0,
    }


def _two_rank_lake(d, ivs, shift) -> Lake:
    """A lake of two ranks with the same (start, duration, category, stream) intervals, the
    second shifted in time by `shift` ns."""
    lake = Lake(d)
    lake.ensure()
    for rank, dt in ((0, 0), (1, shift)):
        sid = f"s{rank}"
        lake.write_source(
            "r", sid, {"gpu_activities": _gpu_table(sid, rank, ivs, dt)}, _source_row(sid, rank)
        )
    return lake


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(interval, min_size=1, max_size=25), st.integers(-80, 80), st.booleans())
def test_breakdown_matches_brute_force(ivs, shift, materialize):
    """Two ranks with the same intervals, the second shifted in time (the sweep runs over all ranks
    in one sort), on plain and materialized views."""
    with tempfile.TemporaryDirectory() as d:
        lake = _two_rank_lake(d, ivs, shift)
        rows = run(connect(lake, materialize=materialize), "breakdown").to_dicts()
    assert [r["rank"] for r in rows] == [0, 1]
    b = brute(ivs)
    for row in rows:
        _check(row, b)


def _check(row, b):
    assert row["span_ns"] == b["span"]
    assert row["gpu_busy_ns"] == b["busy"] and row["gpu_idle_ns"] == b["span"] - b["busy"]
    assert (row["compute_ns"], row["comm_ns"], row["memory_ns"]) == (b["compute"], b["comm"], b["memory"])
    assert (row["overlap_ns"], row["exposed_comm_ns"], row["exposed_memory_ns"]) == (
        b["overlap"],
        b["exposed_comm"],
        b["exposed_memory"],
    )
    assert (
        row["compute_ns"]
        + row["exposed_comm_ns"]
        + row["exposed_memory_ns"]
        + row["exposed_unknown_ns"]
        + row["gpu_idle_ns"]
        == row["span_ns"]
    )
    assert (
        row["idle_host_wait_ns"]
        + row["idle_kernel_wait_ns"]
        + row["idle_other_ns"]
        + row["idle_unreliable_ns"]
        == row["gpu_idle_ns"]
    )


# (start, duration, stream, launch offset before start (None: no launch in the trace), shares the
# previous activity's correlation (a graph replay))
activity = st.tuples(
    st.integers(0, 60),
    st.integers(0, 15),
    st.integers(0, 2),
    st.one_of(st.none(), st.integers(-20, 10)),
    st.booleans(),
)
THRESHOLD = 30_000


def _write_rank_lake(d, acts, shift):
    """Two ranks with the same activities, the second shifted by `shift` ns (times may be
    negative); launches are cudaLaunchKernel rows of cpu_ops correlated to the kernels."""
    lake = Lake(d)
    lake.ensure()
    corr, c = [], 0
    for i, a in enumerate(acts):
        c = c if (a[4] and i > 0) else c + 1
        corr.append(c)
    for rank, dt in ((0, 0), (1, shift)):
        sid, n = f"s{rank}", len(acts)
        launches = {}
        for (s, _, _, off, _), k in zip(acts, corr):
            if off is not None and k not in launches:
                launches[k] = s + dt - off
        m = len(launches)
        ivs = [(a[0], a[1], "compute", a[2]) for a in acts]
        lake.write_source(
            "r",
            sid,
            {
                "gpu_activities": _gpu_table(sid, rank, ivs, dt, corr),
                "cpu_ops": {
                    "run_id": ["r"] * m,
                    "source_id": [sid] * m,
                    "rank": [rank] * m,
                    "kind": ["runtime"] * m,
                    "name": ["cudaLaunchKernel"] * m,
                    "start_ns": list(launches.values()),
                    "end_ns": list(launches.values()),
                    "dur_ns": [0] * m,
                    "event_index": list(range(n, n + m)),
                    "correlation": list(launches),
                },
            },
            _source_row(sid, rank),
        )
    return lake, corr


def _cause(graph, launches, prev_end, gap):
    if graph:
        return "unreliable"
    if None not in launches and min(launches) > prev_end:
        return "host_wait"
    return "kernel_wait" if gap < THRESHOLD else "other"


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(activity, min_size=1, max_size=25), st.integers(-80, 80), st.booleans())
def test_idle_breakdown_and_gaps_match_brute_force(acts, shift, materialize):
    """queries/idle_breakdown.sql (per stream, HTA's rule) and queries/idle_gaps.sql (per rank,
    device level) against quadratic references: each gap's previous end is the max over every
    earlier activity, found by scanning them all."""
    with tempfile.TemporaryDirectory() as d:
        lake, corr = _write_rank_lake(d, acts, shift)
        con = connect(lake, materialize=materialize)
        idle = run(con, "idle_breakdown").to_dicts()
        gaps = run(con, "idle_gaps").to_dicts()
    share = {k: corr.count(k) for k in corr}
    first_launch = {}
    for (s, _, _, off, _), k in zip(acts, corr):
        first_launch.setdefault(k, None if off is None else s - off)
    want_idle, want_gaps = {}, {}
    for rank, dt in ((0, 0), (1, shift)):
        rows = [
            dict(
                start=s + dt,
                end=s + du + dt,
                stream=sm,
                i=i,
                graph=share[k] > 1,
                launch=None if first_launch[k] is None else first_launch[k] + dt,
            )
            for i, ((s, du, sm, _, _), k) in enumerate(zip(acts, corr))
        ]
        # per stream: sorted by (start, end, event_index); the gap before an activity starts at
        # the max end of every activity before it on the stream
        for sm in {r["stream"] for r in rows}:
            on = sorted((r for r in rows if r["stream"] == sm), key=lambda r: (r["start"], r["end"], r["i"]))
            for j, r in enumerate(on):
                if j == 0:
                    continue
                prev_end = max(x["end"] for x in on[:j])
                if r["start"] > prev_end:
                    gap = r["start"] - prev_end
                    w = want_idle.setdefault(
                        (rank, sm),
                        dict(host_wait_ns=0, kernel_wait_ns=0, other_ns=0, unreliable_ns=0, gaps=0),
                    )
                    w[_cause(r["graph"], [r["launch"]], prev_end, gap) + "_ns"] += gap
                    w["gaps"] += 1
        # per rank: activities starting at one instant end the gap before it together
        for s in sorted({r["start"] for r in rows}):
            before = [x["end"] for x in rows if x["start"] < s]
            if before and s > max(before):
                group = [x for x in rows if x["start"] == s]
                gap = s - max(before)
                cause = _cause(any(x["graph"] for x in group), [x["launch"] for x in group], max(before), gap)
                g = want_gaps.setdefault((1 << (gap.bit_length() - 1), cause), [0, 0, set()])
                g[0] += 1
                g[1] += gap
                g[2].add(rank)
    got_idle = {
        (r["rank"], r["stream"]): {
            k: r[k] for k in ("host_wait_ns", "kernel_wait_ns", "other_ns", "unreliable_ns", "gaps")
        }
        for r in idle
    }
    assert all(r["step"] is None and r["device"] == 0 for r in idle)
    assert got_idle == want_idle
    assert {(r["bucket_lo_ns"], r["cause"]): [r["gaps"], r["total_ns"], r["ranks"]] for r in gaps} == {
        k: [v[0], v[1], len(v[2])] for k, v in want_gaps.items()
    }


# (start, duration, is a collective (else compute), unused) per rank; a rank's collectives are
# calls 0, 1, ... of one process group in start order
member = st.tuples(st.integers(0, 60), st.integers(0, 15), st.booleans(), st.just(0))


def _brute_split(ranks: dict[int, list]) -> dict[int, dict]:
    """Per rank: exposed waiting for peers and exposed transfer, walking every ns. Call c (a
    rank's c-th collective in start order) is consistent when two or more ranks have it and their
    kernels overlap (the latest start <= the earliest end); then each rank's kernel waits for its
    first (duration - the shortest duration of the call) ns and transfers after; a kernel of no
    consistent call transfers throughout. An instant is compute if a compute kernel runs, else
    transfer if some collective transfers, else waiting if some collective waits."""
    calls: dict[int, dict[int, tuple]] = {}
    for r, acts in ranks.items():
        for s, d, _, c in _collectives_in_order(acts):
            calls.setdefault(c, {})[r] = (s, d)
    shortest = {}
    for c, kernels in calls.items():
        ok = len(kernels) >= 2 and max(s for s, _ in kernels.values()) <= min(
            s + d for s, d in kernels.values()
        )
        shortest[c] = min(d for _, d in kernels.values()) if ok else None
    out = {}
    for r, acts in ranks.items():
        # (start, end, end of its wait)
        colls = [
            (s, s + d, s if shortest[c] is None else s + d - shortest[c])
            for s, d, _, c in _collectives_in_order(acts)
        ]
        comps = [(s, d) for s, d, coll, _ in acts if not coll]
        t0 = min(s for s, _, _, _ in acts)
        t1 = max(s + d for s, d, _, _ in acts)
        w = x = 0
        for t in range(t0, t1):
            if any(s <= t < s + d for s, d in comps):
                continue
            active = [we for s, e, we in colls if s <= t < e]
            if any(t >= we for we in active):
                x += 1
            elif active:
                w += 1
        out[r] = {"wait": w, "transfer": x}
    return out


def _collectives_in_order(acts):
    """A rank's collectives renumbered 0, 1, ... in start order (tracelake matches calls of one
    process group by their order on each rank when the trace records no sequence number: start,
    then correlation, which is the activity's index + 1 here)."""
    colls = sorted((s, i, d) for i, (s, d, coll, _) in enumerate(acts) if coll)
    return [(s, d, True, k) for k, (s, _, d) in enumerate(colls)]


def collective_lake(d, ranks: dict[int, list], steps: dict[int, list] | None = None) -> Lake:
    """A lake of ranks of `member` activities (compute kernels on stream 0, collectives of one
    process group on stream 1, each collective also a collectives row), one source per rank;
    steps: rank -> host step windows (start, end), numbered 1, 2, ... (none when not given)."""
    lake = Lake(d)
    lake.ensure()
    for rank, acts in ranks.items():
        sid, n = f"s{rank}", len(acts)
        colls = [(i, s, du) for i, (s, du, coll, _) in enumerate(acts) if coll]
        m = len(colls)
        win = (steps or {}).get(rank, [])
        extra = {}
        if win:
            k = len(win)
            extra["steps"] = {
                "run_id": ["r"] * k,
                "source_id": [sid] * k,
                "rank": [rank] * k,
                "step": list(range(1, k + 1)),
                "name": [f"ProfilerStep#{i}" for i in range(1, k + 1)],
                "start_ns": [a for a, _ in win],
                "end_ns": [b for _, b in win],
                "dur_ns": [b - a for a, b in win],
                "source": ["profiler_step"] * k,
            }
        lake.write_source(
            "r",
            sid,
            {
                **extra,
                "gpu_activities": {
                    "run_id": ["r"] * n,
                    "source_id": [sid] * n,
                    "rank": [rank] * n,
                    "device": [0] * n,
                    "stream": [1 if a[2] else 0 for a in acts],
                    "kind": ["kernel"] * n,
                    "category": ["communication" if a[2] else "compute" for a in acts],
                    "classified_by": ["default"] * n,
                    "name": ["k"] * n,
                    "start_ns": [a[0] for a in acts],
                    "end_ns": [a[0] + a[1] for a in acts],
                    "dur_ns": [a[1] for a in acts],
                    "event_index": list(range(n)),
                    "correlation": list(range(1, n + 1)),
                },
                "collectives": {
                    "run_id": ["r"] * m,
                    "source_id": [sid] * m,
                    "rank": [rank] * m,
                    "op": ["all_reduce"] * m,
                    "op_raw": ["allreduce"] * m,
                    "start_ns": [s for _, s, _ in colls],
                    "end_ns": [s + du for _, s, du in colls],
                    "dur_ns": [du for _, _, du in colls],
                    "correlation": [i + 1 for i, _, _ in colls],
                    "process_group": ["0"] * m,
                    "group_size": [2] * m,
                    "timing_source": ["gpu_kernel"] * m,
                },
            },
            {**_source_row(sid, rank), "rank": rank, "world_size": 2},
        )
    return lake


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(member, min_size=1, max_size=12), st.lists(member, min_size=1, max_size=12), st.booleans())
def test_exposed_wait_and_transfer_match_brute_force(acts0, acts1, materialize):
    """Two ranks of random compute kernels and collectives of one process group (queries/breakdown.sql
    level 'rank', views/44_comm_wait.sql): exposed_comm_wait_ns and exposed_comm_transfer_ns per
    rank equal the brute-force walk, and add up to exposed_comm_ns."""
    ranks = {0: acts0, 1: acts1}
    with tempfile.TemporaryDirectory() as d:
        lake = collective_lake(d, ranks)
        rows = run(connect(lake, materialize=materialize), "breakdown").to_dicts()
        rows = [r for r in rows if r["level"] == "rank"]
    b = _brute_split(ranks)
    for row in rows:
        assert row["exposed_comm_wait_ns"] == b[row["rank"]]["wait"], row
        assert row["exposed_comm_transfer_ns"] == b[row["rank"]]["transfer"], row
        assert row["exposed_comm_wait_ns"] + row["exposed_comm_transfer_ns"] == row["exposed_comm_ns"]


def _brute_exposure(ivs) -> tuple[int, int, int]:
    """(communication kernels, their summed duration, their summed time under no compute
    kernel), walking every nanosecond: each kernel counts its own time (collective_exposure.sql)."""
    comp = [(s, s + d) for s, d, c, _ in ivs if c == "compute"]
    kernels = [(s, s + d) for s, d, c, _ in ivs if c == "communication"]
    exposed = sum(1 for s, e in kernels for t in range(s, e) if not any(a <= t < b for a, b in comp))
    return len(kernels), sum(e - s for s, e in kernels), exposed


@settings(max_examples=18, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(interval, min_size=1, max_size=25), st.integers(-80, 80))
def test_collective_exposure_matches_brute_force(ivs, shift):
    """Two ranks with the same intervals, the second shifted (the running sums run over all ranks
    in one order and are taken relative to each rank's offset); no collective is matched, so
    every exposed nanosecond is transfer."""
    with tempfile.TemporaryDirectory() as d:
        lake = _two_rank_lake(d, ivs, shift)
        rows = run(connect(lake), "collective_exposure").to_dicts()
    kernels, kernel_ns, exposed = _brute_exposure(ivs)
    if not kernels:
        assert rows == []
        return
    (row,) = rows
    assert (row["kernels"], row["ranks"]) == (2 * kernels, 2)
    assert (row["kernel_ns"], row["exposed_ns"]) == (2 * kernel_ns, 2 * exposed)
    assert (row["exposed_wait_ns"], row["exposed_transfer_ns"]) == (0, 2 * exposed)
