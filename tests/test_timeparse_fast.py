"""The vectorised fast paths of pipeline/timeparse.py (integers up to 9223372036854775 µs, one to
three decimals, up to 16 integer digits with three decimals) against an independent reference:
Python's Decimal, rounded half away from zero at the nanosecond, invalid beyond int64. Mixed
batches send only the values the fast path cannot take the slow way; every value must come out
as the reference says whatever its neighbours are."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.timeparse import _arrow_decimal, us_text_to_ns


def reference(text: str) -> int | None:
    t = text.strip('" ')
    if not t:
        return None
    try:
        v = int((Decimal(t) * 1000).to_integral_value(rounding="ROUND_HALF_UP"))
    except (InvalidOperation, ValueError, OverflowError):
        return None
    return v if -(2**63) <= v < 2**63 else None


def check(texts: list[str]) -> None:
    ns, ok = us_text_to_ns([t.encode() for t in texts])
    got = [int(v) if k else None for v, k in zip(ns, ok)]
    assert got == [reference(t) for t in texts], texts


NUMBER = st.builds(
    lambda sign, ip, fp: f"{sign}{ip}{'.' + fp if fp is not None else ''}",
    st.sampled_from(["", "", "-"]),
    st.integers(min_value=0, max_value=10**19),
    st.none() | st.text(alphabet="0123456789", min_size=1, max_size=5),
)
ODD = st.sampled_from(
    [
        "",
        "1.5e3",
        '"12.5"',
        "abc",
        "9223372036854775",
        "9223372036854776",
        "-9223372036854775.808",
        "9999999999999999.999",
        "1711964646123456.789",
        "30669.0",
        "0.0005",
        "-0.0005",
        "12.3456",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(NUMBER | ODD, min_size=1, max_size=40))
def test_every_value_as_the_decimal_reference_says(texts):
    check(texts)


def test_edges_of_each_fast_path():
    check(
        [
            "9223372036854775",
            "-9223372036854775",
            "9223372036854776",
            "99999999999999999999",  # integers
            "999999999999999.9",
            "999999999999999.99",
            "9999999999999999.9",  # one / two decimals
            "9223372036854775.807",
            "9223372036854775.808",
            "-9223372036854775.808",  # three decimals near int64
            "68.0",
            "0.5",
            "-0.5",
            "1.25",
            "1.",
            ".5",
            "-.5",
            "+1.5",
        ]
    )


# plain JSON numbers with at most three decimals, as Kineto writes them: one Arrow decimal cast
# (timeparse._arrow_decimal) takes the whole batch, with empty texts (invalid) among them
PLAIN = st.builds(
    lambda sign, ip, fp: f"{sign}{ip}{'.' + fp if fp is not None else ''}",
    st.sampled_from(["", "", "-"]),
    st.integers(min_value=0, max_value=10**19),
    st.none() | st.text(alphabet="0123456789", min_size=1, max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PLAIN | st.just(""), min_size=1, max_size=40))
def test_batches_of_plain_numbers_in_one_arrow_cast(texts):
    assert _arrow_decimal([t.encode() for t in texts]) is not None  # the path under test
    check(texts)


def test_arrow_cast_edges():
    edges = [
        "9223372036854775.807",  # the largest int64 ns
        "9223372036854775.808",  # one past it: invalid
        "-9223372036854775.808",  # the smallest
        "-9223372036854775.809",
        "99999999999999999999.999",  # past int64: invalid
        "1694039959123.456",
        "1.5e3",
        "1E-3",
        "+5",
        "007",
        "",
    ]
    check(edges)
    for t in edges[:4]:
        assert _arrow_decimal([t.encode()]) is not None
    # what the Arrow cast refuses goes the general way, whatever the rest of the batch
    for t in ["12.3456", '"12.5"', "abc", "nan", " 5", "0x10", "1" * 40]:
        assert _arrow_decimal([b"1.5", t.encode()]) is None
        check(["1.5", t])
