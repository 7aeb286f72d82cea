"""Bad input: one line naming the file and the problem; the rest of the batch is ingested; the lake
stays readable; exit codes 3 (some failed) and 4 (all failed)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import X, corpus, write_trace
from typer.testing import CliRunner

from pipeline.cli import EXIT_FAILED, EXIT_PARTIAL, app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake
from pipeline.query import connect

GOOD = [
    X("kernel", "gemm", 10, 5, pid=0, tid=7, stream=7, device=0, correlation=1),
    X("cuda_runtime", "cudaLaunchKernel", 1, 2, correlation=1),
]

BAD = {
    "empty.json": (b"", "empty file"),
    "truncated.json": (b'{"traceEvents": [{"ph": "X", "ts": 1, "na', "truncated"),  # no complete event
    "notjson.json": (b"this is not json at all\n", "not valid JSON"),
    "wrongshape.json": (b'{"traceEvents": 5}', "wrong JSON shape"),
    "number.json": (b"42", "wrong JSON shape"),
    "binary.json.gz": (b"\x1f\x8b\x08\x00garbage-not-deflate", "gzip"),
    "trunc.json.gz": (gzip.compress(json.dumps({"traceEvents": []}).encode() * 50)[:40], "gzip"),
    "noevents.json": (b'{"schemaVersion": 1, "foo": 1}', "without 'traceEvents'"),
}


@pytest.fixture
def batch(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    for name, (data, _) in BAD.items():
        (d / name).write_bytes(data)
    write_trace(d / "rank0.json", GOOD)
    shutil.copy(
        corpus("hta", "tests", "data", "trace_filter", "sampled_rank-1.json.gz"), d / "sampled_rank-1.json.gz"
    )
    # complete events before the cut are kept (tests/test_truncated.py checks real traces)
    (d / "cut.json").write_bytes(json.dumps({"traceEvents": [{"ph": "X", "ts": 1}] * 20}).encode()[:-25])
    return d


def test_batch_continues_and_errors_are_one_line(batch, tmp_path):
    lake = Lake(tmp_path / "lake")
    res = {r.path.rsplit("/", 1)[-1]: r for r in ingest_paths([batch], lake)}
    for name, (_, why) in BAD.items():
        r = res[name]
        assert r.status == "failed", name
        assert why in r.error, (name, r.error)
        assert "\n" not in r.error
    assert res["rank0.json"].status == "ok" and res["sampled_rank-1.json.gz"].status == "ok"
    assert res["cut.json"].status == "partial" and res["cut.json"].error is None
    con = connect(lake)
    assert con.execute("SELECT count(*) FROM gpu_activities WHERE rank = 0").fetchone()[0] == 1
    failed = con.execute(
        "SELECT count(*) FROM sources WHERE status = 'failed' AND error IS NOT NULL"
    ).fetchone()[0]
    assert failed == len(BAD)


def test_failed_rows_say_unknown_when_no_format_was_detected(batch, tmp_path):
    """A failed file whose bytes (decompressed) do not start a JSON object or array was detected as
    no format at all: its row's format is `unknown` ("when detection failed", schemas/v3.toml), not
    the kineto_json its name suggested; one that does start like a Kineto trace stays kineto_json.
    Expected formats read off each file's first bytes in BAD (and the extra files below)."""
    import codecs

    (batch / "blank.json").write_bytes(b" \n\t\n")
    utf16 = '{"traceEvents": [{"ph": "X"'.encode("utf-16-le")
    (batch / "utf16.json").write_bytes(codecs.BOM_UTF16_LE + utf16)
    (batch / "bom.json").write_bytes(codecs.BOM_UTF8 + b' \n{"traceEvents": 5}')
    (batch / "gzip_of_nothing.json.gz").write_bytes(gzip.compress(b""))
    # (the attack of 2026-12-05) white space past the 64 KiB the format is told from, and UTF-16BE
    # without a mark shorter than the 16 bytes text_encoding needs elsewhere (JSON needs 4)
    (batch / "far.json").write_bytes(b" " * 70_000 + b'{"traceEvents": 5}')
    (batch / "utf16be.json").write_bytes('{"tr'.encode("utf-16-be"))
    lake = Lake(tmp_path / "lake")
    ingest_paths([batch], lake)
    rows = connect(lake).execute("SELECT path, format FROM sources WHERE status = 'failed'").fetchall()
    got = {p.rsplit("/", 1)[-1]: f for p, f in rows}
    expected = {
        "empty.json": "unknown",  # b""
        "blank.json": "unknown",  # white space only
        "notjson.json": "unknown",  # b"this is ..."
        "number.json": "unknown",  # b"42": a JSON scalar
        "binary.json.gz": "unknown",  # gzip's magic, then nothing that inflates
        "gzip_of_nothing.json.gz": "unknown",  # inflates to b""
        "noevents.json": "unknown",  # an object without traceEvents (NotKinetoError, as before)
        "truncated.json": "kineto_json",  # b'{"traceEvents": [...'
        "wrongshape.json": "kineto_json",  # b'{"traceEvents": 5}'
        "trunc.json.gz": "kineto_json",  # inflates to b'{"traceEvents": ...' before the cut
        "utf16.json": "kineto_json",  # UTF-16 '{"traceEvents": ...', cut
        "bom.json": "kineto_json",  # UTF-8 mark, white space, then '{'
        "far.json": "kineto_json",  # 64 KiB of white space cannot tell: the JSON reader's
        "utf16be.json": "kineto_json",  # UTF-16BE '{"tr', cut
    }
    assert got == expected


