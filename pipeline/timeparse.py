"""Exact conversion of decimal microsecond text (Kineto `ts`/`dur`) to int64 nanoseconds.

Kineto writes `ts` and `dur` in microseconds: integers (old traces, absolute epoch µs),
or decimals with three fractional digits (ns resolution, since 2024). Epoch microseconds with
ns fractions need ~61 bits, more than a float64 mantissa holds, so the text is converted
digit by digit: ns = int_part * 1000 + first three fractional digits, rounded half away from
zero on the fourth. Exponent forms (1.5e3) go through Python's Decimal. Source of the format:
kineto libkineto/src/output_json.cpp (../shared/reference/hta.md section 1d).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

import numpy as np
import polars as pl


class TimeParseError(ValueError):
    pass


def us_text_to_ns(raws: list) -> np.ndarray:
    """Convert a list of raw JSON number texts (msgspec.Raw, bytes or None) to int64 ns.

    Returns (values, valid) as a numpy int64 array and a bool mask; None/empty/unparseable
    entries, and values whose ns do not fit in int64, are invalid (value 0). Raises nothing:
    callers decide what an invalid time means.
    """
    n = len(raws)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    joined = b"\n".join(r if r is not None else b"" for r in raws)
    s = pl.Series("t", joined.decode("utf-8", "replace").split("\n"), dtype=pl.String)
    # fast path: plain integers (old traces) and exactly three decimals (Kineto's "%d.%03d")
    pos = s.str.find(".", literal=True)
    # (at most 15 integer digits: 1e15 µs = 1e18 ns stays inside int64; longer goes the slow way)
    fast = pl.DataFrame({"t": s, "pos": pos}).select(
        ns=pl.when(pl.col("pos").is_null() & (pl.col("t").str.len_bytes() <= 15))
        .then(pl.col("t").cast(pl.Int64, strict=False) * 1000)
        .when((pl.col("t").str.len_bytes() - pl.col("pos") == 4) & (pl.col("pos") <= 15))
        .then(pl.col("t").str.replace(".", "", literal=True).cast(pl.Int64, strict=False))
    )["ns"]
    if fast.null_count() == 0:
        return fast.to_numpy().astype(np.int64, copy=False), np.ones(n, dtype=bool)
    s = s.str.strip_chars('" ')
    df = pl.DataFrame({"t": s}).with_columns(
        neg=pl.col("t").str.starts_with("-"),
        body=pl.col("t").str.strip_chars_start("+-"),
    ).with_columns(
        ip=pl.col("body").str.split_exact(".", 1).struct.field("field_0"),
        fp=pl.col("body").str.split_exact(".", 1).struct.field("field_1").fill_null(""),
    ).with_columns(
        ok=pl.col("ip").str.contains(r"^\d{1,15}$") & pl.col("fp").str.contains(r"^\d*$"),
    ).with_columns(
        ns=(
            pl.col("ip").cast(pl.Int64, strict=False) * 1000
            + (pl.col("fp") + "000").str.slice(0, 3).cast(pl.Int64, strict=False)
            + (pl.col("fp").str.slice(3, 1).cast(pl.Int64, strict=False).fill_null(0) >= 5).cast(pl.Int64)
        )
    ).with_columns(ns=pl.when(pl.col("neg")).then(-pl.col("ns")).otherwise(pl.col("ns")))
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
