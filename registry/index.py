"""What selection reads without parsing a plan: an entry's key, timings and a few plan facts, one index row each.

index.json holds one row per entry file. Each row ends in a digest of the entry file it was made from and of the
row itself (``row_hash``), so a reader can tell a row that still describes its file, unchanged (use it), from one
that does not: stale, edited or damaged (parse that entry instead). The index is advisory, never trusted over the
entries.

>>> row = IndexRow.from_json({"id": "e", "topology": "topo-00000000000000aa", "collective": "allgather",
...     "nranks": 1, "min_bytes": 4, "max_bytes": 0, "plan": "p", "plan_hash": "h", "solver": "direct",
...     "measured": False, "protocol": "Simple", "dtypes": [], "timings": {
...     "predicted_us": {"1024": 2.0, "4096": 8.0}, "measured_us": {}}})
>>> row.estimate(16384)  # past the last size: bandwidth-bound
('predicted', 32.0, False)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, TypeGuard

UNBOUNDED = 0  # max_bytes of 0: no upper limit (MSCCL++'s convention for max_message_size)


@dataclass(frozen=True, order=True)
class Mode:
    """How a plan was measured, and so how it runs: an LL plan's packets moved as LL128 lines (``lines``), and the
    plan compiled to a kernel of its own instead of interpreted (``compiled``). The bench names a plan timed so
    PLAN+ll128, PLAN+compiled or PLAN+ll128+compiled (``suffix``); an entry keeps each mode's times in its own table
    (``table``).

    >>> Mode(lines=True, compiled=True).suffix, Mode(compiled=True).table
    ('+ll128+compiled', 'measured_compiled_us')
    """

    lines: bool = False
    compiled: bool = False

    @property
    def suffix(self) -> str:
        return ("+ll128" if self.lines else "") + ("+compiled" if self.compiled else "")

    @property
    def table(self) -> str:
        return "measured" + self.suffix.replace("+", "_") + "_us"


MODES = (Mode(), Mode(lines=True), Mode(compiled=True), Mode(lines=True, compiled=True))
TIMING_TABLES = ("predicted_us", *(mode.table for mode in MODES))  # an entry's timings, in Entry's field order


@dataclass(frozen=True)
class EntryKey:
    topology: str
    collective: str
    nranks: int
    min_bytes: int
    max_bytes: int

    def covers(self, nbytes: int) -> bool:
        return self.min_bytes <= nbytes and (self.max_bytes == UNBOUNDED or nbytes <= self.max_bytes)


def row_hash(data: bytes | str, row: dict[str, Any]) -> str:
    """The digest an index row records: the entry file's bytes and the row's other fields, together."""
    fields = json.dumps({k: v for k, v in row.items() if k != "row_hash"}, sort_keys=True).encode()
    return hashlib.sha256((data.encode() if isinstance(data, str) else data) + b"\0" + fields).hexdigest()[:16]


def describes(row: object, data: bytes) -> TypeGuard[dict[str, Any]]:
    """Whether an index row was made from this entry file and not changed since."""
    return isinstance(row, dict) and row.get("row_hash") == row_hash(data, row)


def interpolate(table: dict[int, float], nbytes: int) -> float:
    """A time at ``nbytes`` from a table of (bytes, µs), log-log between its points, bandwidth-bound past the last."""
    points = sorted(table.items())
    if nbytes <= points[0][0]:
        return points[0][1]
    if nbytes >= points[-1][0]:
        (s0, t0), (s1, t1) = points[-2:] if len(points) > 1 else (points[-1], points[-1])
        return t1 if s0 == s1 else t1 * nbytes / s1
    for (s0, t0), (s1, t1) in pairwise(points):
        if s0 <= nbytes <= s1:
            f = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return points[-1][1]


@dataclass(frozen=True)
class Timings:
    """An entry's recorded times (bytes -> µs) and the plan's protocol: predicted, and measured in each ``Mode``
    (only LL plans have times with LL128 lines)."""

    protocol: str
    predicted_us: dict[int, float] = field(default_factory=dict)
    measured_us: dict[int, float] = field(default_factory=dict)
    measured_ll128_us: dict[int, float] = field(default_factory=dict)
    measured_compiled_us: dict[int, float] = field(default_factory=dict)
    measured_ll128_compiled_us: dict[int, float] = field(default_factory=dict)

    def tables(self, ll128: bool = False, compiled: bool = False) -> list[tuple[Mode, dict[int, float]]]:
        """The measured tables an executor may use: LL128 lines where ``ll128`` (an LL plan), compiled kernels
        where ``compiled``; empty tables left out."""
        lined = ll128 and self.protocol == "LL"
        return [
            (mode, table)
            for mode in MODES
            if (table := getattr(self, mode.table)) and (lined or not mode.lines) and (compiled or not mode.compiled)
        ]

    def measured(self, ll128: bool = False, compiled: bool = False) -> bool:
        """Whether any time was measured that such an executor may use."""
        return bool(self.tables(ll128, compiled))

    def rank(self, nbytes: int, ll128: bool = False, compiled: bool = False) -> tuple[bool, float]:
        """Selection's order at ``nbytes`` (the lower, the better): any measured time before a prediction, then the
        time (``estimate``'s; none ranks last)."""
        basis, time_us, _ = self.estimate(nbytes, ll128, compiled)
        return basis != "measured", time_us or math.inf

    def estimate(self, nbytes: int, ll128: bool = False, compiled: bool = False) -> tuple[str, float | None, Mode]:
        """('measured'|'predicted'|'none', time at nbytes, the mode that time was measured in: how to run it).

        A mode's own table (lines, compiled) counts only inside the sizes it was measured at, so that a kernel timed
        at 64 KB is not taken to run 1 MB in that time; the plain table extrapolates as before, and where nothing
        else was measured, so does a mode's."""
        tables = self.tables(ll128, compiled)
        inside = [(m, t) for m, t in tables if m == Mode() or min(t) <= nbytes <= max(t)]
        options = [(interpolate(table, nbytes), mode) for mode, table in inside or tables]
        if options:
            time_us, mode = min(options)
            return "measured", time_us, mode
        if self.predicted_us:
            return "predicted", interpolate(self.predicted_us, nbytes), Mode()
        return "none", None, Mode()


@dataclass(frozen=True)
class IndexRow:
    """One index row: the entry's key and timings, its plan's name, hash, protocol and topology, its dtypes."""

    id: str
    key: EntryKey
    plan: str
    plan_hash: str
    plan_topology: str
    topology_name: str
    dtypes: tuple[str, ...]
    timings: Timings

    @staticmethod
    def from_json(row: dict[str, Any]) -> IndexRow:
        """A row as ``Entry.index_row`` writes it; KeyError, TypeError or ValueError where it is not one."""
        key = EntryKey(*(row[name] for name in ("topology", "collective", "nranks", "min_bytes", "max_bytes")))
        for value in (key.nranks, key.min_bytes, key.max_bytes):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError("a key's sizes are integers")
        tables = row["timings"]
        timings = Timings(
            str(row["protocol"]),
            *({int(k): float(v) for k, v in tables.get(name, {}).items()} for name in TIMING_TABLES),
        )
        if not all(0 < t < math.inf for name in TIMING_TABLES for t in getattr(timings, name).values()):
            raise ValueError("times are positive and finite")
        dtypes = tuple(row["dtypes"])
        if not all(isinstance(d, str) for d in dtypes):
            raise TypeError("dtypes are names")
        return IndexRow(
            row["id"],
            key,
            row["plan"],
            row["plan_hash"],
            str(row.get("plan_topology", "")),
            str(row.get("topology_name", "")),
            dtypes,
            timings,
        )

    def estimate(self, nbytes: int, ll128: bool = False, compiled: bool = False) -> tuple[str, float | None, Mode]:
        return self.timings.estimate(nbytes, ll128, compiled)

    def may_serve(
        self, topology: str | tuple[str, ...], collective: str, nranks: int | None, nbytes: int, dtype: str | None
    ) -> bool:
        """Whether the row's key (and its plan's topology) say it serves this call; only its plan can say whether
        the size runs (``Entry.serves``), so the chosen row's entry is asked again. ``topology``: a fingerprint,
        or every fingerprint of one fabric."""
        known = (topology,) if isinstance(topology, str) else topology
        return (
            self.key.topology in known
            and (self.plan_topology or self.key.topology) in known
            and self.key.collective == collective
            and (nranks is None or self.key.nranks == nranks)
            and self.key.covers(nbytes)
            and (dtype is None or not self.dtypes or dtype in self.dtypes)
        )
