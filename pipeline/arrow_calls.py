"""Arrow compute kernels called without `import pyarrow.compute`.

`import pyarrow.compute` builds a Python wrapper, with its docstring, for each of Arrow's ~300
compute functions: 32-37 ms of CPU on the project machine (`python -X importtime`), about 2 % of
a small job's whole `tracelake run`, which calls three of them. The kernels themselves live in
pyarrow's Cython module `pyarrow._compute` (5 ms to import); `pyarrow.compute.call_function`,
the documented way to call a kernel by name, is that module's function re-exported
(https://arrow.apache.org/docs/python/api/compute.html, "call_function"). Where the private
module is missing (a pyarrow that moved it) the public one is used.

- cast(arr, type): arr cast to `type` with Arrow's safe cast (pyarrow.Array.cast's default);
  raises pyarrow.ArrowInvalid where a value does not fit (as Array.cast does).
- add(a, b): a + b element-wise (Arrow's "add", not "add_checked": wraps on int64 overflow; a
  null, or a null scalar, gives null). a, b: arrays, chunked arrays, Arrow scalars or Python ints.
- sort_by(table, keys): pyarrow.Table.sort_by(keys): keys a list of (column, "ascending" |
  "descending"), nulls last, a stable sort (Arrow's "sort_indices" then "take").
"""

from __future__ import annotations

try:
    from pyarrow._compute import CastOptions, SortOptions, call_function
except ImportError:  # pragma: no cover - a pyarrow without the private module
    from pyarrow.compute import CastOptions, SortOptions, call_function


def cast(arr, target_type):
    return call_function("cast", [arr], CastOptions.safe(target_type))


def add(a, b):
    return call_function("add", [a, b])


def sort_by(table, keys: list[tuple[str, str]]):
    return call_function("take", [table, call_function("sort_indices", [table], SortOptions(keys))])
