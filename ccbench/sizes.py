"""The --sizes syntax: `1K-1G` (powers of two), `1K-1G:4` (factor 4), `8,1K,1M` (a list).

Suffixes are binary, as in nccl-tests: K = 2**10, M = 2**20, G = 2**30, T = 2**40.
A bare number is bytes; a trailing `B` is allowed (`8B`, `1KB`, `1KiB`).
"""

from __future__ import annotations

import re

from ccbench.errors import UsageError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)

__all__ = ["format_size", "parse_size", "parse_sizes"]


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
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if num_bytes >= unit and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)
