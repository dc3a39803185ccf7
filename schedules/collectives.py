"""The eight collectives as pre/post-conditions over (rank, chunk).

Chunks are numbered globally, SCCL-style. With N ranks and ``chunks`` = c chunks per rank-slice:

| collective    | global chunks | rank r starts with            | rank r ends with              |
|---------------|---------------|-------------------------------|-------------------------------|
| allgather     | N·c           | r·c .. r·c+c-1                | all                           |
| reducescatter | N·c           | a contribution to every chunk | the sum of r·c .. r·c+c-1     |
| allreduce     | N·c           | a contribution to every chunk | the sum of every chunk        |
| broadcast     | c             | root: all                     | all                           |
| reduce        | c             | a contribution to every chunk | root: the sum of every chunk  |
| gather        | N·c           | r·c .. r·c+c-1                | root: all                     |
| scatter       | N·c           | root: all                     | r·c .. r·c+c-1                |
| alltoall      | N·N·c         | (r·N+d)·c+j for every d, j    | (s·N+r)·c+j for every s, j    |
| sendrecv      | N·c           | r·c .. r·c+c-1                | p·c .. p·c+c-1, p = r-1 mod N |

``sendrecv`` is MSCCL++'s (its DSL's ``SendRecv``): every rank sends its input to the next rank and receives the
previous rank's into its output, both buffers one slice. weft runs and checks plans for it (``PLAN_ONLY``) but
does not synthesize it. MSCCL++'s ``SendRecv`` with a split mask sends further (to r + group size) under the same
name; the plan reader refuses such a plan in one line (``schedules.plan``).

For combining collectives (reducescatter, allreduce, reduce) every rank contributes to every chunk and a
postcondition means "holds the sum of all N contributions, each counted once".

``input_map(rank)`` and ``output_map(rank)`` give the chunk held at each index of a rank's input and output
buffer; the message size in nccl-tests terms spans ``size_chunks`` chunks.

>>> c = Collective("allgather", 4)
>>> c.nchunks, sorted(c.precondition(1)), c.output_map(2)
(4, [1], (0, 1, 2, 3))
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from weftcore.errors import WeftError

NAMES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter", "alltoall")
PLAN_ONLY = ("sendrecv",)  # collectives that plans (MSCCL++'s) compute and weft checks, but never synthesizes
MAX_CHUNKS = 1 << 24  # global chunks: far beyond any schedule weft makes, but a corrupt count cannot allocate gigabytes
COMBINING = frozenset({"reducescatter", "allreduce", "reduce"})
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter"})
INPUT_IS_SLICE = frozenset({"allgather", "gather"})  # in place: the input is the rank's slice of the output
OUTPUT_IS_SLICE = frozenset({"reducescatter", "scatter"})  # in place: the output is the rank's slice of the input
ONE_SLICE = frozenset({"broadcast", "reduce"})  # the message is one slice, not one per rank
SHIFT = "sendrecv"  # rank r's input becomes rank r+1's output
DUALS = {
    "allgather": "reducescatter",
    "reducescatter": "allgather",
    "broadcast": "reduce",
    "reduce": "broadcast",
    "gather": "scatter",
    "scatter": "gather",
    "allreduce": "allreduce",
    "alltoall": "alltoall",
}


class CollectiveError(WeftError):
    """An unknown collective or impossible parameters."""


@dataclass(frozen=True)
class Collective:
    name: str
    nranks: int
    chunks: int = 1
    root: int = 0

    def __post_init__(self) -> None:
        if self.name not in NAMES + PLAN_ONLY:
            raise CollectiveError(
                f"collective: unknown collective {self.name!r} (choose from {', '.join(NAMES + PLAN_ONLY)})"
            )
        if not isinstance(self.nranks, int) or isinstance(self.nranks, bool) or self.nranks < 1:
            raise CollectiveError(f"collective {self.name}: nranks must be a positive integer, got {self.nranks!r}")
        if not isinstance(self.chunks, int) or isinstance(self.chunks, bool) or self.chunks < 1:
            raise CollectiveError(f"collective {self.name}: chunks must be a positive integer, got {self.chunks!r}")
        if not isinstance(self.root, int) or isinstance(self.root, bool) or not 0 <= self.root < self.nranks:
            raise CollectiveError(f"collective {self.name}: root {self.root!r} is not a rank (0..{self.nranks - 1})")
        if self.nchunks > MAX_CHUNKS:
            raise CollectiveError(
                f"collective {self.name}: chunks {self.chunks} on {self.nranks} ranks make "
                f"{self.nchunks} chunks in all; at most {MAX_CHUNKS}"
            )

    @property
    def min_sends(self) -> int:
        """The fewest sends any schedule of this collective has: every chunk a rank lacks arrives in one send at
        least (for allreduce and reduce, every contribution but the last leaves its rank once).

        >>> Collective("allgather", 4, 2).min_sends, Collective("broadcast", 4).min_sends
        (24, 3)
        """
        n = self.nranks
        if self.name in PLAN_ONLY:
            return 0  # no schedule form to count
        return (
            (n - 1)
            * self.nchunks
            // (n if self.rooted and self.name not in ONE_SLICE or self.name == "alltoall" else 1)
        )

    @property
    def combining(self) -> bool:
        return self.name in COMBINING

    @property
    def rooted(self) -> bool:
        return self.name in ROOTED

    @property
    def input_is_slice(self) -> bool:
        """Whether a rank's input is its own slice of the output (allgather, gather): in place, the input
        buffer lies inside the output at ``rank × input size``."""
        return self.name in INPUT_IS_SLICE

    @property
    def output_is_slice(self) -> bool:
        """Whether a rank's output is its own slice of the input (reducescatter, scatter): in place, the output
        buffer lies inside the input at ``rank × output size``."""
        return self.name in OUTPUT_IS_SLICE

    def inplace_offsets(self, rank: int, input_size: int, output_size: int) -> tuple[int, int]:
        """Where the input and the output start inside an in-place call's one buffer (any unit: chunks, bytes),
        given each buffer's size in that unit: the smaller buffer is the rank's slice of the larger one.

        >>> Collective("allgather", 4).inplace_offsets(2, 3, 12), Collective("allreduce", 4).inplace_offsets(2, 8, 8)
        ((6, 0), (0, 0))
        """
        return (rank * input_size if self.input_is_slice else 0, rank * output_size if self.output_is_slice else 0)

    @property
    def input_fraction(self) -> Fraction:
        """A rank's input buffer as a fraction of the message size (nccl-tests terms)."""
        return Fraction(len(self.input_map(0)), self.size_chunks)

    @property
    def output_fraction(self) -> Fraction:
        """A rank's output buffer as a fraction of the message size (nccl-tests terms)."""
        return Fraction(len(self.output_map(0)), self.size_chunks)

    @property
    def message_parts(self) -> int:
        """The equal parts of a message whose positions matter: one per rank for the collectives that move
        slices (a rank's own input or output), 1 for the element-wise allreduce and for broadcast and reduce.
        A message that is a whole number of parts runs padded: each part staged at a larger part's place."""
        return 1 if self.name in ONE_SLICE or self.name in ("allreduce", SHIFT) else self.nranks

    @property
    def bus_factor(self) -> float:
        """nccl-tests' busbw/algbw ratio: 2(n-1)/n for allreduce, 1 for broadcast and reduce, else (n-1)/n."""
        n = self.nranks
        if self.name == "allreduce":
            return 2 * (n - 1) / n
        return 1.0 if self.name in ONE_SLICE or self.name == SHIFT else (n - 1) / n

    @property
    def dual(self) -> Collective:
        """The collective that this one's schedules become with every send reversed (and copies made
        reductions, or reductions copies): allgather <-> reducescatter, broadcast <-> reduce, gather <-> scatter;
        allreduce and alltoall are their own duals. sendrecv has none among the collectives (reversed, it shifts
        the other way)."""
        if self.name not in DUALS:
            raise CollectiveError(f"collective {self.name}: weft does not synthesize it, so it has no dual")
        return Collective(DUALS[self.name], self.nranks, self.chunks, self.root)

    @property
    def nchunks(self) -> int:
        """Global chunk count."""
        n, c = self.nranks, self.chunks
        if self.name in ONE_SLICE:
            return c
        if self.name == "alltoall":
            return n * n * c
        return n * c

    @property
    def size_chunks(self) -> int:
        """Chunks in the nccl-tests message size (the larger of a rank's input and output buffer)."""
        n, c = self.nranks, self.chunks
        return c if self.name in ONE_SLICE or self.name == SHIFT else n * c

    def chunk_bytes(self, nbytes: float) -> float:
        return nbytes / self.size_chunks

    def _own(self, rank: int) -> range:
        return range(rank * self.chunks, (rank + 1) * self.chunks)

    def precondition(self, rank: int) -> frozenset[int]:
        """Chunks that rank holds at the start (for combining collectives: its contributions)."""
        name, everything = self.name, range(self.nchunks)
        if name in INPUT_IS_SLICE or name == SHIFT:
            return frozenset(self._own(rank))
        if name in COMBINING:
            return frozenset(everything)
        if name in ("broadcast", "scatter"):
            return frozenset(everything) if rank == self.root else frozenset()
        n, c = self.nranks, self.chunks  # alltoall
        return frozenset((rank * n + d) * c + j for d in range(n) for j in range(c))

    def postcondition(self, rank: int) -> frozenset[int]:
        """Chunks that rank must hold at the end (for combining collectives: fully reduced)."""
        name, everything = self.name, frozenset(range(self.nchunks))
        if name in ("allgather", "allreduce", "broadcast"):
            return everything
        if name in OUTPUT_IS_SLICE:
            return frozenset(self._own(rank))
        if name == SHIFT:
            return frozenset(self._own((rank - 1) % self.nranks))
        if name in ("reduce", "gather"):
            return everything if rank == self.root else frozenset()
        n, c = self.nranks, self.chunks  # alltoall
        return frozenset((s * n + rank) * c + j for s in range(n) for j in range(c))

    def input_map(self, rank: int) -> tuple[int, ...]:
        """The chunk at each index of rank's input buffer."""
        n, c, name = self.nranks, self.chunks, self.name
        if name in INPUT_IS_SLICE or name == SHIFT:
            return tuple(self._own(rank))
        if name == "alltoall":
            return tuple((rank * n + d) * c + j for d in range(n) for j in range(c))
        return tuple(range(self.nchunks))

    def output_map(self, rank: int) -> tuple[int, ...]:
        """The chunk at each index of rank's output buffer."""
        n, c, name = self.nranks, self.chunks, self.name
        if name in OUTPUT_IS_SLICE:
            return tuple(self._own(rank))
        if name == SHIFT:
            return tuple(self._own((rank - 1) % n))
        if name == "alltoall":
            return tuple((s * n + rank) * c + j for s in range(n) for j in range(c))
        return tuple(range(self.nchunks))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "nranks": self.nranks, "chunks": self.chunks}
        if self.rooted:
            doc["root"] = self.root
        return doc

    @staticmethod
    def from_json(data: object, source: str) -> Collective:
        if not isinstance(data, dict):
            raise CollectiveError(f"{source}: collective: must be an object")
        # values of any type: Collective checks each field
        name: Any = data.get("name")
        nranks: Any = data.get("nranks")
        try:
            return Collective(name, nranks, data.get("chunks", 1), data.get("root", 0))
        except CollectiveError as e:
            raise CollectiveError(f"{source}: {e}") from None


def collective_on(name: str, topology_name: str, nranks: int, chunks: int = 1, root: int = 0) -> Collective:
    """The collective ``name`` over a topology's ranks, for synthesis: a topology of one rank is refused naming it
    (a one-rank Collective stays valid for hand-written plans that order one GPU's thread blocks)."""
    if name in PLAN_ONLY:
        raise CollectiveError(
            f"collective {name}: weft checks and runs plans for it (MSCCL++'s) but does not "
            f"synthesize it (synthesis takes {', '.join(NAMES)})"
        )
    if nranks < 2:
        raise CollectiveError(f"topology {topology_name}: has {nranks} rank; a collective needs at least 2")
    return Collective(name, nranks, chunks, root)
