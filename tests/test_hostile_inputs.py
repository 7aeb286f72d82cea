"""Hostile inputs that once hung a batch or held the lake's lock for ever (issue 21) fail in one
line, and the good file beside them is still ingested:
- an SQLite file whose kernel table is a recursive VIEW (a 12 kB file that never finished:
  the reader listed views as tables and SELECTed from it);
- a FIFO named on the command line (open() blocked before the regular-file check).
Each ingest runs in a child process with a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys

from conftest import CORPUS, REPO

GOOD = CORPUS / "nsys" / "nsys-ai" / "mfu_2gpu_before.sqlite"
GOOD_KINETO = REPO / "sample_traces" / "hta_trace_filter" / "sampled_rank-0.json.gz"

INGEST = """
import json, sys
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
res = ingest_paths(sys.argv[2:], Lake(sys.argv[1]), jobs=1)
print(json.dumps([[r.path, r.status, r.error] for r in res]))
"""


def _ingest(lake, *paths, timeout=120):
    p = subprocess.run(
        [sys.executable, "-c", INGEST, str(lake), *map(str, paths)],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return {os.path.basename(path): (status, error) for path, status, error in json.loads(p.stdout)}


def test_a_recursive_view_fails_in_one_line_and_the_batch_goes_on(tmp_path):
    bad = tmp_path / "in" / "bad.sqlite"
    bad.parent.mkdir()
    c = sqlite3.connect(bad)
    c.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS
          WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n)
          SELECT x AS start, x + 1 AS "end", 0 AS deviceId, 7 AS streamId, 1 AS shortName,
                 x AS correlationId, 1 AS globalPid FROM n;
        """
    )
    c.close()
    assert bad.stat().st_size < 64 << 10
    shutil.copy(GOOD, tmp_path / "in" / "good.sqlite")
    got = _ingest(tmp_path / "lake", bad, tmp_path / "in" / "good.sqlite")
    status, error = got["bad.sqlite"]
    assert status == "failed" and "\n" not in error
    assert "holds 1 view (CUPTI_ACTIVITY_KIND_KERNEL)" in error and "views are not read" in error
    assert got["good.sqlite"] == ("ok", None)


def test_a_fifo_fails_at_once_and_leaves_the_lake_usable(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    got = _ingest(tmp_path / "lake", fifo, GOOD_KINETO, timeout=60)
    status, error = got["trace.json"]
    assert status == "failed" and error == "not a regular file or directory"
    assert got[GOOD_KINETO.name] == ("ok", None)
    # the lock was let go: a second ingest is not refused
    again = _ingest(tmp_path / "lake", GOOD_KINETO, timeout=60)
    assert again[GOOD_KINETO.name][0] == "skipped"


SMALL_TRACE = CORPUS / "hta" / "tests" / "data" / "trace_compare" / "base" / "base.json.gz"


def _overlapping_zip(path, copies: int) -> None:
    """A zip with one real member, rank0.json, and `copies` more central-directory entries
    (rank1.json, ...) that all point at its one local header and deflated data: the layout of
    the 75 kB zip that made ingest inflate one 63 MiB member 200 times."""
    import gzip
    import struct
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("rank0.json", gzip.decompress(SMALL_TRACE.read_bytes()))
    raw = path.read_bytes()
    eocd = raw.rindex(b"PK\x05\x06")
    _, _, _, _, n, cd_size, cd_off, _ = struct.unpack("<IHHHHIIH", raw[eocd : eocd + 22])
    entry = raw[cd_off : cd_off + cd_size]
    extra = b"".join(entry.replace(b"rank0.json", f"rank{k}.json".encode()) for k in range(1, copies + 1))
    new_cd = entry + extra
    tail = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n + copies, n + copies, len(new_cd), cd_off, 0)
    path.write_bytes(raw[:cd_off] + new_cd + tail)


def test_zip_entries_that_share_one_member_are_refused(tmp_path):
    z = tmp_path / "bomb.zip"
    _overlapping_zip(z, copies=3)
    got = _ingest(tmp_path / "lake", z)
    assert got["bomb.zip!rank0.json"] == ("ok", None)
    for k in (1, 2, 3):
        status, error = got[f"bomb.zip!rank{k}.json"]
        assert status == "failed" and "overlap member rank0.json" in error and "zip bomb" in error


