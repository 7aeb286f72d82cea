"""Bus bandwidth against the line rate NCCL states, the busbw cliff, topology anomalies and NCCL
configuration drift between the ranks of one job (pipeline/diagnosis/link_findings.py,
queries/nccl_tests_bandwidth.sql, views/50_nccl.sql nccl_line_rate and nccl_process_settings).
Expected values are read from the corpus files by hand (lines cited) or from copies changed in one
place, as the finding must then name that place."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import corpus

from pipeline.analyze import analyze
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

ISSUE_350 = "nccl-tests-issue-350-a100-cx5-200g-topo-graph-net-speed-and-gather-perf-same-run.log"
ISSUE_256 = "nccl-tests-issue-256-h200-cx7-400g-topo-dump-xml-speed-and-allreduce-baremetal-vs-vm.log"
EKS = "aws-eks-efa-t4-2rank-nccl2.12.7-init-and-ncclTests.log"
OCI = "ncclTests-oci-a100-16rank-roce-allreduce.txt"


def _lake(tmp_path: Path, *files: Path, name: str = "lake") -> Lake:
    lake = Lake(tmp_path / f"lake_{name}")
    res = ingest_paths(list(files), lake, run="job")
    assert {r.status for r in res} == {"ok"}, [r.error for r in res]
    return lake


def _findings(lake: Lake) -> dict[str, dict]:
    return {f["kind"]: f for f in analyze(lake)["findings"]}


def _bw(lake: Lake) -> dict[tuple, dict]:
    cur = connect(lake).execute("SELECT * FROM nccl_tests_bandwidth")
    cols = [d[0] for d in cur.description]
    return {(r["test"], r["placement"]): r for r in (dict(zip(cols, x)) for x in cur.fetchall())}


def test_issue_350_busbw_against_the_nic_and_the_cliff(tmp_path):
    lake = _lake(tmp_path, corpus("nccl", ISSUE_350))
    bw = _bw(lake)
    # channels go "via NET/IB/1/GDRDMA" (line 54): NET/1 = mlx5_2 (line 14), "+ NET[25.0] - NET/1" (line 29)
    oop, inp = bw[("gather_perf", "out_of_place")], bw[("gather_perf", "in_place")]
    assert (oop["link_kind"], oop["link_peak_gbps"], oop["nics"], oop["nic_names"]) == (
        "nic",
        25.0,
        1,
        "mlx5_2",
    )
    # best busbw by hand from the table (lines 88-172): out-of-place 20.87 (line 89), in-place 23.61
    assert oop["peak_busbw_gbps"] == 20.87 and inp["peak_busbw_gbps"] == 23.61
    assert inp["busbw_pct_of_link"] == pytest.approx(100 * 23.61 / 25)
    # NCCL's own ring estimate: "Pattern 4, crossNic 0, nChannels 1, bw 24.000000/24.000000" (line 38)
    assert inp["nccl_expected_gbps"] == 24.0 and inp["busbw_pct_of_expected"] == pytest.approx(
        100 * 23.61 / 24
    )
    assert "200.0 Gb/s = 25.0 GB/s each, the ones NCCL's channels use" in oop["link_note"]

    # the cliff, read from the file: out-of-place busbw by size
    table = [
        (int(m.group(1)), float(m.group(2)))
        for m in re.finditer(
            r"^\s+(\d{9,})\s+\d+\s+float\s+none\s+0\s+\S+\s+\S+\s+(\S+)",
            corpus("nccl", ISSUE_350).read_text(),
            re.M,
        )
    ]
    assert len(table) == 85
    below = [b for s, b in table if s < 6 * 2**30]
    after = [b for s, b in table if s >= 6 * 2**30]
    assert min(below) > 16.5 and max(after) < 12.5  # 68-94 % of the NIC, then about 45 %
    f = _findings(lake)["nccl_cliff"]
    oop_line = next(e for e in f["evidence"] if e.startswith("gather_perf out-of-place"))
    assert "from 6 GiB on (38 sizes" in oop_line and "of the 25 GB/s the NICs give (mlx5_2)" in oop_line
    assert len(after) == 38
    # mlx5_0, the 25 Gb/s RoCE port (line 33), beside the 200 Gb/s mlx5_2, unused by the channels
    slow = _findings(lake)["nccl_slow_nic"]["evidence"]
    assert slow == [
        "mlx5_0 on node01: 3.125 GB/s (25 Gb/s) beside mlx5_2 at 25 GB/s (200 Gb/s); NCCL's channels do not "
        "use it"
    ]


def test_tree_busbw_above_the_ring_bound_is_not_a_fault(tmp_path):
    """nccl-tests#256: 488.81 GB/s (line 28) beside 400 Gb/s NICs (lines 80-102: 50 GB/s each, the
    dump lists 3 before the poster cut it): above the NICs' ring bound, which Tree/NVLS-Tree on 2
    nodes can pass; said so in the note, no low-bandwidth finding."""
    lake = _lake(tmp_path, corpus("nccl", ISSUE_256))
    r = _bw(lake)[("all_reduce_perf", "out_of_place")]
    assert r["peak_busbw_gbps"] == 488.81 and r["nic_gbps"] == 50.0 and r["nics"] == 3
    assert (
        "busbw above it: NCCL's Tree or NVLS-Tree on few nodes can pass the network bound" in r["link_note"]
    )
    assert not any(k.endswith("low_busbw") for k in _findings(lake))


def test_line_rate_unknown_is_said_never_guessed(tmp_path):
    """The OCI nccl-tests run spans 2 nodes (device lines 7-22) and states no NIC speed."""
    lake = _lake(tmp_path, corpus("nccl", OCI))
    r = _bw(lake)[("all_reduce_perf", "out_of_place")]
    assert r["link_peak_gbps"] is None and r["link_kind"] is None
    assert r["link_note"] == "spans 2 nodes: line rate unknown: run with NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET"


def _split_eks(d: Path, change=None) -> list[Path]:
    """The aws-eks log split the way NCCL_DEBUG_FILE=nccl.%h.%p writes it: one file per mpirun rank
    ([1,0] node01:21, [1,1] node02:21); change(rank, line) may rewrite a line of one rank's file."""
    d.mkdir()
    out = {0: [], 1: []}
    for line in corpus("nccl", EKS).read_text().split("\n"):
        m = re.match(r"\[1,(\d)\]<std\w+>:", line)
        if m:
            r = int(m.group(1))
            out[r].append(change(r, line) if change else line)
    paths = []
    for r, lines in out.items():
        p = d / f"nccl.node0{r + 1}.21.log"
        p.write_text("\n".join(x for x in lines if x is not None) + "\n")
        paths.append(p)
    return paths


