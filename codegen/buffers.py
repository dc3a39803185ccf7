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
    _inputs: list[dict[int, int]] = field(default_factory=list)  # rank -> chunk -> input index (chunks held)
    _outputs: list[dict[int, int]] = field(default_factory=list)  # rank -> chunk -> output index
    _input_chunk_at: list[dict[Loc, int]] = field(default_factory=list)  # rank -> input slot -> its chunk

    def __post_init__(self) -> None:
        c = self.collective
        self.scratch = [0] * c.nranks
        # the collective recomputes its maps on every call: look each up once (lowering asks per send)
        for r in range(c.nranks):
            held = c.precondition(r)
            self._inputs.append({chunk: k for k, chunk in enumerate(c.input_map(r)) if chunk in held})
            self._outputs.append({chunk: k for k, chunk in enumerate(c.output_map(r))})
        for r in range(c.nranks):
            self._input_chunk_at.append(
                {self._physical(r, "i", index): chunk for chunk, index in self._inputs[r].items()}
            )

    @property
    def input_chunks(self) -> int:
        return len(self.collective.input_map(0))

    @property
    def output_chunks(self) -> int:
        return len(self.collective.output_map(0))

    @property
    def section(self) -> int:
        """Chunks of an input or output buffer that belong together: a rank's slice, or the whole buffer where
        every rank holds every chunk at the same index (see ``codegen.replicate``)."""
        c = self.collective
        if all(c.input_map(r) == c.output_map(r) for r in range(c.nranks)):
            return self.output_chunks
        return c.chunks

    def _physical(self, rank: int, type: str, index: int) -> Loc:
        if not self.inplace:
            return Loc(rank, type, index)
        big = "o" if self.output_chunks >= self.input_chunks else "i"
        if type == big:
            return Loc(rank, type, index)
        offsets = self.collective.inplace_offsets(rank, self.input_chunks, self.output_chunks)
        return Loc(rank, big, offsets[type == "o"] + index)

    def input_loc(self, rank: int, chunk: int) -> Loc | None:
        """Where ``chunk`` sits in rank's input buffer, when rank holds it there at the start."""
        index = self._inputs[rank].get(chunk)
        return None if index is None else self._physical(rank, "i", index)

    def output_loc(self, rank: int, chunk: int) -> Loc | None:
        index = self._outputs[rank].get(chunk)
        return None if index is None else self._physical(rank, "o", index)

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
        return self._input_chunk_at[rank].get(self.home(rank, chunk), chunk) != chunk

    def new_scratch(self, rank: int) -> Loc:
        self.scratch[rank] += 1
        return Loc(rank, "s", self.scratch[rank] - 1)


def place_buffers(collective: Collective, inplace: bool = False) -> Placement:
    """A fresh placement for ``collective``; scratch grows as lowering asks for slots."""
    return Placement(collective, inplace)
