"""The report's chart specs from cached templates, so that a report whose chart kinds were drawn
before needs no `import altair` (0.2-0.3 CPU-s of the small job's `tracelake run`: issue 38).

Every chart builder (charts.py, collective_charts.py, roofline_chart.py, nccl_tests_chart.py,
fleet_chart.py) returns a `Spec`: the function that draws the chart with altair (`draw`), the
arguments that decide its form (`variant`: which layers, a width; part of the template's key) and
the values it shows (`values`: the data rows, sort orders, domains, titles). A draw function uses
each value verbatim, as one whole JSON value of the chart (never inside a longer string, never as a
number it computes with, never to decide a branch), so its Vega-Lite spec is the spec it gives when
drawn with a unique placeholder string in place of each value, each placeholder then replaced by
its value. That spec with placeholders, the template, is built once with altair (debug mode off,
`to_dict(validate=False)`, as the page always embedded it) and kept on disk in the cache directory
(paths.cache_dir(), beside the Vega bundle) under the installed altair's version and a hash of the
source of every module of this package (the draw functions, what they read, this file: derived,
never listed), so a new altair or a changed chart builds new templates; when a new key's
directory is written, the directories of other keys unused for PRUNE_AFTER_S (30 days) are
removed (another installation sharing the cache keeps its own in use). What is cached
gives the spec that drawing with the values gives, byte for byte
(tests/test_chart_templates.py compares them on every chart of real reports and every form of
each builder).

A template whose placeholders altair did not keep whole (one missing, or inside a longer string)
is not kept: such a chart is drawn with altair each time. A template that cannot be read (cut,
not JSON) is built again; a cache that cannot be written (or pruned) costs only the time of
building it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from functools import cache
from pathlib import Path

from ..paths import keep

_DIR_PREFIX = "altair-"  # a key's directory: altair-<altair's version>-<source_hash>
_MARK = "\x00tracelake-value:"  # a placeholder is _MARK + the value's name + "\x00"


class Spec:
    """A chart of the report, drawn on demand: draw(**variant, **values) returns the altair chart;
    to_dict() its Vega-Lite spec (from the cached template when there is one). variant: keyword
    arguments that decide the chart's form (hashable, JSON-printable: repr'd into the key);
    values: keyword arguments shown verbatim (JSON values: dicts, lists, str, int, float, bool,
    None)."""

    def __init__(self, draw, variant: dict | None = None, **values):
        self.draw = draw
        self.variant = variant or {}
        self.values = values

    def chart(self):
        """The altair chart, drawn with the values (imports altair; debug mode off while it is
        drawn, as the page's charts always were)."""
        return _draw(self.draw, {**self.variant, **self.values})

    def to_dict(self, validate: bool = False) -> dict:
        """The chart's Vega-Lite spec: its template filled with the values, or, when the template
        cannot be cached, the chart drawn and converted by altair (validate: altair's schema check,
        which only the drawn path can run; the argument of an altair chart's to_dict, which
        callers treat a Spec as)."""
        if validate:
            return self.chart().to_dict(validate=True)
        template = _template(self)
        if template is None:
            return _drawn(self.chart())
        return _fill(template, self.values)


def spec_dict(chart) -> dict:
    """The Vega-Lite spec of a Spec or of an altair chart, as the page embeds it."""
    return chart.to_dict() if isinstance(chart, Spec) else _drawn(chart)


def _drawn(chart) -> dict:
    from .altair_lib import alt

    with alt.utils.schemapi.debug_mode(False):
        return chart.to_dict(validate=False)


def _draw(draw, kwargs: dict):
    """draw(**kwargs) with altair's debug mode off (no validation of each object as it is made:
    a placeholder stands where altair wants a list)."""
    from .altair_lib import alt

    with alt.utils.schemapi.debug_mode(False):
        return draw(**kwargs)


def placeholder(name: str) -> str:
    """The string that stands for value `name` while a template is drawn (a NUL-delimited mark no
    chart text holds)."""
    return f"{_MARK}{name}\x00"


def source_hash(package: Path) -> str:
    """The first 16 hex digits of the SHA-256 of every module's source in directory `package`
    (each name and bytes, by name): the draw functions, what they read in the package and this
    file, so that a change to any of them, or a module added or removed, keys new templates.
    Raises FileNotFoundError when this file's own source is not there (bytecode installed without
    its source: no template is kept then, as for a cache that cannot be written)."""
    files = sorted(package.glob("*.py"))
    if Path(__file__).name not in {f.name for f in files}:
        raise FileNotFoundError(f"no {Path(__file__).name} in {package}: the charts' source is not installed")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@cache
def _code_hash() -> str:
    return source_hash(Path(__file__).parent)


@cache
def _altair_version() -> str:
    from importlib.metadata import version

    return version("altair")


def directory() -> Path:
    """Where this altair and these chart modules keep their templates."""
    from ..paths import cache_dir

    return cache_dir() / "chart-specs" / f"{_DIR_PREFIX}{_altair_version()}-{_code_hash()}"


def warm() -> bool:
    """Whether templates were kept for this altair and these chart modules (a report then most
    likely draws without importing altair)."""
    try:
        return directory().is_dir()
    except Exception:  # no altair installed, no home: as a cold cache
        return False


def _key(spec: Spec) -> str:
    text = repr(
        (spec.draw.__module__, spec.draw.__qualname__, sorted(spec.variant.items()), sorted(spec.values))
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_MISSING = object()
_memo: dict[str, object] = {}  # key -> template (None: not cacheable), per process
# template directories of other keys unused this long are removed (_prune); a directory is marked
# used (its modification time) the first time a process reads a template from it (_use), so a
# second installation sharing the cache (another virtual environment, another altair) keeps its
# own while it is used instead of each removing the other's at its next new key
PRUNE_AFTER_S = 30 * 86400
_used: set[Path] = set()


def _use(d: Path) -> None:
    """Mark the template directory d used, once per process; a cache that cannot be written is
    left as it is."""
    if d not in _used:
        _used.add(d)
        try:
            os.utime(d)
        except OSError:
            pass


def _template(spec: Spec):
    key = _key(spec)
    got = _memo.get(key, _MISSING)
    if got is not _MISSING:
        return got
    try:
        path = directory() / f"{key}.json"
    except (OSError, RuntimeError):  # no home directory to keep a cache in: built per process
        path = None
    try:
        got = json.loads(path.read_bytes())["template"]
        _use(path.parent)
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        got = _build(spec)
        if got is not None and path is not None:
            _store(path, got)
    _memo[key] = got
    return got


def _build(spec: Spec):
    """The spec drawn with a placeholder for each value; None when a placeholder did not come
    through whole (the chart is then drawn each time)."""
    marks = {name: placeholder(name) for name in spec.values}
    template = _drawn(_draw(spec.draw, {**spec.variant, **marks}))
    found: set[str] = set()
    whole = set(marks.values())

    def walk(x) -> bool:
        if isinstance(x, str):
            if x in whole:
                found.add(x)
                return True
            return _MARK not in x
        if isinstance(x, dict):
            return all(_MARK not in k and walk(v) for k, v in x.items())
        if isinstance(x, list):
            return all(walk(v) for v in x)
        return True

    return template if walk(template) and found == whole else None


def _store(path: Path, template) -> None:
    """Write atomically (a temporary name, then renamed); a cache that cannot be written is left.
    The first template of a key's directory prunes the unused directories of other keys (_prune)."""
    new = not path.parent.is_dir()
    if keep(path, json.dumps({"template": template})) and new:
        _prune(path.parent)


def _prune(current: Path) -> None:
    """Remove the template directories of other keys beside `current` (another altair, older
    chart modules) that no process has used for PRUNE_AFTER_S seconds (_use). What cannot be
    removed is left: a report never fails for it."""
    try:
        old = time.time() - PRUNE_AFTER_S
        for d in current.parent.iterdir():
            if d.name.startswith(_DIR_PREFIX) and d.name != current.name and d.is_dir():
                if d.stat().st_mtime < old:
                    shutil.rmtree(d, ignore_errors=True)
    except Exception:  # a report never fails for its cache's housekeeping
        pass


def _fill(template, values: dict):
    """The template with each placeholder replaced by its value (the template's dicts and lists
    new, each value placed as it is: JSON values, Spec's contract)."""
    marks = {placeholder(n): v for n, v in values.items()}

    def fill(x):
        if isinstance(x, str):
            return marks.get(x, x)
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, list):
            return [fill(v) for v in x]
        return x

    return fill(template)
