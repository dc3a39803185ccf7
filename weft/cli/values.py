"""Comma-separated command-line values: every item present, so ``--instances 1,,2`` or ``--dtypes ""`` is refused
in one line instead of read as if it were valid."""

from __future__ import annotations

from weft.cli import ArgumentError


def comma_items(text: str, flag: str) -> tuple[str, ...]:
    """The items of ``text``, stripped; an empty list or an empty item is refused naming ``flag``.

    >>> comma_items("fp32, bf16", "--dtypes")
    ('fp32', 'bf16')
    """
    items = tuple(x.strip() for x in str(text).split(","))
    if not any(items):
        raise ArgumentError(f"{flag}: empty: give at least one value")
    if not all(items):
        raise ArgumentError(f"{flag}: {text!r} has an empty item; separate values with single commas")
    return items


def comma_ints(text: str, flag: str, low: int = 1, high: int | None = None) -> tuple[int, ...]:
    """The integers of ``text``, each in ``low..high``."""
    values = []
    for item in comma_items(text, flag):
        if not item.isdecimal() or len(item) > 18 or int(item) < low or (high is not None and int(item) > high):
            bound = f"at least {low}" if high is None else f"in {low}..{high}"
            raise ArgumentError(f"{flag}: {item[:40]!r}: each value must be an integer {bound}")
        values.append(int(item))
    return tuple(values)
