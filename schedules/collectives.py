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

Each collective is written once, as ``Facts`` (msccl-tools' way: the conditions are built from predicates, so no
stage branches on a name; ``Collective.facts``, ``facts_of(name)``, ``Plan.facts``). ``starts`` and ``ends`` say
what rank r holds (``Holding``: its SLICE, ALL chunks, everything at the ROOT, a ROW or COLUMN of alltoall blocks,
the PREVIOUS rank's slice); ``chunking`` how the chunks are numbered (SHARED, SLICES, BLOCKS); the rest whether it
combines, its dual on the reversed fabric, the phases it runs as (allreduce: reducescatter then allgather), and its
name in torch.distributed and MSCCL's XML. Derived: ``rooted``, ``from_root``, ``to_root``, ``same_to_all`` (every
rank ends with the same data), ``spanning`` (a spanning tree carries each chunk), ``sums_everywhere``, ``shifts``,
``from_dual`` (solved as its copy-only dual, reversed).

>>> c = Collective("allgather", 4)
>>> c.nchunks, sorted(c.precondition(1)), c.output_map(2)
(4, [1], (0, 1, 2, 3))
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Any

from weftcore.errors import WeftError

NAMES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter", "alltoall")
PLAN_ONLY = ("sendrecv",)  # collectives that plans (MSCCL++'s) compute and weft checks, but never synthesizes
MAX_CHUNKS = 1 << 24  # global chunks: far beyond any schedule weft makes, but a corrupt count cannot allocate gigabytes
SHIFT = "sendrecv"  # rank r's input becomes rank r+1's output


class Holding(Enum):
    """What rank r holds, at the start or at the end: the predicates the pre- and postconditions are built from."""

    SLICE = "slice"  # its own slice: chunks r·c .. r·c+c-1
    ALL = "all"  # every chunk (combining: a contribution to every chunk, or every chunk's sum)
    ROOT = "root"  # the root: every chunk; any other rank: nothing
    ROW = "row"  # the block (r, d) for every rank d: what it sends to each (alltoall's input)
    COLUMN = "column"  # the block (s, r) from every rank s: what each sent it (alltoall's output)
    PREVIOUS = "previous"  # the slice of rank r - 1 (sendrecv's output)


class Chunking(Enum):
    """How the global chunks are numbered."""

    SHARED = "shared"  # one slice of c chunks, the same on every rank (broadcast, reduce)
    SLICES = "slices"  # one slice of c chunks per rank: N·c
    BLOCKS = "blocks"  # one block of c chunks per (source, destination) rank pair: N·N·c


@dataclass(frozen=True)
class Facts:
    """What a collective does, as data (msccl-tools' way: pre/post-conditions from predicates). Stages ask these;
    they never compare a collective's name."""

    starts: Holding
    ends: Holding
    chunking: Chunking
    combining: bool = False  # contributions are summed: a postcondition means "the sum of all N, each once"
    dual: str | None = None  # the collective its schedules become with every send reversed (None: none is made)
    phases: tuple[str, ...] = ()  # the collectives run one after the other that make it (allreduce's two halves)
    torch_op: str | None = None  # torch.distributed's call for it, where one call computes it
    msccl_coll: str = ""  # the MSCCL XML ``coll`` attribute, where it is not the name

    @property
    def rooted(self) -> bool:
        return Holding.ROOT in (self.starts, self.ends)

    @property
    def from_root(self) -> bool:
        """Data only leaves the root (broadcast, scatter)."""
        return self.starts is Holding.ROOT

    @property
    def to_root(self) -> bool:
        """Data only reaches the root (reduce, gather)."""
        return self.ends is Holding.ROOT

    @property
    def same_to_all(self) -> bool:
        """Every rank ends with the same data: every chunk (allgather, allreduce, broadcast)."""
        return self.ends is Holding.ALL

    @property
    def spanning(self) -> bool:
        """Each chunk spreads from one rank to every rank, or (combining) sums from every rank into one: a spanning
        tree carries it (allgather, reducescatter, allreduce, broadcast, reduce; not gather, scatter, alltoall)."""
        return self.same_to_all or (self.combining and self.starts is Holding.ALL)

    @property
    def sums_everywhere(self) -> bool:
        """Every rank ends with every chunk's full sum (allreduce): element-wise, the same bits wanted on all."""
        return self.combining and self.ends is Holding.ALL

    @property
    def shifts(self) -> bool:
        """Every rank's input moves to the next rank (MSCCL++'s SendRecv)."""
        return self.ends is Holding.PREVIOUS

    @property
    def from_dual(self) -> bool:
        """Its schedules are its copy-only dual's, reversed on the reversed fabric with every copy made a reduction
        (reducescatter from allgather, reduce from broadcast; allreduce is its own dual and combines)."""
        return self.combining and self.dual is not None and not FACTS[self.dual].combining

    @property
    def personalized(self) -> bool:
        """Every rank sends each peer a block of its own, none shared or summed (alltoall)."""
        return self.chunking is Chunking.BLOCKS

    @property
    def input_is_slice(self) -> bool:
        return self.starts is Holding.SLICE and not self.shifts

    @property
    def output_is_slice(self) -> bool:
        return self.ends is Holding.SLICE


