"""How the `tracelake` command converts its parameters' values: without Pydantic where the value is
already what typer would make of it.

typer (0.29) converts every parameter's value with a Pydantic TypeAdapter built on first use:
importing Pydantic and building the adapters of one command's 25 parameters cost `tracelake run
--help` 0.3 s of its 0.45 s, and every command about 0.1 s before any work (issue 38: `--help` and
usage errors under 0.15 s). plain_params() gives each parameter of a simple type a converter
that does what typer's adapter does for the values a command line gives most often, by typer's own
functions, and leaves the rest to typer:
- no value (an option not given, `--help` not asked for): None, or () for a repeatable one (typer's
  own RuntimeParam.coerce);
- `str`: a str that UTF-8 can encode, as it is (typer's `_parse_cli_str` gives str(value), which
  Pydantic's str then keeps);
- `Path` without path options (allow_dash, path_type, resolve_path): a str that UTF-8 can encode
  made a Path, or a Path (a default), then typer's own coerce_cli_path (its existence, file or
  directory and access checks, unchanged);
- `int`, `float`, `bool`: a value already of exactly that type (a default);
- a list of those (a repeatable option or argument): each item as above, as a list;
- anything else (a number typed on the command line, a choice, a constrained number, a
  surrogate-escaped file name): typer's own converter, built then, with Pydantic.
tests/test_cli_params.py checks that these give what typer's own converters give, value by value,
errors included. Where typer's internals differ from these (another typer version), nothing is
replaced: typer converts everything itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

try:  # typer's own conversion: the base class, the full converter and its path checks
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import _path_options_requested, coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover  (another typer: its own conversion, unchanged)
    RuntimeParam = None

_SCALARS = (int, float, bool)


def _plain_type(desc) -> bool:
    """Whether a parameter's type descriptor (typer's TypeDescriptor) is one _Plain converts:
    str, Path without path options, int, float or bool without a parser, choices, range or file,
    or a list of one of them."""
    info, ann = desc.parameter_info, desc.annotation
    if info.parser is not None or desc.file_annotation is not None or desc.is_choice:
        return False
    if info.min is not None or info.max is not None or info.clamp:
        return False
    if getattr(ann, "__origin__", None) is list:
        (ann,) = getattr(ann, "__args__", (None,))
    if ann is Path:
        return not _path_options_requested(info)
    return ann is str or ann in _SCALARS


if RuntimeParam is not None:

    @dataclasses.dataclass(frozen=True)
    class _Plain(RuntimeParam):
        """A parameter's converter (module doc); `full` builds typer's own for the other values."""

        descriptor: Any = None

        def _coerce_value(self, value, param, ctx):
            many = getattr(self.annotation, "__origin__", None) is list
            leaf = self.annotation.__args__[0] if many else self.annotation
            items = (value if isinstance(value, (list, tuple)) else [value]) if many else [value]
            out = []
            for v in items:
                if type(v) is str and leaf in (str, Path) and _utf8(v):
                    v = v if leaf is str else Path(v)
                elif not (type(v) is leaf or leaf is Path and isinstance(v, Path)):
                    return self._full(param)._coerce_value(value, param, ctx)
                if leaf is Path:
                    v = coerce_cli_path(v, self.parameter_info, path_type=Path, param=param, ctx=ctx)
                out.append(v)
            return out if many else out[0]

        def _full(self, param):
            full = getattr(param, "_tracelake_full", None)
            if full is None:
                full = build_runtime_param(self.descriptor)
                param._tracelake_full = full
            return full


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # surrogate-escaped bytes of a file name: typer decides
        return False
    return True


def plain_params(params: list) -> list:
    """params (a click command's, typer's parameters), each of a type _Plain converts given
    _Plain as its converter (once; typer builds its own only when a value needs it). Returns
    params."""
    if RuntimeParam is None:  # pragma: no cover
        return params
    for p in params:
        if not isinstance(p, _TyperParameter) or getattr(p, "_runtime_param", 0) is not None:
            continue
        desc = getattr(p, "type_descriptor", None)
        if desc is not None and _plain_type(desc):
            p._runtime_param = _Plain(
                parameter_info=desc.parameter_info, annotation=desc.annotation, descriptor=desc
            )
    return params
