"""Ingest on an existing Dask cluster (`--scheduler ADDRESS`): a dask.distributed LocalCluster
(in-process workers, so the test stays fast) parses and stages the files, this process commits
them: the lake equals the serial one, table by table."""

from __future__ import annotations

import io
import shutil
import tarfile

import distributed  # the `dask` extra, part of the test extra
import pytest

from conftest import corpus, lake_rows
from pipeline.cli import EXIT_PARTIAL, app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as c:
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
    assert [(r.path, r.status, r.run_id, r.rank, r.error) for r in a] == [(r.path, r.status, r.run_id, r.rank, r.error) for r in b]
    assert sorted(r.status for r in b) == ["failed"] + ["ok"] * 5
    assert lake_rows(serial) == lake_rows(remote)
    # again: everything is skipped, on the cluster too
    again = ingest_paths(inputs, remote, scheduler=cluster.scheduler_address)
    assert sorted(r.status for r in again) == ["failed"] + ["skipped"] * 5
    assert lake_rows(serial) == lake_rows(remote)


def test_cli_scheduler_option(cluster, inputs, tmp_path):
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["ingest", str(inputs[0]), "--lake", str(tmp_path / "lake"), "--scheduler", cluster.scheduler_address])
    assert r.exit_code == EXIT_PARTIAL, r.output
    assert "ingested 4, failed 1" in r.output and "bad.json: truncated JSON" in r.output
