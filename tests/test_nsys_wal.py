"""An Nsight Systems SQLite export whose database is partly in the files SQLite keeps beside it
(issue 39 item 5): rows still in its write-ahead log (`-wal`) are read, and a transaction cut
short (a hot `-journal`) is rolled back, as SQLite itself reads the database; the user's files
are never changed and nothing is created beside them. Expected counts come from sqlite3 opening a
copy of the same files the ordinary way."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from nsys_handmade import export

from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

MS = 1_000_000


def _kernels_as_sqlite_reads(files: dict[str, bytes], tmp: Path) -> int:
    """Kernel rows of the database made of these files, read by sqlite3 the ordinary way."""
    d = tmp / "reference"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    c = sqlite3.connect(d / "rank0.sqlite")
    try:
        return c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    finally:
        c.close()


def _add_kernels(c: sqlite3.Connection, n: int, t0: int) -> None:
    for i in range(n):
        t = t0 + i * MS
        c.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 9)",
            (t - 10_000, t - 5_000, 101, 900 + i),
        )
        c.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, 7, ?, ?, 1, 1)",
            (t, t + MS // 2, 900 + i, 100 << 24),
        )


def _snapshot(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())}


def _lake_kernels(lake: Lake) -> int:
    return connect(lake).execute("SELECT count(*) FROM gpu_activities WHERE kind = 'kernel'").fetchall()[0][0]


@pytest.fixture()
def wal_export(tmp_path) -> Path:
    """job/rank0.sqlite (3 iterations: 15 kernels in the file) and job/rank0.sqlite-wal holding
    7 more kernels, committed but not checkpointed: the files as a program that still has the
    database open leaves them."""
    build = tmp_path / "build"
    build.mkdir()
    export(build / "rank0.sqlite", 3)
    c = sqlite3.connect(build / "rank0.sqlite")
    assert c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    c.execute("PRAGMA wal_autocheckpoint=0")
    _add_kernels(c, 7, 100 * MS)
    c.commit()
    job = tmp_path / "job"
    job.mkdir()
    for suffix in ("", "-wal"):  # copied while the writer still holds them open
        shutil.copyfile(build / f"rank0.sqlite{suffix}", job / f"rank0.sqlite{suffix}")
    c.close()
    return job / "rank0.sqlite"


def test_rows_in_the_write_ahead_log_are_read(wal_export, tmp_path):
    job = wal_export.parent
    before = _snapshot(job)
    assert before["rank0.sqlite-wal"][:4] == b"\x37\x7f\x06\x82" and len(before["rank0.sqlite-wal"]) > 32
    want = _kernels_as_sqlite_reads(before, tmp_path)
    assert want == 15 + 7
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([job], lake)
    assert r.status == "ok", r.error
    assert _lake_kernels(lake) == want  # immutable, the file alone: 15
    assert any(
        n.startswith(
            f"read with the {len(before['rank0.sqlite-wal']):,} bytes of its write-ahead log rank0.sqlite-wal"
        )
        for n in r.notes
    ), r.notes
    assert _snapshot(job) == before  # nothing changed, no -shm created beside it
    # the log is part of the content: the same files again are skipped, a log that grew is new
    (again,) = ingest_paths([job], lake)
    assert again.status == "skipped"
    src = connect(lake).execute("SELECT content_sha256 FROM sources").fetchall()[0][0]
    import hashlib

    assert src != hashlib.sha256(before["rank0.sqlite"]).hexdigest()


def test_a_transaction_cut_short_is_rolled_back(tmp_path):
    """A program killed in the middle of a transaction that had spilled pages into the database
    file (rollback-journal mode): the file alone holds half of it; SQLite rolls it back."""
    build = tmp_path / "build"
    build.mkdir()
    export(build / "rank0.sqlite", 3)
    c = sqlite3.connect(build / "rank0.sqlite", isolation_level=None)
    c.execute("PRAGMA cache_size=2")  # dirty pages spill into the file before the commit
    c.execute("BEGIN")
    _add_kernels(c, 3000, 100 * MS)
    job = tmp_path / "job"
    job.mkdir()
    for suffix in ("", "-journal"):  # what a kill -9 at this moment leaves
        shutil.copyfile(build / f"rank0.sqlite{suffix}", job / f"rank0.sqlite{suffix}")
    c.execute("ROLLBACK")
    c.close()
    before = _snapshot(job)
    assert before["rank0.sqlite-journal"][:8] == bytes.fromhex("d9d505f920a163d7")
    assert _kernels_as_sqlite_reads(before, tmp_path) == 15
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([job], lake)
    assert r.status == "ok", r.error
    assert _lake_kernels(lake) == 15
    assert any(
        "its rollback journal rank0.sqlite-journal holds a transaction cut short" in n for n in r.notes
    )
    assert _snapshot(job) == before


def test_an_unreadable_log_fails_the_file_with_one_line(wal_export, tmp_path):
    wal = wal_export.parent / "rank0.sqlite-wal"
    wal.unlink()
    wal.mkdir()  # exists, cannot be read as a file (a permission error would not stop root)
    (r,) = ingest_paths([wal_export], Lake(tmp_path / "lake"))
    assert r.status == "failed"
    assert r.error == (
        f"its write-ahead log {wal} cannot be read (Is a directory), so the database cannot be read whole"
    )


def test_an_export_without_sidecars_is_read_in_place(tmp_path):
    """The ordinary case: no copy, no note, the file's own hash."""
    import hashlib

    f = tmp_path / "rank0.sqlite"
    export(f, 3)
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([f], lake)
    assert r.status == "ok" and not [n for n in r.notes if "private copy" in n]
    assert _lake_kernels(lake) == 15
    sha = connect(lake).execute("SELECT content_sha256 FROM sources").fetchall()[0][0]
    assert sha == hashlib.sha256(f.read_bytes()).hexdigest()


def test_a_log_written_to_while_it_is_read_fails_the_file(wal_export, tmp_path, monkeypatch):
    """A program still writing the database: the log grows after it was hashed. The rows read
    and the hash would be of different content, so the file fails and nothing of it is stored."""
    from pipeline.ingest.nsys import readers

    real = readers._private_copy

    def copy_then_write(path, side, scratch):
        out = real(path, side, scratch)
        db = wal_export.read_bytes()
        with open(str(wal_export) + "-wal", "ab") as f:  # the writer appends frames
            f.write(b"\0" * 4096)
        assert wal_export.read_bytes() == db  # the database file itself unchanged
        return out

    monkeypatch.setattr(readers, "_private_copy", copy_then_write)
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([wal_export], lake)
    assert r.status == "failed"
    assert r.error.startswith("the file changed while it was read")
    assert _lake_kernels(lake) == 0


def test_a_name_with_percent_signs_is_the_file_read(tmp_path):
    """SQLite URIs decode %HH: "a%41.sqlite" must not open "aA.sqlite" (or fail)."""
    export(tmp_path / "a%41.sqlite", 3)
    export(tmp_path / "aA.sqlite", 1)
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([tmp_path / "a%41.sqlite"], lake)
    assert r.status == "ok", r.error
    assert _lake_kernels(lake) == 15
