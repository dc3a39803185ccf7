"""The intermediate form codegen passes hand each other, between a Schedule and a Plan.

A ``Loc`` is one chunk slot of a rank's buffer. An ``Action`` is one thing a rank does for the schedule
(send a chunk, let a chunk arrive, combine arrivals, unpack packets, copy locally); passes give it a thread
block and turn it into ``Draft`` ops, which name ranks and peers instead of the plan's numeric ids
(``codegen.assemble`` resolves those).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.protocol import CodegenError

SEND, ARRIVE, REDUCE, UNPACK, COPY = "send", "arrive", "reduce", "unpack", "copy"
# Pulls: a rank that reads a peer's input tells the peer when its input may be read (READY, at the start) and when
# it is done reading it (DONE); both are a signal with no data, waited for by an ARRIVE whose ``sends`` names them.
READY, DONE = "ready", "done"
NOTICES = (READY, DONE)


@dataclass(frozen=True, order=True)
class Loc:
    """``size`` chunks starting at ``index`` of buffer ``type`` (i, o or s) on ``rank``."""

    rank: int
    type: str
    index: int
    size: int = 1

    def follows(self, other: Loc) -> bool:
        """Whether this range starts right where ``other`` ends, in the same buffer."""
        return (self.rank, self.type) == (other.rank, other.type) and self.index == other.index + other.size

    def slots(self) -> list[Loc]:
        return [Loc(self.rank, self.type, k) for k in range(self.index, self.index + self.size)]


@dataclass
class Action:
    """One rank's part of the schedule, in the order ``order`` that every pass respects.

    Phases follow the schedule's step semantics: sends read the state at the start of a step (phase 0),
    arrivals land (1), then combining and unpacking write the new state (2); final copies come last (3).
    """

    rank: int
    step: int
    phase: int
    seq: int
    kind: str
    peer: int | None
    src: tuple[Loc, ...]
    dst: tuple[Loc, ...]
    packet: bool = False
    instance: int = 0
    tb: int = -1
    sends: tuple[int, ...] = ()  # ARRIVE: the seqs of the SEND actions (on the peer) whose data lands here
    piece: int = 0  # pipelining: which sub-chunk of its instance (``codegen.replicate.pipeline``)
    via: tuple = ()  # a notice or its ARRIVE: the role (thread block) of the pull it belongs to, if any

    @property
    def partner(self) -> int:
        """The peer of an action that has one (a send, an arrival, a notice); a CodegenError for any other."""
        if self.peer is None:
            raise CodegenError(f"rank {self.rank}: a {self.kind} action (seq {self.seq}) names no peer")
        return self.peer

    @property
    def order(self) -> tuple[int, int, int, int, int]:
        """Where the action runs: the sends of step 0 first, then each step piece by piece (``piece``: pipelining),
        with a piece's sends of the next step right after that piece's combining in this one.

        Unpipelined (every piece 0) this is the order (step, phase, seq). Pipelined, a receiver combines piece 0
        and forwards it while later pieces are still arriving; pieces are disjoint, so step semantics hold per piece.
        """
        if self.kind in (SEND, READY) and self.step > 0:
            return (self.step - 1, 1, self.piece, 3, self.seq)
        return (self.step, 0 if self.kind in (SEND, READY) else 1, self.piece, self.phase, self.seq)

    @property
    def role(self) -> tuple:
        if self.via:
            return self.via[:2] + (self.instance,)
        if self.kind == SEND or self.kind == READY:
            return ("send", self.peer, self.instance)
        if self.kind in (ARRIVE, REDUCE, UNPACK) and self.peer is not None:
            return ("recv", self.peer, self.instance)
        return ("local", -1, self.instance)

    @property
    def signals(self) -> bool:
        """A Simple send or a notice: a signal on the channel to ``peer`` that an ARRIVE there waits for."""
        return (self.kind == SEND and not self.packet) or self.kind in NOTICES

    def reads(self) -> list[Loc]:
        """Slots the action reads, a peer's too for a pull (ARRIVE reads nothing; it makes a peer's write visible)."""
        return [s for loc in self.src for s in loc.slots()] if self.kind != ARRIVE else []

    def writes(self) -> list[Loc]:
        """Local slots the action writes (a SEND writes only its peer's memory)."""
        return [s for loc in self.dst for s in loc.slots()] if self.kind != SEND else []


@dataclass(frozen=True)
class Channel:
    """A channel end named by meaning: to ``peer``, carrying data in ``direction`` (0: lower rank to higher)."""

    peer: int
    direction: int
    instance: int = 0


def direction(src: int, dst: int) -> int:
    return 0 if src < dst else 1


@dataclass
class Draft:
    """A plan op before ids are assigned: buffers as Locs (remote when ``loc.rank`` is not the op's rank)."""

    name: str
    src: tuple[Loc, ...] = ()
    dst: tuple[Loc, ...] = ()
    channels: tuple[Channel, ...] = ()
    semaphores: tuple[int, ...] = ()
    packet_src: tuple[bool, ...] = field(default=())