def test_cli_exit_codes_and_message_names_the_file(batch, tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["ingest", str(batch), "--lake", str(tmp_path / "l1")])
    assert r.exit_code == EXIT_PARTIAL
    assert "notjson.json: not valid JSON" in r.output
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "x.json").write_bytes(b"{")
    r = runner.invoke(app, ["ingest", str(only_bad), "--lake", str(tmp_path / "l2")])
    assert r.exit_code == EXIT_FAILED
    # a path that does not exist is a usage error (exit 2) that creates nothing
    r = runner.invoke(app, ["ingest", str(tmp_path / "nope"), "--lake", str(tmp_path / "l3")])
    assert r.exit_code == 2 and "nope: no such file or directory" in r.output
    assert not (tmp_path / "l3").exists()


def test_invalid_utf8_is_replaced_and_noted(tmp_path):
    doc = json.dumps({"traceEvents": GOOD}).encode().replace(b'"gemm"', b'"ge\xff\xfemm"')
    (tmp_path / "rank0.json").write_bytes(doc)
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([tmp_path / "rank0.json"], lake)
    assert r.status == "ok" and any("invalid UTF-8" in n for n in r.notes)
    name = connect(lake).execute("SELECT name FROM gpu_activities").fetchone()[0]
    assert name == "ge\ufffd\ufffdmm"


