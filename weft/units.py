"""Byte sizes as users write them: 1KB, 4MB, 1GB (powers of two, as nccl-tests prints them)."""

from __future__ import annotations

import re

from topologies.errors import WeftError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}


class SizeError(WeftError):
    """A size that cannot be read."""


def parse_bytes(text: str, field: str = "--size") -> int:
    """'4MB' -> 4194304; '3MB+48' -> 3145776."""
    total = 0
    for part in str(text).replace(" ", "").split("+"):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", part)
        if not m or m.group(2).upper() not in _UNITS:
            raise SizeError(f"{field}: cannot read size {text!r} (write e.g. 1KB, 4MB, 1GB or 3MB+48)")
        total += int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if total <= 0:
        raise SizeError(f"{field}: size must be positive, got {text!r}")
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
