"""Sketch hints for the MILP synthesizer (``weft.sketch/1``): symmetry, relays, chunks per rank.

Every field is optional::

    {"format": "weft.sketch/1",
     "symmetry": {"rank_offset": 8},   # the same schedule on every node, shifted by 8 ranks
     "relays": [0, 4, 8, 12],          # only these ranks send or receive across hosts
     "rails": true,                    # cross-host sends only between GPUs of the same local index
     "hierarchy": "trees",             # inter-host hops from the tree packing ("rails", or "none")
     "chunks": 2}                      # chunks per rank

``hierarchy`` splits the model into an inter-host and an intra-host part (``synth.milp.hierarchy``): each
chunk enters another host only by the hops named (``rails``: from its owner along its rail; ``trees``: the
cross-host hops of its root's packed trees) and spreads inside a host from the ranks that hold it there.
Without it the solver uses ``rails`` for copy collectives across hosts at bandwidth-bound sizes and none
elsewhere (``"none"`` turns it off).

Without ``rails`` the solver decides: rails when a chunk takes longer to cross hosts than the link's latency
(fanning one chunk out to many remote GPUs then costs NIC bandwidth for nothing), every pair otherwise.

A malformed sketch raises SketchError (exit 2) naming the file and field. Whether a well-formed sketch fits a
topology (a symmetry that does not map the fabric onto itself, relays that cut a host off) is decided by the
solver, which knows the topology.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from synth.errors import SynthesisError
from weftcore.jsonfile import read_json

FORMAT = "weft.sketch/1"
FIELDS = ("format", "symmetry", "relays", "rails", "hierarchy", "chunks", "description")
HIERARCHIES = ("rails", "trees", "none")


class SketchError(SynthesisError):
    """A sketch file is malformed or does not fit the topology (exit code 2)."""


@dataclass(frozen=True)
class Sketch:
    """Hints that narrow the MILP; ``None`` or empty means no hint."""

    rank_offset: int | None = None
    relays: tuple[int, ...] | None = None
    chunks: int | None = None
    rails: bool | None = None
    source: str = "sketch"
    hierarchy: str | None = None  # one of HIERARCHIES, None: the solver decides

    def to_json(self) -> dict:
        doc: dict = {"format": FORMAT}
        if self.rank_offset is not None:
            doc["symmetry"] = {"rank_offset": self.rank_offset}
        if self.relays is not None:
            doc["relays"] = list(self.relays)
        if self.rails is not None:
            doc["rails"] = self.rails
        if self.hierarchy is not None:
            doc["hierarchy"] = self.hierarchy
        if self.chunks is not None:
            doc["chunks"] = self.chunks
        return doc


def load_sketch(path: str | Path) -> Sketch:
    """Read a sketch file; every problem names the file and field."""
    return parse_sketch(read_json(path, "sketch", SketchError), str(path))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def parse_sketch(data: object, source: str = "sketch") -> Sketch:
    """Build a Sketch from decoded JSON."""

    def fail(field: str, reason: str) -> SketchError:
        return SketchError(f"sketch {source}: {field}: {reason}")

    if not isinstance(data, dict):
        raise fail("(top level)", f"must be a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise fail("format", f"must be {FORMAT!r}, got {data.get('format')!r}")
    for key in data:
        if key not in FIELDS:
            raise fail(key, f"unknown field (known: {', '.join(FIELDS)})")
    rank_offset = _rank_offset(data["symmetry"], fail) if "symmetry" in data else None
    relays = _relays(data["relays"], fail) if "relays" in data else None
    rails = data.get("rails")
    if rails is not None and not isinstance(rails, bool):
        raise fail("rails", f"must be true or false, got {rails!r}")
    hierarchy = data.get("hierarchy")
    if hierarchy is not None and hierarchy not in HIERARCHIES:
        raise fail("hierarchy", f"must be one of {', '.join(HIERARCHIES)}, got {hierarchy!r}")
    chunks = data.get("chunks")
    if chunks is not None and not _positive_int(chunks):
        raise fail("chunks", f"must be a positive integer, got {chunks!r}")
    if "description" in data and not isinstance(data["description"], str):
        raise fail("description", "must be a string")
    return Sketch(rank_offset, relays, chunks, rails, source, hierarchy)


def _rank_offset(symmetry: object, fail: Callable[[str, str], SketchError]) -> int:
    if not isinstance(symmetry, dict) or set(symmetry) != {"rank_offset"}:
        raise fail("symmetry", 'must be {"rank_offset": N}')
    rank_offset = symmetry["rank_offset"]
    if not _positive_int(rank_offset):
        raise fail("symmetry.rank_offset", f"must be a positive integer, got {rank_offset!r}")
    return int(rank_offset)


def _relays(raw: object, fail: Callable[[str, str], SketchError]) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw:
        raise fail("relays", "must be a non-empty list of ranks")
    for i, rank in enumerate(raw):
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise fail(f"relays[{i}]", f"must be a rank (an integer >= 0), got {rank!r}")
        if rank in raw[:i]:
            raise fail(f"relays[{i}]", f"rank {rank} is listed twice")
    return tuple(sorted(raw))
