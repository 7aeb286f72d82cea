"""The README's "Your own traces" commands, run as written (issue 19 point 1): each line of its
first code block with its argv as the shell splits it (run in this process by typer's runner),
in a fresh directory, the placeholder paths (`path/to/...`) standing for real traces:
sample_traces/ (Kineto), a corpus Nsight Systems export, and a job directory holding Kineto
traces and an NCCL_DEBUG log together."""

from __future__ import annotations

import re
import shlex
import shutil
import sqlite3
from pathlib import Path

import polars as pl
from conftest import REPO, corpus, raw_gpu_events
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.lake import Lake


def _your_own_traces_block() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Your own traces", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_the_readme_commands_run_as_written(tmp_path, monkeypatch):
    job = tmp_path / "job"  # a one-rank trace of HTA's with an NCCL_DEBUG log beside it
    job.mkdir()
    shutil.copy(corpus("hta", "tests", "data", "nccl_parser_config", "nccl_data.json.gz"), job)
    log = corpus("nccl", "nccl-issue-1189-channels-net-ib-gdrdma-and-p2p-cumem-2node.log")
    shutil.copy(log, job / log.name)
    places = {
        "path/to/job_traces/": str(REPO / "sample_traces" / "hta_trace_filter") + "/",
        "path/to/profile.sqlite": str(corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")),
        "path/to/job/": str(job) + "/",
    }
    lines = _your_own_traces_block()
    assert len(lines) == 4 and all(ln.startswith(".venv/bin/tracelake ") for ln in lines), lines
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a fresh directory: the lake is ./.tracelake
    outputs = []
    for ln in lines:
        cmd = ln
        for k, v in places.items():
            cmd = cmd.replace(k, v)
        argv = shlex.split(cmd)
        assert argv[0] == ".venv/bin/tracelake" and "path/to" not in cmd, cmd
        # the command in this process (typer's runner: the same argv the shell would pass)
        r = CliRunner().invoke(app, argv[1:])
        assert r.exit_code == 0, (ln, r.output)
        outputs.append(r)
    # the three reports, each with its verdict on stderr; one lake, .tracelake, for all of them
    for name in ("report.html", "nsys_report.html", "job_report.html"):
        assert "verdict" in (work / name).read_text()
    assert all("wrote " in p.stderr and "run " in p.stderr for p in outputs[:3])
    assert (work / ".tracelake" / "TRACELAKE").exists() and sorted(x.name for x in work.iterdir()) == [
        ".tracelake",
        "job_report.html",
        "nsys_report.html",
        "report.html",
    ]
    # the sql line: GPU activities per (run, rank) against the inputs themselves: Kineto's
    # kernel / gpu_memcpy / gpu_memset events per file, the export's CUPTI kernel, memcpy,
    # memset and synchronization rows
    got = {
        (m[1], int(m[2])): int(m[3])
        for m in re.finditer(r"│\s*(\S+)\s*┆\s*(\d+)\s*┆\s*(\d+)\s*│", outputs[3].stdout)
    }
    sample = REPO / "sample_traces" / "hta_trace_filter"
    want = {
        ("hta_trace_filter", 0): raw_gpu_events(sample / "sampled_rank-0.json.gz"),
        ("hta_trace_filter", 1): raw_gpu_events(sample / "sampled_rank-1.json.gz"),
        ("job", 0): raw_gpu_events(job / "nccl_data.json.gz"),
    }
    assert {k: v for k, v in got.items() if k[0] != "nsys-ai"} == want, outputs[3].stdout
    con = sqlite3.connect(places["path/to/profile.sqlite"])
    cupti = sum(
        con.execute(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{t}").fetchone()[0]
        for t in ("KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION")
    )
    assert {k[1] for k in got if k[0] == "nsys-ai"} == {0, 1}  # its two GPU processes
    assert sum(v for k, v in got.items() if k[0] == "nsys-ai") == cupti
    # the trace and the NCCL log of one directory are one run
    src = Lake(work / ".tracelake").sources().filter(pl.col("run_id") == "job")
    assert sorted(Path(x).name for x in src["path"]) == sorted([log.name, "nccl_data.json.gz"])
