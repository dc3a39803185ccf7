"""The sketch's symmetry: the same schedule on every node, up to a rank offset.

A shift r -> r + offset (mod N) that maps every link, sharing group and allowed link onto an equal one, and
every chunk's owners onto the shifted chunk's, maps schedules onto schedules of the same cost. The flow
then keeps one send variable per orbit, which divides the model by the number of nodes.
"""

from __future__ import annotations

from typing import Callable

from schedules.collectives import Collective
from synth.milp.sketch import Sketch, SketchError
from topologies import Link, Topology


def rank_symmetry(topo: Topology, collective: Collective, links: frozenset[tuple[int, int]], sketch: Sketch) -> tuple[
        Callable[[int], int] | None, Callable[[int], int] | None]:
    """(rank shift, chunk shift) for the sketch's symmetry, after checking that it maps everything onto itself."""
    offset = sketch.rank_offset
    if offset is None:
        return None, None
    n = topo.nranks

    def fail(reason: str) -> SketchError:
        return SketchError(f"sketch {sketch.source}: symmetry.rank_offset: {reason}")

    if offset >= n or n % offset:
        raise fail(f"{offset} must be smaller than and divide the rank count ({n})")
    if collective.rooted:
        raise fail(f"{collective.name} has a root, so no rank shift maps it onto itself")

    def rank_shift(r: int) -> int:
        return (r + offset) % n

    c = collective.chunks
    if collective.name == "alltoall":
        def chunk_shift(x: int) -> int:
            pair, j = divmod(x, c)
            s, d = divmod(pair, n)
            return (rank_shift(s) * n + rank_shift(d)) * c + j
    else:
        def chunk_shift(x: int) -> int:
            r, j = divmod(x, c)
            return rank_shift(r) * c + j

    for link in topo.links:
        image = (rank_shift(link.src), rank_shift(link.dst))
        if not topo.has_link(*image) or _cost(topo.link(*image)) != _cost(link):
            raise fail(f"the fabric is not symmetric: link {link.src}->{link.dst} has no equal image "
                       f"{image[0]}->{image[1]}")
        if (link.key in links) != (image in links):
            raise fail(f"the links the relays or rails allow are not symmetric: link {link.src}->{link.dst} "
                       "and its image differ")
    groups = {(frozenset(tuple(k) for k in g.links), g.bandwidth) for g in topo.sharing}
    for g in topo.sharing:
        image = (frozenset((rank_shift(s), rank_shift(d)) for s, d in g.links), g.bandwidth)
        if image not in groups:
            raise fail(f"the fabric is not symmetric: sharing group of link {g.links[0][0]}->{g.links[0][1]} "
                       "has no equal image")
    return rank_shift, chunk_shift


def _cost(link: Link) -> tuple[float, float]:
    return (round(link.capacity, 6), round(link.latency, 6))
