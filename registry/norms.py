"""norm.json: the fused all-reduce + residual add + RMSNorm call's measured times, beside the plans' own.

The fused call (``executor.reference.norm``) runs an all-reduce plan with an epilogue whose cost depends on the plan:
a plan whose thread blocks own whole rows normalizes them alone, one whose rows are split over blocks exchanges sums
of squares between them. So the plan that runs the all-reduce fastest need not run the fused call fastest, and
``bench/norm_peers.py`` times the call per plan. ``weft registry record`` stores those times here, per fabric, row
length (the hidden size, in elements), message size and plan, with the way the plan ran (``Mode``: an LL plan's
LL128 lines, its compiled kernel)::

    {"format": "weft.registry-norm/1",
     "norm_us": {TOPOLOGY: {ROW_ELEMS: {BYTES: {PLAN_HASH + MODE SUFFIX: µs}}}}}

Selection for the fused call ranks the plans with times here at a size first, by them, and the others after them
by their all-reduce times (``executor.reference.norm.fused_tiers``). Like baselines.json the file is advisory: a
damaged one is ignored with a warning, never costing the plans.

>>> norm_key("0123456789abcdef", Mode(compiled=True))
'0123456789abcdef+compiled'
>>> split_key("0123456789abcdef+ll128+compiled")
('0123456789abcdef', Mode(lines=True, compiled=True))
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from registry.index import MODES, Mode

NORM_FORMAT = "weft.registry-norm/1"
KEY = re.compile(r"^([0-9a-f]{16})((?:\+ll128)?(?:\+compiled)?)$")  # a plan's content hash and a Mode's suffix
SUFFIXES = {mode.suffix: mode for mode in MODES}


def norm_key(plan_hash: str, mode: Mode) -> str:
    return plan_hash + mode.suffix


def split_key(key: str) -> tuple[str, Mode]:
    """(plan hash, Mode) of a key; ValueError where it is not one."""
    match = KEY.match(key)
    if match is None:
        raise ValueError(f"{key[:40]!r} is not a plan hash (16 hex digits) with a mode suffix (+ll128, +compiled)")
    return match.group(1), SUFFIXES[match.group(2)]


def empty() -> dict[str, Any]:
    return {"format": NORM_FORMAT, "norm_us": {}}


def parse_norms(
    doc: object, valid_size: Callable[[object], int | None], valid_us: Callable[[object], bool]
) -> dict[str, Any]:
    """A norm.json document, checked: ValueError naming the field where it is malformed (``valid_size``: a JSON
    key's size in bytes or None; ``valid_us``: whether a value is a measured time, the registry's own checks)."""
    if not isinstance(doc, dict) or doc.get("format") != NORM_FORMAT:
        raise ValueError(f"format: must be {NORM_FORMAT!r}")
    tables = doc.get("norm_us")
    if not isinstance(tables, dict):
        raise ValueError("norm_us: must be an object of topologies")
    for topology, rows in tables.items():
        if not isinstance(rows, dict):
            raise ValueError(f"norm_us.{topology[:40]}: must be an object of row lengths")
        for row_elems, sizes in rows.items():
            where = f"norm_us.{topology[:40]}.{row_elems[:24]}"
            if valid_size(row_elems) is None or not isinstance(sizes, dict):
                raise ValueError(f"{where}: must be a row length in elements mapped to an object of sizes")
            for size, plans in sizes.items():
                if valid_size(size) is None or not isinstance(plans, dict):
                    raise ValueError(f"{where}.{size[:24]}: must be a size in bytes mapped to an object of plans")
                for key, us in plans.items():
                    try:
                        split_key(key)
                    except ValueError as e:
                        raise ValueError(f"{where}.{size[:24]}: {e}") from None
                    if not valid_us(us):
                        raise ValueError(f"{where}.{size[:24]}.{key[:40]}: must be a measured time in µs")
    return doc


def times_for(doc: dict[str, Any], fingerprints: tuple[str, ...], row_elems: int) -> dict[str, dict[int, float]]:
    """Each plan-and-mode key's fused-call times (bytes -> µs) for rows of ``row_elems`` on a fabric: its
    fingerprints' tables together, the fabric's own (the first) winning where two hold one size."""
    out: dict[str, dict[int, float]] = {}
    for fingerprint in reversed(fingerprints):
        for size, plans in doc["norm_us"].get(fingerprint, {}).get(str(row_elems), {}).items():
            for key, us in plans.items():
                out.setdefault(key, {})[int(size)] = float(us)
    return out


def with_times(doc: dict[str, Any], times: dict[str, dict[int, dict[int, dict[str, float]]]]) -> dict[str, Any]:
    """``doc`` with ``times`` ({topology: {row_elems: {bytes: {key: µs}}}}) stored over what it held."""
    tables = {t: {r: {s: dict(p) for s, p in rows.items()} for r, rows in v.items()} for t, v in doc["norm_us"].items()}
    for topology, rows in times.items():
        for row_elems, sizes in rows.items():
            for size, plans in sizes.items():
                stored = tables.setdefault(topology, {}).setdefault(str(row_elems), {}).setdefault(str(size), {})
                stored.update({key: float(us) for key, us in plans.items()})
    return {"format": NORM_FORMAT, "norm_us": tables}
