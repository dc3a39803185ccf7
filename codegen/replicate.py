"""Instance replication: split every chunk into ``k`` pieces, each moved by its own copy of the algorithm.

Instance i moves piece i of every chunk with its own thread blocks and channels, so the k instances never
wait for each other and a large message keeps k times as many thread blocks busy. Pieces are laid out in
blocks: a buffer is cut into sections, and within each section instance i owns the i-th contiguous block,
so that one instance's consecutive chunks stay consecutive and merge into one op per range (interleaved
pieces would leave k-strided ranges, one op per chunk). A section is one rank's slice of the collective's
buffer (``chunks`` long), or the whole buffer where every rank holds every chunk at the same index
(allreduce, broadcast, reduce); the data layout of every collective is unchanged, since matching slices on
every rank and in both buffers (in place too) are cut alike. Scratch is one section per rank.

Pipelining (``pipeline``) cuts each instance's piece again, into sub-pieces that keep the instance's thread blocks
and channels and run one after another within each step (``Action.order``): a receiver combines sub-piece 0 while
sub-piece 1 is still on the wire, where unpipelined it would wait for its whole piece first.
"""

from __future__ import annotations

from dataclasses import replace

from codegen.buffers import Placement
from codegen.ir import Action, Loc


def replicate(actions: list[Action], instances: int, placement: Placement) -> list[Action]:
    """The actions of ``instances`` independent copies, one per piece of every chunk."""
    if instances == 1:
        return actions
    section = placement.section
    pieces: dict[Loc, list[Loc]] = {}

    def piece(loc: Loc) -> list[Loc]:
        if loc not in pieces:
            assert loc.size == 1, "replication runs before ranges are merged"
            size = placement.scratch[loc.rank] if loc.type == "s" else section
            block, offset = divmod(loc.index, size)
            pieces[loc] = [Loc(loc.rank, loc.type, (block * instances + i) * size + offset) for i in range(instances)]
        return pieces[loc]

    out = []
    for a in actions:
        src, dst = [piece(loc) for loc in a.src], [piece(loc) for loc in a.dst]
        for i in range(instances):
            out.append(
                replace(
                    a,
                    seq=a.seq * instances + i,
                    instance=i,
                    src=tuple(p[i] for p in src),
                    dst=tuple(p[i] for p in dst),
                    sends=tuple(s * instances + i for s in a.sends),
                )
            )
    return out


def pipeline(actions: list[Action], instances: int, depth: int, placement: Placement) -> list[Action]:
    """``instances`` copies, each moving its piece as ``depth`` sub-pieces in turn on the same thread blocks."""
    copies = replicate(actions, instances * depth, placement)
    if depth == 1:
        return copies
    return [replace(a, instance=a.instance // depth, piece=a.instance % depth) for a in copies]
