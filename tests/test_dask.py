"""Ingest and analysis on an existing Dask cluster (`--scheduler ADDRESS`): a dask.distributed
LocalCluster (in-process workers, so the test stays fast) parses and stages the files, this process
commits them: the lake equals the serial one, table by table. Analysis runs one task per run
(pipeline/analyze_cluster.py) and the merged document equals analyze(lake) on one machine."""

from __future__ import annotations

import copy
import functools
import io
import json
import shutil
import tarfile

import distributed  # the `dask` extra, part of the test extra
import pytest
from conftest import REPO, corpus, lake_rows
from typer.testing import CliRunner

from pipeline import query
from pipeline.analyze import analyze, assemble
from pipeline.analyze_cluster import analyze_on_cluster
from pipeline.analyze_doc import LIST_KEYS
from pipeline.cli import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, app
from pipeline.cli.analysis_cmd import _timeline_lake
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None
    ) as c:
        yield c


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("in")
    job = d / "job"
    job.mkdir()
    for f in sorted(corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto").glob("worker*.json"))[:4]:
        shutil.copy(f, job / f.name)
    (job / "bad.json").write_bytes(b'{"traceEvents": [')
    with tarfile.open(d / "more.tar", "w") as t:
        data = corpus("hta", "tests", "data", "trace_filter", "sampled_rank-1.json.gz").read_bytes()
        info = tarfile.TarInfo("other/sampled_rank-1.json.gz")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return [job, d / "more.tar"]


def test_cluster_ingest_equals_serial(cluster, inputs, tmp_path):
    serial, remote = Lake(tmp_path / "serial"), Lake(tmp_path / "remote")
    a = ingest_paths(inputs, serial)
    b = ingest_paths(inputs, remote, scheduler=cluster.scheduler_address)
    assert [(r.path, r.status, r.run_id, r.rank, r.error) for r in a] == [
        (r.path, r.status, r.run_id, r.rank, r.error) for r in b
    ]
    assert sorted(r.status for r in b) == ["failed"] + ["ok"] * 5
    assert lake_rows(serial) == lake_rows(remote)
    # again: everything is skipped, on the cluster too
    again = ingest_paths(inputs, remote, scheduler=cluster.scheduler_address)
    assert sorted(r.status for r in again) == ["failed"] + ["skipped"] * 5
    assert lake_rows(serial) == lake_rows(remote)


def test_cli_scheduler_option(cluster, inputs, tmp_path):
    from typer.testing import CliRunner

    r = CliRunner().invoke(
        app,
        [
            "ingest",
            str(inputs[0]),
            "--lake",
            str(tmp_path / "lake"),
            "--scheduler",
            cluster.scheduler_address,
        ],
    )
    assert r.exit_code == EXIT_PARTIAL, r.output
    assert "ingested 4, failed 1" in r.output and "bad.json: truncated JSON" in r.output


# ---------------------------------------------------------------- analysis, one task per run


@pytest.fixture(scope="module")
def one_thread():
    """DuckDB on one thread, here and in the (in-process) workers. On all cores, where a query has
    ties the winner depends on thread timing: kernels of equal total_ns in top_kernels and
    step_kernels (ORDER BY run_id, total_ns DESC), two ranks starting a collective in the same µs
    (arg_max(rank, start_ns): the straggler, then stragglers and findings). On these traces
    analyze(lake) then differs from itself from one call to the next, so no exact comparison of two
    analyses can hold. On one thread the scan order is the parts' order, the same for a run alone
    as in the whole lake, and the documents are identical (floats included: no tolerance; see
    _dump for the one exception). Module-scoped: from the first test that asks, to the module's end."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(query, "connect", functools.partial(query.connect, threads=1))
        yield


@pytest.fixture(scope="module")
def runs_lake(inputs, tmp_path_factory):
    """A lake of four runs of real traces: job (4 ranks of a DLRM job and a truncated file), other
    (a tar member), hta_trace_filter (sample_traces/: 2 ranks of a 128-rank NCCL job) and broken
    (one file, which failed)."""
    d = tmp_path_factory.mktemp("runs")
    (d / "broken").mkdir()
    (d / "broken" / "rank0.json").write_bytes(b"not json")
    # sample_traces/ copied beside the other inputs: its rank 1 has the tar member's content, and a
    # batch takes its files in path order, so which of the two holds it must not depend on where
    # the repository lies (it is skipped in hta_trace_filter, as the tar's path comes first)
    shutil.copytree(REPO / "sample_traces" / "hta_trace_filter", d / "hta_trace_filter")
    lake = Lake(d / "lake")
    res = ingest_paths([*inputs, d / "hta_trace_filter", d / "broken"], lake)
    assert sorted({r.run_id for r in res}) == ["broken", "hta_trace_filter", "job", "other"]
    return lake


def _dump(doc: dict) -> str:
    """The document as sorted JSON, kernels of equal total_ns in name order: top_kernels.sql and
    step_kernels.sql order by (run_id, total_ns DESC) only, and the order of ties follows DuckDB's
    hash table, which holds one run's kernels or every run's (the same ties come out in another
    order, even on one thread)."""
    doc = dict(doc)
    for k in ("top_kernels", "step_kernels") & doc.keys():
        doc[k] = sorted(doc[k], key=lambda r: (r["run_id"], -r["total_ns"], r["name"], r["category"]))
    return json.dumps(doc, sort_keys=True)


# options other than the defaults, to see them reach the workers; the CLI flags that give them
OPTS = dict(window="hta", kernel_wait_threshold_ns=20_000, top_n=20, peak_tflops=312.0)
OPT_ARGS = ["--window", "hta", "--kernel-wait-us", "20", "--peak-tflops", "312"]


@pytest.fixture(scope="module")
def local_doc(runs_lake, one_thread):
    return analyze(runs_lake, keep=False, **OPTS)  # computed here, nothing kept


def test_cluster_analysis_equals_local(cluster, runs_lake, local_doc, one_thread, tmp_path):
    local = local_doc
    lake = Lake(tmp_path / "lake")
    shutil.copytree(runs_lake.root, lake.root)
    shutil.rmtree(lake.root / "results", ignore_errors=True)
    # every run a task on the workers (keep=False: nothing read back, nothing kept)
    doc, failures = analyze_on_cluster(lake, cluster.scheduler_address, keep=False, **OPTS)
    assert failures == []
    assert [r["run_id"] for r in doc["runs"]] == ["hta_trace_filter", "job", "other"]
    assert _dump(doc) == _dump(local)
    assert list(doc) == list(local)  # same keys, in the same order
    # each failed source once (each was in one run's task), not once per task
    assert sum(": not ingested: " in n for n in doc["notes"]) == 2
    assert not (lake.root / "results").exists()
    # the workers keep each run's result in the lake; the next analysis reads them back, and
    # one run's kept result goes on serving after another run's is removed
    kept, failures = analyze_on_cluster(lake, cluster.scheduler_address, **OPTS)
    assert failures == [] and _dump(kept) == _dump(local)
    runs_kept = sorted(p.name for p in (lake.root / "results").iterdir() if p.is_dir())
    assert runs_kept == ["broken", "hta_trace_filter", "job", "other"]
    shutil.rmtree(lake.root / "results" / "job")
    again, failures = analyze_on_cluster(lake, cluster.scheduler_address, **OPTS)
    assert failures == [] and _dump(again) == _dump(local)


def test_cli_analyze_and_report_scheduler(cluster, runs_lake, local_doc, one_thread):
    from pipeline.report import document, markdown

    runner = CliRunner()
    lake = ["--lake", str(runs_lake.root), *OPT_ARGS]
    a = runner.invoke(app, ["analyze", "--json", *lake])  # computed here and kept
    # --recompute: every run a task on the cluster, the kept results not read
    b = runner.invoke(
        app, ["analyze", "--json", *lake, "--recompute", "--scheduler", cluster.scheduler_address]
    )
    assert a.exit_code == b.exit_code == EXIT_OK, b.output
    # the CLI's findings name --lake in their timeline commands (the lake is not the default)
    expected = _timeline_lake(copy.deepcopy(local_doc), str(runs_lake.root))
    assert _dump(json.loads(a.stdout)) == _dump(json.loads(b.stdout)) == _dump(expected)
    assert [r["run_id"] for r in json.loads(b.stdout)["runs"]] == ["hta_trace_filter", "job", "other"]
    r = runner.invoke(app, ["report", "--format", "md", *lake, "--scheduler", cluster.scheduler_address])
    assert r.exit_code == EXIT_OK, r.output
    assert r.stdout == markdown.render(document.build(expected, None))


def test_cli_run_scheduler(cluster, tmp_path, one_thread):
    """`run --scheduler`: ingest and analysis on the cluster, the same report as on one machine."""
    runner = CliRunner()
    src = REPO / "sample_traces" / "hta_trace_filter"
    a = runner.invoke(app, ["run", str(src), "--lake", str(tmp_path / "a"), "-o", str(tmp_path / "a.html")])
    b = runner.invoke(
        app,
        [
            "run",
            str(src),
            "--lake",
            str(tmp_path / "b"),
            "-o",
            str(tmp_path / "b.html"),
            "--scheduler",
            cluster.scheduler_address,
        ],
    )
    assert a.exit_code == b.exit_code == EXIT_OK, b.output
    assert lake_rows(Lake(tmp_path / "a")) == lake_rows(Lake(tmp_path / "b"))
    # the same report but for the lake its timeline commands name (--lake, not the default)
    assert (tmp_path / "a.html").read_text().replace(str(tmp_path / "a"), "LAKE") == (
        tmp_path / "b.html"
    ).read_text().replace(str(tmp_path / "b"), "LAKE")


def test_failed_run_task_keeps_the_others(cluster, runs_lake, local_doc, tmp_path, one_thread):
    """A run whose parts are corrupt fails its task: the other runs are analysed as on one machine,
    one note names the run and the error, the command warns and exits 3."""
    lake = Lake(tmp_path / "lake")
    full = _timeline_lake(copy.deepcopy(local_doc), str(lake.root))
    shutil.copytree(runs_lake.root, lake.root)
    parts = sorted((lake.root / "gpu_activities" / "run=job").glob("*.parquet"))
    assert parts
    for f in parts:
        f.write_bytes(b"not parquet")
    r = CliRunner().invoke(
        app,
        # --recompute: the corrupt parts are the same sources, so a kept result would hide them
        [
            "analyze",
            "--json",
            "--recompute",
            "--lake",
            str(lake.root),
            "--scheduler",
            cluster.scheduler_address,
            *OPT_ARGS,
        ],
    )
    assert r.exit_code == EXIT_PARTIAL, r.output
    assert "warning: run job: not analysed: the Dask task failed (" in r.stderr
    doc = json.loads(r.stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["hta_trace_filter", "other"]
    for k, v in full.items():
        if k != "notes" and isinstance(v, list):
            assert _dump({k: doc[k]}) == _dump({k: [x for x in v if x["run_id"] != "job"]}), k
    failed = [n for n in doc["notes"] if n.startswith("run job:")]
    assert (
        len(failed) == 1
        and failed[0].startswith("run job: not analysed: the Dask task failed (")
        and "\n" not in failed[0]
    )
    # the job run's failed file keeps its note (written here, as analyze writes it), and only once
    assert [n for n in doc["notes"] if ": not ingested: " in n] == [
        n for n in full["notes"] if ": not ingested: " in n
    ]
    assert [n for n in doc["notes"] if not n.startswith("run job:")] == [
        n for n in full["notes"] if not n.startswith("run job:")
    ]


def test_unreachable_scheduler(runs_lake, monkeypatch):
    import dask

    monkeypatch.setattr("pipeline.cluster.CONNECT_TIMEOUT_S", 1)  # a refused port, retried for 1 s

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        r = CliRunner().invoke(
            app, ["analyze", "--recompute", "--lake", str(runs_lake.root), "--scheduler", "tcp://127.0.0.1:9"]
        )
    assert r.exit_code == EXIT_FAILED
    assert "error: cannot reach the Dask scheduler at tcp://127.0.0.1:9" in r.stderr
    r = CliRunner().invoke(
        app, ["report", "--recompute", "--lake", str(runs_lake.root), "--scheduler", "nonsense://x"]
    )
    assert r.exit_code == EXIT_FAILED
    assert (
        "error: cannot reach the Dask scheduler at nonsense://x: ValueError: unknown address scheme"
        in r.stderr
    )


def test_ingest_unreachable_scheduler(tmp_path, monkeypatch):
    """ingest says which scheduler it could not reach (not 'cannot write to the lake'), writes nothing."""
    import dask

    monkeypatch.setattr("pipeline.cluster.CONNECT_TIMEOUT_S", 1)  # a refused port, retried for 1 s
    src = str(REPO / "sample_traces" / "hta_trace_filter")
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        r = CliRunner().invoke(
            app, ["ingest", src, "--lake", str(tmp_path / "l"), "--scheduler", "tcp://127.0.0.1:9"]
        )
    assert r.exit_code == EXIT_FAILED
    assert "error: cannot reach the Dask scheduler at tcp://127.0.0.1:9" in r.stderr
    r = CliRunner().invoke(app, ["ingest", src, "--lake", str(tmp_path / "l"), "--scheduler", "nonsense://x"])
    assert r.exit_code == EXIT_FAILED
    assert (
        "error: cannot reach the Dask scheduler at nonsense://x: ValueError: unknown address scheme"
        in r.stderr
    )
    assert Lake(tmp_path / "l").sources().height == 0


def test_assemble_puts_each_runs_notes_in_run_order():
    """The document's lists and notes are the runs' own, concatenated in run order; a failed
    task's note (extra_notes) stands where that run's notes would be, and a run without a
    document adds nothing else."""

    def doc(run_id, notes):
        part = {k: [] for k in LIST_KEYS}
        part["runs"] = [{"run_id": run_id}] if run_id != "d" else []
        part["verdicts"] = [{"run_id": run_id}] if run_id != "d" else []
        return {**part, "notes": notes}

    docs = {
        "a": doc("a", ["run a: x", "run a: outlier", "/p/a1: not ingested: e1"]),
        "b": doc("b", ["run b: y", "/p/b1: not ingested: e2", "/p/b2: not ingested: e3"]),
        "d": doc("d", ["/p/d1: not ingested: e5"]),
    }
    m = assemble(dict(window="hta"), ["a", "b", "c", "d"], docs, extra_notes={"c": ["run c: failed"]})
    assert m["window"] == "hta" and m["schema"] == "tracelake.analyze/5"
    assert m["runs"] == [{"run_id": "a"}, {"run_id": "b"}]
    assert [v["run_id"] for v in m["verdicts"]] == ["a", "b"]
    assert m["notes"] == [
        "run a: x",
        "run a: outlier",
        "/p/a1: not ingested: e1",
        "run b: y",
        "/p/b1: not ingested: e2",
        "/p/b2: not ingested: e3",
        "run c: failed",
        "/p/d1: not ingested: e5",
    ]


def test_the_scheduler_check_works_inside_a_running_event_loop(monkeypatch):
    """A notebook (or Playwright's sync API) runs an event loop in the main thread: the handshake
    with the scheduler runs in a thread of its own there, so an unreachable scheduler is still
    said as such, not as 'asyncio.run() cannot be called from a running event loop'."""
    import asyncio

    from pipeline.cluster import SchedulerError, client

    monkeypatch.setattr("pipeline.cluster.CONNECT_TIMEOUT_S", 1)  # a refused port, retried for 1 s

    async def inside() -> str:
        with pytest.raises(SchedulerError) as e:
            client("tcp://127.0.0.1:9")
        return str(e.value)

    msg = asyncio.run(inside())
    assert msg.startswith("cannot reach the Dask scheduler at tcp://127.0.0.1:9: ")
    assert "running event loop" not in msg
