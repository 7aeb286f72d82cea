"""Parallel ingest (a process pool of the standard library) gives the same lake as the serial
path, table by table; a worker that dies takes only its own file down; the CLI's progress bar
shows files, MB/s and errors."""

from __future__ import annotations

import concurrent.futures as cf
import io
import shutil
import tarfile

import pytest
from conftest import corpus, lake_rows
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TextColumn

import pipeline.ingest as ingest_mod
from pipeline.cli import _RateColumn
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

DLRM = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")
SAMPLED = corpus("hta", "tests", "data", "trace_filter")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """8 ranks of one run, a copy of rank 0 under another name (skipped: same content), a file
    whose rank is taken (moved to its own run), a bad file, and a tar of two more ranks."""
    d = tmp_path_factory.mktemp("in")
    job = d / "job"
    job.mkdir()
    for f in sorted(DLRM.glob("worker*.json")):
        shutil.copy(f, job / f.name)
    shutil.copy(next(DLRM.glob("worker0_*.json")), job / "zz_copy_of_worker0.json")
    shutil.copy(SAMPLED / "sampled_rank-1.json.gz", job / "zz_rank1_other.json.gz")
    (job / "bad.json").write_bytes(b"{not json")
    with tarfile.open(d / "more.tar", "w") as t:
        for f in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
            data = (SAMPLED / f).read_bytes()
            info = tarfile.TarInfo(f"other/{f}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return [job, d / "more.tar"]


def summary(res):
    return [(r.path, r.status, r.run_id, r.rank, r.error, r.notes) for r in res]


def spy_on(monkeypatch, name: str) -> list:
    """Replace the executor ingest_mod.<name> by one that records its jobs argument (returned
    list) and runs the real one."""
    used, real = [], getattr(ingest_mod, name)

    def spy(*a):
        used.append(a[-1])
        yield from real(*a)

    monkeypatch.setattr(ingest_mod, name, spy)
    return used


def test_pool_gives_the_serial_lake(inputs, tmp_path, monkeypatch):
    serial = Lake(tmp_path / "serial")
    res1 = ingest_paths(inputs, serial, jobs=1)
    monkeypatch.setattr(ingest_mod, "PARALLEL_MIN_BYTES", 0)
    used = spy_on(monkeypatch, "run_pool")
    pooled = Lake(tmp_path / "pooled")
    res2 = ingest_paths(inputs, pooled, jobs=2)
    assert used == [2]
    assert summary(res1) == summary(res2)
    statuses = sorted(r.status for r in res1)
    # skipped: the copy of worker0, and more.tar's other/sampled_rank-1 (the same bytes as
    # zz_rank1_other, earlier in the batch: the same trace, whatever run its directory names)
    assert statuses == ["failed"] + ["ok"] * 10 + ["skipped"] * 2
    # a copy of a file in the same batch is named as such, the same with and without the pool
    # (the pool's workers only know the lake as it was before the batch)
    dup = [r for r in res1 if r.path.endswith("zz_copy_of_worker0.json")][0]
    assert dup.notes == ["same content as a file ingested earlier in this batch; --force re-ingests"]
    again = [r for r in ingest_paths(inputs, serial, jobs=1) if r.path.endswith("zz_copy_of_worker0.json")][0]
    assert again.notes == ["already in the lake (same content); --force re-ingests"]
    moved = [r for r in res1 if r.path.endswith("zz_rank1_other.json.gz")][0]
    assert moved.run_id.startswith("job_") and any("already held" in n for n in moved.notes)
    assert lake_rows(serial) == lake_rows(pooled)
    assert not any((pooled.root / ".tmp").iterdir())


def test_threads_give_the_serial_lake(inputs, tmp_path, monkeypatch):
    """Inputs under PARALLEL_MIN_BYTES go to threads of the ingesting process: the same results,
    notes and rows as the serial path."""
    serial = Lake(tmp_path / "serial")
    res1 = ingest_paths(inputs, serial, jobs=1)
    monkeypatch.setattr(ingest_mod, "PARALLEL_MIN_BYTES", 1 << 40)
    monkeypatch.setattr(ingest_mod, "run_pool", None)  # never the pool here
    used = spy_on(monkeypatch, "run_threads")
    threaded = Lake(tmp_path / "threaded")
    res2 = ingest_paths(inputs, threaded, jobs=2)
    assert used == [2]
    assert summary(res1) == summary(res2)
    assert lake_rows(serial) == lake_rows(threaded)
    assert not any((threaded.root / ".tmp").iterdir())


def test_a_worker_that_dies_fails_only_its_file(inputs, tmp_path, monkeypatch):
    monkeypatch.setattr(ingest_mod, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TRACELAKE_CRASH_ON", "worker3_step_12.1694128201557.pt.trace.json")
    res = ingest_paths([inputs[0]], Lake(tmp_path / "lake"), jobs=2)
    by = {r.path.rsplit("/", 1)[-1]: r for r in res}
    dead = by["worker3_step_12.1694128201557.pt.trace.json"]
    assert dead.status == "failed" and "worker process died" in dead.error
    assert sorted(r.status for r in res) == ["failed", "failed"] + ["ok"] * 8 + ["skipped"]


def test_progress_shows_files_rate_and_errors():
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=200)
    with Progress(
        *[
            c
            for c in (
                MofNCompleteColumn(),
                TextColumn("files"),
                _RateColumn(),
                TextColumn("{task.fields[errors]} error(s)"),
            )
        ],
        console=con,
    ) as prog:
        t = prog.add_task("ingest", total=10, mb=0.0, errors=0)
        prog.update(t, advance=3, mb=120.0, errors=1)
        task = prog.tasks[t]
        line = _RateColumn().render(task).plain
        prog.refresh()
    assert line.startswith("120.0 MB") and "MB/s" in line
    text = buf.getvalue()
    assert "3/10" in text and "files" in text and "1 error(s)" in text


def test_pool_workers_know_the_lake_given_once(inputs, tmp_path, monkeypatch):
    """The lake's content index reaches each pool worker once (executors.init_worker), not with
    every unit: a second pooled ingest of the same inputs into the same lake skips every file the
    first stored, as the serial path does, and no unit is submitted with the index."""
    monkeypatch.setattr(ingest_mod, "PARALLEL_MIN_BYTES", 0)
    lake = Lake(tmp_path / "lake")
    first = ingest_paths(inputs, lake, jobs=2)
    stored = sorted(r.path for r in first if r.status == "ok")
    assert len(stored) == 10
    submitted = []
    real = cf.ProcessPoolExecutor.submit

    def submit(self, fn, *args, **kwargs):
        submitted.append(len(args))
        return real(self, fn, *args, **kwargs)

    monkeypatch.setattr(cf.ProcessPoolExecutor, "submit", submit)
    again = ingest_paths(inputs, lake, jobs=2, force=False)
    assert submitted and set(submitted) == {2}  # (unit, opts): no index
    by_path = {r.path: r for r in again}
    for p in stored:
        assert by_path[p].status == "skipped", p
        assert by_path[p].notes[0].startswith("already in the lake (same content"), p
    serial = [(r.path, r.status, r.notes) for r in ingest_paths(inputs, lake, jobs=1)]
    assert serial == [(r.path, r.status, r.notes) for r in again]


def _polars_threads(_) -> int:
    import polars as pl

    return pl.thread_pool_size()


def _blas_threads(_) -> str | None:
    import os

    return os.environ.get("OPENBLAS_NUM_THREADS")


@pytest.mark.parametrize(("cores", "user", "expected"), [(2, None, 1), (4, None, 2), (2, "3", 3)])
def test_pool_workers_size_polars_to_their_share_of_the_cores(monkeypatch, cores, user, expected):
    """A pool of 2 workers: each runs polars on cores // 2 threads (executors.worker_env, set in
    the forkserver, which imports polars for its workers: polars reads POLARS_MAX_THREADS once),
    unless the user set POLARS_MAX_THREADS; the ingest's own environment is left as it was."""
    import multiprocessing
    import os

    from pipeline.ingest import executors, pool_scope

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    if user is None:
        monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    else:
        monkeypatch.setenv("POLARS_MAX_THREADS", user)
    before = dict(os.environ)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pipeline.ingest.forkserver_preload", "pipeline.ingest.executors"])
    with pool_scope.helpers_stopped():
        pool_scope.forkserver_started(executors.worker_env(2))
        assert dict(os.environ) == before
        with pool_scope.process_pool(2, ctx, executors.init_worker, (2, {})) as pool:
            assert set(pool.map(_polars_threads, range(4))) == {expected}
            # OpenBLAS on one thread (pipeline/thread_env.py), unless the user chose
            blas = os.environ.get("OPENBLAS_NUM_THREADS") or "1"
            assert set(pool.map(_blas_threads, range(4))) == {blas}


def test_a_pooled_ingest_starts_its_forkserver_with_the_workers_environment(inputs, tmp_path, monkeypatch):
    from pipeline.ingest import executors

    monkeypatch.setattr(ingest_mod, "PARALLEL_MIN_BYTES", 0)
    given, real = [], executors.forkserver_started
    monkeypatch.setattr(executors, "forkserver_started", lambda env: (given.append(env), real(env)))
    ingest_paths([inputs[0]], Lake(tmp_path / "lake"), jobs=2)
    assert given == [executors.worker_env(2)]
