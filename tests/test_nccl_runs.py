"""NCCL-family files placed into runs by their own identity (pipeline/ingest/runs.py rule 4) and
matched to the traced ranks of their run (queries/views/50_nccl.sql nccl_log_match, the analysis's
runs[].nccl_matching, the report's list under the run summary). Expected groupings are read by
hand from the files (lines cited)."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import CORPUS, REPO
from typer.testing import CliRunner

from pipeline.analyze import analyze
from pipeline.cli import app
from pipeline.diagnosis.nccl_findings import findings
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect
from pipeline.report import markdown
from pipeline.report.document import build

NCCL = CORPUS / "nccl"

# Which corpus files are one job, written by hand from the files (PROVENANCE.md: 29 excerpts of
# unrelated jobs). No two files share a commId / comm hash or a host:pid, so each is a job of its
# own. What identifies each (or that nothing does):
JOBS = [
    # node01:21 and node02:21 (lines 8, 17), NCCL 2.12.7 (line 16), Init COMPLETE without commId
    ["aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"],
    # no host or pid: [rankN]: watchdog lines only (lines 1-5)
    ["basicsr-issue-737-torch-watchdog-timeout-allreduce.log"],
    # no host or pid: [rankN]: watchdog lines only
    ["llamafactory-issue-6269-torch-watchdog-timeout-reduce-scatter-base.log"],
    # node02:4015539, node02:4015540, node01:1789225 (lines 1, 2, 11); no commId
    ["nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log"],
    # node01:615, node02:22754, node03:619 (lines 1-3: COLL lines, no commId)
    ["nccl-issue-1193-coll-allreduce-ray-prefix-128rank.log"],
    # node01:3468 (line 1)
    ["nccl-issue-1405-warn-net-ib-completion-status12-error-chain.log"],
    # node01:2017630, commId 0x49bbd7790311d5eb (line 2)
    ["nccl-issue-1412-init-complete-and-init-timings-16rank.log"],
    # node01:227602 (line 1), nRanks 24 (line 4); no commId
    ["nccl-issue-1453-init-h100-3node-nvls-heads-rings-truncated.log"],
    # node01:88 (line 4)
    ["nccl-issue-1657-torch-processgroupnccl-init-env-and-nccl-bootstrap.log"],
    # pid 12079 without a host, CommHash 6479621443159067765 = 0x59ec3d5f3e800c75 (line 3)
    ["nccl-issue-1765-profiler-example-plugin-trace-truncated.json.txt"],
    # node05:980/982/983/984, commId 0x5ae77eb5ea4ec1ee (lines 7-10)
    ["nccl-issue-1814-init-complete-nvls-64rank-then-ib-status12.log"],
    # RAS: comm hash fa93daea854b060b (line 24), process 323032 on node 192.0.2.1
    ["nccl-issue-1911-ncclras-text-mismatch-32gpu.txt"],
    # node01:199574 (line 1)
    ["nccl-issue-584-coll-send-recv-nil-buffers.log"],
    # node01:33347 (line 1)
    ["nccl-issue-892-single-node-h800-p2p-direct-pointer-channels.log"],
    # node01:5180-5186 (lines 1-16)
    ["nccl-tests-issue-228-net-ib-using-hca-env-echo.log"],
    # node01:6287-6294, node02:7438-7445 (device lines 6-21) and the VMs' pids (lines 36-51); no NCCL line
    ["nccl-tests-issue-256-h200-cx7-400g-topo-dump-xml-speed-and-allreduce-baremetal-vs-vm.log"],
    # node02:475220, node01:3867861 (lines 2, 3)
    ["nccl-tests-issue-284-socket-transport-info-interleaved-in-table.log"],
    # node01:101855, node02:34424 (device lines 6-7), NCCL 2.16.5 (line 13)
    ["nccl-tests-issue-350-a100-cx5-200g-topo-graph-net-speed-and-gather-perf-same-run.log"],
    # node01:14926, node02:9210 (device lines 4-5), NCCL 2.9.6
    ["nccl-tests-issue-82-legacy-broadcast-header-error-column-socket.txt"],
    # no host or pid: an srun "0: " nccl-tests table only
    ["ncclTests-aws-p5-h100-16rank-efa-srun-prefix.txt"],
    # node01:6899-6906, node02:6733-6740 (device lines 4-19)
    ["ncclTests-gcp-a3mega-h100-16rank-allreduce.txt"],
    # node01:43-50 and node02:43-50 (device lines 7-22)
    ["ncclTests-oci-a100-16rank-roce-allreduce.txt"],
    # node-01 with many pids, NCCL 2.30.3; its commIds are masked as 0x... (line 19): no id
    ["nvidia-nccl-docs-2.30-logging-examples-by-subsystem.log"],
    # no host or pid: legacy [E ProcessGroupNCCL.cpp:737] [Rank N] lines only
    ["ofa-issue-271-torch-watchdog-timeout-legacy-format.log"],
    # Flight Recorder dump: no host, pid or communicator id
    ["pytorch-tutorial-flight-recorder-unpickled-dump-repr.txt"],
    # torchfrtrace report: no host, pid or communicator id
    ["pytorch-tutorial-torchfrtrace-output-missing-rank.txt"],
    # empty host (":5202:5683", line 4): a pid alone names no process; NCCL 2.4.7
    ["tensorflow-issue-34375-nccl-2.4.7-legacy-ring-format-empty-hostname.log"],
    # node01:191370, node01:191369 (lines 1, 2)
    ["torchtitan-issue-1369-coll-allgather-reducescatter-tp2.log"],
    # node01:561, commId 0xa015ae7e0a50005d (line 5)
    ["vllm-issue-8447-init-start-2node-ib-ray-prefix-nccl2.20.5.log"],
]
OFA = "ofa-issue-271-torch-watchdog-timeout-legacy-format.log"
VLLM = "vllm-issue-8447-init-start-2node-ib-ray-prefix-nccl2.20.5.log"


def _groups(lake: Lake) -> tuple[list[list[str]], dict[str, str]]:
    src = lake.sources()
    by_run: dict[str, list[str]] = {}
    run_of = {}
    for run, path in zip(src["run_id"].to_list(), src["path"].to_list()):
        by_run.setdefault(run, []).append(Path(path).name)
        run_of[Path(path).name] = run
    return sorted(sorted(v) for v in by_run.values()), run_of


def _timeout(con, run_id: str) -> list[str]:
    (f,) = [f for f in findings(con, run_id) if f["title"] == "Collective timed out (hang)"]
    return f["evidence"]


def test_corpus_folder_is_one_run_per_job(tmp_path):
    """The whole corpus folder in one call: one run per job of the hand-written table; the first
    file (in path order) keeps the folder's name, the others are moved with a note. The ofa-issue-271
    hang finding is the one of that log alone (it no longer names ranks of other jobs' logs)."""
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([NCCL], lake)
    assert {r.status for r in res} == {"ok"} and len(res) == 29
    groups, run_of = _groups(lake)
    assert groups == sorted(sorted(g) for g in JOBS)
    assert run_of["aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"] == "nccl"
    moved = next(r for r in res if Path(r.path).name == OFA)
    assert moved.run_id.startswith("nccl_") and len(moved.run_id) == len("nccl_") + 8
    assert any("this file was put in run " + moved.run_id in n for n in moved.notes)

    alone = Lake(tmp_path / "alone")
    ingest_paths([NCCL / OFA], alone, run="alone")
    want = _timeout(connect(alone), "alone")
    assert _timeout(connect(lake), run_of[OFA]) == want
    # lines 1-5: ranks 1, 3, 2, 6, 7 time out; the log states nothing about enqueued work
    assert want == [
        "ALLREDUCE SeqNum 469508 of process group ? timed out after 1802.2 s on rank(s) 1, 2, 3, 6, 7 "
        f"({OFA}, line 1)"
    ]

    # --run puts them all in one run; the findings still stay within each job
    together = Lake(tmp_path / "together")
    ingest_paths([NCCL], together, run="all")
    con = connect(together)
    # one evidence line per job's timeout (basicsr, llamafactory, ofa), ofa's the one of that log alone
    assert len(_timeout(con, "all")) == 3
    assert [e for e in _timeout(con, "all") if OFA in e] == want
    assert con.execute("SELECT count(DISTINCT job) FROM nccl_jobs").fetchone() == (29,)
    # ingesting the folder again skips every file, wherever it was put
    assert {r.status for r in ingest_paths([NCCL], lake)} == {"skipped"}


def test_per_rank_logs_of_one_job_stay_together(tmp_path):
    """nccl-issue-1814 split the way NCCL_DEBUG_FILE=nccl.%h.%p writes it: one file per process
    (node05:980, 982, 983, 984), each with its Init COMPLETE line naming commId 0x5ae77eb5ea4ec1ee
    (lines 7-10), beside a log of another job (nccl-issue-1412, commId 0x49bbd7790311d5eb): the four
    are one run, the other is moved. A fifth rank's file added later joins them (its identity is
    compared with the stored files')."""
    lines = (NCCL / "nccl-issue-1814-init-complete-nvls-64rank-then-ib-status12.log").read_text().splitlines()
    job = tmp_path / "job"
    job.mkdir()
    pids = sorted({ln.split(":")[1] for ln in lines if ln.startswith("node05:")})
    assert pids == ["980", "982", "983", "984"]
    for pid in pids[:3]:
        (job / f"nccl.node05.{pid}.log").write_text(
            "\n".join(ln for ln in lines if ln.startswith(f"node05:{pid}:")) + "\n"
        )
    shutil.copy(NCCL / "nccl-issue-1412-init-complete-and-init-timings-16rank.log", job / "other.log")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([job], lake)
    assert {Path(r.path).name: r.run_id for r in res if r.run_id == "job"} == {
        f"nccl.node05.{p}.log": "job" for p in pids[:3]
    }
    other = next(r for r in res if Path(r.path).name == "other.log")
    assert other.run_id.startswith("job_") and "shares no communicator and no process" in other.notes[0]
    late = tmp_path / "late" / "job"
    late.mkdir(parents=True)
    (late / "nccl.node05.984.log").write_text(
        "\n".join(ln for ln in lines if ln.startswith("node05:984:")) + "\n"
    )
    (r,) = ingest_paths([late], lake)
    assert r.run_id == "job"


def _trace_pair(tmp_path: Path, pid: str | None) -> tuple[Lake, str]:
    """Rank 0 and rank 1 of sample_traces/hta_trace_filter (world size 128) and the vLLM corpus log
    (node01:561, rank 0 of a 2-rank world communicator, line 5) in one directory; pid: the pid
    the log's 'node01:561:' prefixes are edited to (None: the log as it is)."""
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        shutil.copy(REPO / "sample_traces" / "hta_trace_filter" / f"sampled_rank-{r}.json.gz", job)
    lake = Lake(tmp_path / "lake")
    assert {r.status for r in ingest_paths([job], lake)} == {"ok"}
    text = (NCCL / VLLM).read_text()
    if pid is not None:
        # the one edit: the process of the log's NCCL lines becomes the trace's process
        assert text.count("node01:561:561") == 7
        text = text.replace("node01:561:561", f"node01:{pid}:{pid}")
    (job / "nccl.log").write_text(text)
    (res,) = [r for r in ingest_paths([job], lake) if r.status == "ok"]
    assert res.run_id == "job"  # the log stays with the traces of its directory
    return lake, text


def test_log_matched_to_a_traced_rank_by_host_and_pid(tmp_path):
    job_lake = Lake(tmp_path / "probe")
    ingest_paths([REPO / "sample_traces" / "hta_trace_filter" / "sampled_rank-0.json.gz"], job_lake, run="p")
    # the pid that wrote rank 0's trace, read from the trace itself (its host calls)
    ((pid,),) = connect(job_lake).execute("SELECT pid FROM trace_process WHERE rank = 0").fetchall()
    lake, _ = _trace_pair(tmp_path, str(pid))
    doc = analyze(lake)
    (run,) = doc["runs"]
    m = run["nccl_matching"]
    assert m == {
        "logs": [
            {
                "file": "nccl.log",
                "source_id": m["logs"][0]["source_id"],
                "ranks": [0],
                "matched_by": "host_pid",
            }
        ],
        "unmatched_logs": [],
        "ranks_without_log": [1],
    }
    assert run["hosts"] == ["node01"]  # the traces name no host; the matched log does
    md = markdown.render(build(doc))
    assert "- NCCL log nccl.log: rank 0, matched by host + pid" in md
    assert "- traced rank 1 without an NCCL log" in md


def test_log_that_matches_no_traced_rank_is_listed(tmp_path):
    """The vLLM log as it is: pid 561 is not a traced process, and its world communicator has 2
    ranks against the traces' 128, so rank 0 is not matched on rank either."""
    lake, _ = _trace_pair(tmp_path, None)
    doc = analyze(lake)
    (run,) = doc["runs"]
    m = run["nccl_matching"]
    assert m["unmatched_logs"] == ["nccl.log"] and m["ranks_without_log"] == [0, 1]
    assert m["logs"][0]["ranks"] == [] and m["logs"][0]["matched_by"] is None
    assert run["hosts"] == [] and run["world_size"] == 128  # not node01, not the log's 2
    md = markdown.render(build(doc))
    assert "- NCCL log(s) matching no traced rank: nccl.log" in md
    assert "- traced ranks 0, 1 without an NCCL log" in md


def test_a_run_of_logs_alone_is_analysed_with_kinds_and_no_timeline(tmp_path):
    """The ofa-issue-271 watchdog log alone: analyze() gives its finding a kind (nccl_<check>) and
    no timeline (nothing on a GPU to draw), the run a note that the traces are missing, and the
    Markdown report renders it (an NCCL-log finding without a kind once broke the analysis)."""
    log = CORPUS / "nccl" / "ofa-issue-271-torch-watchdog-timeout-legacy-format.log"
    lake = Lake(tmp_path / "lake")
    assert [r.status for r in ingest_paths([log], lake)] == ["ok"]
    doc = analyze(lake)
    (f,) = doc["findings"]
    # line 1 of the log: "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508"
    assert f["kind"] == "nccl_watchdog_timeout" and f["timeline"] is None
    assert any("NCCL logs only, no trace" in n for n in doc["notes"])
    # the verdict abstains saying the traces are missing, not that they had no GPU activity
    (v,) = doc["verdicts"]
    assert v["verdict"] == "unknown" and v["reason"].startswith("NCCL logs only, no trace")
    md = markdown.render(build(doc))
    assert f["title"] in md and "Timeline:" not in md
    # `run` prints that verdict and the log's finding, as `analyze` does
    r = CliRunner().invoke(
        app, ["run", str(log), "--lake", str(tmp_path / "l2"), "-o", str(tmp_path / "r.md")]
    )
    assert r.exit_code == 0, r.output
    assert f"run {v['run_id']}: unknown — NCCL logs only, no trace" in r.stderr
    assert f"  1. {f['title']} — not timed" in r.stderr.splitlines()


def test_an_unmatched_log_of_a_larger_job_leaves_the_traces_collectives_alone(tmp_path):
    """PARAM's 8 DLRM ranks (distributedInfo world_size 8) with nccl-issue-1412's log of a
    16-rank job (its 'nranks 16' init lines) in one directory: the log matches no traced rank, so
    the collectives keep the traces' world of 8 ranks (expected ranks, completeness, busbw's n,
    the NVLink peak), as the traces ingested alone give them."""
    dlrm = CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto"
    job = tmp_path / "job"
    shutil.copytree(dlrm, job)
    shutil.copy(CORPUS / "nccl" / "nccl-issue-1412-init-complete-and-init-timings-16rank.log", job)

    def calls(src, name):
        lake = Lake(tmp_path / name)
        assert all(r.status == "ok" for r in ingest_paths([str(src)], lake, jobs=1))
        con = connect(lake)
        got = con.execute(
            "SELECT op, call_key, expected_ranks, complete FROM collective_calls ORDER BY ALL"
        ).fetchall()
        bw = con.execute(
            "SELECT rank, op, busbw_gbps, link_peak_gbps FROM collective_bandwidth ORDER BY ALL"
        ).fetchall()
        return got, bw

    with_log, alone = calls(job, "with_log"), calls(dlrm, "alone")
    assert with_log[0] and all(e == 8 and c for _, _, e, c in with_log[0])
    assert with_log == alone


def _beside(tmp_path: Path, traces: list[Path], log: Path) -> Lake:
    """A lake of one directory holding copies of `traces` and `log` (one run), every file ok."""
    job = tmp_path / "job"
    job.mkdir()
    for f in [*traces, log]:
        shutil.copy(f, job)
    lake = Lake(tmp_path / "lake")
    assert all(r.status == "ok" for r in ingest_paths([job], lake, jobs=1))
    return lake


def test_a_finding_only_in_a_log_matching_no_traced_rank_says_so(tmp_path):
    """PARAM's 8 DLRM ranks with nccl-tests-issue-284's output of another job in one directory:
    its lines 4-6 ('node01:3867861:3867877 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via
    NET/Socket/0') are host node01, pid 3867861, none of the DLRM traces' pids (59811-59818, their
    cpu_op events), and the log matches no traced rank. Its socket finding is still shown, marked as
    seen only in that log, ranked after the traces' findings and not high."""
    log = CORPUS / "nccl" / "nccl-tests-issue-284-socket-transport-info-interleaved-in-table.log"
    traces = sorted((CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto").glob("*.json"))
    doc = analyze(_beside(tmp_path, traces, log))
    (run,) = doc["runs"]
    assert run["nccl_matching"]["unmatched_logs"] == [log.name]
    (f,) = [f for f in doc["findings"] if f["kind"] == "nccl_socket_transport"]
    assert f["title"].endswith("(in a log matching no traced rank)") and f["severity"] == "moderate"
    assert f["evidence"][0].startswith(f"seen only in {log.name}, which matched no traced rank of this run")
    trace_kinds = {"host_idle", "straggler", "input_idle"}
    ranks = {g["kind"]: i for i, g in enumerate(doc["findings"])}
    assert all(ranks[k] < ranks["nccl_socket_transport"] for k in trace_kinds & ranks.keys())


def test_a_log_of_another_gpu_is_not_matched_by_rank(tmp_path):
    """HTA's df_index_resolver trace (distributedInfo rank 1 of world_size 2, deviceProperties
    'Tesla V100-SXM2-32GB') beside the aws-eks-efa log of another 2-rank job, whose nccl-tests
    device list says 'Rank  1 Group  0 Pid     21 on node02 device  0 [0xf5] Tesla T4' (line 7):
    the rank and world size agree, the GPU does not, so the log is not this rank's (it was
    matched by rank, and its GDR finding and NCCL version became the run's)."""
    log = CORPUS / "nccl" / "aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"
    trace = CORPUS / "hta" / "tests" / "data" / "df_index_resolver" / "df_index_resolver.json.gz"
    lake = _beside(tmp_path, [trace], log)
    con = connect(lake)
    assert con.execute("SELECT DISTINCT rank, name FROM devices").fetchall() == [(1, "Tesla V100-SXM2-32GB")]
    assert ("node02", 1, "Tesla T4") in con.execute(
        "SELECT host, rank, gpu_name FROM nccl_processes"
    ).fetchall()
    assert con.execute("SELECT count(*) FROM rank_nccl").fetchone() == (0,)
    doc = analyze(lake)
    (run,) = doc["runs"]
    assert run["nccl_matching"]["unmatched_logs"] == [log.name]
    nccl = [f for f in doc["findings"] if f["kind"].startswith("nccl_")]
    assert nccl and all(f["title"].endswith("(in a log matching no traced rank)") for f in nccl)