def test_a_path_that_is_not_utf8_fails_alone(tmp_path):
    """A directory, a file or an archive member named in another encoding than UTF-8 (Latin-1's
    byte E9 for e-acute): one line naming it, its bytes written as \\xe9, and the rest of the
    batch ingested (the lake stores paths and run names as UTF-8: it had stopped the batch with a
    traceback)."""
    import os
    import tarfile

    top = os.fsencode(str(tmp_path / "in"))
    bad_dir = top + b"/caf\xe9"
    os.makedirs(bad_dir)
    write_trace(Path(os.fsdecode(bad_dir + b"/rank0.json")), GOOD)
    write_trace(tmp_path / "in" / "ok" / "rank1.json", GOOD)
    write_trace(Path(os.fsdecode(top + b"/ok/r\xe9sum\xe9_rank2.json")), GOOD)
    with tarfile.open(tmp_path / "in" / "a.tar", "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as t:
        t.add(tmp_path / "in" / "ok" / "rank1.json", arcname="caf\xe9/rank3.json")
    runner = CliRunner()
    r = runner.invoke(app, ["ingest", str(tmp_path / "in"), "--lake", str(tmp_path / "lake")])
    assert r.exit_code == EXIT_PARTIAL, r.output
    failed = [line for line in r.output.splitlines() if line.startswith("failed ")]
    assert len(failed) == 3 and all("not UTF-8" in line for line in failed)
    assert any(
        line.endswith(
            "caf\\xe9/rank0.json: its path is not UTF-8 text (a name in another encoding): rename it"
        )
        for line in failed
    )
    assert any("r\\xe9sum\\xe9_rank2.json" in line for line in failed)
    assert any("a.tar!caf\\xe9/rank3.json: its name is not UTF-8" in line for line in failed)
    assert "ingested 1, failed 3" in r.output
    (n,) = connect(Lake(tmp_path / "lake")).execute("SELECT count(*) FROM gpu_activities").fetchone()
    assert n == 1


def test_a_bad_file_never_corrupts_what_is_in_the_lake(tmp_path):
    lake = Lake(tmp_path / "lake")
    write_trace(tmp_path / "a" / "rank0.json", GOOD)
    ingest_paths([tmp_path / "a"], lake, run="job")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "rank1.json").write_bytes(b'{"traceEvents": [')
    ingest_paths([tmp_path / "b"], lake, run="job")
    con = connect(lake)
    assert con.execute("SELECT count(*) FROM gpu_activities").fetchone()[0] == 1
    assert sorted(con.execute("SELECT status FROM sources").fetchall()) == [("failed",), ("ok",)]


def test_two_files_never_silently_share_a_rank(tmp_path):
    write_trace(tmp_path / "job" / "a.json", GOOD)  # no rank anywhere -> default 0
    write_trace(tmp_path / "job" / "b.json", GOOD + [X("cpu_op", "aten::add", 1, 1)])
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([tmp_path / "job"], lake)
    assert [r.status for r in res] == ["ok", "ok"]
    assert res[0].run_id == "job" and res[1].run_id != "job"
    assert any("already held" in n for n in res[1].notes)
    # --rank given for one file
    lake2 = Lake(tmp_path / "lake2")
    (r,) = ingest_paths([tmp_path / "job" / "a.json"], lake2, rank=5)
    assert r.rank == 5


def test_reingest_skips_and_force_replaces(tmp_path):
    write_trace(tmp_path / "job" / "rank0.json", GOOD)
    lake = Lake(tmp_path / "lake")
    ingest_paths([tmp_path / "job"], lake)
    (r,) = ingest_paths([tmp_path / "job"], lake)
    assert r.status == "skipped"
    (r,) = ingest_paths([tmp_path / "job"], lake, force=True)
    assert r.status == "ok"
    con = connect(lake)
    assert con.execute("SELECT count(*) FROM gpu_activities").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM sources").fetchone()[0] == 1


def test_force_with_a_bad_rank_keeps_the_earlier_data(tmp_path):
    write_trace(tmp_path / "a" / "norank.json", GOOD)
    lake = Lake(tmp_path / "lake")
    (r,) = ingest_paths([tmp_path / "a" / "norank.json"], lake, rank=1)
    assert r.status == "ok"
    (r,) = ingest_paths([tmp_path / "a" / "norank.json"], lake, rank=3_000_000_000, force=True)
    assert r.status == "failed" and "outside" in r.error
    # the failed attempt replaced the source's row, but never before it was known to fail;
    # a rank read from the trace itself is checked the same way
    write_trace(tmp_path / "b" / "x.json", GOOD, distributedInfo={"rank": 2**31})
    write_trace(tmp_path / "b" / "y.json", GOOD, distributedInfo={"rank": 3})
    res = {Path(r.path).name: r for r in ingest_paths([tmp_path / "b"], lake)}
    assert res["x.json"].status == "failed" and res["y.json"].status == "ok"


