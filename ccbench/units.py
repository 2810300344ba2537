"""Sizes in bytes and rates in bits per second: every parse and every display of them.

Sizes: the --sizes syntax, `1K-1G` (powers of two), `1K-1G:4` (factor 4), `8,1K,1M` (a
list). Suffixes are binary, as in nccl-tests: K = 2**10, M = 2**20, G = 2**30, T = 2**40.
A bare number is bytes; a trailing `B` is allowed (`8B`, `1KB`, `1KiB`). Shown three ways:
as the --sizes syntax writes them (`format_size`: 1K, 1536, exact), as a compact label of a
column, axis or tick (`size_label`: 2.275M, or 2.3M at two digits) and in prose
(`size_text`: 1.5 MiB, or 3000 B where every byte counts).

Rates: `500M`, `1G`, `1gbit`, `250mbit` are bits per second with decimal units, as tc and
link speeds are (`parse_rate`). Shown as tc writes them (`format_rate`: 250Mbit/s), in prose
(`rate_text`: 95.6 Mbit/s) or in one unit for a column that compares rows
(`rate_text(bps, unit="M")`: 95.6 Mbit/s, 1000.0 Mbit/s).
"""

from __future__ import annotations

import math
import re

from ccbench.errors import UsageError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_BINARY = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_DECIMAL = (("G", 10**9), ("M", 10**6), ("k", 10**3))
_RATE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|bps|b)?(?:/s)?\s*", re.IGNORECASE)

__all__ = ["bits_per_second", "format_rate", "format_size", "parse_rate", "parse_size",
           "parse_sizes", "rate_text", "size_label", "size_text"]


def parse_size(text: str) -> int:
    """One size in bytes; raises UsageError naming the bad text."""
    match = _SIZE_RE.match(text)
    if not match:
        raise UsageError(f"malformed size {text!r} (examples: 8, 1K, 64M, 1G)")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise UsageError(f"size must be positive, got {text!r}")
    return value


def parse_sizes(spec: str) -> list[int]:
    """All sizes of a spec, ascending and without duplicates."""
    if not spec or not spec.strip():
        raise UsageError("empty --sizes (examples: 1K-1G, 1K-1G:4, 8,1K,1M)")
    sizes: set[int] = set()
    for part in spec.split(","):
        if not part.strip():
            raise UsageError(f"malformed --sizes {spec!r}: empty item")
        sizes.update(_parse_part(part.strip()))
    return sorted(sizes)


def _parse_part(part: str) -> list[int]:
    if "-" not in part:
        if ":" in part:
            raise UsageError(f"malformed size range {part!r}: a factor needs a range (1K-1M:4)")
        return [parse_size(part)]
    bounds, _, factor_text = part.partition(":")
    low_text, _, high_text = bounds.partition("-")
    if not low_text.strip():
        raise UsageError(f"size {part!r} is negative or has no lower bound: sizes are positive "
                         f"byte counts (examples: 8, 1K, 1K-1G)")
    if "-" in high_text:
        raise UsageError(f"malformed size range {part!r} (examples: 1K-1G, 1K-1G:4)")
    low, high = parse_size(low_text), parse_size(high_text)
    if low > high:
        raise UsageError(f"size range {part!r} goes down: {low} > {high}")
    factor = 2
    if factor_text:
        if not factor_text.strip().isdigit() or int(factor_text) < 2:
            raise UsageError(f"size factor must be an integer >= 2, got {factor_text!r}")
        factor = int(factor_text)
    out = []
    size = low
    while size <= high:
        out.append(size)
        size *= factor
    return out


def format_size(num_bytes: int) -> str:
    """1024 -> '1K', 1536 -> '1536', 3 MiB -> '3M': exact, binary, as in the size axis."""
    for suffix, unit in _BINARY:
        if num_bytes >= unit and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def size_label(num_bytes: float, digits: int = 4) -> str:
    """A compact label, one style for a whole column or axis: the exact form when it has at
    most `digits` digits (1026K, 16M), else `digits` significant digits of the largest binary
    unit (2385960 -> 2.275M; at digits=2, 2040 -> 2K, 131064 -> 128K); bytes below 1 KiB.
    Interpolated (float) sizes are rounded to whole bytes first."""
    whole = int(round(num_bytes))
    exact = format_size(whole)
    if whole < 1024 or (not exact.isdigit() and len(exact) - 1 <= digits):
        return exact
    suffix, unit = next((suffix, unit) for suffix, unit in _BINARY if whole >= unit)
    return f"{_significant(whole / unit, digits)}{suffix}"


def size_text(count: float, digits: int = 3, exact: bool = False) -> str:
    """A size in prose, to `digits` significant digits: 1.5 MiB, 12 GiB, 300 B. With
    `exact`, a whole number of its largest unit or else every byte: 64 KiB, 3000 B."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            if exact and count % scale:
                break
            return f"{_significant(count / scale, digits)} {unit}"
    if exact or float(count).is_integer():
        return f"{count:.0f} B"
    return f"{_significant(count, digits)} B"


def _significant(value: float, digits: int) -> str:
    """`digits` significant digits, never an exponent: 1.99 -> 2, 99.7 -> 100 at two."""
    return f"{value:.{digits}g}" if value < 10 ** (digits - 1) else f"{value:.0f}"


def duration_text(us: float) -> str:
    """A time in microseconds, in prose, to three significant digits of its largest unit:
    12.3 µs, 4.5 ms, 1.2 s (µs as the figures' axes write it); '-' for no value."""
    if not math.isfinite(us):
        return "-"
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def bits_per_second(text: str, name: str = "rate") -> float:
    """'500M', '1G', '1gbit', '250mbit', '95.6M' -> bits per second (decimal units, as tc);
    `name` says in the error which option gave it."""
    match = _RATE_RE.fullmatch(text)
    if not match:
        raise UsageError(f"bad {name} {text!r} (valid: a number with K, M or G: 100M, "
                         f"500M, 1G, 2.5G; bits per second)")
    return float(match.group(1)) * _RATE_UNITS[match.group(2).lower()]


def parse_rate(text: str, name: str = "--link rate") -> int:
    """A link's rate as tc shapes it: whole bits per second, at least 100K."""
    value = bits_per_second(text, name)
    if value < 10**5:
        raise UsageError(f"{name} {text!r} is below 100K (bits per second)")
    return int(value)


def format_rate(bits_per_s: float) -> str:
    """1e9 -> '1Gbit/s', 2.5e8 -> '250Mbit/s' (decimal units, as tc)."""
    for unit, scale in _DECIMAL:
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit.upper()}bit/s"
    return f"{bits_per_s:g}bit/s"


def rate_text(bits_per_s: float, digits: int = 3, unit: str | None = None) -> str:
    """A rate in prose, to `digits` significant digits of its largest decimal unit:
    95.6 Mbit/s, 1 Gbit/s, 512 bit/s. With `unit` ('k', 'M' or 'G'), always that unit
    with one decimal, so that a column of rates compares row by row: 1000.0 Mbit/s."""
    if unit is not None:
        scale = dict(_DECIMAL)[unit]
        return f"{bits_per_s / scale:.1f} {unit}bit/s"
    for name, scale in _DECIMAL:
        if bits_per_s >= scale:
            return f"{_significant(bits_per_s / scale, digits)} {name}bit/s"
    return f"{_significant(bits_per_s, digits)} bit/s"
