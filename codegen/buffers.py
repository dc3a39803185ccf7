"""Buffer placement: where each chunk of a collective lives on each rank (input, output, scratch).

Input and output indices come from ``Collective.input_map``/``output_map``. In place, the smaller buffer is
the rank's slice of the larger one (see ``schedules.plan``), and every location is written in terms of the
larger buffer, so that two names for one slot never hide a dependency. Scratch slots are handed out in
order, one per arrival that cannot land in its final place, plus one accumulator per chunk that a rank
combines but does not output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.ir import Loc
from schedules.collectives import Collective


@dataclass
class Placement:
    collective: Collective
    inplace: bool
    scratch: list[int] = field(default_factory=list)
    _accumulators: dict[tuple[int, int], Loc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scratch = [0] * self.collective.nranks

    @property
    def input_chunks(self) -> int:
        return len(self.collective.input_map(0))

    @property
    def output_chunks(self) -> int:
        return len(self.collective.output_map(0))

    def _physical(self, rank: int, type: str, index: int) -> Loc:
        if not self.inplace:
            return Loc(rank, type, index)
        name, big = self.collective.name, "o" if self.output_chunks >= self.input_chunks else "i"
        if type == big:
            return Loc(rank, type, index)
        if name in ("allgather", "gather"):
            return Loc(rank, big, rank * self.input_chunks + index)
        if name in ("reducescatter", "scatter"):
            return Loc(rank, big, rank * self.output_chunks + index)
        return Loc(rank, big, index)

    def input_loc(self, rank: int, chunk: int) -> Loc | None:
        """Where ``chunk`` sits in rank's input buffer, when rank holds it there at the start."""
        if chunk not in self.collective.precondition(rank):
            return None
        return self._physical(rank, "i", self.collective.input_map(rank).index(chunk))

    def output_loc(self, rank: int, chunk: int) -> Loc | None:
        mapping = self.collective.output_map(rank)
        return self._physical(rank, "o", mapping.index(chunk)) if chunk in mapping else None

    def home(self, rank: int, chunk: int) -> Loc:
        """The slot where rank keeps its own copy of ``chunk``: its output slot, or a scratch accumulator."""
        out = self.output_loc(rank, chunk)
        if out is not None:
            return out
        if (rank, chunk) not in self._accumulators:
            self._accumulators[(rank, chunk)] = self.new_scratch(rank)
        return self._accumulators[(rank, chunk)]

    def holds_other(self, rank: int, chunk: int) -> bool:
        """Whether rank's home slot for ``chunk`` starts out holding another chunk's input (in place only)."""
        if not self.inplace:
            return False
        home = self.home(rank, chunk)
        return any(self.input_loc(rank, c) == home for c in self.collective.precondition(rank) if c != chunk)

    def new_scratch(self, rank: int) -> Loc:
        self.scratch[rank] += 1
        return Loc(rank, "s", self.scratch[rank] - 1)


def place_buffers(collective: Collective, inplace: bool = False) -> Placement:
    """A fresh placement for ``collective``; scratch grows as lowering asks for slots."""
    return Placement(collective, inplace)
