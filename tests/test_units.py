import pytest
from hypothesis import given
from hypothesis import strategies as st

from ccbench.errors import UsageError
from ccbench.units import (
    bits_per_second,
    format_rate,
    format_size,
    parse_rate,
    parse_size,
    parse_sizes,
    rate_text,
    size_label,
    size_text,
)


def test_examples() -> None:
    assert parse_sizes("1K-8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K-1M:4") == [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20]
    assert parse_sizes("8,1K,1M") == [8, 1024, 1 << 20]
    assert parse_sizes("1G") == [1 << 30]
    assert parse_sizes("8-64M")[0] == 8 and parse_sizes("8-64M")[-1] == 64 << 20
    assert parse_size("4KiB") == 4096 and parse_size("16kb") == 16384


@pytest.mark.parametrize("bad", ["", " ", "abc", "1X", "0", "-8", "8-", "-", "1K-1M:1",
                                 "1K-1M:x", "1M-1K", "1,,2", "8:4", "1K-2K-4K"])
def test_malformed(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_sizes(bad)


units = st.sampled_from(["", "K", "M", "G"])


@given(st.integers(1, 4096), units)
def test_single_roundtrip(value: int, unit: str) -> None:
    parsed = parse_sizes(f"{value}{unit}")
    assert len(parsed) == 1
    assert parse_size(format_size(parsed[0])) == parsed[0]


@given(st.integers(0, 30), st.integers(0, 12), st.integers(2, 8))
def test_range_is_geometric(low_exp: int, span: int, factor: int) -> None:
    low, high = 1 << low_exp, (1 << low_exp) * factor ** span
    sizes = parse_sizes(f"{low}-{high}:{factor}")
    assert sizes[0] == low and sizes[-1] == high
    assert len(sizes) == span + 1
    assert all(b == a * factor for a, b in zip(sizes, sizes[1:], strict=False))


@given(st.lists(st.integers(1, 1 << 40), min_size=1, max_size=10))
def test_list_sorted_unique(values: list[int]) -> None:
    assert parse_sizes(",".join(map(str, values))) == sorted(set(values))


def test_one_display_per_use() -> None:
    """The axis (exact), a column (four digits), prose (KiB/MiB/GiB) and rates (decimal)."""
    assert [format_size(n) for n in (8, 1536, 3 << 20, 1 << 40)] == ["8", "1536", "3M", "1T"]
    assert [size_label(n) for n in (8, 1026 * 1024, 2385960)] == ["8", "1026K", "2.275M"]
    assert [size_text(n) for n in (300, 1536, 12 << 30)] == ["300 B", "1.5 KiB", "12 GiB"]
    assert size_text(1.0 + (1 << 20) / 3, digits=4) == "341.3 KiB"
    assert [format_rate(r) for r in (10**9, 2.5e8, 95.6e6)] == ["1Gbit/s", "250Mbit/s",
                                                                "95.6Mbit/s"]


def test_axis_style_is_exact_and_odd_sizes_stay_bytes() -> None:
    """format_size: the --sizes syntax, so an odd size (3 ranks: 3000, 2040) is every byte."""
    assert [format_size(n) for n in (3000, 2040, 1 << 30, 3 << 30)] == \
        ["3000", "2040", "1G", "3G"]


def test_column_style_keeps_four_digits_of_odd_sizes() -> None:
    """size_label: exact up to four digits of a unit, else four significant digits."""
    assert [size_label(n) for n in (3000, 2040, 1536, 1023, 1 << 30, 12345 << 10)] == \
        ["2.93K", "1.992K", "1.5K", "1023", "1G", "12.06M"]
    assert size_label(4096.0) == "4K" and size_label(1536.4) == "1.5K"     # axis ticks: floats


def test_two_digit_style_of_ticks_and_interpolated_sizes() -> None:
    """size_label(digits=2): heat-map ticks and half-peak sizes; never an exponent."""
    assert [size_label(n, digits=2) for n in (12, 768, 3000, 2040, 1026 << 10, 16 << 20)] == \
        ["12", "768", "2.9K", "2K", "1M", "16M"]
    assert [size_label(n, digits=2) for n in (99.7 * 1024, 131064, 1536.6)] == \
        ["100K", "128K", "1.5K"]


def test_prose_styles() -> None:
    """size_text: rounded prose (2.93 KiB) or exact prose, whole units else bytes (3000 B)."""
    assert [size_text(n) for n in (3000, 2040, 1023.6 * 1024, 4 << 40)] == \
        ["2.93 KiB", "1.99 KiB", "1024 KiB", "4 TiB"]
    assert [size_text(n, exact=True) for n in (8, 3000, 2040, 1536, 64 << 10, 1 << 40)] == \
        ["8 B", "3000 B", "2040 B", "1536 B", "64 KiB", "1 TiB"]


def test_rate_prose_and_column_styles() -> None:
    """rate_text: three significant digits of a decimal unit, or one unit for a column."""
    assert [rate_text(r) for r in (95.63e6, 1e9, 999.7e6, 1500, 512)] == \
        ["95.6 Mbit/s", "1 Gbit/s", "1000 Mbit/s", "1.5 kbit/s", "512 bit/s"]
    assert [rate_text(r, unit="M") for r in (95.63e6, 1e9)] == ["95.6 Mbit/s", "1000.0 Mbit/s"]
    assert format_rate(3000) == "3Kbit/s"        # tc's spelling, which parse_rate reads back


def test_rates_parse_once() -> None:
    assert bits_per_second("95.6M") == 95.6e6 and bits_per_second("10gbit/s") == 1e10
    assert parse_rate(format_rate(parse_rate("2.5G"))) == 2_500_000_000
    with pytest.raises(UsageError, match="bad --link-rate 'x'"):
        parse_rate("x", "--link-rate")
    with pytest.raises(UsageError, match="is below 100K"):
        parse_rate("50K")


def test_a_topology_uplink_rate_is_one_of_them() -> None:
    from ccbench.model.topology import LinkClass, build_topology

    topo = build_topology("fat-tree:8:leaf=4:uplink=800M", None, LinkClass(1e-6, 1e-9))
    assert topo.cap[topo.klass.index("uplink")] == pytest.approx(4 * 800e6 / 8)
    with pytest.raises(UsageError, match="uplink rate"):
        build_topology("fat-tree:8:leaf=4:uplink=fast", None, LinkClass(1e-6, 1e-9))
