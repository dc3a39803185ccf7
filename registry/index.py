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
TIMING_TABLES = ("predicted_us", "measured_us", "measured_ll128_us")


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
    """An entry's recorded times (bytes -> µs) and the plan's protocol (only LL plans have LL128-line times)."""

    protocol: str
    predicted_us: dict[int, float] = field(default_factory=dict)
    measured_us: dict[int, float] = field(default_factory=dict)
    measured_ll128_us: dict[int, float] = field(default_factory=dict)

    def measured(self, ll128: bool = False) -> bool:
        """Whether any time was measured (with LL128 lines too when ``ll128``, for an LL plan)."""
        return bool(self.measured_us or (ll128 and self.protocol == "LL" and self.measured_ll128_us))

    def estimate(self, nbytes: int, ll128: bool = False) -> tuple[str, float | None, bool]:
        """('measured'|'predicted'|'none', time at nbytes, whether that time was measured with LL128 lines)."""
        if self.measured(ll128):
            lined = ll128 and self.protocol == "LL"
            options = [
                (interpolate(table, nbytes), lines)
                for table, lines in ((self.measured_us, False), (self.measured_ll128_us, True))
                if table and (lined or not lines)
            ]
            time_us, lines = min(options)
            return "measured", time_us, lines
        if self.predicted_us:
            return "predicted", interpolate(self.predicted_us, nbytes), False
        return "none", None, False


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
        if not all(
            0 < t < math.inf
            for table in (timings.predicted_us, timings.measured_us, timings.measured_ll128_us)
            for t in table.values()
        ):
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

    def estimate(self, nbytes: int, ll128: bool = False) -> tuple[str, float | None, bool]:
        return self.timings.estimate(nbytes, ll128)

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
