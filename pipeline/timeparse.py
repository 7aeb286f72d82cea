"""Exact conversion of decimal microsecond text (Kineto `ts`/`dur`) to int64 nanoseconds.

Kineto writes `ts` and `dur` in microseconds: integers (old traces, absolute epoch µs),
or decimals with three fractional digits (ns resolution, since 2024). Epoch microseconds with
ns fractions need ~61 bits, more than a float64 mantissa holds, so the text is converted
digit by digit: ns = int_part * 1000 + first three fractional digits, rounded half away from
zero on the fourth. Exponent forms (1.5e3) go through Python's Decimal. A batch of plain numbers
with at most three decimals (what Kineto writes) is converted in one Arrow decimal cast instead
(_arrow_decimal: the same values, a few calls per batch). Source of the format:
kineto libkineto/src/output_json.cpp (../shared/reference/hta.md section 1d).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import numpy as np
import polars as pl
import pyarrow as pa

from .arrow_calls import cast

# every text in one Arrow cast to a decimal of 3 fractional digits: its unscaled integer is the
# ns value, exactly (Arrow refuses a text with more digits rather than round it: those go the
# polars way below). 38 digits (decimal128's most) hold any int64 ns value and then some: the
# range is checked after the cast.
_DECIMAL_NS = pa.decimal128(38, 3)


class TimeParseError(ValueError):
    pass


def us_text_to_ns(raws: list) -> np.ndarray:
    """Convert a list of raw JSON number texts (msgspec.Raw, bytes or None) to int64 ns.

    Returns (values, valid) as a numpy int64 array and a bool mask; None/empty/unparseable
    entries, and values whose ns do not fit in int64, are invalid (value 0). Raises nothing:
    callers decide what an invalid time means.
    """
    if len(raws) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    got = _arrow_decimal(raws)
    return got if got is not None else us_series_to_ns(text_series(raws))


def _arrow_decimal(raws: list):
    """us_text_to_ns in one Arrow cast (a few calls whatever the count: a small trace's times
    cost tens of µs instead of the polars plan's ms) when every text is a plain JSON number
    (digits with at most three decimals, or an exponent form Arrow reads exactly) or empty
    (invalid); None when any is not (None among the raws, a quoted number, a fourth decimal,
    junk): the caller then converts them the general way. Built from the joined bytes and their
    offsets (no Python object per value; pa.array would import pandas where it is installed)."""
    try:
        lens = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
        data = b"".join(raws)
    except TypeError:  # None among them
        return None
    n = len(raws)
    if len(data) >= 2**31:
        return None
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    empty = lens == 0
    valid = None if not empty.any() else pa.py_buffer(np.packbits(~empty, bitorder="little"))
    try:
        texts = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), valid)
        dec = cast(texts, _DECIMAL_NS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    # the 128-bit unscaled integers, little-endian: (low, high) int64 pairs; a value fits in int64
    # when its high half is the sign extension of its low half
    words = np.frombuffer(dec.buffers()[1], dtype=np.int64, count=2 * n, offset=dec.offset * 16)
    lo, hi = words[0::2], words[1::2]
    ok = (hi == (lo >> 63)) & ~empty
    return np.where(ok, lo, 0).astype(np.int64), ok


def text_series(raws: list) -> pl.Series:
    """A String series of the texts of raw JSON values (msgspec.Raw, bytes or None -> ''), built
    from one joined buffer split in Rust (no Python str per value). JSON text never holds a raw
    newline (strings escape it), so each value is one line. (No values: an empty series.)"""
    if len(raws) == 0:
        return pl.Series("t", [], dtype=pl.String)
    try:
        joined = b"\n".join(raws)
    except TypeError:  # None among them
        joined = b"\n".join(r if r is not None else b"" for r in raws)
    return pl.Series("t", [joined.decode("utf-8", "replace")], dtype=pl.String).str.split("\n").explode()


def us_series_to_ns(s: pl.Series):
    """us_text_to_ns of a String series of the texts (text_series)."""
    n = len(s)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    # fast path: plain integers (old traces) and one to three decimals (Kineto's "%d.%03d", and
    # "68.0"), each exact: integers up to 9223372036854775 µs times 1000; decimals as the integer
    # of their digits scaled to ns, with at most 15 integer digits (3 decimals: 16, and a cast that
    # leaves int64 is null). Anything else (more decimals, exponents, strings, junk) goes the slow
    # way below, value by value only for those.
    t = pl.col("t")
    k = t.str.len_bytes() - t.str.find(".", literal=True)  # fraction digits + 1; null without a '.'
    iv = t.cast(pl.Int64, strict=False)
    dv = t.str.replace(".", "", literal=True).cast(pl.Int64, strict=False)
    fast = (
        s.rename("t")
        .to_frame()
        .select(
            ns=pl.when(k.is_null())
            .then(pl.when(iv.is_between(-9223372036854775, 9223372036854775)).then(iv * 1000))
            .when(k == 4)
            .then(pl.when(t.str.len_bytes() <= 20).then(dv))
            .when(k == 3)
            .then(pl.when(t.str.len_bytes() <= 18).then(dv * 10))
            .when(k == 2)
            .then(pl.when(t.str.len_bytes() <= 17).then(dv * 100))
        )["ns"]
    )
    nulls = fast.null_count()
    if nulls == 0:
        return fast.to_numpy().astype(np.int64, copy=False), np.ones(n, dtype=bool)
    if nulls < n:  # only those the fast path left
        miss = fast.is_null()
        ns = fast.fill_null(0).to_numpy().astype(np.int64, copy=True)
        ok = np.ones(n, dtype=bool)
        idx = np.flatnonzero(miss.to_numpy())
        ns_s, ok_s = _slow(s.filter(miss))
        ns[idx], ok[idx] = ns_s, ok_s
        return ns, ok
    return _slow(s)


def _slow(s: pl.Series):
    """Digit by digit (and Decimal for the rest): every text of s."""
    s = s.str.strip_chars('" ')
    df = (
        pl.DataFrame({"t": s})
        .with_columns(
            neg=pl.col("t").str.starts_with("-"),
            body=pl.col("t").str.strip_chars_start("+-"),
        )
        .with_columns(
            ip=pl.col("body").str.split_exact(".", 1).struct.field("field_0"),
            fp=pl.col("body").str.split_exact(".", 1).struct.field("field_1").fill_null(""),
        )
        .with_columns(
            ok=pl.col("ip").str.contains(r"^\d{1,15}$") & pl.col("fp").str.contains(r"^\d*$"),
        )
        .with_columns(
            ns=(
                pl.col("ip").cast(pl.Int64, strict=False) * 1000
                + (pl.col("fp") + "000").str.slice(0, 3).cast(pl.Int64, strict=False)
                + (pl.col("fp").str.slice(3, 1).cast(pl.Int64, strict=False).fill_null(0) >= 5).cast(pl.Int64)
            )
        )
        .with_columns(ns=pl.when(pl.col("neg")).then(-pl.col("ns")).otherwise(pl.col("ns")))
    )
    ok = df["ok"].fill_null(False).to_numpy().copy()
    ns = df["ns"].fill_null(0).to_numpy().astype(np.int64, copy=True)
    ok &= df["ns"].is_not_null().to_numpy()
    bad = np.flatnonzero(~ok)
    texts = df["t"]
    for i in bad:
        t = texts[int(i)]
        if not t:
            continue
        try:
            v = int((Decimal(t) * 1000).to_integral_value(rounding="ROUND_HALF_UP"))
            if -(2**63) <= v < 2**63:  # beyond int64 ns: invalid, never wrapped
                ns[i] = v
                ok[i] = True
        except (InvalidOperation, ValueError, OverflowError):
            pass
    return ns, ok
