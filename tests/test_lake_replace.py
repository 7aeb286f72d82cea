"""A source that cannot be replaced keeps its earlier version whole (issue 39 item 6). `ingest
--force` of a source whose part cannot be moved or replaced (`chattr +i` on it, simulated by an
os.replace that fails for it, or real where chattr works) used to drop the good `ok` row for a
`failed` one while the fault lasted and leave a stale failed row after it. Now the commit is
undone: every file of the lake is byte for byte what it was, no row is added, the file is
reported failed with one line naming the lake part, and once the fault is gone nothing stale is
left: a plain ingest skips the file and --force replaces it. A kill in the middle of the undo is
finished by the next ingest's recovery."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, corpus
from test_crash_safety import assert_clean, snapshot

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake, LakeError

DLRM = corpus("param", "et_replay", "tests", "inputs", "dlrm_kineto")


@pytest.fixture()
def job(tmp_path) -> Path:
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(next(DLRM.glob("worker0_*.json")), d / "rank0.json")
    return d


def files(lake: Lake) -> dict[str, bytes]:
    """Every file of the lake outside its staging area, by path, with its bytes."""
    return {
        str(f.relative_to(lake.root)): f.read_bytes()
        for f in sorted(lake.root.rglob("*.parquet"))
        if ".tmp" not in f.relative_to(lake.root).parts
    }


def ingested(job: Path, lake: Lake) -> tuple[Path, dict[str, bytes]]:
    """Ingest job once; (its gpu_activities part, the lake's files)."""
    (r,) = ingest_paths([job], lake)
    assert r.status == "ok", r.error
    part = lake.part_path("gpu_activities", r.run_id, r.source_id)
    assert part.exists()
    return part, files(lake)


@pytest.mark.parametrize("step", ["moving the old part out", "putting the new part in"])
def test_force_that_cannot_replace_a_part_leaves_the_source_as_it_was(step, job, tmp_path, monkeypatch):
    lake = Lake(tmp_path / "lake")
    part, before = ingested(job, lake)
    real = os.replace

    def replace(src, dst, **kw):  # chattr +i on the part (EPERM); or the new part cannot go in
        if step == "moving the old part out":
            blocked = Path(src) == part
        else:  # the new part, not the earlier one being put back
            blocked = Path(dst) == part and Path(src).parent.name != "old"
        if blocked:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    (r,) = ingest_paths([job], lake, force=True)
    assert r.status == "failed"
    assert r.error == (
        f"cannot replace its rows in the lake ({part}: Operation not permitted); the version already in the "
        "lake is kept as it was"
    )
    assert files(lake) == before  # the ok row and every part, byte for byte; no failed row
    assert_clean(lake.root)
    monkeypatch.undo()  # the fault is gone
    (r,) = ingest_paths([job], lake)
    assert r.status == "skipped"
    assert files(lake) == before
    (r,) = ingest_paths([job], lake, force=True)
    assert r.status == "ok", r.error
    src = lake.sources()
    assert src["status"].to_list() == ["ok"]
    assert sorted(files(lake)) == sorted(before)


def test_a_new_source_that_cannot_be_put_in_place_leaves_nothing_of_it(job, tmp_path, monkeypatch):
    """The same fault on a first ingest: its parts placed so far are taken back out; the file gets
    a failed row, as any file the lake cannot take."""
    lake = Lake(tmp_path / "lake")
    real = os.replace

    def replace(src, dst, **kw):
        if f"{os.sep}gpu_activities{os.sep}run=" in str(dst):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return real(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    (r,) = ingest_paths([job], lake)
    assert r.status == "failed" and r.error == "cannot write its rows to the lake"
    assert [p for p in files(lake) if not p.startswith("sources/")] == []  # no part of it
    assert lake.sources()["status"].to_list() == ["failed"]
    assert_clean(lake.root)


def _chattr(flag: str, path: Path) -> bool:
    return (
        shutil.which("chattr") is not None
        and subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0
    )


def _cli(*args: str, env: dict | None = None) -> tuple[int, str]:
    e = {k: v for k, v in os.environ.items() if k != "TRACELAKE_CRASH_AT"}
    p = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO,
        env={**e, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return p.returncode, p.stderr


def test_chattr_immutable_part_for_real(job, tmp_path):
    """The reported case itself, through the command, where this machine lets chattr +i work."""
    lake = Lake(tmp_path / "lake")
    part, before = ingested(job, lake)
    if not _chattr("+i", part):
        pytest.skip("chattr +i not possible here (needs CAP_LINUX_IMMUTABLE and ext4/xfs/btrfs)")
    try:
        code, err = _cli("ingest", str(job), "--lake", str(lake.root), "--force", "--jobs", "1")
    finally:
        _chattr("-i", part)
    assert code == 4, err
    assert err.splitlines() == [
        f"failed {job / 'rank0.json'}: cannot replace its rows in the lake ({part}: Operation not "
        "permitted); the version already in the lake is kept as it was",
        f"ingested 0, failed 1, skipped 0 (already in the lake) -> {lake.root}",
    ]
    assert files(lake) == before
    code, err = _cli("ingest", str(job), "--lake", str(lake.root), "--jobs", "1")
    assert code == 0 and "skipped 1" in err, err
    assert files(lake) == before and lake.sources()["status"].to_list() == ["ok"]


def test_a_kill_during_the_undo_is_undone_by_the_next_ingest(job, tmp_path):
    """Killed (TRACELAKE_CRASH_AT=undo:1) after the first file of the earlier version was put back:
    the source has no sources row then; the next ingest's recovery finishes the undo (it does not
    carry the abandoned commit forward), so the lake is what it was before, to the byte."""
    lake = Lake(tmp_path / "lake")
    part, before = ingested(job, lake)
    if not _chattr("+i", part):
        pytest.skip("chattr +i not possible here (needs CAP_LINUX_IMMUTABLE and ext4/xfs/btrfs)")
    try:
        code, err = _cli(
            "ingest",
            str(job),
            "--lake",
            str(lake.root),
            "--force",
            "--jobs",
            "1",
            env={"TRACELAKE_CRASH_AT": "undo:1"},
        )
    finally:
        _chattr("-i", part)
    assert code == -9, err
    assert files(lake) != before  # killed half-way: the source's sources row is still out
    code, err = _cli("ingest", str(job), "--lake", str(lake.root), "--jobs", "1")
    assert code == 0 and "skipped 1" in err, err
    assert files(lake) == before
    assert_clean(lake.root)


@pytest.mark.parametrize("point", ["rename:2", "rename:4"])
def test_a_kill_during_a_forced_replacement_is_finished_by_the_next_ingest(point, job, tmp_path):
    """A --force replacement killed after some new parts are in place (the earlier version moved
    out): the next ingest carries it forward, and the lake holds the new version whole, as an
    uninterrupted --force leaves it."""
    ref = Lake(tmp_path / "ref")
    ingested(job, ref)
    code, err = _cli("ingest", str(job), "--lake", str(ref.root), "--force", "--jobs", "1")
    assert code == 0, err
    lake = Lake(tmp_path / "lake")
    ingested(job, lake)
    code, err = _cli(
        "ingest",
        str(job),
        "--lake",
        str(lake.root),
        "--force",
        "--jobs",
        "1",
        env={"TRACELAKE_CRASH_AT": point},
    )
    assert code == -9, err
    code, err = _cli("ingest", str(job), "--lake", str(lake.root), "--jobs", "1")
    assert code == 0, err
    assert_clean(lake.root)
    assert snapshot(lake.root) == snapshot(ref.root)


def test_forget_of_a_part_that_cannot_be_removed_says_so_and_blocks_nothing(job, tmp_path, monkeypatch):
    """The same fault under forget: one line naming the part (it was a traceback), the source is
    gone for readers, and the part, which nothing reads, blocks no later ingest (recover() said
    nothing and raised on it, failing every ingest of the lake); once it can be, it is removed."""
    lake = Lake(tmp_path / "lake")
    part, _ = ingested(job, lake)
    ((run_id, sid),) = zip(lake.sources()["run_id"], lake.sources()["source_id"])
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(next(DLRM.glob("worker1_*.json")), other / "rank1.json")
    real = Path.unlink

    def unlink(self, missing_ok=False):  # chattr +i on the part
        if self == part:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(self))
        return real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with lake.lock(), pytest.raises(LakeError) as e:
        lake.forget([(run_id, sid)])
    assert str(e.value) == (
        f"{part} (Operation not permitted): cannot be removed; its source {run_id}/{sid} is forgotten (no "
        "reader sees the part), and a later ingest or forget removes the part once it can"
    )
    assert lake.sources().height == 0 and lake.table_files("gpu_activities") == []
    (r,) = ingest_paths([other], lake)  # the fault still there
    assert r.status == "ok", r.error
    assert part.exists()
    monkeypatch.undo()
    with lake.lock():
        assert f"removed {part.relative_to(lake.root)} (no sources row)" in lake.recover()
    assert not part.exists()
