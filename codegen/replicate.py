"""Instance replication: split every chunk into ``k`` pieces, each moved by its own copy of the algorithm.

Chunk j of any buffer becomes plan chunks ``j·k .. j·k+k-1``; instance i moves piece ``j·k+i`` with its
own thread blocks and channels, so the k instances never wait for each other and a large message keeps k
times as many thread blocks busy. Pieces stay interleaved (not blocked) so that every collective's data
layout is unchanged: the plan's chunk j·k+i is the i-th part of the schedule's chunk j.
"""

from __future__ import annotations

from dataclasses import replace

from codegen.ir import Action, Loc


def replicate(actions: list[Action], instances: int) -> list[Action]:
    """The actions of ``instances`` independent copies, one per piece of every chunk."""
    if instances == 1:
        return actions
    out = []
    for a in actions:
        for i in range(instances):
            out.append(replace(
                a, seq=a.seq * instances + i, instance=i,
                src=tuple(_piece(loc, instances, i) for loc in a.src),
                dst=tuple(_piece(loc, instances, i) for loc in a.dst),
                sends=tuple(s * instances + i for s in a.sends)))
    return out


def _piece(loc: Loc, instances: int, i: int) -> Loc:
    assert loc.size == 1, "replication runs before ranges are merged"
    return Loc(loc.rank, loc.type, loc.index * instances + i)
