"""Event fields -> column values: the tolerant conversions every table builder shares.

Owns: _int (any JSON value -> int64 or None), _ints / _ints_or / _ext_ids (Int64 series with a
fast path), _names and _texts (String series), _text, _ranks, _dims / _dims3 (grid and block
sizes), and the attribute getters of KEvent / KArgs fields (_TS, _DUR, _AG, _A_*, ...).
"""

from __future__ import annotations

import json
import operator

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa


def _int(v) -> int | None:
    """An integer value of a Kineto field: an int in int64, an integral-valued float, or a string
    holding a number (decimal, 0x hex, or with a decimal point); anything else (text such as
    "v10", which is no number) is None rather than the digits found in it."""
    if type(v) is int:
        return v if -(2**63) <= v < 2**63 else None
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 9.2e18 else None
    if isinstance(v, str):
        s = v.strip()
        try:
            out = int(s, 16) if s.lower().startswith("0x") else int(float(s)) if "." in s else int(s)
        except (ValueError, OverflowError):
            return None
        return out if -(2**63) <= out < 2**63 else None
    return None


def _text(r: msgspec.Raw) -> str | None:
    return bytes(r).decode("utf-8", "replace") if len(r) else None


_AG = {
    k: operator.attrgetter(k)
    for k in (
        "pid",
        "tid",
        "correlation",
        "context",
        "registers_per_thread",
        "shared_memory",
        "bytes",
        "graph_id",
        "sequence_number",
    )
}


def _ints(values) -> pl.Series:
    """Int64 column from Python values: the fast path takes ints and None as they are; any other
    value (float, numeric string, hex string, out-of-range int) goes through _int."""
    vals = list(values)
    try:
        return pl.Series(vals, dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series([_int(v) for v in vals], dtype=pl.Int64)


def _names(evs: list) -> tuple[list, pl.Series]:
    """Event names (str(name) for a name that is not a string) as a list and a String series."""
    names = list(map(_NAME, evs))
    try:
        s = pl.Series(names, dtype=pl.String, strict=True)
        if not s.null_count():
            return names, s
    except (TypeError, pl.exceptions.PolarsError):
        pass
    names = [n if isinstance(n, str) else str(n) for n in names]
    return names, pl.Series(names, dtype=pl.String)


_NAME = operator.attrgetter("name")


def _texts(raws: list) -> pl.Series:
    """JSON texts of many msgspec.Raw values (null for an empty one): an Arrow string array built
    from the joined bytes and their offsets (no Python str per value; pa.array would import
    pandas), or, when the bytes are not valid UTF-8, split in Rust from one joined decode with
    U+FFFD in place of the invalid bytes (NUL never occurs in JSON text)."""
    if not raws:
        return pl.Series([], dtype=pl.String)
    n = len(raws)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    data = b"".join(raws)
    if len(data) < 2**31:
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        empty = lens == 0
        valid = pa.py_buffer(np.packbits(~empty, bitorder="little")) if empty.any() else None
        arr = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), valid)
        try:
            arr.validate(full=True)  # UTF-8
            # as a table's column: polars' from_arrow of a lone array imports pyarrow.compute
            # (pipeline/arrow_calls.py)
            return pl.from_arrow(pa.Table.from_arrays([arr], ["t"])).to_series()
        except pa.ArrowInvalid:
            pass
    s = (
        pl.Series([b"\x00".join(raws).decode("utf-8", "replace")], dtype=pl.String)
        .str.split("\x00")
        .explode()
    )
    return s.replace("", None) if s.str.len_bytes().min() == 0 else s


def _ranks(v) -> list[int] | None:
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    if isinstance(v, list):
        out = [_int(x) for x in v]
        return None if any(x is None for x in out) else out
    return None


def _dims3(vals: list, prefix: str) -> dict[str, pl.Series]:
    """{prefix_x, prefix_y, prefix_z} Int32 columns from grid/block values: _dims(v, 3) of each,
    with the common case (a list of three ints) checked inline."""
    xs, ys, zs = [], [], []
    lim = 2**31
    for v in vals:
        if type(v) is list and len(v) == 3:
            a, b, c = v
            if (
                type(a) is int
                and type(b) is int
                and type(c) is int
                and 0 <= a < lim
                and 0 <= b < lim
                and 0 <= c < lim
            ):
                xs.append(a)
                ys.append(b)
                zs.append(c)
                continue
        d = _dims(v, 3)
        xs.append(d[0] if d else None)
        ys.append(d[1] if d else None)
        zs.append(d[2] if d else None)
    return {
        f"{prefix}_x": pl.Series(xs, dtype=pl.Int32),
        f"{prefix}_y": pl.Series(ys, dtype=pl.Int32),
        f"{prefix}_z": pl.Series(zs, dtype=pl.Int32),
    }


def _dims(v, n):
    if (
        isinstance(v, list)
        and len(v) >= n
        and all(isinstance(x, (int, float)) and 0 <= x < 2**31 for x in v[:n])
    ):
        return [int(x) for x in v[:n]]
    return None


_TS, _DUR, _PID, _TID, _CAT = (operator.attrgetter(k) for k in ("ts", "dur", "pid", "tid", "cat"))
_A_GRID, _A_BLOCK, _A_COLL, _A_DEVICE, _A_STREAM, _A_TYPE, _A_FLOPS = (
    operator.attrgetter(k)
    for k in ("grid", "block", "collective_name", "device", "stream", "input_type", "flops")
)


def _ints_or(vals: list, fallback: pl.Series, evs: list, attr) -> pl.Series:
    """_ints(v if v is not None else attr(e)) for v, e in zip(vals, evs), where fallback is
    _ints(map(attr, evs)): when every v is an int or None (the fast path), v's nulls are exactly
    its None values, so the fallback fills them; otherwise value by value."""
    try:
        s = pl.Series(vals, dtype=pl.Int64, strict=True)
        return s.fill_null(fallback) if s.null_count() else s
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        return _ints(attr(e) if v is None else v for v, e in zip(vals, evs))


def _ext_ids(args: list) -> pl.Series:
    """External id ('External id', else the old 'external id')."""
    new = list(map(_A_EXT, args))
    try:
        s = pl.Series(new, dtype=pl.Int64, strict=True)
        if not s.null_count():
            return s
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        pass
    return _ints(a.external_id_old if v is None else v for v, a in zip(new, args))


_A_EXT = operator.attrgetter("external_id")