def test_a_zip_that_declares_far_more_than_it_holds_is_refused_whole(tmp_path):
    import zipfile

    z = tmp_path / "many.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        for k in range(80):  # 80 MiB of zeros in about 100 kB: 800:1 over the archive
            f.writestr(f"rank{k}.json", bytes(1 << 20))
    got = _ingest(tmp_path / "lake", z, GOOD_KINETO)
    (status, error) = got["many.zip"]
    assert status == "failed" and "zip declares 83886080 bytes uncompressed in all" in error
    assert "refusing a possible zip bomb" in error and "\n" not in error
    assert got[GOOD_KINETO.name] == ("ok", None)


def test_a_zip_member_of_an_unsupported_compression_method_fails_alone(tmp_path):
    # found by the fuzzing harness (archive, N=1000): a member whose compression method field was
    # damaged failed as "could not ingest (NotImplementedError: That compression method is not
    # supported); please report this file"
    import gzip
    import struct
    import zipfile

    z = tmp_path / "odd.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        f.writestr("rank0.json", gzip.decompress(SMALL_TRACE.read_bytes()))
        f.writestr("rank1.json", gzip.decompress(SMALL_TRACE.read_bytes()))
    raw = bytearray(z.read_bytes())
    # rank1's compression method (offset 10 of its local header, 10 of its central-directory
    # entry) set to 99, a method Python's zipfile does not implement
    local = raw.index(b"PK\x03\x04rank1"[:4], raw.index(b"rank0.json") + 1)
    central = raw.rindex(b"PK\x01\x02")
    struct.pack_into("<H", raw, local + 8, 99)
    struct.pack_into("<H", raw, central + 10, 99)
    z.write_bytes(bytes(raw))
    got = _ingest(tmp_path / "lake", z)
    assert got["odd.zip!rank0.json"] == ("ok", None)
    status, error = got["odd.zip!rank1.json"]
    assert status == "failed" and error.startswith("unsupported archive member (") and "\n" not in error


# --- pickle resource bombs (flight-recorder dumps are pickles) ---------------------------------

PARSE_PICKLE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a bomb that gets through fails here
from pipeline.ingest import nccl
from pipeline.ingest.errors import TraceError
data = open(sys.argv[1], "rb").read()
try:
    nccl.parse(data, "fr.pkl", "flight_recorder")
    print("PARSED")
except TraceError as e:
    print("REFUSED", e)
