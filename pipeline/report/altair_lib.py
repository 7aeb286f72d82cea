"""altair for the report's charts, imported without jsonschema's optional format packages, which
cost seconds (issue 38 item 2).

altair imports jsonschema, whose format checkers (jsonschema/_format.py) import every optional
format package that is installed. In an environment with jsonschema's format extras (a notebook
environment; tracelake's test extra pulls them in through HolisticTraceAnalysis) that includes
rfc3987_syntax, which compiles 39 lark grammars when imported (1.7 s of the 2.7 s `import altair`
took here, `python -X importtime`), and isoduration (which imports arrow), rfc3986_validator,
rfc3339_validator, webcolors, idna, uri_template, jsonpointer and fqdn (0.1-0.2 s more). They
only serve jsonschema's format checks ("iri", "uri", "duration", "color", ...), which the report
never runs: it writes its charts with to_dict(validate=False), and the Vega-Lite schema's formats
("uri", "uri-reference") concern no field the charts fill. So while altair is imported the first
time, an import of one of FORMAT_PACKAGES *by jsonschema/_format.py* fails (as when the package is
not installed, which jsonschema handles: the format is then not checked); any other module's import
of them, in this thread or another, goes through as usual, and nothing else changes. When the
process had already imported jsonschema's format checkers (a user's notebook), there is nothing to
save and altair is imported as it is. tests/test_report_charts.py checks that the report's import
leaves these packages unimported.

`alt` stands for the altair module, imported on its first attribute (`alt.Chart`): the report's
modules import it without importing altair, which a report whose chart templates are cached never
needs (pipeline/report/spec_cache.py). `load()` imports it now (the CLI's preload thread).
"""

from __future__ import annotations

import importlib.abc
import sys

# top-level packages jsonschema/_format.py imports when installed (jsonschema 4.x, its "format"
# and "format-nongpl" extras), not imported by it while altair is
FORMAT_PACKAGES = (
    "rfc3987_syntax",
    "rfc3987",
    "rfc3986_validator",
    "rfc3339_validator",
    "isoduration",
    "webcolors",
    "idna",
    "uri_template",
    "jsonpointer",
    "fqdn",
)
_IMPORTER = "jsonschema._format"


class _Skip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORMAT_PACKAGES and _importer() == _IMPORTER:
            raise ImportError(f"{name} is not imported with tracelake's charts (jsonschema's format checks)")
        return None


def _importer() -> str | None:
    """The module whose code runs the import being looked up: the first frame of this thread
    outside this module and Python's import machinery."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if name != __name__ and not name.startswith(("importlib", "_frozen_importlib")):
            return name
        f = f.f_back
    return None


def load():
    """The altair module, imported (as described above) when it was not."""
    if "altair" in sys.modules or _IMPORTER in sys.modules:
        import altair

        return altair
    skip = _Skip()
    sys.meta_path.insert(0, skip)
    try:
        import altair
    finally:
        sys.meta_path.remove(skip)
    return altair


class _Altair:
    """altair, imported on first use (load())."""

    def __getattr__(self, name: str):
        return getattr(load(), name)


alt = _Altair()
