"""A lake part damaged in place (found by the attack of 2026-12-05's changes): its bytes
overwritten, its size and both PAR1 marks intact, as a bad disk block or a partial overwrite
leaves it.

A per-source result part (local_*):

DuckDB then fails with its generic duckdb.Error ("TProtocolException: Invalid data", "don't know
what type: ...") whose only mention of the file is the excerpt of the SQL after "LINE 1:", cut
after about 60 characters of the path: for a lake at anything but a short path (pytest's
tmp_path here) neither the file nor "/local_<table>/run=" appears in it. pipeline/local.py
unreadable(e) looks for "/local_<table>/run=", so none of the three readers reads past the
part, as they do for one cut short (tests/test_local_fill.py):
- analysis raises duckdb.Error (6202c54 looked for "/local_" alone, which the excerpt still
  holds for a lake at a somewhat shorter path: `tracelake analyze --lake /tmp/attack4/s3/mylake`
  fell back with a note there and ends in a traceback now);
- the Python API raises duckdb.Error from every metric, with no UserWarning;
- `tracelake sql` ends in a Python traceback, exit 1 (its connect catches IOException and
  InvalidInputException only, not duckdb.Error).

Expected, as for a part cut short: the same metrics as a lake without per-source results, with a
note naming the part (analysis: in its notes; API: a UserWarning; sql: on stderr, exit 0);
pipeline/local.py fallback_note finds it by reading the per-source parts whole.

A part of the lake's own rows (cpu_ops) damaged the same way: `tracelake analyze` and `tracelake
sql` ended in a traceback; expected: "cannot read the lake", naming the part, exit 4
(pipeline/cli/lake_errors.py).
"""

from __future__ import annotations

import json
import warnings

import polars as pl
import pytest
from conftest import FEW
from typer.testing import CliRunner

import pipeline
from pipeline import local, local_fill, query
from pipeline.analyze import analyze
from pipeline.cli import app
from pipeline.ingest import ingest_paths
from pipeline.lake import Lake

NOTE = "per-source results could not be read"


def _zero_middle(part) -> None:
    data = bytearray(part.read_bytes())
    n = len(data)
    data[n // 4 : 3 * n // 4] = bytes(3 * n // 4 - n // 4)
    part.write_bytes(bytes(data))
    assert data[:4] == data[-4:] == b"PAR1"


def _full_and_filled(few, root, monkeypatch) -> tuple[Lake, Lake]:
    """(full: no per-source results; lake: the same sources, each with its per-source results as
    parts of its own)."""
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10**9)
    full = Lake(root / "full")
    ingest_paths([few], full, jobs=1)
    monkeypatch.setattr(local, "MIN_GPU_ROWS", 10)
    lake = Lake(root / "lake")
    ingest_paths([few], lake, jobs=1, compact=False)
    assert local_fill.fill(lake, min_rows=10) == FEW
    return full, lake


def _lakes(few, root, monkeypatch) -> tuple[Lake, Lake]:
    """_full_and_filled's, local_step_time's part damaged in place: the middle half of its bytes
    zeroed."""
    full, lake = _full_and_filled(few, root, monkeypatch)
    _zero_middle(sorted((lake.root / "local_step_time").rglob("*.parquet"))[0])
    return full, lake


def test_analysis_reads_past_a_part_damaged_in_place(few, tmp_path, monkeypatch):
    full, lake = _lakes(few, tmp_path, monkeypatch)
    ref = analyze(full, keep=False)
    got = analyze(lake, keep=False)  # raises duckdb.Error: TProtocolException: Invalid data
    notes = [n for n in got["notes"] if NOTE in str(n)]
    assert len(notes) == 1 and "local_step_time" in str(notes[0]), got["notes"]
    got["notes"] = [n for n in got["notes"] if n not in notes]
    assert json.dumps(got, sort_keys=True, default=str) == json.dumps(ref, sort_keys=True, default=str)


def test_the_api_reads_past_a_part_damaged_in_place(few, tmp_path, monkeypatch):
    full, lake = _lakes(few, tmp_path, monkeypatch)
    with pipeline.open_lake(full.root) as s:
        ref = s.df("step_time").sort(pl.all())
    with pipeline.open_lake(lake.root) as s:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = s.df("step_time").sort(pl.all())  # raises duckdb.Error
        assert got.equals(ref)
        assert [w for w in caught if NOTE in str(w.message)], [str(w.message) for w in caught]


