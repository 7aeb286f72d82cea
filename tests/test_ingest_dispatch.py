"""One `tracelake ingest` over mixed inputs: each file goes to its format's parser (Kineto,
Nsight Systems, NCCL family), directory search takes text files only when they look like NCCL
output, and a named file that is none of these fails with one line without stopping the batch."""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import CORPUS

from pipeline.ingest import discover, ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

NCCL = CORPUS / "nccl"


def test_whole_nccl_corpus_directory(tmp_path):
    lake = Lake(tmp_path / "lake")
    files = sorted(p.name for p in NCCL.iterdir() if p.name != "PROVENANCE.md")
    res = ingest_paths([NCCL], lake, run="nccl")
    assert sorted(Path(r.path).name for r in res) == files  # PROVENANCE.md is not NCCL output: not taken
    assert all(r.status == "ok" for r in res), [(r.path, r.error) for r in res if r.status != "ok"]
    con = connect(lake)
    fmt = dict(con.execute("SELECT regexp_extract(path, '[^/]+$'), format FROM sources").fetchall())
    # formats as PROVENANCE.md describes the files
    assert fmt["ncclTests-oci-a100-16rank-roce-allreduce.txt"] == "nccl_tests"
    assert fmt["ofa-issue-271-torch-watchdog-timeout-legacy-format.log"] == "torch_watchdog"
    assert fmt["nccl-issue-1911-ncclras-text-mismatch-32gpu.txt"] == "nccl_ras"
    assert fmt["pytorch-tutorial-flight-recorder-unpickled-dump-repr.txt"] == "flight_recorder"
    assert fmt["nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log"] == "nccl_log"
    # logs claim no rank: nothing moved to another run, sources.rank stays null
    assert con.execute("SELECT count(DISTINCT run_id), count(rank) FROM sources").fetchone() == (1, 0)


def test_mixed_batch_and_text_discovery(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(CORPUS / "nsys" / "pipit" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite", d)
    shutil.copy(NCCL / "nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log", d)
    (d / "README.txt").write_text("notes about this job\n")
    (d / "stdout.log").write_text("epoch 1 loss 0.3\nepoch 2 loss 0.2\n")
    assert sorted(p.name for p in discover([d])) == [
        "nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log",
        "saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    ]
    lake = Lake(tmp_path / "lake")
    res = {Path(r.path).name: r for r in ingest_paths([d, d / "README.txt"], lake)}
    assert res["saxpy-mpi-cuda_nsys_perlmutter0.sqlite"].status == "ok"
    assert res["nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log"].status == "ok"
    bad = res["README.txt"]
    assert bad.status == "failed" and "\n" not in bad.error
    assert bad.error.startswith("not a Kineto trace, Nsight Systems export or NCCL-family log")