FACTS: dict[str, Facts] = {
    "allgather": Facts(
        Holding.SLICE, Holding.ALL, Chunking.SLICES, dual="reducescatter", torch_op="all_gather_into_tensor"
    ),
    "reducescatter": Facts(
        Holding.ALL,
        Holding.SLICE,
        Chunking.SLICES,
        combining=True,
        dual="allgather",
        torch_op="reduce_scatter_tensor",
        msccl_coll="reduce_scatter",
    ),
    "allreduce": Facts(
        Holding.ALL,
        Holding.ALL,
        Chunking.SLICES,
        combining=True,
        dual="allreduce",
        phases=("reducescatter", "allgather"),
        torch_op="all_reduce",
    ),
    "broadcast": Facts(Holding.ROOT, Holding.ALL, Chunking.SHARED, dual="reduce", torch_op="broadcast"),
    "reduce": Facts(Holding.ALL, Holding.ROOT, Chunking.SHARED, combining=True, dual="broadcast", torch_op="reduce"),
    "gather": Facts(Holding.SLICE, Holding.ROOT, Chunking.SLICES, dual="scatter"),
    "scatter": Facts(Holding.ROOT, Holding.SLICE, Chunking.SLICES, dual="gather"),
    "alltoall": Facts(Holding.ROW, Holding.COLUMN, Chunking.BLOCKS, dual="alltoall", torch_op="all_to_all_single"),
    SHIFT: Facts(Holding.SLICE, Holding.PREVIOUS, Chunking.SLICES),
}
COMBINING = frozenset(name for name, f in FACTS.items() if f.combining)
ROOTED = frozenset(name for name, f in FACTS.items() if f.rooted)


