"""Kineto µs text -> int64 ns, exactly (no float rounding)."""

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from pipeline.timeparse import us_text_to_ns


def test_known_values():
    raws = [
        b"1694128201429795",
        b"4458677009853.422",
        b"30669.0",
        b'"1.5"',
        b"1.5e3",
        None,
        b"12.3456",
        b"abc",
    ]
    ns, ok = us_text_to_ns(raws)
    assert ns[0] == 1694128201429795000
    assert ns[1] == 4458677009853422
    assert ns[2] == 30669000
    assert ns[3] == 1500
    assert ns[4] == 1500000
    assert ns[6] == 12346  # fourth decimal rounds half up
    assert list(ok) == [True, True, True, True, True, False, True, False]


def test_float64_would_lose_these_nanoseconds():
    # absolute epoch µs with ns fractions (Kineto Mar-Apr 2024): float64 cannot hold them
    text = b"1711964646123456.789"
    assert int(float(text) * 1000) != 1711964646123456789
    assert us_text_to_ns([text])[0][0] == 1711964646123456789


@given(st.integers(min_value=0, max_value=2**53), st.integers(min_value=0, max_value=999))
def test_matches_decimal_reference(us, frac):
    text = f"{us}.{frac:03d}".encode()
    assert us_text_to_ns([text])[0][0] == int(Decimal(text.decode()) * 1000)
