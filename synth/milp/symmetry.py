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


Shift = Callable[[int], int]
ChunkLinks = tuple[frozenset[tuple[int, int]], ...] | None


def rank_symmetry(topo: Topology, collective: Collective, links: frozenset[tuple[int, int]], sketch: Sketch,
                  chunk_links: ChunkLinks = None) -> tuple[Shift | None, Shift | None]:
    """(rank shift, chunk shift) for the sketch's symmetry, after checking that it maps everything onto itself.

    Without a sketch symmetry: the smallest offset that does (DGX-2: 2 ranks, a NIC's pair; HGX: a host), or
    none. A sketch's offset that fails is a SketchError naming what does not map.
    """
    offset = sketch.rank_offset
    if offset is None:
        return auto_symmetry(topo, collective, links, chunk_links)

    def fail(reason: str) -> SketchError:
        return SketchError(f"sketch {sketch.source}: symmetry.rank_offset: {reason}")

    shifts, reason = _shifts(topo, collective, links, chunk_links, offset)
    if reason:
        raise fail(reason)
    return shifts


def auto_symmetry(topo: Topology, collective: Collective, links: frozenset[tuple[int, int]],
                  chunk_links: ChunkLinks = None) -> tuple[Shift | None, Shift | None]:
    """The shift by the smallest offset under which the fabric, links and chunks map onto themselves."""
    n = topo.nranks
    if collective.rooted:
        return None, None
    for offset in range(1, n):
        if n % offset == 0:
            shifts, reason = _shifts(topo, collective, links, chunk_links, offset)
            if not reason:
                return shifts
    return None, None


def _shifts(topo: Topology, collective: Collective, links: frozenset[tuple[int, int]], chunk_links: ChunkLinks,
            offset: int) -> tuple[tuple[Shift | None, Shift | None], str]:
    """((rank shift, chunk shift), "") if shifting ranks by ``offset`` maps everything onto itself, else the reason."""
    n = topo.nranks
    none = (None, None)
    if offset >= n or n % offset:
        return none, f"{offset} must be smaller than and divide the rank count ({n})"
    if collective.rooted:
        return none, f"{collective.name} has a root, so no rank shift maps it onto itself"

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
            return none, (f"the fabric is not symmetric: link {link.src}->{link.dst} has no equal image "
                          f"{image[0]}->{image[1]}")
        if (link.key in links) != (image in links):
            return none, (f"the links the relays or rails allow are not symmetric: link {link.src}->{link.dst} "
                          "and its image differ")
    groups = {(frozenset(tuple(k) for k in g.links), g.bandwidth) for g in topo.sharing}
    for g in topo.sharing:
        image = (frozenset((rank_shift(s), rank_shift(d)) for s, d in g.links), g.bandwidth)
        if image not in groups:
            return none, (f"the fabric is not symmetric: sharing group of link {g.links[0][0]}->{g.links[0][1]} "
                          "has no equal image")
    if chunk_links is not None:
        for x, allowed in enumerate(chunk_links):
            if frozenset((rank_shift(u), rank_shift(v)) for u, v in allowed) != chunk_links[chunk_shift(x)]:
                return none, (f"the hierarchy's links are not symmetric: chunk {x}'s and chunk "
                              f"{chunk_shift(x)}'s differ")
    return (rank_shift, chunk_shift), ""


def _cost(link: Link) -> tuple[float, float]:
    return (round(link.capacity, 6), round(link.latency, 6))
