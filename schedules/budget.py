"""The memory budget: work that allocates in proportion to its input is estimated first and refused in one line
when the estimate passes the budget, before anything is allocated.

The budget is ``$WEFT_MEMORY_LIMIT`` bytes when set (``weft --memory-limit`` sets it for one command), otherwise
half of this machine's memory, and never more than what the process's own address-space limit
(``ulimit -v``) leaves free. Estimates are upper-leaning counts of what the work holds at once (bytes per
slot, per vector clock, per send), measured on real runs; they are not exact, and need not be: a refusal says
how much was needed and how to raise the budget.

>>> require(1 << 20, "a small thing", 1 << 30)
>>> try:
...     require(1 << 40, "a large thing", 1 << 30)
... except BudgetError as e:
...     print(e)  # doctest: +NORMALIZE_WHITESPACE
a large thing needs about 1 TiB of memory, more than the budget of 1 GiB
(raise it with --memory-limit or $WEFT_MEMORY_LIMIT)
"""

from __future__ import annotations

import os
import resource

from weftcore.errors import WeftError

ENV = "WEFT_MEMORY_LIMIT"


class BudgetError(WeftError):
    """Work whose estimated memory passes the budget: refused before it allocates (bad input, exit code 2)."""


def machine_bytes() -> int:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _address_space_left() -> int | None:
    """What ``RLIMIT_AS`` leaves of the address space beyond what the process maps now (None: no limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        mapped = 0
    return max(0, soft - mapped)


def budget_bytes() -> int:
    """The budget in bytes: ``$WEFT_MEMORY_LIMIT`` (a count of bytes), else half the machine's memory; within
    ``ulimit -v``."""
    stated = os.environ.get(ENV, "").strip()
    if stated and not (stated.isdecimal() and len(stated) < 20 and int(stated) > 0):
        raise BudgetError(f"${ENV}: must be a positive count of bytes, got {stated[:40]!r}")
    limit = int(stated) if stated else machine_bytes() // 2
    left = _address_space_left()
    return limit if left is None else min(limit, left * 3 // 4)


def human(n: float) -> str:
    if n >= 1 << 60:
        return "more than 1 EiB"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def require(estimate: float, what: str, budget: int | None = None) -> None:
    """Refuse ``what`` (a phrase naming the work and its input) when ``estimate`` bytes pass the budget."""
    budget = budget_bytes() if budget is None else budget
    if estimate > budget:
        raise BudgetError(
            f"{what} needs {'about ' * (estimate < 1 << 60)}{human(estimate)} of memory, more than the budget of "
            f"{human(budget)} (raise it with --memory-limit or ${ENV})"
        )