def test_markup_control_characters_and_overflow(tmp_path):
    d = tmp_path / "in"
    write_trace(d / "[red]c.json", GOOD)
    (d / "bad\nname.json").write_bytes(b"{")
    (d / "markup.json").write_text(json.dumps({"traceEvents": GOOD, "baseTimeNanoseconds": "[/bold]"}))
    huge = [
        X("kernel", "k", 9999999999999999, 2, pid=0, tid=7, stream=7),
        X("kernel", "k2", 5, 99999999999999999, pid=0, tid=7, stream=7),
    ]
    write_trace(d / "huge.json", huge)
    write_trace(d / "all_unreadable.json", [X("kernel", "k", 9999999999999999, 2, pid=0, tid=7, stream=7)])
    runner = CliRunner()
    r = runner.invoke(app, ["ingest", str(d), "--lake", str(tmp_path / "lake")])
    assert r.exit_code == EXIT_PARTIAL, r.output
    assert "bad\\x0aname.json: truncated JSON" in r.output
    assert "markup.json: baseTimeNanoseconds is not an integer" in r.output
    con = connect(Lake(tmp_path / "lake"))
    assert con.execute("SELECT status FROM sources WHERE path LIKE '%[red]c.json'").fetchall() == [("ok",)]
    rows = con.execute(
        "SELECT name, start_ns, dur_ns FROM gpu_activities WHERE source_id IN "
        "(SELECT source_id FROM sources WHERE path LIKE '%huge.json') ORDER BY name"
    ).fetchall()
    # 9999999999999999 µs does not fit in int64 ns: dropped, not wrapped; the huge dur becomes 0 (noted)
    assert rows == [("k2", 5000, 0)]
    # a trace whose only event is dropped that way has nothing left: failed, not an empty ok
    assert con.execute(
        "SELECT status, error FROM sources WHERE path LIKE '%all_unreadable.json'"
    ).fetchall() == [("failed", "none of its 1 events has a readable time: nothing to store")]


def test_lake_path_with_glob_characters(tmp_path):
    write_trace(tmp_path / "a" / "rank0.json", GOOD)
    write_trace(tmp_path / "b" / "rank1.json", GOOD)
    ingest_paths([tmp_path / "a" / "rank0.json"], Lake(tmp_path / "Lx[1]"))
    ingest_paths([tmp_path / "b" / "rank1.json"], Lake(tmp_path / "Lx1"))
    con = connect(Lake(tmp_path / "Lx[1]"))
    assert con.execute("SELECT rank FROM sources").fetchall() == [(0,)]


def test_gzip_bomb_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACELAKE_MAX_UNCOMPRESSED_BYTES", str(10_000_000))
    bomb = gzip.compress(b"[" + b" " * 50_000_000 + b"]", compresslevel=9)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bomb.json.gz").write_bytes(bomb)
    write_trace(tmp_path / "in" / "rank0.json", GOOD)
    res = {Path(r.path).name: r for r in ingest_paths([tmp_path / "in"], Lake(tmp_path / "lake"))}
    assert res["bomb.json.gz"].status == "failed" and "gzip bomb" in res["bomb.json.gz"].error
    assert res["rank0.json"].status == "ok"


