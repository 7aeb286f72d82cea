"""The cache directory (pipeline/paths.cache_dir): $TRACELAKE_CACHE_DIR, else an absolute
$XDG_CACHE_HOME/tracelake, else ~/.cache/tracelake. A relative XDG_CACHE_HOME is invalid by the
XDG Base Directory spec ("If an implementation encounters a relative path in any of these
variables it should consider the path invalid and ignore it"): the tester's `XDG_CACHE_HOME=relx`
made ./relx/tracelake in the working directory. Expected paths written by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.paths import cache_dir


@pytest.mark.parametrize(
    ("xdg", "want"),
    [
        ("relx", "home/.cache/tracelake"),  # relative: ignored
        ("./relx", "home/.cache/tracelake"),
        ("", "home/.cache/tracelake"),  # empty: unset
        (None, "home/.cache/tracelake"),
        ("/abs/cache", "/abs/cache/tracelake"),  # absolute: used
    ],
)
def test_a_relative_xdg_cache_home_is_ignored(xdg, want, tmp_path, monkeypatch):
    monkeypatch.delenv("TRACELAKE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert cache_dir() == (Path(want) if want.startswith("/") else tmp_path / want)


def test_tracelake_cache_dir_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACELAKE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", "/abs/cache")
    assert cache_dir() == tmp_path / "mine"
