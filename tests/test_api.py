"""The lake from Python (pipeline/api.py, issue 20 point 3) on a corpus run: every metric view
read through it equals what the CLI's connection gives, values against the raw trace, SQL with
parameters, the analysis document, and the README's example run as written."""

from __future__ import annotations

import gzip
import json
import os
import re

import pyarrow as pa
import pytest
from conftest import REPO, corpus, raw_gpu_events
from typer.testing import CliRunner

import pipeline
from pipeline import query
from pipeline.analyze import analyze
from pipeline.cli import app
from pipeline.lake import Lake

TRACES = ("hta", "tests", "data", "trace_filter")


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("api") / ".tracelake"
    assert CliRunner().invoke(app, ["ingest", str(corpus(*TRACES)), "--lake", str(d)]).exit_code == 0
    return d


def _gpu_events(rank: int) -> int:
    """Kernels, copies and memsets of one rank, counted in the raw JSON."""
    return raw_gpu_events(corpus(*TRACES, f"sampled_rank-{rank}.json.gz"))


def test_every_metric_view_and_the_tables_read_as_the_cli_reads_them(lake_dir):
    with pipeline.open_lake(lake_dir) as lake:
        runs = lake.runs()
        assert runs["run_id"].to_list() == ["trace_filter"] and runs.row(0, named=True)["ranks"] == 2
        names = set(lake.names())
        assert set(query.metric_names()) <= names and {"gpu_activities", "sources", "scope"} <= names
        assert not any(n.startswith("_") for n in names)
        con = query.connect(Lake(lake_dir))
        for name in query.metric_names():
            got = lake.df(name, run="trace_filter")
            want = query.run(con, name)
            assert got.columns == want.columns, name
            key = got.columns
            assert got.sort(key, nulls_last=True).equals(want.sort(key, nulls_last=True)), name
        t = lake.arrow("gpu_activities")
        assert isinstance(t, pa.Table) and t.num_rows == _gpu_events(0) + _gpu_events(1)
        per_rank = lake.sql("SELECT count(*) AS n FROM gpu_activities WHERE rank = $rank", {"rank": 1})
        assert per_rank["n"].to_list() == [_gpu_events(1)]
        positional = lake.sql("SELECT count(*) AS n FROM gpu_activities WHERE rank = ?", [0])
        assert positional["n"].to_list() == [_gpu_events(0)]
        with pytest.raises(KeyError, match="no such table or view"):
            lake.df("nope")
        with pytest.raises(ValueError, match="no run_id column"):
            lake.df("device_catalog", run="trace_filter")
    with pytest.raises(FileNotFoundError, match="not a tracelake lake"):
        pipeline.open_lake(lake_dir.parent / "missing")


def test_the_analysis_document_is_analyzes(lake_dir):
    lake = pipeline.open_lake(lake_dir, window="hta")
    doc = lake.analysis()
    assert doc == analyze(Lake(lake_dir), window="hta")
    ranks = {r["rank"]: r for r in doc["ranks"]}
    # HTA's overlap for these files (../shared/reference/hta.md 4.2): rank0 11.81 %, rank1 20.05 %
    assert round(ranks[0]["comm_comp_overlap_pct"], 2) == 11.81
    assert round(ranks[1]["comm_comp_overlap_pct"], 2) == 20.05


def test_the_readme_example_runs_as_written(lake_dir):
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert 'pipeline.open_lake(".tracelake")' in block
    cwd = os.getcwd()
    os.chdir(lake_dir.parent)  # the lake is ./.tracelake, as after `make demo`
    try:
        env: dict = {}
        exec(compile(block, "README.md", "exec"), env)
    finally:
        os.chdir(cwd)
    comm = env["comm"].sort("rank")
    # communication time per rank, brute force over the raw trace's NCCL kernels
    for rank, ms in zip(comm["rank"], comm["comm_ms"]):
        doc = json.load(gzip.open(corpus(*TRACES, f"sampled_rank-{rank}.json.gz")))
        want = sum(
            e["dur"]
            for e in doc["traceEvents"]
            if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")
        )
        assert ms == pytest.approx(want / 1e3, abs=1e-3), rank
    assert env["steps"].height > 0 and env["doc"]["schema"] == "tracelake.analyze/5"


def test_options_are_checked_and_names_are_the_listed_ones(lake_dir):
    from pipeline.sqldoc import listed

    for kw in (
        {"kernel_wait_us": -1},
        {"kernel_wait_us": float("inf")},
        {"kernel_wait_us": "30"},
        {"kernel_wait_us": 1e300},  # issue 39 item 13: accepted
    ):
        with pytest.raises(ValueError, match="kernel_wait_us must be a finite number"):
            pipeline.open_lake(lake_dir, **kw)
    with pytest.raises(ValueError, match="peak_tflops"):
        pipeline.open_lake(lake_dir, peak_tflops=0)
    lake = pipeline.open_lake(lake_dir)
    names = lake.names()
    assert set(names) <= {d.name for d in listed()} and not any(n.startswith("local_") for n in names)
    assert lake.df("STEPS").equals(lake.df("steps"))
    with pytest.raises(ValueError, match="returns no rows"):
        lake.sql("")


def test_runs_counts_the_ranks_of_an_export_of_several_processes(tmp_path):
    """nsys-ai's mfu_2gpu_before.sqlite holds 2 processes with GPU work (KERNEL deviceId 0 and 1,
    PROVENANCE.md), one file: runs() said 1 rank (it counted sources.rank, NULL for such a file)."""
    from pipeline.ingest import ingest_paths

    lake = Lake(tmp_path / "lake")
    assert (
        ingest_paths([corpus("nsys", "nsys-ai", "mfu_2gpu_before.sqlite")], lake, run="two")[0].status == "ok"
    )
    with pipeline.open_lake(lake.root) as s:
        row = s.runs().to_dicts()[0]
    assert (row["run_id"], row["sources"], row["ranks"]) == ("two", 1, 2)


def test_the_readme_whatif_line_runs_on_the_demo_lake(lake_dir):
    """README's what-if command, as written, on the demo's lake (sample_traces/ are these two
    ranks): each of its three changes is answered (it once named rank 7 and flash_fwd kernels,
    which the demo's lake lacks, and stopped with a usage error)."""
    import shlex

    readme = (REPO / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith(".venv/bin/tracelake whatif ")]
    args = shlex.split(line)[1:]
    assert args[args.index("--lake") + 1] == ".tracelake"
    args[args.index("--lake") + 1] = str(lake_dir)
    r = CliRunner().invoke(app, [*args, "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    keys = [c["change"] for c in doc["changes"]]
    assert keys == ["scale kernel:*split_embedding*=0.5", "rank 1 on time", "no launch gaps"], keys
    # the embedding kernels exist in the demo's traces (the scale reaches some work)
    raw = [
        e
        for rank in (0, 1)
        for e in json.load(gzip.open(corpus(*TRACES, f"sampled_rank-{rank}.json.gz")))["traceEvents"]
        if e.get("cat") == "kernel" and "split_embedding" in e["name"]
    ]
    assert raw
