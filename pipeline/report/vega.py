"""The inlined Vega bundle and JSON made safe for <script> (html.py embeds both in the page).

- vega_bundle(): Vega, Vega-Lite and vega-embed as one ES module (vl_convert.javascript_bundle),
  inlined once per report, so the file makes no request and renders with the network off. Building
  it takes about 2 s, so it is built once per installed vl-convert version and kept on disk in
  the cache directory ($TRACELAKE_CACHE_DIR, else $XDG_CACHE_HOME/tracelake, else
  ~/.cache/tracelake); when that cannot be written it is built per process.
- _json_for_script(): JSON with '<', '>' and '&' escaped as \\u003c etc., so input text placed in a
  <script> (the chart specs) cannot close it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..paths import cache_dir, keep


def _json_for_script(obj) -> str:
    return json.dumps(obj).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


MIN_BUNDLE_BYTES = 100_000  # a cached bundle shorter than this was cut: built again


def bundle_path() -> Path:
    """Where the installed vl-convert's bundle is kept: vega-bundle-vl-convert-<its version>.js in
    cache_dir() (RuntimeError as cache_dir; PackageNotFoundError without vl-convert-python)."""
    from importlib.metadata import version

    return cache_dir() / f"vega-bundle-vl-convert-{version('vl-convert-python')}.js"


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one ES module (vl-convert's bundle), safe inside <script>:
    read from the cache when it holds the bundle of the installed vl-convert, else built and
    written there (atomically: a temporary name, then renamed, so a reader never sees half)."""
    path = bundle_path()
    try:
        js = path.read_text(encoding="utf-8")
        if len(js) >= MIN_BUNDLE_BYTES:
            return js
    except (OSError, UnicodeDecodeError):
        pass
    import vl_convert as vlc

    js = vlc.javascript_bundle().replace("</script", "<\\/script")
    keep(path, js)  # a read-only home: built per process
    return js