def test_configuration_drift_names_the_variable_and_the_ranks(tmp_path):
    same = _lake(tmp_path, *_split_eks(tmp_path / "same"), name="same")
    assert "nccl_drift" not in _findings(same)  # lines 33-34: NCCL_SHM_DISABLE 0 on both ranks

    def shm(rank, line):
        return (
            line.replace(
                "NCCL_SHM_DISABLE set by environment to 0.", "NCCL_SHM_DISABLE set by environment to 1."
            )
            if rank == 1
            else line
        )

    files = _split_eks(tmp_path / "changed", shm)
    at = [_line_of(f, "NCCL_SHM_DISABLE") for f in files]  # where each rank's file states it
    changed = _lake(tmp_path, *files, name="changed")
    ev = _findings(changed)["nccl_drift"]["evidence"]
    assert ev == [
        f"NCCL_SHM_DISABLE: 0 on node01:21 (rank 0), nccl.node01.21.log line {at[0]}; "
        f"1 on node02:21 (rank 1), nccl.node02.21.log line {at[1]}"
    ]

    def gone(rank, line):
        return None if rank == 1 and "NCCL_SHM_DISABLE" in line else line

    files = _split_eks(tmp_path / "unset", gone)
    assert "Init COMPLETE" in files[1].read_text()  # node02's init still completes (the log's line 51)
    ev = _findings(_lake(tmp_path, *files, name="unset"))["nccl_drift"]["evidence"]
    assert ev == [
        "NCCL_SHM_DISABLE: (unset) on node02:21 (rank 1): its init completed without it; "
        f"0 on node01:21 (rank 0), nccl.node01.21.log line {_line_of(files[0], 'NCCL_SHM_DISABLE')}"
    ]


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().split("\n"), 1) if text in line)


def test_drift_of_the_algorithm_chosen_for_one_size(tmp_path):
    """Each rank's log gains one TUNING line in the 2.30 grammar (nvidia-nccl-docs logging example,
    line 78: "AllReduce: 33554432 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}"); rank 1
    chose TREE/LL128 for the same size."""
    tuning = (
        "node0{n}:21:27 [0] NCCL INFO AllReduce: 33554432 Bytes -> Algo {a} proto {p} "
        "channel{{Lo..Hi}}={{0..31}}"
    )

    def add(rank, line):
        if "Init COMPLETE" in line:
            a, p = ("RING", "SIMPLE") if rank == 0 else ("TREE", "LL128")
            return line + "\n" + tuning.format(n=rank + 1, a=a, p=p)
        return line

    f = _findings(_lake(tmp_path, *_split_eks(tmp_path / "algo", add), name="algo"))
    ev = f["nccl_drift"]["evidence"]
    assert len(ev) == 1 and ev[0].startswith(
        "algorithm AllReduce 33554432 B: RING/SIMPLE on node01:21 (rank 0)"
    )
    assert "; TREE/LL128 on node02:21 (rank 1)" in ev[0]