def test_sql_reads_past_a_part_damaged_in_place(few, tmp_path, monkeypatch):
    full, lake = _lakes(few, tmp_path, monkeypatch)
    runner = CliRunner()
    ref = runner.invoke(app, ["sql", "SELECT * FROM step_time", "--lake", str(full.root), "--format", "json"])
    assert ref.exit_code == 0, ref.output
    r = runner.invoke(app, ["sql", "SELECT * FROM step_time", "--lake", str(lake.root), "--format", "json"])
    # exit 1: the uncaught duckdb.Error (a traceback on the command line)
    assert r.exit_code == 0, (r.exit_code, repr(r.exception), r.output[-500:])
    assert [line for line in r.stderr.splitlines() if NOTE in line], r.stderr
    rows = sorted(json.dumps(x, sort_keys=True) for x in json.loads(r.stdout))
    assert rows == sorted(json.dumps(x, sort_keys=True) for x in json.loads(ref.stdout))


def test_a_damaged_part_of_the_lakes_rows_is_one_line_naming_it(few, tmp_path):
    """cpu_ops' part zeroed inside (DuckDB: "TProtocolException: Invalid data", no file named):
    analyze and sql exit 4 with one line that names the part (read whole to find it), and a
    query's own error on a sound lake still exits 2."""
    lake = Lake(tmp_path / "lake")
    ingest_paths([few], lake, jobs=1)
    part = sorted((lake.root / "cpu_ops").rglob("*.parquet"))[-1]
    _zero_middle(part)
    runner = CliRunner()
    for args in (["analyze", "--json"], ["sql", "SELECT max(name), sum(end_ns - start_ns) FROM cpu_ops"]):
        r = runner.invoke(app, [*args, "--lake", str(lake.root)])
        assert r.exit_code == 4, (args, r.exit_code, repr(r.exception))
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot read the lake" in lines[0] and str(part) in lines[0], r.stderr
    good = Lake(tmp_path / "good")
    ingest_paths([few], good, jobs=1)
    r = runner.invoke(app, ["sql", "SELECT 'x'::INT", "--lake", str(good.root)])
    assert r.exit_code == 2 and r.stderr.startswith("error: Conversion Error"), r.stderr


def test_sql_and_the_api_read_past_a_damaged_per_source_part(few, tmp_path, monkeypatch):
    """A per-source part cut short (as in test_local_fill.py's analysis test), read by `tracelake
    sql` and the Python API (they had failed with DuckDB's "No magic bytes", `sql` even as a usage
    error, exit 2): each metric equals the one of a lake without per-source results, with one note
    (sql: on stderr; API: a UserWarning) naming the file; sql exits 0. The part is cut at 100 bytes
    (whole parts end in PAR1). Both when the small lake's tables are read as the connection opens
    and when each query reads the parts (LOAD_ALL_BYTES 0, as for a larger lake)."""
    full, lake = _full_and_filled(few, tmp_path, monkeypatch)
    for metric, load_all in (("step_time", query.LOAD_ALL_BYTES), ("breakdown", 0), ("phases", 0)):
        monkeypatch.setattr(query, "LOAD_ALL_BYTES", load_all)
        with pipeline.open_lake(full.root) as s:
            ref = s.df(metric).sort(pl.all())
        with pipeline.open_lake(lake.root) as s:
            assert s.connection.execute("SELECT getvariable('use_local')").fetchone()[0]
        # the last part: a view binds on the first part's footer, so a query reads this one
        part = sorted((lake.root / f"local_{metric}").rglob("*.parquet"))[-1]
        whole = part.read_bytes()
        part.write_bytes(whole[:100])
        with pipeline.open_lake(lake.root) as s:
            with pytest.warns(UserWarning, match="per-source results could not be read") as caught:
                assert s.df(metric).sort(pl.all()).equals(ref)
                assert s.df(metric).sort(pl.all()).equals(ref)  # warned once: the session read past it
            assert len(caught) == 1 and part.name in str(caught[0].message)
        r = CliRunner().invoke(
            app, ["sql", f"SELECT * FROM {metric}", "--lake", str(lake.root), "--format", "json"]
        )
        assert r.exit_code == 0, r.output
        notes = [line for line in r.stderr.splitlines() if line.startswith("note: per-source results")]
        assert len(notes) == 1 and part.name in notes[0], r.stderr
        got = pl.DataFrame(json.loads(r.stdout)) if r.stdout.strip().startswith("[") else None
        assert got is not None and got.height == ref.height
        part.write_bytes(whole)