"""


def _parse_pickle(tmp_path, data: bytes) -> str:
    f = tmp_path / "fr.pkl"
    f.write_bytes(data)
    p = subprocess.run([sys.executable, "-c", PARSE_PICKLE, str(f)], cwd=REPO, capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr[-1500:]
    return p.stdout.strip()


def _shared_lists(depth: int, width: int):
    x: list = []
    for _ in range(depth):
        x = [x] * width  # each level refers `width` times to the one list below it
    return x


class _Reduce:
    def __init__(self, f, args):
        self.f, self.args = f, args

    def __reduce__(self):
        return self.f, self.args


def test_a_35_byte_pickle_cannot_allocate_6_gib(tmp_path):
    # PROTO 2, GLOBAL builtins.bytearray, LONG1 6 GiB, TUPLE1, REDUCE, STOP
    bomb = b"\x80\x02cbuiltins\nbytearray\n\x8a\x05" + (6 << 30).to_bytes(5, "little") + b"\x85R."
    assert len(bomb) <= 35
    out = _parse_pickle(tmp_path, bomb)
    assert out.startswith("REFUSED unsafe pickle: refused bytearray(6442450944)"), out


def test_str_of_shared_lists_is_refused(tmp_path):
    import pickle

    bomb = pickle.dumps(_Reduce(str, (_shared_lists(8, 50),)), protocol=4)
    assert len(bomb) < 1024
    out = _parse_pickle(tmp_path, bomb)
    assert out.startswith("REFUSED unsafe pickle: refused str() of a list"), out


def test_shared_references_past_the_budget_are_refused(tmp_path):
    import pickle

    # 50^8 leaves from a ~1 kB pickle; and one entry referenced a million times
    nested = pickle.dumps({"entries": _shared_lists(8, 50)}, protocol=4)
    entry = {f"k{i}": i for i in range(10)}
    wide = pickle.dumps({"version": "2.1", "entries": [entry] * 1_000_000}, protocol=4)
    for bomb in (nested, wide):
        out = _parse_pickle(tmp_path, bomb)
        assert out.startswith("REFUSED pickle bomb: its values expand to more than"), out
    # the same entries written out (no sharing) are an ordinary dump and parse
    ok = pickle.dumps(
        {"version": "2.1", "pg_config": {}, "entries": [dict(entry) for _ in range(1000)]}, protocol=4
    )
    assert _parse_pickle(tmp_path, ok) == "PARSED"


# --- a killed parallel ingest leaves no process behind ----------------------------------------

POOL_INGEST = """
import sys
import pipeline.ingest as ingest
from pipeline import pool_scope
from pipeline.lake import Lake
pool_scope.PARALLEL_MIN_BYTES = 0  # a pool however small the input
ingest.ingest_paths(sys.argv[2:], Lake(sys.argv[1]), jobs=2)
"""


def _children() -> dict[int, int]:
    """pid -> parent pid of every process (Linux /proc)."""
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                out[int(p)] = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        p = todo.pop()
        for c, parent in tree.items():
            if parent == p and c not in found:
                found.add(c)
                todo.append(c)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_9_of_a_parallel_ingest_takes_its_workers_forkserver_and_tracker(tmp_path):
    import signal
    import time

    dlrm = CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto"
    for k in range(4):  # 32 rank files: a few seconds of work for two workers
        shutil.copytree(dlrm, tmp_path / "in" / f"job{k}")
    p = subprocess.Popen([sys.executable, "-c", POOL_INGEST, str(tmp_path / "lake"), str(tmp_path / "in")],
                         cwd=REPO)  # fmt: skip
    procs: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(procs) < 4:  # forkserver, 2 workers, resource tracker
        procs |= _descendants(p.pid)
        time.sleep(0.05)
    assert len(procs) >= 4, f"the pool did not start: {procs}"
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(x) for x in procs):
        time.sleep(0.1)
    left = [x for x in procs if _alive(x)]
    for x in left:  # clean up before failing
        os.kill(x, signal.SIGKILL)
    assert left == []


# --- one huge Kineto event ---------------------------------------------------------------------


def _trace_with(string_bytes: int, at: int = 1000) -> bytes:
    """A Kineto trace of 2,000 small CPU ops with one op (the `at`th, in the middle by default)
    whose name is `string_bytes` long (the 1 GiB-string event of the issue, scaled down with the
    limits)."""
    import json

    evs = [
        {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
        for i in range(2000)
    ]
    evs[at]["name"] = "x" * string_bytes
    return json.dumps({"schemaVersion": 1, "traceEvents": evs}).encode()


def test_one_event_past_the_event_cap_fails_in_one_line(monkeypatch):
    import io

    from pipeline.ingest import kineto
    from pipeline.ingest.errors import TraceError
    from pipeline.ingest.kineto import stream

    monkeypatch.setattr(stream, "MAX_EVENT_BYTES", 1 << 20)  # 1 MiB instead of 256 MiB
    monkeypatch.setattr(stream, "READ_BYTES", 64 << 10)
    ok = kineto.parse_stream(io.BytesIO(_trace_with(512 << 10)).read, batch_bytes=64 << 10)
    try:
        assert ok.event_count == 2000
    finally:
        ok.close()
    # the message gives the offset of the long event itself (issue 39 item 13: it gave the start
    # of its batch, 'after byte 96' of a file whose events start there); the 2nd event too
    for at in (1000, 1):
        data = _trace_with(3 << 20, at)
        start = data.index(b'"name": "xxx') - len(b'{"ph": "X", "cat": "cpu_op", ')
        assert data[start : start + 1] == b"{"
        try:
            kineto.parse_stream(io.BytesIO(data).read, batch_bytes=64 << 10).close()
            raise AssertionError("a 3 MiB event passed a 1 MiB cap")
        except TraceError as e:
            assert str(e) == (
                f"an event longer than 1 MB (or no end of an event) at byte {start}: events are capped "
                "at that size; not a trace?"
            )


# --- values SQLite let through: REAL or TEXT in INTEGER columns ------------------------------


def test_values_of_the_wrong_type_are_null_with_a_note_and_the_rest_ingested(tmp_path):
    import sqlite3

    f = tmp_path / "bad_values.sqlite"
    shutil.copy(GOOD, f)
    os.chmod(f, 0o644)
    c = sqlite3.connect(f)
    # SQLite's flexible typing stores these in INTEGER columns; they once failed the whole file
    # with "could not ingest (ArrowInvalid ...); please report this file"
    c.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 1.5e300 WHERE rowid = (SELECT min(rowid) FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL)"
    )
    c.execute(
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = 'abc' WHERE rowid = (SELECT max(rowid) FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL)"
    )
    (kernels,) = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    c.commit()
    c.close()
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake
    from pipeline.query import connect

    (r,) = ingest_paths([f], Lake(tmp_path / "lake"), jobs=1)
    assert r.status == "ok", r.error
    what = "are not of the column's type (REAL out of range, TEXT or BLOB) and were read as NULL"
    assert f"1 value(s) of CUPTI_ACTIVITY_KIND_KERNEL.start {what}" in r.notes
    assert f"1 value(s) of CUPTI_ACTIVITY_KIND_KERNEL.streamId {what}" in r.notes
    con = connect(Lake(tmp_path / "lake"))
    got = con.execute("SELECT count(*), count(stream) FROM gpu_activities WHERE kind = 'kernel'").fetchone()
    assert got == (kernels - 1, kernels - 2)  # the kernel without a start is left out; one has no stream


def test_lists_and_objects_where_kineto_writes_strings_are_read_as_text():
    # found by the fuzzing harness: a list as an event's cat or name failed the whole file with
    # "could not ingest (TypeError: unhashable type: 'list'); please report this file"
    import io
    import json

    from pipeline.ingest import kineto

    evs = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {"ph": "X", "cat": ["cpu_op"], "name": "aten::add", "pid": 1, "tid": 1, "ts": 20, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": {"op": "x"}, "pid": [1], "tid": 1, "ts": 30, "dur": 5},
    ]
    p = kineto.parse_stream(io.BytesIO(json.dumps({"schemaVersion": 1, "traceEvents": evs}).encode()).read)
    try:
        assert "2 events had a JSON list or object as cat, name, pid or tid; read as its JSON text" in p.notes
        cpu = p.tables({"run_id": "r", "source_id": "s", "rank": 0}, arrow=True)["cpu_ops"]
        parts = [cpu] if hasattr(cpu, "column") else list(cpu)  # a table, or its batches streamed
        names = sorted(n for part in parts for n in part.column("name").to_pylist())
        assert names == ["aten::add", "aten::mm", '{"op":"x"}']
    finally:
        p.close()


def test_a_zip_with_a_negative_member_offset_does_not_stop_the_batch(tmp_path):
    # found by the fuzzing harness: a flipped byte in the end record made zipfile report a member
    # at header offset -61952, and the overlap check raised TypeError out of ingest_paths (the
    # whole batch stopped)
    import gzip
    import struct
    import zipfile

    z = tmp_path / "odd.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as f:
        f.writestr("rank0.json", gzip.decompress(SMALL_TRACE.read_bytes()))
    raw = bytearray(z.read_bytes())
    eocd = raw.rindex(b"PK\x05\x06")
    (cd_off,) = struct.unpack("<I", raw[eocd + 16 : eocd + 20])
    raw[eocd + 16 : eocd + 20] = struct.pack("<I", cd_off + 61952)
    z.write_bytes(bytes(raw))
    assert zipfile.ZipFile(z).infolist()[0].header_offset == -61952
    got = _ingest(tmp_path / "lake", z, GOOD_KINETO)
    assert got[GOOD_KINETO.name] == ("ok", None)
    (status, error) = got["odd.zip!rank0.json"]
    assert status == "failed" and error and "\n" not in error and "please report" not in error


def test_an_export_whose_payload_table_lacks_a_column_is_read_without_payloads(tmp_path):
    # found by the fuzzing harness: NVTX_EVENTS with binaryData but without a column the payload
    # query names failed the file with "could not ingest (OperationalError: no such column: start);
    # please report this file" (a missing `start` now fails it as a schema violation instead)
    import sqlite3

    f = tmp_path / "no_start.sqlite"
    shutil.copy(GOOD, f)
    os.chmod(f, 0o644)
    c = sqlite3.connect(f)
    c.execute('ALTER TABLE NVTX_EVENTS RENAME COLUMN "text" TO "text_x"')
    c.commit()
    c.close()
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    (r,) = ingest_paths([f], Lake(tmp_path / "lake"), jobs=1)
    assert r.status == "ok", r.error
    assert (
        "NVTX_EVENTS has payloads (binaryData) but lacks column(s) text: its NCCL payloads "
        "(message sizes, communicators) were not read"
    ) in r.notes


def test_device_values_out_of_the_int32_range_are_read_as_null_with_a_note(tmp_path):
    # found by the fuzzing harness (nsys, N=1000): a memset's deviceId of 2^62 failed the file
    # with "could not ingest (ComputeError: could not append value ...); please report this file"
    import sqlite3

    import duckdb

    f = tmp_path / "big_device.sqlite"
    shutil.copy(GOOD, f)
    os.chmod(f, 0o644)
    c = sqlite3.connect(f)
    (n_memset,) = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()
    (first,) = c.execute("SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()
    c.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET deviceId = 4611686018427387904 WHERE rowid = ?", [first])
    # this export has no TARGET_INFO_GPU: add the table real exports have, for its two GPUs
    c.execute(
        "CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT, busLocation TEXT, totalMemory INTEGER, "
        "smCount INTEGER, computeMajor INTEGER, computeMinor INTEGER)"
    )
    c.executemany(
        "INSERT INTO TARGET_INFO_GPU VALUES (?, 'NVIDIA H100', NULL, 85899345920, 4611686018427387904, 9, 0)",
        [(0,), (1,)],
    )
    n_gpus = 2
    c.commit()
    c.close()
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([f], lake, jobs=1)
    assert r.status == "ok", r.error
    assert "1 value(s) of memset.deviceId out of the INT32 range, read as NULL" in r.notes
    assert f"{n_gpus} value(s) of TARGET_INFO_GPU.smCount out of range, read as NULL" in r.notes
    (g,) = lake.table_files("gpu_activities")
    memsets = duckdb.sql(
        "SELECT count(*), count(*) FILTER (WHERE device IS NULL) "
        f"FROM read_parquet('{g}') WHERE kind = 'memset'"
    ).fetchall()[0]
    assert memsets == (n_memset, 1)
    (d,) = lake.table_files("devices")
    assert (
        duckdb.sql(f"SELECT count(num_sms), count(compute_major) FROM read_parquet('{d}')").fetchall()[0][0]
        == 0
    )


def test_invalid_utf8_in_the_sqlite_schema_fails_in_one_line(tmp_path):
    # found by the fuzzing harness (nsys, N=1000, seed 26): one byte of a table name in the
    # schema set to 0x93 made SQLite's own error message ("malformed database schema (ENUM\x93...)")
    # undecodable, and the file came out as "could not ingest (UnicodeDecodeError ...); please report"
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    raw = GOOD.read_bytes()
    name = b"ENUM_NSYS_GENERIC_EVENT_SOURCE"
    assert raw.count(name) >= 2  # the table's name in sqlite_master, and in its CREATE text
    i = raw.index(name) + 4
    bad = tmp_path / "bad_schema.sqlite"
    bad.write_bytes(raw[:i] + b"\x93" + raw[i + 1 :])
    lake = Lake(tmp_path / "lake")
    # a batch takes its files in path order, not in the order given: the results by name
    res = {r.path.rsplit("/", 1)[-1]: r for r in ingest_paths([bad, GOOD_KINETO], lake, jobs=1)}
    r, ok = res[bad.name], res[GOOD_KINETO.name]
    assert r.status == "failed" and ok.status == "ok"
    assert r.error.startswith("not a readable SQLite database (malformed database schema (ENUM")
    assert "\n" not in r.error and "please report" not in r.error


def test_a_step_number_past_int64_drops_that_step_and_keeps_the_file(tmp_path):
    """PARAM's DLRM worker0 with its ProfilerStep#10 renamed ProfilerStep#9223372036854775808
    (2**63): the file failed whole with a polars cast error ('please report this file'); now it
    is ingested with every event, and only that step, whose number no step column can hold, is
    gone (the file has one step: the run then has none)."""
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake
    from pipeline.query import connect

    src = next((CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto").glob("worker0_*.json"))
    text = src.read_text()
    assert text.count('"ProfilerStep#10"') == 1
    for name, body in (
        ("plain", text),
        ("huge", text.replace('"ProfilerStep#10"', '"ProfilerStep#9223372036854775808"')),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank0.json").write_text(body)
    got = {}
    for name in ("plain", "huge"):
        lake = Lake(tmp_path / f"lake_{name}")
        (r,) = ingest_paths([tmp_path / name], lake, jobs=1)
        assert r.status == "ok", r.error
        con = connect(lake)
        got[name] = con.execute(
            "SELECT (SELECT count(*) FROM gpu_activities), (SELECT count(*) FROM cpu_ops), "
            "(SELECT count(*) FROM steps)"
        ).fetchone()
    assert got["plain"][:2] == got["huge"][:2] and (got["plain"][2], got["huge"][2]) == (1, 0)


def test_a_pattern_python_warns_about_gives_no_warning_text(tmp_path):
    """`--step-range '[[:alpha:]]'`: Python's re warns 'Possible nested set' (a FutureWarning),
    which printed two lines of source to the user; the pattern is valid, so ingest says nothing
    of it. With the file already in the lake, --comm-pattern gets a note that it applies only to
    files ingested now (it changes rows, and a skipped file is not read again)."""
    src = next((CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto").glob("worker0_*.json"))
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(src, d)
    tl = [sys.executable, "-m", "pipeline.cli", "ingest", str(d), "--lake", str(tmp_path / "lake")]
    p = subprocess.run([*tl, "--step-range", "[[:alpha:]]"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0 and "Warning" not in p.stderr and "re.compile" not in p.stderr, p.stderr
    p = subprocess.run([*tl, "--comm-pattern", "gemm"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0
    assert "note: --comm-pattern applies to the files ingested now, not to the 1 skipped" in p.stderr


def test_a_rank_outside_its_world_size_is_ingested_with_a_note(tmp_path):
    """PARAM's DLRM worker1 with distributedInfo rank 8 (its world_size is 8: ranks 0..7), and
    with world_size -8: both were taken silently; each now has a note saying what is wrong."""
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    src = next((CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto").glob("worker1_*.json"))
    doc = json.loads(src.read_text())
    assert doc["distributedInfo"]["world_size"] == 8 and doc["distributedInfo"]["rank"] == 1
    cases = {"rank8": {"rank": 8}, "negative_world": {"world_size": -8}}
    for name, change in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "t.json").write_text(
            json.dumps({**doc, "distributedInfo": {**doc["distributedInfo"], **change}})
        )
    (r,) = ingest_paths([tmp_path / "rank8"], Lake(tmp_path / "a"), jobs=1)
    assert r.status == "ok" and r.rank == 8
    assert "distributedInfo rank 8 is not below its world_size 8 (ranks are 0..7)" in " ".join(r.notes)
    (r,) = ingest_paths([tmp_path / "negative_world"], Lake(tmp_path / "b"), jobs=1)
    assert r.status == "ok" and "distributedInfo world_size -8 is not a world size: left out" in r.notes


def test_a_rank_option_outside_the_rank_column_is_a_usage_error(tmp_path):
    """`--rank -1` and `--rank 99999999999` were file failures (exit 4, a failed sources row);
    they are usage errors (exit 2) before any work: no lake is created."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    for bad in ("-1", "99999999999"):
        r = CliRunner().invoke(
            app, ["ingest", str(REPO / "sample_traces"), "--lake", str(tmp_path / "l"), "--rank", bad]
        )
        assert r.exit_code == 2 and f"--rank {bad}: a rank is 0 to 2147483647" in r.output
        assert not (tmp_path / "l").exists()


def test_a_rank_that_is_not_a_number_is_not_read_from_its_digits(tmp_path):
    """distributedInfo rank "v10" was read as rank 10 (the digits in it); it is no number: left
    out with a note, and the rank comes from the file name (worker1) as for a trace without one."""
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    src = next((CORPUS / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto").glob("worker1_*.json"))
    doc = json.loads(src.read_text())
    d = tmp_path / "in"
    d.mkdir()
    (d / "worker1_x.json").write_text(
        json.dumps({**doc, "distributedInfo": {**doc["distributedInfo"], "rank": "v10"}})
    )
    (r,) = ingest_paths([d], Lake(tmp_path / "lake"), jobs=1)
    assert r.status == "ok" and r.rank == 1
    assert "distributedInfo rank 'v10' is not an integer: left out" in r.notes
