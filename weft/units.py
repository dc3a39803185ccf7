"""Byte sizes as users write them: 1KB, 4MB, 1GB (powers of two, KB = KiB = 1024 B, as nccl-tests prints them)."""

from __future__ import annotations

import re
from fractions import Fraction

from weftcore.errors import WeftError
from weftcore.jsonfile import short_repr

_PREFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
MAX_BYTES = 1 << 60  # 1 EiB: no message comes near it, and every size stays a 64-bit count
SIZE_HELP = (
    "sizes are bytes in powers of two (1KB = 1KiB = 1024 B, 1MB = 2^20 B), at most 1EB (2^60 B); "
    "a lowercase b (4Mb) means bits and is refused; bandwidths are decimal GB/s (10^9 B/s)"
)
_SIZE = re.compile(r"(\d{1,20}(?:\.\d{1,20})?)([KMGTPE]?)(I?)(B?)", re.IGNORECASE)


class SizeError(WeftError):
    """A size that cannot be read."""


def parse_bytes(text: str, field: str = "--size") -> int:
    """'4MB' -> 4194304; '3MB+48' -> 3145776. Units are binary (K = 1024) and case-insensitive, except that
    a lowercase b after a number or prefix means bits ('4Mb'), which weft refuses rather than guess."""
    total = 0
    for part in str(text).replace(" ", "").split("+"):
        m = _SIZE.fullmatch(part)
        if not m or (m.group(3) and not m.group(2)):
            raise SizeError(f"{field}: cannot read size {short_repr(text)} (write e.g. 1KB, 4MB, 1GB or 3MB+48)")
        if m.group(4) == "b":
            raise SizeError(
                f"{field}: {short_repr(text)}: a lowercase b means bits; weft sizes are bytes "
                f"(write {m.group(1)}{m.group(2).upper()}B)"
            )
        total += int(Fraction(m.group(1)) * _PREFIXES[m.group(2).upper()])
        if total > MAX_BYTES:
            raise SizeError(f"{field}: {short_repr(text)}: more than the largest size, 1EB (2^60 bytes)")
    if total <= 0:
        raise SizeError(f"{field}: size must be positive, got {short_repr(text)}")
    return total


def parse_size_range(text: str, field: str = "--sizes") -> list[int]:
    """'1KB:1GB' -> every power of two from 1 KB to 1 GB; '1KB,4MB' -> those sizes."""
    if ":" in text:
        lo, hi = (parse_bytes(x, field) for x in text.split(":", 1))
        if lo > hi:
            raise SizeError(f"{field}: {text!r} runs backwards")
        sizes, n = [], lo
        while n <= hi:
            sizes.append(n)
            n *= 2
        return sizes
    return [parse_bytes(x, field) for x in text.split(",")]


def format_bytes(n: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{int(n // scale)}{unit}"
    return f"{int(n)}B"