def facts_of(name: str) -> Facts:
    """The facts of the collective ``name`` (one of NAMES or PLAN_ONLY)."""
    if not isinstance(name, str) or name not in FACTS:
        raise CollectiveError(f"collective: unknown collective {name!r} (choose from {', '.join(NAMES + PLAN_ONLY)})")
    return FACTS[name]


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
    def facts(self) -> Facts:
        """What this collective does (``Facts``): stages branch on these, never on the name."""
        return FACTS[self.name]

    @property
    def min_sends(self) -> int:
        """The fewest sends any schedule of this collective has: every chunk a rank lacks arrives in one send at
        least (for allreduce and reduce, every contribution but the last leaves its rank once).

        >>> Collective("allgather", 4, 2).min_sends, Collective("broadcast", 4).min_sends
        (24, 3)
        """
        n, f = self.nranks, self.facts
        if f.dual is None:
            return 0  # not synthesized: no schedule form to count
        # gather, scatter and alltoall: each chunk goes to one rank, not to (or from) every other
        one_each = f.chunking is Chunking.BLOCKS or (f.rooted and f.chunking is Chunking.SLICES)
        return (n - 1) * self.nchunks // (n if one_each else 1)

    @property
    def combining(self) -> bool:
        return self.facts.combining

    @property
    def rooted(self) -> bool:
        return self.facts.rooted

    @property
    def input_is_slice(self) -> bool:
        """Whether a rank's input is its own slice of the output (allgather, gather): in place, the input
        buffer lies inside the output at ``rank × input size``."""
        return self.facts.input_is_slice

    @property
    def output_is_slice(self) -> bool:
        """Whether a rank's output is its own slice of the input (reducescatter, scatter): in place, the output
        buffer lies inside the input at ``rank × output size``."""
        return self.facts.output_is_slice

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
        f = self.facts
        sizes_differ = self._buffer_size(f.starts) != self._buffer_size(f.ends)
        return self.nranks if sizes_differ or f.chunking is Chunking.BLOCKS else 1

    @property
    def bus_factor(self) -> float:
        """nccl-tests' busbw/algbw ratio: 2(n-1)/n for allreduce, 1 for broadcast and reduce, else (n-1)/n."""
        n, f = self.nranks, self.facts
        if f.chunking is Chunking.SHARED or f.shifts:
            return 1.0  # the message is one slice, sent whole
        return max(len(f.phases), 1) * (n - 1) / n

    @property
    def dual(self) -> Collective:
        """The collective that this one's schedules become with every send reversed (and copies made
        reductions, or reductions copies): allgather <-> reducescatter, broadcast <-> reduce, gather <-> scatter;
        allreduce and alltoall are their own duals. sendrecv has none among the collectives (reversed, it shifts
        the other way)."""
        dual = self.facts.dual
        if dual is None:
            raise CollectiveError(f"collective {self.name}: weft does not synthesize it, so it has no dual")
        return Collective(dual, self.nranks, self.chunks, self.root)

    @property
    def phases(self) -> tuple[Collective, ...]:
        """The collectives that run one after the other to make this one, at its chunks: allreduce's
        reducescatter then allgather; any other collective is its own one phase."""
        names = self.facts.phases or (self.name,)
        return tuple(Collective(name, self.nranks, self.chunks, self.root) for name in names)

    @property
    def nchunks(self) -> int:
        """Global chunk count."""
        n, c, chunking = self.nranks, self.chunks, self.facts.chunking
        return c if chunking is Chunking.SHARED else n * n * c if chunking is Chunking.BLOCKS else n * c

    @property
    def size_chunks(self) -> int:
        """Chunks in the nccl-tests message size (the larger of a rank's input and output buffer)."""
        f = self.facts
        return max(self._buffer_size(f.starts), self._buffer_size(f.ends))

    def chunk_bytes(self, nbytes: float) -> float:
        return nbytes / self.size_chunks

    def _buffer_size(self, holding: Holding) -> int:
        """Chunks in a rank's buffer that holds ``holding`` (a rooted one is as large on every rank)."""
        if holding in (Holding.ALL, Holding.ROOT):
            return self.nchunks
        return self.nranks * self.chunks if holding in (Holding.ROW, Holding.COLUMN) else self.chunks

    def _held(self, holding: Holding, rank: int, buffer: bool) -> tuple[int, ...]:
        """The chunks ``holding`` gives rank, in buffer order (``buffer``: the root's layout on every rank)."""
        n, c = self.nranks, self.chunks
        if holding is Holding.SLICE:
            return tuple(range(rank * c, (rank + 1) * c))
        if holding is Holding.PREVIOUS:
            return self._held(Holding.SLICE, (rank - 1) % n, buffer)
        if holding is Holding.ROW:
            return tuple((rank * n + d) * c + j for d in range(n) for j in range(c))
        if holding is Holding.COLUMN:
            return tuple((s * n + rank) * c + j for s in range(n) for j in range(c))
        if holding is Holding.ROOT and not buffer and rank != self.root:
            return ()
        return tuple(range(self.nchunks))

    def precondition(self, rank: int) -> frozenset[int]:
        """Chunks that rank holds at the start (for combining collectives: its contributions)."""
        return frozenset(self._held(self.facts.starts, rank, buffer=False))

    def postcondition(self, rank: int) -> frozenset[int]:
        """Chunks that rank must hold at the end (for combining collectives: fully reduced)."""
        return frozenset(self._held(self.facts.ends, rank, buffer=False))

    def input_map(self, rank: int) -> tuple[int, ...]:
        """The chunk at each index of rank's input buffer."""
        return self._held(self.facts.starts, rank, buffer=True)

    def output_map(self, rank: int) -> tuple[int, ...]:
        """The chunk at each index of rank's output buffer."""
        return self._held(self.facts.ends, rank, buffer=True)

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


def slice_chunks(name: str, nranks: int, input_chunks: int, output_chunks: int) -> int:
    """Chunks per slice of the collective ``name`` whose ranks' buffers hold these many chunks (a plan's): read off
    the buffer that is one slice (or, in alltoall, N blocks; in allreduce, N slices)."""
    f = facts_of(name)
    if f.starts is Holding.SLICE:
        return input_chunks
    if f.ends is Holding.SLICE:
        return output_chunks
    if f.chunking is Chunking.BLOCKS:
        return input_chunks // nranks
    if f.chunking is Chunking.SHARED:
        return output_chunks if f.ends is Holding.ALL else input_chunks
    return output_chunks // nranks


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
