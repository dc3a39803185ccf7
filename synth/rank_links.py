"""Link keys of a switch-free fabric as rank pairs.

``Topology`` types a vertex as ``int | str`` because switches have names; on ``Topology.without_switches()``
(what synthesis works on) every vertex is a rank, which that type cannot say. These narrow a key or a vertex
for the type checker and copy nothing.
"""

from __future__ import annotations

from typing import cast

from topologies.topology import Vertex

RankPair = tuple[int, int]


def rank_pair(key: tuple[Vertex, ...]) -> RankPair:
    """A link key (src, dst) of a switch-free fabric, as the ranks it joins."""
    return cast(RankPair, key)


def rank(vertex: Vertex) -> int:
    """A vertex of a switch-free fabric, as the rank it is."""
    return cast(int, vertex)
