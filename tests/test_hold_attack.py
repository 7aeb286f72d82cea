"""A run whose small sources arrive in several held batches (pipeline/ingest/hold.py: each ingest
naming two or more of its files appends a new file per table to the run's generation,
lake_compact.append) is merged back to one file per table by `tracelake compact`
(lake_compact.fragmented; before, compact_run only compacted a run that had small sources with
parts of their own, which a held run never has, so the files per table grew with every ingest).
docs/usage.md ("Compaction") says `tracelake compact` merges each run's small sources into files of
at most 64 MiB of input, and that a nightly ingest of small jobs leaves one file per table and run.

Inputs: PARAM's 8-rank DLRM job (the corpus), ingested two ranks at a time into one run
directory named dlrm_kineto (four ingests), then compacted. Expected: what one ingest of the 8
ranks leaves (one file per table, 8 x 0.9 MB of trace is far under 64 MiB), with the same rows;
counted from the Parquet files on disk and the manifest JSON, not through the code under test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from conftest import REPO, corpus

DLRM = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")


def _tracelake(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True, check=True
    )


def _files(lake: Path) -> dict[str, list[str]]:
    """table -> the files the run's manifest names (read as JSON)."""
    m = json.loads((lake / "_compacted" / "run=dlrm_kineto.json").read_text())
    return {t: sorted(ns) for t, ns in m["files"].items()}


def _rows(lake: Path, table: str) -> int:
    return sum(
        pq.ParquetFile(lake / table / "run=dlrm_kineto" / n).metadata.num_rows for n in _files(lake)[table]
    )


def test_compact_merges_a_run_of_held_batches(tmp_path):
    ranks = sorted(DLRM.iterdir())
    assert len(ranks) == 8
    whole = tmp_path / "whole"
    _tracelake("ingest", str(DLRM), "--lake", str(whole), "-q")
    lake = tmp_path / "lake"
    for i in range(0, 8, 2):
        d = tmp_path / f"batch{i}" / "dlrm_kineto"
        d.mkdir(parents=True)
        for f in ranks[i : i + 2]:
            shutil.copy(f, d / f.name)
        _tracelake("ingest", str(d), "--lake", str(lake), "-q")
    _tracelake("compact", "--lake", str(lake))
    ref = _files(whole)
    assert all(len(ns) == 1 for ns in ref.values())
    got = _files(lake)
    assert sorted(got) == sorted(ref)
    for t in ref:
        assert _rows(lake, t) == _rows(whole, t), t
    # one file per table, as one ingest of the 8 ranks leaves (or as compact of 8 parts does)
    assert {t: len(ns) for t, ns in got.items()} == {t: 1 for t in ref}


def test_held_sources_that_cannot_be_written_are_not_counted_ingested(tmp_path, monkeypatch):
    """A held run whose batch cannot be written (OSError: a full disk, an immutable run directory,
    `chattr +i lake/cpu_ops/run=trace_filter` reproduces it without mocks) and whose sources then
    cannot be committed one by one either: every file is reported failed, as the same ingest with
    parts (compact=False, or before 6d1824b) reports it: `ingested 0, failed 2`, exit 4 (nothing
    could be ingested). The held path reports each file twice through on_file (ok when committed
    to the pending batch, then failed at the flush, FileResult.again); the command counted both
    (`ingested 2, failed 2`, exit 3) until it counted the second as replacing the first."""
    import errno

    from typer.testing import CliRunner

    from pipeline import lake_compact
    from pipeline.cli import app
    from pipeline.lake import Lake

    def append(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_commit = Lake.commit

    def commit(self, staged, row, *a, **k):
        if row.get("status") != "failed":  # a failed row (no tables) still fits
            self.discard(staged)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_commit(self, staged, row, *a, **k)

    monkeypatch.setattr(lake_compact, "append", append)
    monkeypatch.setattr(Lake, "commit", commit)
    src = corpus("hta", "tests", "data", "trace_filter")
    r = CliRunner().invoke(app, ["ingest", str(src), "--lake", str(tmp_path / "lake"), "--jobs", "1", "-q"])
    out = r.output
    assert out.count("failed ") >= 2, out
    assert "ingested 0, failed 2, skipped 0" in out, out
    assert r.exit_code == 4, out