def test_a_rank_on_sockets_where_its_peers_use_the_nic(tmp_path):
    def sock(rank, line):
        return line.replace("via NET/AWS Libfabric/0", "via NET/Socket/0") if rank == 1 else line

    lake = _lake(tmp_path, *_split_eks(tmp_path / "sock", sock))
    f = _findings(lake)
    ev = f["nccl_mixed_transport"]["evidence"]
    assert ev == ["NET/AWS Libfabric on node01:21; NET/Socket on node02:21"]
    assert f["nccl_drift"]["evidence"][0].startswith("net_transport: NET/AWS Libfabric on node01:21 (rank 0)")


def test_far_nic_and_slow_path_from_changed_graph_lines(tmp_path):
    """nccl-tests#350 with its channels moved to NET/0 (line 54 on: via NET/IB/0): mlx5_0's path
    from GPU/81000 is SYS (line 35: "NET/0 (4/3.125000/SYS)") while NET/1 is PHB: a far NIC chosen.
    And with line 35's path to NET/1 cut to 0.2 GB/s: slower than the 25 GB/s NIC."""
    text = corpus("nccl", ISSUE_350).read_text()
    far = tmp_path / "far" / "job.log"
    far.parent.mkdir()
    far.write_text(text.replace("via NET/IB/1/", "via NET/IB/0/"))
    f = _findings(_lake(tmp_path, far, name="far"))
    assert f["nccl_far_nic"]["evidence"] == [
        "GPU/81000 on node01: channels use mlx5_0 (path SYS) while mlx5_2 is PHB (line 35)"
    ]
    slow = tmp_path / "slow" / "job.log"
    slow.parent.mkdir()
    slow.write_text(text.replace("NET/1 (3/24.000000/PHB)", "NET/1 (3/0.200000/PHB)", 1))
    f = _findings(_lake(tmp_path, slow, name="slow"))
    assert f["nccl_slow_path"]["evidence"] == [
        "GPU/81000 to mlx5_2 on node01: 0.2 GB/s over 3 link(s) (PHB) against the NIC's 25 GB/s (line 35)"
    ]


def test_report_json_carries_the_line_rate(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "run",
            str(corpus("nccl", ISSUE_350)),
            "--lake",
            str(tmp_path / "l"),
            "-o",
            str(out),
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    kinds = [f["kind"] for run in doc["runs"] for f in run["findings"]]
    assert "nccl_cliff" in kinds


def test_traced_collectives_across_hosts_against_the_nic(tmp_path):
    """sample_traces' ranks 0 and 1 of a 128-rank job (their collectives span hosts: no NVLink peak)
    beside an NCCL log for rank 0's process (pid 4037, the trace's cpu_ops) made of nccl-tests#350's
    NCCL lines with their prefix's host:pid changed: rank 0's calls are held against that log's
    25 GB/s NIC (mlx5_2, the one its channels use); rank 1 has no log, so no peak."""
    root = Path(__file__).resolve().parent.parent
    job = tmp_path / "job"
    job.mkdir()
    for f in (root / "sample_traces" / "hta_trace_filter").glob("*.json.gz"):
        (job / f.name).write_bytes(f.read_bytes())
    lines = [
        line.replace("node01:101855:", "nodeA:4037:", 1)
        for line in corpus("nccl", ISSUE_350).read_text().split("\n")
        if line.startswith("node01:101855:")
    ]
    (job / "nccl.nodeA.4037.log").write_text("\n".join(lines) + "\n")
    lake = _lake(tmp_path, job)
    doc = analyze(lake)
    assert doc["runs"][0]["nccl_matching"]["logs"][0]["ranks"] == [0]
    rows = doc["collectives_per_rank"]
    r0 = [r for r in rows if r["rank"] == 0 and r["busbw_gbps"] is not None]
    r1 = [r for r in rows if r["rank"] == 1]
    assert r0 and all(r["link_kind"] == "nic" and r["link_peak_gbps"] == 25.0 for r in r0)
    assert all(r["busbw_util_pct"] == pytest.approx(100 * r["busbw_gbps"] / 25.0) for r in r0)
    assert r1 and all(r["link_peak_gbps"] is None and r["link_kind"] is None for r in r1)
