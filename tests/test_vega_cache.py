"""The Vega bundle (pipeline/report/vega.py) is built once per installed vl-convert version and
read from the cache directory after that; a cut or unreadable cache is built again, and a cache
that cannot be written never stops a report. vl-convert's builder is replaced by a counting fake
(building the real bundle takes ~2 s), so the test sees exactly when a build happens."""

from __future__ import annotations

from importlib.metadata import version

import pytest
import vl_convert

from pipeline.report import vega


@pytest.fixture
def builds(monkeypatch, tmp_path):
    calls = []

    def fake():
        calls.append(1)
        return "x" * vega.MIN_BUNDLE_BYTES + "</script>"

    monkeypatch.setattr(vl_convert, "javascript_bundle", fake)
    monkeypatch.setenv("TRACELAKE_CACHE_DIR", str(tmp_path / "cache"))
    vega.vega_bundle.cache_clear()
    yield calls
    vega.vega_bundle.cache_clear()


def _cached(tmp_path):
    return tmp_path / "cache" / f"vega-bundle-vl-convert-{version('vl-convert-python')}.js"


def test_built_once_then_read_from_the_cache(builds, tmp_path):
    want = "x" * vega.MIN_BUNDLE_BYTES + "<\\/script>"  # '</script' escaped for the <script> tag
    assert vega.vega_bundle() == want and len(builds) == 1
    assert _cached(tmp_path).read_text() == want
    assert vega.bundle_path() == _cached(tmp_path)  # the name benchmarks/small_job.py copies
    vega.vega_bundle.cache_clear()  # a new process: the file is read, nothing is built
    _cached(tmp_path).write_text("y" * vega.MIN_BUNDLE_BYTES)
    assert vega.vega_bundle() == "y" * vega.MIN_BUNDLE_BYTES and len(builds) == 1
    assert [p.name for p in _cached(tmp_path).parent.iterdir()] == [_cached(tmp_path).name]  # no temp left


def test_a_cut_cache_is_built_again(builds, tmp_path):
    _cached(tmp_path).parent.mkdir(parents=True)
    _cached(tmp_path).write_text("x" * 10)
    assert vega.vega_bundle().endswith("<\\/script>") and len(builds) == 1
    assert len(_cached(tmp_path).read_text()) > vega.MIN_BUNDLE_BYTES


def test_an_unwritable_cache_still_gives_the_bundle(builds, tmp_path):
    (tmp_path / "cache").write_text("a file where the directory should be")
    assert vega.vega_bundle().endswith("<\\/script>") and len(builds) == 1
