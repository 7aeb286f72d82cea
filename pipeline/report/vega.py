"""The inlined Vega bundle and JSON made safe for <script> (html.py embeds both in the page).

- vega_bundle(): Vega, Vega-Lite and vega-embed as one ES module (vl_convert.javascript_bundle),
  inlined once per report, so the file makes no request and renders with the network off.
- _json_for_script(): JSON with '<', '>' and '&' escaped as \\u003c etc., so input text placed in a
  <script> (the chart specs) cannot close it.
"""

from __future__ import annotations

import json
from functools import lru_cache


def _json_for_script(obj) -> str:
    return json.dumps(obj).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one ES module (vl-convert's bundle), safe inside <script>."""
    import vl_convert as vlc

    js = vlc.javascript_bundle()
    return js.replace("</script", "<\\/script")
