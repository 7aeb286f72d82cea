"""altair for the report's charts, imported without the one optional package of jsonschema that
costs seconds (issue 38 item 2).

altair imports jsonschema, whose format checkers (jsonschema/_format.py) import every optional
format package that is installed. In an environment with jsonschema's format extras (a notebook
environment; tracelake's test extra pulls them in through HolisticTraceAnalysis) that includes
rfc3987_syntax, which compiles 39 lark grammars when imported: 1.7 s of the 2.7 s `import
altair` took here (`python -X importtime`). It only serves jsonschema's "iri" and
"iri-reference" formats, which altair never checks (it validates chart specs without a format
checker). So while altair is imported the first time, an import of rfc3987_syntax fails (as when
it is not installed, which jsonschema handles), and nothing else changes. When the process had
already imported jsonschema's format checkers (a user's notebook), there is nothing to save and
altair is imported as it is. tests/test_report_charts.py checks that the report's import leaves
rfc3987_syntax unimported.

`alt` is the altair module.
"""

from __future__ import annotations

import importlib.abc
import sys

# top-level packages not imported while altair is (only jsonschema's optional formats use them)
SKIPPED = ("rfc3987_syntax",)


class _Skip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in SKIPPED:
            raise ImportError(f"{name} is not imported with tracelake's charts (jsonschema's 'iri' format)")
        return None


def _load():
    if "altair" in sys.modules or "jsonschema._format" in sys.modules:
        import altair

        return altair
    skip = _Skip()
    sys.meta_path.insert(0, skip)
    try:
        import altair
    finally:
        sys.meta_path.remove(skip)
    return altair


alt = _load()
