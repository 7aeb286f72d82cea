"""`tracelake timeline` (pipeline/timeline/): the Chrome JSON trace of a run's window, checked
event by event against the lake's rows (counts per track, times to the ns), the flows of matched
collectives, the overlap rule (no two slices on one track that overlap without nesting), and a
round trip through tracelake's own Kineto reader. Lakes: the hand-made two-rank trace of
tests/test_handmade.py, PARAM's 8-rank DLRM job and an Nsight Systems export of two ranks."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from decimal import Decimal

import pytest
from conftest import corpus, write_trace
from test_handmade import H100, rank0_events, rank1_events
from typer.testing import CliRunner

from pipeline import timeline
from pipeline.analyze import analyze
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect
from pipeline.timeline.chrome import FINDINGS_PID
from pipeline.timeline.layout import Slice, assign_lanes, proper

US = 1000
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation"}


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    d = tmp_path_factory.mktemp("tl_hand")
    info = {"backend": "nccl", "world_size": 2}
    write_trace(
        d / "job" / "r0.json", rank0_events(), distributedInfo={**info, "rank": 0}, deviceProperties=H100
    )
    write_trace(
        d / "job" / "r1.json", rank1_events(), distributedInfo={**info, "rank": 1}, deviceProperties=H100
    )
    lk = Lake(d / "lake")
    assert [r.status for r in ingest_paths([d / "job"], lk)] == ["ok", "ok"]
    return lk


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    lk = Lake(tmp_path_factory.mktemp("tl_dlrm") / "lake")
    ingest_paths([corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")], lk)
    return lk


@pytest.fixture(scope="module")
def nsys(tmp_path_factory):
    lk = Lake(tmp_path_factory.mktemp("tl_nsys") / "lake")
    ingest_paths([corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")], lk)
    return lk


def _run(lk) -> str:
    return lk.sources()["run_id"][0]


_DOCS: dict = {}


def _doc(lk) -> dict:
    """The lake's analysis, computed once (the findings the timelines draw)."""
    if lk.root not in _DOCS:
        _DOCS[lk.root] = analyze(lk)
    return _DOCS[lk.root]


def _write(lk, path, **kw) -> dict:
    """Build and write the timeline; the document read back with exact decimals."""
    tl = timeline.build(lk, _run(lk), doc=_doc(lk), **kw)
    timeline.write(tl, path)
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw, parse_float=Decimal)


def _ns(us: Decimal) -> int:
    ns = us * 1000
    assert ns == int(ns), us  # three decimals at most: whole ns
    return int(ns)