def test_missing_paths_and_bad_lake_do_not_crash(tmp_path):
    write_trace(tmp_path / "rank0.json", GOOD)
    runner = CliRunner()
    assert (
        runner.invoke(
            app, ["ingest", str(tmp_path / "rank0.json"), "--lake", str(tmp_path / "lake")]
        ).exit_code
        == 0
    )
    write_trace(tmp_path / "rank1.json", GOOD)
    r = runner.invoke(
        app,
        [
            "ingest",
            str(tmp_path / "rank1.json"),
            str(tmp_path / "nope.json"),
            "--lake",
            str(tmp_path / "lake"),
        ],
    )
    # one missing path among the inputs: a usage error before any work, the lake unchanged
    assert r.exit_code == 2 and "nope.json: no such file or directory" in r.output
    assert connect(Lake(tmp_path / "lake")).execute("SELECT count(*) FROM gpu_activities").fetchone()[0] == 1
    (tmp_path / "afile").write_text("x")
    r = runner.invoke(app, ["ingest", str(tmp_path / "rank0.json"), "--lake", str(tmp_path / "afile")])
    assert r.exit_code == 2 and "not a directory" in r.output and isinstance(r.exception, SystemExit)
    r = runner.invoke(app, ["sql", "--lake", str(tmp_path / "lake"), ""])
    assert r.exit_code == 2 and "empty query" in r.output
    r = runner.invoke(app, ["sql", "--lake", str(tmp_path / "lake"), "@" + str(tmp_path / "missing.sql")])
    assert r.exit_code == 2 and "missing.sql" in r.output


def test_run_ids_never_merge_after_sanitizing():
    from pipeline.lake import safe_run_id

    assert safe_run_id("a'b") != safe_run_id("a\nb")
    assert safe_run_id("job-1") == "job-1"
    assert safe_run_id("..") != safe_run_id(".")


def test_identical_bad_files_keep_a_row_each(tmp_path):
    d = tmp_path / "dup"
    d.mkdir()
    (d / "rank-3.json").write_bytes(b"")
    (d / "rank-5.json").write_bytes(b"")
    lake = Lake(tmp_path / "lake")
    res = ingest_paths([d], lake)
    assert [r.status for r in res] == ["failed", "failed"]
    rows = (
        connect(lake)
        .execute("SELECT regexp_extract(path, '[^/]+$'), status, error FROM sources ORDER BY 1")
        .fetchall()
    )
    assert rows == [("rank-3.json", "failed", "empty file"), ("rank-5.json", "failed", "empty file")]
    ingest_paths([d], lake)  # again: each file's row is replaced, not duplicated
    assert connect(lake).execute("SELECT count(*) FROM sources").fetchone()[0] == 2


def test_a_gz_that_is_not_gzip_says_so(tmp_path):
    bad = tmp_path / "job" / "rank0.json.gz"
    bad.parent.mkdir()
    bad.write_bytes(b"hello, this is not gzip")
    (r,) = ingest_paths([bad], Lake(tmp_path / "lake"))
    assert r.status == "failed" and r.error.startswith(
        "named .gz but not gzip (no gzip header); not valid JSON"
    )
    text = bad.parent / "notes.gz"  # *.gz is also a trace suffix
    text.write_bytes(b"hello, this is not gzip\n")
    (r,) = ingest_paths([text], Lake(tmp_path / "lake1"))
    assert r.status == "failed" and r.error.startswith(
        "named .gz but not gzip (no gzip header); not a Kineto trace"
    )
    # a plain JSON trace named .gz and cut short: said too (it was "truncated JSON" alone)
    cut = bad.parent / "rank1.json.gz"
    cut.write_bytes(b'{"traceEvents": [')
    (r,) = ingest_paths([cut], Lake(tmp_path / "lake3"))
    assert r.status == "failed" and r.error.startswith(
        "named .gz but not gzip (no gzip header); truncated JSON"
    )
    # gzip is told from the bytes, not the name: a plain JSON trace named .gz ingests
    plain = write_trace(tmp_path / "job2" / "rank0.json.gz", GOOD)
    (r,) = ingest_paths([plain], Lake(tmp_path / "lake2"))
    assert r.status == "ok"


# --- issue 39 item 13: what is one clear line, or read ------------------------------------------

