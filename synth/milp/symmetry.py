"""The model's symmetry: the same schedule on every host, and on every NIC pair inside a host, up to a shift.

A rank permutation that maps every link, sharing group and allowed link onto an equal one, and every chunk's
owners onto the permuted chunk's, maps schedules onto schedules of the same cost. The flow then keeps one send
variable per orbit of the group such permutations generate. Two kinds are used:

- a global shift r -> r + offset (mod N): the sketch's ``symmetry.rank_offset``, or without a sketch the
  smallest offset that maps the fabric onto itself (a host, on multi-host fabrics);
- without a sketch, on fabrics of equal hosts whose ranks are all linked to each other (NVSwitch hosts), a
  rotation inside every host r -> base + (local + d) mod G by the smallest d that maps the fabric onto itself
  (DGX-2: 2, the pair of GPUs that shares a NIC). Not in a cube mesh: on NDv2 x 2 at 1 MB the rotation by 4
  cost 4 points of the bound (77.3% against 81.2%).

On DGX-2 × 2 the two together divide the model by 16, where the host shift alone divides it by 2.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.collectives import Chunking, Collective
from synth.milp.sketch import Sketch, SketchError
from synth.rank_links import rank, rank_pair
from topologies import Link, Topology

Perm = tuple[int, ...]
ChunkLinks = tuple[frozenset[tuple[int, int]], ...] | None


@dataclass(frozen=True)
class Symmetry:
    """Generators of the group the model's variables are shared under, each a (rank, chunk) permutation."""

    generators: tuple[tuple[Perm, Perm], ...]
    offset: int | None = None  # the global shift, if one is a generator
    local: int | None = None  # the rotation inside every host, if one is a generator


def rank_symmetry(
    topo: Topology,
    collective: Collective,
    links: frozenset[tuple[int, int]],
    sketch: Sketch,
    chunk_links: ChunkLinks = None,
) -> Symmetry | None:
    """The sketch's symmetry after checking that it maps everything onto itself, else the one found.

    A sketch's offset that fails is a SketchError naming what does not map.
    """
    offset = sketch.rank_offset
    if offset is None:
        return auto_symmetry(topo, collective, links, chunk_links)
    n = topo.nranks

    def fail(reason: str) -> SketchError:
        return SketchError(f"sketch {sketch.source}: symmetry.rank_offset: {reason}")

    if offset >= n or n % offset:
        raise fail(f"{offset} must be smaller than and divide the rank count ({n})")
    if collective.rooted:
        raise fail(f"{collective.name} has a root, so no rank shift maps it onto itself")
    perm = tuple((r + offset) % n for r in topo.ranks)
    reason = _maps(topo, collective, links, chunk_links, perm)
    if reason:
        raise fail(reason)
    return Symmetry(((perm, _chunk_perm(collective, perm)),), offset=offset)


def auto_symmetry(
    topo: Topology, collective: Collective, links: frozenset[tuple[int, int]], chunk_links: ChunkLinks = None
) -> Symmetry | None:
    """The smallest global shift and the smallest rotation inside hosts that map everything onto themselves."""
    n = topo.nranks
    if collective.rooted:
        return None
    generators: list[tuple[Perm, Perm]] = []
    offset = local = None
    for d in range(1, n):
        perm = tuple((r + d) % n for r in topo.ranks)
        if n % d == 0 and not _maps(topo, collective, links, chunk_links, perm):
            offset = d
            generators.append((perm, _chunk_perm(collective, perm)))
            break
    blocks = _host_blocks(topo)
    if blocks and all((u, v) in links for b in blocks for u in b for v in b if u != v):
        size = len(blocks[0])
        for d in range(1, size):
            perm = tuple(b[(i + d) % size] for b in blocks for i in range(size))
            if size % d == 0 and not _maps(topo, collective, links, chunk_links, perm):
                local = d
                generators.append((perm, _chunk_perm(collective, perm)))
                break
    return Symmetry(tuple(generators), offset, local) if generators else None


def _host_blocks(topo: Topology) -> list[list[int]]:
    """The hosts as blocks of consecutive ranks of one size, if there are several such hosts; else []."""
    blocks: list[list[int]] = []
    for r in topo.ranks:
        if blocks and topo.hosts[blocks[-1][0]] == topo.hosts[r]:
            blocks[-1].append(r)
        else:
            blocks.append([r])
    if len(blocks) < 2 or len({len(b) for b in blocks}) != 1 or len({topo.hosts[b[0]] for b in blocks}) != len(blocks):
        return []
    return blocks


def _chunk_perm(collective: Collective, perm: Perm) -> Perm:
    n, c = collective.nranks, collective.chunks
    if collective.facts.chunking is Chunking.BLOCKS:

        def image(x: int) -> int:
            pair, j = divmod(x, c)
            s, d = divmod(pair, n)
            return (perm[s] * n + perm[d]) * c + j
    else:

        def image(x: int) -> int:
            r, j = divmod(x, c)
            return perm[r] * c + j

    return tuple(image(x) for x in range(collective.nchunks))


def _maps(
    topo: Topology, collective: Collective, links: frozenset[tuple[int, int]], chunk_links: ChunkLinks, perm: Perm
) -> str:
    """ "" if the rank permutation maps fabric, allowed links and chunks onto themselves, else the reason."""
    for link in topo.links:
        src, dst = rank_pair(link.key)
        image = (perm[src], perm[dst])
        if not topo.has_link(*image) or _cost(topo.link(*image)) != _cost(link):
            return f"the fabric is not symmetric: link {link.src}->{link.dst} has no equal image {image[0]}->{image[1]}"
        if (link.key in links) != (image in links):
            return (
                f"the links the relays or rails allow are not symmetric: link {link.src}->{link.dst} "
                "and its image differ"
            )
    groups = {(frozenset(tuple(k) for k in g.links), g.bandwidth) for g in topo.sharing}
    for g in topo.sharing:
        moved = (frozenset((perm[rank(s)], perm[rank(d)]) for s, d in g.links), g.bandwidth)
        if moved not in groups:
            return (
                f"the fabric is not symmetric: sharing group of link {g.links[0][0]}->{g.links[0][1]} "
                "has no equal image"
            )
    if chunk_links is not None:
        chunks = _chunk_perm(collective, perm)
        for x, allowed in enumerate(chunk_links):
            if frozenset((perm[u], perm[v]) for u, v in allowed) != chunk_links[chunks[x]]:
                return f"the hierarchy's links are not symmetric: chunk {x}'s and chunk {chunks[x]}'s differ"
    return ""


def _cost(link: Link) -> tuple[float, float]:
    return (round(link.capacity, 6), round(link.latency, 6))
