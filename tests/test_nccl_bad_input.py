"""Bad input for the NCCL parsers: one clear TraceError line each, sniff says 'not ours' for other
formats, and a batch of good and bad files is parsed to the end."""

from __future__ import annotations

import gzip
import json
import random
import sqlite3
import zipfile

import polars as pl
import pytest
from conftest import corpus, write_trace

from pipeline import schema as sch
from pipeline.ingest import nccl
from pipeline.ingest.kineto import TraceError

GOOD_LOG = b"node01:1:2 [0] NCCL INFO Using network IB\n"


def _random_bytes(n: int) -> bytes:
    rnd = random.Random(7)
    return bytes(rnd.randrange(256) for _ in range(n))


def _sqlite(tmp_path) -> bytes:
    db = tmp_path / "t.sqlite"
    con = sqlite3.connect(db)
    con.execute("create table t (x)")
    con.commit()
    con.close()
    return db.read_bytes()


def _zip(tmp_path) -> bytes:
    z = tmp_path / "t.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("a.log", GOOD_LOG)
    return z.read_bytes()


BAD = {
    "empty.log": (b"", "empty file"),
    "blank.log": (b"\n \n\t\n", "empty file"),
    "random.bin": (_random_bytes(4096), "binary data, not a text log"),
    "nul.log": (b"node01:1:2 [0] NCCL INFO x\x00\x00\x00\x00" * 10, "binary data, not a text log"),
    "gzip.gz": (gzip.compress(GOOD_LOG), "binary data (SQLite, zip or gzip), not an NCCL log"),
    "kineto.json": (
        json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": [{"ph": "X"}]}).encode(),
        "a Kineto trace (traceEvents), not an NCCL log",
    ),
    "plain.txt": (
        b"epoch 1 loss 0.3\nepoch 2 loss 0.2\n",
        "no NCCL, nccl-tests, watchdog, flight-recorder or RAS lines found",
    ),
    "other.json": (
        b'{"foo": [1, 2, 3]}',
        "no NCCL, nccl-tests, watchdog, flight-recorder or RAS lines found",
    ),
    "trunc_profiler.json": (
        b'[\n{"name": "Group", "cat": "GROUP", "ph": "b", "id": 0, "ts": 1.0, "args": {"gr',
        "truncated JSON: no complete element",
    ),
    "trunc_fr.json": (
        b'{"version": "2.5", "pg_config": {"0": {"name": "0", "desc"',
        "truncated JSON: no complete Flight Recorder entry",
    ),
    "trunc.pkl": (b"\x80\x02}q\x00(X\x07\x00\x00\x00version", "truncated pickle"),
    "ras_garbage.txt": (
        b"NCCL version 2.26.2 compiled with CUDA 12.6\n",
        None,
    ),  # versions only: parses, no rows
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_one_line_error(name):
    data, why = BAD[name]
    if why is None:
        p = nccl.parse(data, name)
        assert p.format == "nccl_ras" and p.tables == {} and p.tool_versions["nccl_version"] == "2.26.2"
        return
    with pytest.raises(TraceError) as exc:
        nccl.parse(data, name)
    assert str(exc.value) == why
    assert "\n" not in str(exc.value)


def test_sqlite_and_zip_are_not_ours(tmp_path):
    for data in (_sqlite(tmp_path), _zip(tmp_path)):
        assert nccl.sniff(data[:65536], "x") is None
        with pytest.raises(TraceError, match="^binary data"):
            nccl.parse(data, "x")


def test_sniff_refuses_kineto_traces(tmp_path):
    for path in (
        write_trace(
            tmp_path / "k.json", [{"ph": "X", "cat": "kernel", "name": "nccl:all_reduce", "ts": 1, "dur": 1}]
        ),
        corpus("hta", "tests", "data", "trace_filter", "sampled_rank-1.json.gz"),
    ):
        raw = path.read_bytes()
        data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        assert nccl.sniff(data[:65536], path.name) is None
        assert nccl.sniff(raw[:65536], path.name) is None


def test_sniff_needs_real_markers():
    # log lines starting with '[' are not JSON; a word "NCCL" alone is not an NCCL line
    assert nccl.sniff(b"[rank0]: training started, using NCCL backend\n", "a.log") is None
    assert nccl.sniff(b"[0] node01:1:2 [0] NCCL INFO Using network IB\n", "a.log") == "nccl_log"
    assert nccl.sniff(b"NCCL version 2.18.1+cuda12.1\n", "a.log") == "nccl_log"
    assert (
        nccl.sniff(
            b"0: #       size         count      type   redop    root     time   algbw   busbw #wrong\n", "a"
        )
        == "nccl_tests"
    )


def test_explicit_format_on_wrong_content():
    with pytest.raises(TraceError, match="^JSON, not a nccl_log text log$"):
        nccl.parse(b'[{"a": 1}]', "x.json", "nccl_log")
    with pytest.raises(TraceError, match="^unknown NCCL format 'bogus'$"):
        nccl.parse(GOOD_LOG, "x.log", "bogus")
    with pytest.raises(TraceError, match="^binary data, not a Flight Recorder pickle or JSON$"):
        nccl.parse(_random_bytes(1000).replace(b"\x80", b"\x81"), "nccl_trace_rank_0", "flight_recorder")


def test_garbage_lines_inside_a_log_are_kept():
    junk = "".join(chr(c) for c in range(0x21, 0x7E))
    data = (
        GOOD_LOG.decode() + junk + "\n" + "node01:1:2 [0] NCCL INFO Channel 99/0 : garbage -> via\n"
    ).encode()
    p = nccl.parse(data, "x.log")
    ev = p.tables["nccl_events"].to_dicts()
    assert [(e["line_no"], e["kind"]) for e in ev] == [(1, "net"), (2, "other"), (3, "info")]
    assert ev[1]["text"] == junk


def test_batch_never_stops(tmp_path):
    """Every bad file gives its error and every good corpus file still parses, in one loop."""
    files = {name: data for name, (data, _) in BAD.items()}
    files["sqlite.db"] = _sqlite(tmp_path)
    for p in sorted(corpus("nccl").iterdir()):
        if p.name != "PROVENANCE.md":
            files[p.name] = p.read_bytes()
    ok, failed = [], []
    for name, data in files.items():
        try:
            nccl.parse(data, name)
            ok.append(name)
        except TraceError as e:
            failed.append((name, str(e)))
    assert len(ok) == 29 + 1  # the corpus and ras_garbage.txt
    assert {n for n, _ in failed} == set(BAD) - {"ras_garbage.txt"} | {"sqlite.db"}
    assert all(msg and "\n" not in msg for _, msg in failed)


def test_random_text_fuzz_never_raises_anything_but_traceerror():
    rnd = random.Random(11)
    pieces = [
        "node01:1:2 [0] NCCL INFO ",
        "NCCL WARN ",
        "Channel 00/0 : ",
        "0[0] -> 1[1] ",
        "via NET/IB/0 ",
        "opCount ",
        "comm 0x1 ",
        "rank 1 nranks 2 ",
        "- Init COMPLETE",
        "# size count type time ",
        "WorkNCCL(SeqNum=1, ",
        "[rank0]:",
        "\n",
        " ",
        "-1",
        "999999999999999999999999",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        ":",
        "\r",
    ]
    for _ in range(300):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randrange(1, 60)))
        try:
            p = nccl.parse(text.encode(), "fuzz.log")
        except TraceError:
            continue
        for t, df in p.tables.items():  # whatever was read still fits the schema (non-null columns included)
            sch.conform(t, df.with_columns(run_id=pl.lit("r"), source_id=pl.lit("s")).to_arrow())