def _tracks(doc) -> dict:
    return {
        (e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"
    }


def _slices(doc) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def _base(name: str) -> str:
    return re.sub(r" \(overlap \d+\)$", "", name)


def _in(start, end, t0, t1) -> bool:
    return start < t1 and (end > t0 or start >= t0)


def _expected(lk, doc) -> Counter:
    """The lake's rows in the window, read here with plain SQL: (rank, track, name, start, end)."""
    od = doc["otherData"]
    t0 = od["start_ns"] if od["start_ns"] is not None else -(2**63)
    t1 = od["end_ns"] if od["end_ns"] is not None else 2**63 - 1
    con = connect(lk, derived_views=False)
    q = (
        "SELECT rank, 'stream ' || stream || ' · GPU ' || device, name, start_ns, end_ns FROM gpu_activities "
        "UNION ALL SELECT rank, 'thread ' || tid, name, start_ns, end_ns FROM cpu_ops "
        "UNION ALL SELECT rank, CASE WHEN stream IS NOT NULL THEN 'stream ' || stream || ' · GPU ' || device "
        "  ELSE 'thread ' || tid END, name, start_ns, end_ns FROM annotations a WHERE stream IS NOT NULL "
        "  OR NOT EXISTS (SELECT 1 FROM cpu_ops c WHERE c.source_id = a.source_id AND c.rank = a.rank "
        "  AND c.tid IS NOT DISTINCT FROM a.tid AND c.start_ns = a.start_ns AND c.end_ns = a.end_ns)"
    )
    return Counter(r for r in con.execute(q).fetchall() if r[0] in od["ranks"] and _in(r[3], r[4], t0, t1))


def _check(lk, doc) -> list[dict]:
    """Every host and GPU slice equals a lake row in the window (times to the ns), each row is
    there once, and no track holds two slices that overlap without nesting. Returns the slices."""
    tracks = _tracks(doc)
    got = Counter()
    per_tid: dict = {}
    for e in _slices(doc):
        start = _ns(e["ts"])
        end = start + _ns(e["dur"])
        per_tid.setdefault((e["pid"], e["tid"]), []).append(
            Slice(e["pid"], (), e["name"], e["cat"], start, end)
        )
        if e["cat"] not in ("idle", "finding", "critical_path"):
            got[(e["pid"], _base(tracks[(e["pid"], e["tid"])]), e["name"], start, end)] += 1
    assert got == _expected(lk, doc)
    assert all(proper(v) for v in per_tid.values())
    return _slices(doc)


def test_handmade_event_by_event(hand, tmp_path):
    doc = _write(hand, tmp_path / "t.json")
    assert doc["displayTimeUnit"] == "ns"
    od = doc["otherData"]
    # every step has the same 1000 µs window: the worst is step 1 (the lower number), + step 2
    assert od["steps"] == [1, 2] and (od["start_ns"], od["end_ns"]) == (1000 * US, 3000 * US)
    evs = _check(hand, doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert procs[0] == "rank 0 · NVIDIA H100 80GB HBM3" and procs[1] == "rank 1 · NVIDIA H100 80GB HBM3"
    tracks = _tracks(doc)
    per_track = Counter((e["pid"], _base(tracks[(e["pid"], e["tid"])])) for e in evs)
    assert per_track[(0, "stream 7 · GPU 0")] == 4 and per_track[(0, "stream 20 · GPU 0")] == 1
    assert per_track[(0, "thread 10")] == 7 and per_track[(1, "thread 10")] == 6
    # rank 1's gemm_small [1120, 1180) nests in gemm [1100, 1200): one track, no overlap lane
    assert per_track[(1, "stream 7 · GPU 0")] == 2
    assert [n for n in tracks.values() if "overlap" in n] == [
        "thread 10 (overlap 1)",
        "thread 10 (overlap 2)",
    ]
    # ... but its launches [1010, 1015), [1011, 1016), [1012, 1017) overlap without nesting: a lane each
    lanes = {
        tracks[(1, e["tid"])]
        for e in evs
        if e["pid"] == 1 and 1010 * US <= _ns(e["ts"]) <= 1012 * US and e["cat"] != "critical_path"
    }
    assert lanes == {"thread 10", "thread 10 (overlap 1)", "thread 10 (overlap 2)"}
    k1 = next(e for e in evs if e["name"] == "sm90_xmma_gemm_bf16")
    assert (k1["ts"], k1["dur"]) == (Decimal("1100.000"), Decimal("200.000"))
    assert k1["args"]["correlation"] == 1 and k1["args"]["External id"] == 5 and k1["args"]["stream"] == 7
    assert k1["args"]["category"] == "compute" and k1["args"]["device"] == 0
    copy = next(e for e in evs if e["cat"] == "gpu_memcpy")
    assert copy["args"]["bytes"] == 1_000_000
    # rank 0's idle gaps by hand (tests/test_handmade.py): [1500,1550) other, [1600,1750) host wait
    idle = sorted((e["pid"], _ns(e["ts"]), _ns(e["dur"]), e["name"]) for e in evs if e["cat"] == "idle")
    assert idle == [(0, 1500 * US, 50 * US, "other"), (0, 1600 * US, 150 * US, "host_wait")]
    assert all(tracks[(e["pid"], e["tid"])] == "idle (GPU gaps by cause)" for e in evs if e["cat"] == "idle")
    # the all-reduce: rank 0 started last (1200 vs 1150 µs): one flow from its kernel to rank 1's
    s = [e for e in doc["traceEvents"] if e["ph"] == "s" and e["cat"] == "collective"]
    f = [e for e in doc["traceEvents"] if e["ph"] == "f" and e["cat"] == "collective"]
    assert len(s) == len(f) == 1 and s[0]["id"] == f[0]["id"] and f[0]["bp"] == "e"
    assert (s[0]["pid"], _ns(s[0]["ts"]), f[0]["pid"], _ns(f[0]["ts"])) == (0, 1200 * US, 1, 1200 * US)
    assert tracks[(0, s[0]["tid"])] == "stream 20 · GPU 0" and tracks[(1, f[0]["tid"])] == "stream 20 · GPU 0"
    # the findings, on the run's findings track, each with the command of its window
    fs = [e for e in evs if e["cat"] == "finding"]
    res = _doc(hand)
    assert {e["args"]["id"] for e in fs} == {x["timeline"]["id"] for x in res["findings"]}
    assert all(e["pid"] == FINDINGS_PID for e in fs)
    for x in res["findings"]:
        fid = x["timeline"]["id"]
        assert (
            x["timeline"]["command"]
            == f"tracelake timeline --run job --around {fid} -o timeline-{fid}.json.gz"
        )


def test_dlrm_eight_ranks_event_by_event(dlrm, tmp_path):
    doc = _write(dlrm, tmp_path / "t.json.gz")
    evs = _check(dlrm, doc)
    assert doc["otherData"]["ranks"] == list(range(8)) and doc["otherData"]["steps"] == [10, 10]
    assert {e["pid"] for e in evs} == set(range(8)) | {FINDINGS_PID}
    # each flow runs from the last rank's collective kernel to another rank's kernel of that call
    tracks = _tracks(doc)
    kernels = {(e["pid"], e["tid"], _ns(e["ts"])): e for e in evs}
    s = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s" and e["cat"] == "collective"}
    f = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f" and e["cat"] == "collective"}
    assert s and s.keys() == f.keys()
    # the critical path of step 10 (docs/whatif.md): its segments, on each rank's "critical path"
    # track, add up to the step time of the rank that ended last (step_window), and the path
    # passes from rank 7 (the straggler it waited for) to that rank
    cp = [e for e in evs if e["cat"] == "critical_path"]
    assert {tracks[(e["pid"], e["tid"])] for e in cp} == {"critical path (each step's, across ranks)"}
    end_rank = cp[0]["args"]["end_rank"]
    (step_ns,) = [r["step_ns"] for r in _doc(dlrm)["step_time"] if r["rank"] == end_rank and r["step"] == 10]
    assert sum(_ns(e["dur"]) for e in cp) == step_ns
    hops = [e["name"] for e in doc["traceEvents"] if e["ph"] == "s" and e["cat"] == "critical_path"]
    assert f"critical path: rank 7 -> rank {end_rank}" in hops
    for i in s:
        assert s[i]["pid"] != f[i]["pid"] and "last" in s[i]["name"]
        src = kernels[(s[i]["pid"], s[i]["tid"], _ns(s[i]["ts"]))]  # bound at the kernel's start
        assert src["args"]["category"] == "communication" and tracks[(s[i]["pid"], s[i]["tid"])].startswith(
            "stream"
        )
        dst = [e for (p, t, _), e in kernels.items() if (p, t) == (f[i]["pid"], f[i]["tid"])]
        assert any(_ns(e["ts"]) <= _ns(f[i]["ts"]) <= _ns(e["ts"]) + _ns(e["dur"]) for e in dst)
    # --around the straggler finding: its window (the worst step) and the same rows
    around = _write(dlrm, tmp_path / "a.json", around="straggler")
    assert around["otherData"]["window"].startswith("--around straggler")
    _check(dlrm, around)


def test_nsys_export_whole_run_and_a_real_overlap(nsys, tmp_path):
    # its steps are found from the period of its kernel sequence (tests/test_nsys_steps.py); the
    # whole run is asked for, so the timeline holds every step and the work between them
    doc = _write(nsys, tmp_path / "t.json.gz", all_steps=True)
    assert doc["otherData"]["steps"] is None  # the whole run
    evs = _check(nsys, doc)
    # the export holds two kernels on one stream whose intervals overlap without nesting
    con = connect(nsys, derived_views=False)
    pairs = con.execute(
        "SELECT a.rank, a.start_ns, a.end_ns, b.start_ns, b.end_ns FROM gpu_activities a "
        "JOIN gpu_activities b ON a.rank = b.rank AND a.device = b.device AND a.stream = b.stream "
        "AND a.kind = 'kernel' AND b.kind = 'kernel' AND a.start_ns < b.start_ns AND b.start_ns < a.end_ns "
        "AND a.end_ns < b.end_ns"
    ).fetchall()
    assert len(pairs) == 1
    rank, a0, a1, b0, b1 = pairs[0]
    tracks = _tracks(doc)
    where = {(e["pid"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])): e["tid"] for e in evs}
    ta, tb = where[(rank, a0, a1)], where[(rank, b0, b1)]
    assert ta != tb and _base(tracks[(rank, ta)]) == _base(tracks[(rank, tb)])
    assert any("(overlap 1)" in tracks[(rank, t)] for t in (ta, tb))


def test_round_trip_through_the_kineto_reader(hand, dlrm, tmp_path):
    """One file per rank, read back by `tracelake ingest`: the same kernels, names and durations."""
    for lk, ranks in ((hand, [0, 1]), (dlrm, [0, 7])):
        res = _doc(lk)
        out = tmp_path / _run(lk)
        out.mkdir()
        want = {}
        for r in ranks:
            tl = timeline.build(lk, _run(lk), ranks=str(r), doc=res)
            timeline.write(tl, out / f"rank{r}.json")
            want[r] = sorted(
                (s.name, s.start_ns, s.end_ns - s.start_ns) for s in tl.slices if s.cat == "kernel"
            )
        back = Lake(tmp_path / f"{_run(lk)}_lake")
        assert {x.status for x in ingest_paths([out], back)} == {"ok"}
        con = connect(back, derived_views=False)
        for r in ranks:
            got = con.execute(
                "SELECT name, start_ns, dur_ns FROM gpu_activities WHERE rank = ? AND kind = 'kernel' "
                "ORDER BY ALL",
                [r],
            ).fetchall()
            assert got == want[r] and got


def test_lanes_keep_every_slice_and_nest_each():
    # [0,10) holds [2,5); [4,12) overlaps both without nesting -> lane 1; [11,13) fits lane 0
    ss = [Slice(0, (), n, "x", a, b) for n, a, b in (("p", 0, 10), ("c", 2, 5), ("o", 4, 12), ("z", 11, 13))]
    assert assign_lanes(ss) == 2
    assert [s.lane for s in ss] == [0, 0, 1, 0]
    assert all(proper([s for s in ss if s.lane == lane]) for lane in (0, 1))


def test_a_rank_past_the_rank_column_is_out_of_range_not_a_bad_range(hand, tmp_path):
    """`--ranks 0-99999999999` said 'not an increasing range' (issue 39 item 13): a rank past
    2^31 - 1 is out of range, a range of more than 1,000,000 ranks says so, and missing ranks are
    listed as they are (1,3 is not '1-3')."""
    from pipeline.timeline import WindowError, parse_ranges

    for text, why in (
        ("0-99999999999", "rank 99999999999 is out of range (a rank is 0 to 2147483647)"),
        ("2147483648", "rank 2147483648 is out of range (a rank is 0 to 2147483647)"),
        ("0-2000000", "0-2000000 names 2000001 ranks, more than 1,000,000 in one range"),
        ("5-2", "5-2 is not an increasing range"),
    ):
        with pytest.raises(WindowError) as e:
            parse_ranges(text, "ranks")
        assert str(e.value) == f"--ranks {text!r}: {why}"
    assert parse_ranges("2147483647", "ranks") == [2147483647]
    runner = CliRunner()
    out = str(tmp_path / "t.json")
    r = runner.invoke(app, ["timeline", "--lake", str(hand.root), "--ranks", "0-99999999999", "-o", out])
    assert r.exit_code == 2 and r.output == (
        "error: --ranks '0-99999999999': rank 99999999999 is out of range (a rank is 0 to 2147483647)\n"
    )
    r = runner.invoke(app, ["timeline", "--lake", str(hand.root), "--ranks", "0,3,5", "-o", out])
    assert r.exit_code == 2 and r.output == "error: --ranks 0,3,5: rank(s) 3, 5 not in run job (ranks 0-1)\n"


def test_cli_limits_and_errors(hand, tmp_path):
    runner = CliRunner()
    lake = str(hand.root)
    r = runner.invoke(app, ["timeline", "--lake", lake, "-o", str(tmp_path / "t.json"), "--max-events", "5"])
    assert r.exit_code == 2 and "over the limit of 5" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()
    for args, why in (
        (["-o", str(tmp_path / "t.perfetto")], "name it .json"),
        (["--steps", "7"], "no such step"),
        (["--ranks", "5"], "not in run job"),
        (["--around", "nope"], "no such finding"),
        (["--run", "other"], "not in the lake"),
        # one span of time per file: a list of steps is not read as everything between them
        (["--steps", "1,3"], "one step N or one range N-M"),
        (["--steps", "x"], "expected N or N-M"),
        (["--all", "--around", "host_idle"], "give --around or --all, not both"),
    ):
        r = runner.invoke(
            app,
            [
                "timeline",
                "--lake",
                lake,
                *(args if args[0] == "-o" else args + ["-o", str(tmp_path / "x.json")]),
            ],
        )
        assert r.exit_code == 2 and why in r.output, r.output
    r = runner.invoke(
        app, ["timeline", "--lake", lake, "-o", str(tmp_path / "w.json"), "--steps", "2", "--ranks", "1"]
    )
    assert r.exit_code == 0 and "wrote" in r.output
    doc = json.loads((tmp_path / "w.json").read_text(), parse_float=Decimal)
    assert doc["otherData"]["ranks"] == [1] and doc["distributedInfo"]["rank"] == 1


def _read_pftrace(path):
    """The .pftrace read back with Perfetto's own message classes: (pid, track name, name, start,
    end, category) per slice (BEGIN/END matched per track, innermost first), and the flow ids
    begun and terminated."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    t = Trace()
    t.ParseFromString(path.read_bytes())
    tracks, out, stacks, flows = {}, [], {}, ([], [])
    last_ts = -(2**63)
    for p in t.packet:
        assert p.trusted_packet_sequence_id == 1
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("thread"):
                tracks[d.uuid] = (d.thread.pid, d.thread.thread_name)
            continue
        ev = p.track_event
        assert p.timestamp >= last_ts  # written in time order
        last_ts = p.timestamp
        pid, track = tracks[ev.track_uuid]
        if ev.type == TrackEvent.TYPE_SLICE_BEGIN:
            stacks.setdefault(ev.track_uuid, []).append((p.timestamp, ev.name, list(ev.categories)))
        elif ev.type == TrackEvent.TYPE_SLICE_END:
            start, name, cats = stacks[ev.track_uuid].pop()
            out.append((pid, track, name, start, p.timestamp, cats[0] if cats else None))
        else:
            assert ev.type == TrackEvent.TYPE_INSTANT
            out.append((pid, track, ev.name, p.timestamp, p.timestamp, ev.categories[0]))
        if ev.type != TrackEvent.TYPE_SLICE_END:
            flows[0].extend(ev.flow_ids)
            flows[1].extend(ev.terminating_flow_ids)
    assert all(not s for s in stacks.values())  # every slice closed on its own track
    return out, flows


def test_pftrace_holds_the_same_slices_and_flows_to_the_ns(dlrm, hand, tmp_path):
    """Perfetto's protobuf format: every lake row of the window once, on its track, with its
    exact ns (no µs rounding), the idle and findings slices and the flows of the JSON trace."""
    for lk in (hand, dlrm):
        doc = _write(lk, tmp_path / "t.json")
        tl = timeline.build(lk, _run(lk), doc=_doc(lk))
        timeline.write(tl, tmp_path / "t.pftrace")
        got, (begun, ended) = _read_pftrace(tmp_path / "t.pftrace")
        host_gpu = Counter(
            (p, _base(tr), n, a, b)
            for p, tr, n, a, b, c in got
            if c not in ("idle", "finding", "critical_path")
        )
        assert host_gpu == _expected(lk, doc)
        tracks = _tracks(doc)
        json_rest = Counter(
            (e["pid"], tracks[(e["pid"], e["tid"])], e["name"], _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
            for e in _slices(doc)
            if e["cat"] in ("idle", "finding", "critical_path")
        )
        rest = ("idle", "finding", "critical_path")
        assert Counter((p, tr, n, a, b) for p, tr, n, a, b, c in got if c in rest) == json_rest
        n_flows = sum(e["ph"] == "s" for e in doc["traceEvents"])
        assert sorted(begun) == sorted(ended) == list(range(1, n_flows + 1))
    assert n_flows > 0  # DLRM's matched collectives


def test_run_writes_the_worst_steps_window_and_each_findings_command_works(tmp_path):
    """`tracelake run … --timeline` writes REPORT.timeline.json.gz: the worst step (the longest
    step time of any rank, from the analysis' step_time) with one step either side; and the
    `timeline.command` each finding carries runs as written (with --lake added) and writes the
    window of that finding."""
    import shlex

    job = tmp_path / "job"
    info = {"backend": "nccl", "world_size": 2}
    write_trace(job / "r0.json", rank0_events(), distributedInfo={**info, "rank": 0}, deviceProperties=H100)
    write_trace(job / "r1.json", rank1_events(), distributedInfo={**info, "rank": 1}, deviceProperties=H100)
    lake, out = tmp_path / "lake", tmp_path / "r.html"
    runner = CliRunner()
    r = runner.invoke(app, ["run", str(job), "--lake", str(lake), "-o", str(out), "--timeline", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(runner.invoke(app, ["analyze", "--lake", str(lake), "--json", "-q"]).stdout)
    rows = doc["step_time"]
    worst = max(rows, key=lambda s: (s["step_ns"], -s["step"]))["step"]
    steps = sorted({s["step"] for s in rows})
    want = [s for s in steps if abs(steps.index(s) - steps.index(worst)) <= 1]
    tl = json.loads(gzip.decompress((tmp_path / "r.timeline.json.gz").read_bytes()))
    assert tl["otherData"]["steps"] == [want[0], want[-1]] and tl["otherData"]["ranks"] == [0, 1]
    assert doc["findings"]
    for f in doc["findings"]:
        # run as printed: it names the lake, which is not the default (issue 39 item 13)
        args = shlex.split(f["timeline"]["command"])
        assert args[:4] == ["tracelake", "timeline", "--lake", str(lake)] and "--around" in args
        args = [a if not a.endswith(".json.gz") else str(tmp_path / a) for a in args[1:]]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (f["timeline"]["command"], r.output)
        written = json.loads(gzip.decompress((tmp_path / args[-1].split("/")[-1]).read_bytes()))
        assert written["otherData"]["window"].startswith(f"--around {f['timeline']['id']}")
        steps_of = f["timeline"]["steps"]
        assert written["otherData"]["steps"] == (steps_of if steps_of is None else list(steps_of))


def test_the_timeline_command_of_a_finding_names_the_lake_unless_it_is_the_default(tmp_path, monkeypatch):
    """Without --lake the printed command opens ./.tracelake; it names --lake (as given, quoted)
    when the lake analysed is another, or TRACELAKE_LAKE would send it to another."""
    job = tmp_path / "job"
    info = {"backend": "nccl", "world_size": 2}
    write_trace(job / "r0.json", rank0_events(), distributedInfo={**info, "rank": 0}, deviceProperties=H100)
    write_trace(job / "r1.json", rank1_events(), distributedInfo={**info, "rank": 1}, deviceProperties=H100)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACELAKE_LAKE", raising=False)
    runner = CliRunner()
    assert runner.invoke(app, ["ingest", "job", "-q"]).exit_code == 0

    def commands(*args, env=None):
        r = runner.invoke(app, ["analyze", "--json", "-q", *args], env=env)
        assert r.exit_code == 0, r.output
        return [f["timeline"]["command"] for f in json.loads(r.stdout)["findings"]]

    import shutil

    plain = commands()
    assert plain and all(c.startswith("tracelake timeline --run job --around ") for c in plain)
    assert commands("--lake", "./.tracelake") == plain
    shutil.copytree(tmp_path / ".tracelake", tmp_path / "my lake")
    assert commands("--lake", "my lake") == [
        c.replace("tracelake timeline ", "tracelake timeline --lake 'my lake' ", 1) for c in plain
    ]
    other = {"TRACELAKE_LAKE": str(tmp_path / "my lake")}
    assert commands("--lake", ".tracelake", env=other) == [
        c.replace("tracelake timeline ", "tracelake timeline --lake .tracelake ", 1) for c in plain
    ]


def test_run_timeline_skips_a_run_of_logs_alone(tmp_path):
    """A batch whose NCCL log is a run of its own (another job: it shares no process with the
    traces): `run --timeline` writes the traces' timeline, says the log's run has none, exit 0."""
    import shutil

    from conftest import REPO

    d = tmp_path / "multi"
    shutil.copytree(REPO / "sample_traces" / "hta_trace_filter", d / "a")
    shutil.copy(corpus("nccl", "aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"), d)
    out = tmp_path / "r.md"
    r = CliRunner().invoke(
        app, ["run", str(d), "--lake", str(tmp_path / "lake"), "-o", str(out), "--timeline"]
    )
    assert r.exit_code == 0, r.output
    assert "run multi: no GPU work, so no timeline" in r.stderr
    assert (tmp_path / "r.a.timeline.json.gz").exists() and not list(tmp_path.glob("r.multi*"))
