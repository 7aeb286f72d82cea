"""pipeline/toml_data.py: the TOML data files read through a JSON copy in the cache directory.
Expected values come from tomllib itself, run on the same files."""

from __future__ import annotations

import tomllib

import pytest

from pipeline import toml_data
from pipeline.paths import CATALOG_DIR, SCHEMAS_DIR

SHIPPED = sorted(SCHEMAS_DIR.glob("*.toml")) + sorted(CATALOG_DIR.glob("*.toml"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACELAKE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "toml"


def test_every_shipped_file_reads_as_tomllib_reads_it(cache):
    assert len(SHIPPED) >= 5  # schemas/v3.toml and the catalog's files
    for p in SHIPPED:
        want = tomllib.loads(p.read_text(encoding="utf-8"))
        assert toml_data.load(p) == want, p  # parsed, then kept
        assert toml_data.load(p) == want, p  # read back from the kept copy
    assert len(list(cache.glob("*.json"))) == len(SHIPPED)


def test_the_kept_copy_is_read_without_parsing(cache, tmp_path, monkeypatch):
    f = tmp_path / "a.toml"
    f.write_text('x = 1\ny = [1.5, "s", true]\n[t]\nz = -0.0\n')
    first = toml_data.load(f)

    def no_parse(*a, **k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(tomllib, "loads", no_parse)
    assert toml_data.load(f) == first == {"x": 1, "y": [1.5, "s", True], "t": {"z": -0.0}}


def test_an_edited_file_is_parsed_again(cache, tmp_path):
    f = tmp_path / "a.toml"
    f.write_text("x = 1\n")
    assert toml_data.load(f) == {"x": 1}
    f.write_text("x = 2\n")
    assert toml_data.load(f) == {"x": 2}


def test_a_garbled_or_cut_copy_is_parsed_and_kept_again(cache, tmp_path):
    f = tmp_path / "a.toml"
    f.write_text("x = 1\n")
    toml_data.load(f)
    (kept,) = cache.glob("*.json")
    for bad in (b'{"x": ', b"\xff\xfe", b"[1, 2]"):
        kept.write_bytes(bad)
        assert toml_data.load(f) == {"x": 1}
        assert kept.read_text() == '{"x": 1}'


def test_a_cache_that_cannot_be_written_costs_only_the_parse(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TRACELAKE_CACHE_DIR", str(blocker))
    f = tmp_path / "a.toml"
    f.write_text("x = 1\n")
    assert toml_data.load(f) == {"x": 1}
    assert blocker.read_text() == "not a directory"


def test_dates_are_not_kept_and_still_read(cache, tmp_path):
    f = tmp_path / "a.toml"
    f.write_text("d = 2026-12-05\nt = 07:30:00\n")
    want = tomllib.loads(f.read_text())
    assert toml_data.load(f) == want
    assert toml_data.load(f) == want
    assert not cache.exists() or not list(cache.glob("*.json"))


def test_errors_are_tomllibs(cache, tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("x = = 1\n")
    with pytest.raises(tomllib.TOMLDecodeError):
        toml_data.load(f)
    with pytest.raises(FileNotFoundError):
        toml_data.load(tmp_path / "missing.toml")