def test_numbers_too_large_for_their_columns():
    big = "9" * 30
    log = (
        f"n:1:2 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x1 count {big} "
        f"datatype 7 op 0 root 0 "
        f"comm 0x1 [nranks=2] stream 0x2\n"
        f"n:1:2 [0] NCCL INFO Channel {big}/0 : 0[0] -> 1[1] via P2P/IPC\n"
        f"n:{big}:2 [0] NCCL INFO Using network IB\n"
        f"#       size         count      type   redop    root     time   algbw   busbw #wrong"
        f"     time   algbw   busbw #wrong\n"
        f"{big} 2 float sum -1 1.0 0.0 0.0 0 1.0 0.0 0.0 0\n"
        f"8 2 float sum -1 1e300 0.0 0.0 0 1.0 0.0 0.0 0\n"
    )
    p = nccl.parse(log.encode(), "big.log")
    assert set(p.tables) == {"nccl_events", "nccl_processes"}
    kinds = {r["line_no"]: r["kind"] for r in p.tables["nccl_events"].to_dicts()}
    assert kinds == {1: "info", 2: "info", 3: "net", 4: "nccl_tests_header", 5: "other", 6: "other"}
    assert "nccl_processes.pid: 1 values outside int64 stored as null" in p.notes
    for t, df in p.tables.items():
        sch.conform(t, df.with_columns(run_id=pl.lit("r"), source_id=pl.lit("s")).to_arrow())


def test_a_log_padded_with_nul_bytes_is_still_the_log(tmp_path):
    """nccl-issue-1189's log with 100 NUL bytes after its last line (a node that died leaves its
    log padded so), or 3,000 before its first: the same rows as the log itself, in every table;
    a file of NULs alone is still not a log (one line, failed)."""
    from pipeline.ingest import ingest_paths
    from pipeline.lake import Lake

    (log,) = corpus("nccl").glob("nccl-issue-1189-*.log")
    text = log.read_bytes()
    variants = {"tail": text + b"\0" * 100, "head": b"\0" * 3000 + text, "plain": text}

    def rows(name: str, data: bytes) -> dict:
        f = tmp_path / name / "node.log"
        f.parent.mkdir()
        f.write_bytes(data)
        lake = Lake(tmp_path / f"lake_{name}")
        (r,) = ingest_paths([f], lake, jobs=1)
        assert r.status == "ok", (name, r.error)
        return {
            t: pl.read_parquet(lake.table_files(t))
            .drop("source_id", "run_id", strict=False)
            .sort(pl.all())
            .rows()
            for t in sch.tables()
            if t != "sources" and lake.table_files(t)
        }

    want = rows("plain", variants["plain"])
    assert want and rows("tail", variants["tail"]) == want and rows("head", variants["head"]) == want
    f = tmp_path / "noted" / "node.log"
    f.parent.mkdir()
    f.write_bytes(variants["tail"])
    (r,) = ingest_paths([f], Lake(tmp_path / "lake_n"), jobs=1)
    assert "100 NUL bytes left out (a log padded when its writer died?)" in r.notes
    z = tmp_path / "zeros" / "node.log"
    z.parent.mkdir()
    z.write_bytes(b"\0" * 5000)
    (r,) = ingest_paths([z], Lake(tmp_path / "lake_z"), jobs=1)
    assert r.status == "failed" and "\n" not in r.error
