import pytest
from hypothesis import given, strategies as st

from zenedge.errors import InvalidInput
from zenedge.sizes import MAX_SIZE, format_size, parse_size


@pytest.mark.parametrize("text,expected", [
    ("16GB", 16 * 10**9), ("16GiB", 16 * 2**30), ("500MB", 500 * 10**6), ("123B", 123), ("123", 123),
    ("1.5GiB", int(1.5 * 2**30)), (" 2 kib ", 2048), (4096, 4096),
])
def test_parses_decimal_and_binary_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "16 GBs", "-1GB", "1e9", "sixteen", "16XB", True, -5])
def test_rejects_garbage_with_a_hint(text):
    with pytest.raises(InvalidInput):
        parse_size(text)


@given(st.integers(min_value=0, max_value=MAX_SIZE))
def test_integers_round_trip(n):
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}B") == n


@given(st.integers(min_value=MAX_SIZE + 1, max_value=10**40))
def test_sizes_above_a_petabyte_are_refused(n):
    with pytest.raises(InvalidInput, match="more than 1 PB"):
        parse_size(f"{n}B")


def test_the_largest_size_is_one_petabyte():
    assert parse_size("1PB") == MAX_SIZE
    for text in ("99999999999999999999999TB", "1PiB", "1.000000001PB", 2**63):
        with pytest.raises(InvalidInput, match="more than 1 PB"):
            parse_size(text)


def test_format_is_human():
    assert format_size(12) == "12 B"
    assert format_size(3 * 2**30) == "3.0 GiB"


@pytest.mark.parametrize("text", ["1.5", "0.5B", "1.5B", 1.5, 0.5, "1.0000000001KB", float("nan"), float("inf")])
def test_fractional_bytes_are_refused(text):
    """Regression: "1.5" became 2 bytes and "0.5B" became 0 (and evicted everything)."""
    with pytest.raises(InvalidInput, match="whole number of bytes|invalid size"):
        parse_size(text)


@pytest.mark.parametrize("text,expected", [("1.5KB", 1500), ("0.5KiB", 512), ("2.0", 2), (2.0, 2), (1e9, 10**9),
                                           ("1.25GB", 1_250_000_000), ("0.1GB", 100_000_000)])
def test_fractions_of_a_unit_that_make_whole_bytes_are_fine(text, expected):
    assert parse_size(text) == expected
