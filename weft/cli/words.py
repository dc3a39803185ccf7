"""Counts in words: ``counted(1, "entry", "entries") == "1 entry"``, so no line says "1 thread blocks"."""

from __future__ import annotations


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it needs.

    >>> counted(1, "thread block"), counted(2, "thread block"), counted(0, "entry", "entries")
    ('1 thread block', '2 thread blocks', '0 entries')
    """
    return f"{n} {singular if n == 1 else plural or singular + 's'}"
