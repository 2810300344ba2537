"""Sizes in bytes and rates in bits per second: every parse and every display of them.

Sizes: the --sizes syntax, `1K-1G` (powers of two), `1K-1G:4` (factor 4), `8,1K,1M` (a
list). Suffixes are binary, as in nccl-tests: K = 2**10, M = 2**20, G = 2**30, T = 2**40.
A bare number is bytes; a trailing `B` is allowed (`8B`, `1KB`, `1KiB`). Shown as the axis
writes them (`format_size`: 1K, exact), in a column of one style (`size_label`: 2.275M) or
in prose (`size_text`: 1.5 MiB).

Rates: `500M`, `1G`, `1gbit`, `250mbit` are bits per second with decimal units, as tc and
link speeds are (`parse_rate`, `format_rate`).
"""

from __future__ import annotations

import re

from ccbench.errors import UsageError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_BINARY = (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))
_RATE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_RATE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|bps|b)?(?:/s)?\s*", re.IGNORECASE)

__all__ = ["bits_per_second", "format_rate", "format_size", "parse_rate", "parse_size",
           "parse_sizes", "size_label", "size_text"]


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


def size_label(num_bytes: int) -> str:
    """Every size of a column in one unit style: 1026K exactly, 2385960 as 2.275M (binary
    units, four significant digits), bytes below 1 KiB."""
    exact = format_size(num_bytes)
    if not exact.isdigit() or num_bytes < 1024:
        return exact
    for suffix, unit in _BINARY:
        if num_bytes >= unit:
            return f"{num_bytes / unit:.4g}{suffix}"
    return exact


def size_text(count: float, digits: int = 3) -> str:
    """A size in prose, to `digits` significant digits: 1.5 MiB, 12 GiB, 300 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.{digits}g} {unit}"
    return f"{count:.0f} B" if float(count).is_integer() else f"{count:.{digits}g} B"


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
    for unit, scale in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit}bit/s"
    return f"{bits_per_s:g}bit/s"