NAMED = [
    X("kernel", "gemm_é_核", 10, 5, pid=0, tid=7, stream=7, device=0, correlation=1),
    X("cuda_runtime", "cudaLaunchKernel", 1, 2, correlation=1),
]


def test_json_with_a_bom_or_in_utf16_or_utf32_is_read(tmp_path):
    """A UTF-8 byte order mark failed 'not valid JSON: ... invalid character (byte 0)', as did
    UTF-16 JSON (PowerShell's `>` writes it): the mark is dropped, UTF-16 and UTF-32 (with a mark
    or without, told by their zero bytes) decoded as read; each gives the rows of the UTF-8 file."""
    text = json.dumps({"schemaVersion": 1, "traceEvents": NAMED}, ensure_ascii=False)
    files = {
        "plain": (text.encode(), []),
        "bom": (b"\xef\xbb\xbf" + text.encode(), []),
        "u16": (text.encode("utf-16"), ["UTF-16LE encoded JSON: decoded to UTF-8 as it was read"]),
        "u16be": (text.encode("utf-16-be"), ["UTF-16BE encoded JSON: decoded to UTF-8 as it was read"]),
        "u32": (text.encode("utf-32"), ["UTF-32LE encoded JSON: decoded to UTF-8 as it was read"]),
    }
    for d, (data, _) in files.items():
        (tmp_path / d).mkdir()
        (tmp_path / d / "rank0.json").write_bytes(data)
    lake = Lake(tmp_path / "lake")
    res = {r.run_id: r for r in ingest_paths([tmp_path / d for d in files], lake, jobs=1)}
    assert {d: (r.status, r.notes) for d, r in res.items()} == {
        d: ("ok", notes) for d, (_, notes) in files.items()
    }
    rows = connect(lake).execute("SELECT run_id, name, start_ns, dur_ns FROM gpu_activities").fetchall()
    assert sorted(rows) == sorted((d, "gemm_é_核", 10_000, 5_000) for d in files)


def test_bytes_after_a_complete_trace_are_ignored_with_a_note(tmp_path):
    """Bytes after the end of the JSON document failed the whole file ('trailing characters after
    the traceEvents array'): the trace is kept (status ok, its rows), a note counts the bytes."""
    doc = json.dumps({"schemaVersion": 1, "traceEvents": GOOD}).encode()
    cases = {
        "garbage": (
            doc + b"\n\x00\x00garbage",
            f"9 trailing bytes after the JSON document (from byte {len(doc) + 1}) were ignored",
        ),
        "twice": (
            doc + doc,
            f"{len(doc)} trailing bytes after the JSON document (from byte {len(doc)}) were ignored",
        ),
        "array": (
            json.dumps(GOOD).encode() + b" ]}",
            f"2 trailing bytes after the JSON document (from byte {len(json.dumps(GOOD)) + 1}) were ignored",
        ),
    }
    for d, (data, _) in cases.items():
        (tmp_path / d).mkdir()
        (tmp_path / d / "rank0.json").write_bytes(data)
    lake = Lake(tmp_path / "lake")
    res = {r.run_id: r for r in ingest_paths([tmp_path / d for d in cases], lake, jobs=1)}
    assert {d: (r.status, r.notes) for d, r in res.items()} == {d: ("ok", [n]) for d, (_, n) in cases.items()}
    con = connect(lake)
    assert sorted(con.execute("SELECT run_id, count(*) FROM gpu_activities GROUP BY 1").fetchall()) == [
        ("array", 1),
        ("garbage", 1),
        ("twice", 1),
    ]
    notes = con.execute("SELECT notes FROM sources WHERE run_id = 'garbage'").fetchone()[0]
    assert notes == [cases["garbage"][1]]
    # a document read whole (kineto.decode) ignores them the same way
    from pipeline.ingest.kineto import decode

    top, n = decode(b'{"traceEvents": []} xy')
    assert top.trace_events == [] and n == [
        "2 trailing bytes after the JSON document (from byte 20) were ignored"
    ]
