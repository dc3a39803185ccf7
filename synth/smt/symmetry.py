"""Symmetry from topology automorphisms: rank permutations that keep the fabric and the collective.

An automorphism sigma of the switch-free fabric (links onto links of equal capacity, sharing groups onto
groups of equal capacity) together with a chunk permutation tau such that ``pre(sigma r) = tau(pre r)`` and
``post(sigma r) = tau(post r)`` maps every schedule onto another schedule. The encoder asks for schedules
that a group of such pairs maps onto themselves by giving each orbit of variables one name.

>>> from topologies.topology import Link, Topology
>>> ring = Topology("ring3", 3, tuple(Link(i, (i + 1) % 3, 1.0) for i in range(3)))
>>> from schedules.collectives import Collective
>>> len(symmetry_levels(ring, Collective("allgather", 3))[0].elements)
3
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from networkx.algorithms.isomorphism import DiGraphMatcher

from schedules.collectives import Chunking, Collective
from synth.rank_links import rank
from topologies.topology import Topology

Perm = tuple[int, ...]
MAX_GROUP = 64  # a larger group costs more per variable lookup than it saves
MAX_ENUMERATED = 4096  # fully_connected(8) alone has 40320 automorphisms


@dataclass(frozen=True)
class Symmetry:
    """A group of (rank permutation, chunk permutation) pairs, the identity included."""

    elements: tuple[tuple[Perm, Perm], ...]

    def canonical(self, key: tuple) -> tuple:
        """The smallest image of a variable key ``(kind, chunk, rank..., step)`` under the group."""
        kind, chunk, *ranks, step = key
        return min((kind, tau[chunk], *(sigma[r] for r in ranks), step) for sigma, tau in self.elements)


def symmetry_levels(fabric: Topology, collective: Collective) -> list[Symmetry]:
    """Groups to try, strongest first: the whole compatible group, then one cyclic subgroup.

    Empty when the fabric has no automorphism that keeps the collective.
    """
    pairs = [p for p in (_with_chunk_map(sigma, collective) for sigma in _automorphisms(fabric)) if p]
    nontrivial = [p for p in pairs if p[0] != tuple(range(fabric.nranks))]
    if not nontrivial:
        return []
    levels = [_bounded_closure(nontrivial)]
    best = max(nontrivial, key=lambda p: (_order(p[0]), -_fixed(p[0])))
    cyclic = _closure([best])
    if set(cyclic.elements) != set(levels[0].elements):
        levels.append(cyclic)
    return levels


def _automorphisms(fabric: Topology) -> list[Perm]:
    graph = fabric.to_networkx()
    matcher = DiGraphMatcher(graph, graph, edge_match=lambda a, b: round(a["capacity"], 6) == round(b["capacity"], 6))
    groups = {(frozenset(tuple(k) for k in g.links), round(g.bandwidth, 6)) for g in fabric.sharing}
    found = []
    for mapping in islice(matcher.isomorphisms_iter(), MAX_ENUMERATED):
        sigma = tuple(mapping[r] for r in range(fabric.nranks))
        moved = {(frozenset((sigma[rank(s)], sigma[rank(d)]) for s, d in links), bw) for links, bw in groups}
        if moved == groups:
            found.append(sigma)
    return found


def _chunk_map(sigma: Perm, collective: Collective) -> Perm:
    n, c = collective.nranks, collective.chunks
    if collective.facts.chunking is Chunking.SHARED:
        return tuple(range(collective.nchunks))
    if collective.facts.chunking is Chunking.BLOCKS:
        return tuple((sigma[k // (n * c)] * n + sigma[(k // c) % n]) * c + k % c for k in range(collective.nchunks))
    return tuple(sigma[k // c] * c + k % c for k in range(collective.nchunks))


def _with_chunk_map(sigma: Perm, collective: Collective) -> tuple[Perm, Perm] | None:
    """(sigma, tau) when sigma keeps the collective's pre- and postconditions, else None."""
    tau = _chunk_map(sigma, collective)
    for r in range(collective.nranks):
        if frozenset(tau[k] for k in collective.precondition(r)) != collective.precondition(sigma[r]):
            return None
        if frozenset(tau[k] for k in collective.postcondition(r)) != collective.postcondition(sigma[r]):
            return None
    return sigma, tau


def _compose(a: tuple[Perm, Perm], b: tuple[Perm, Perm]) -> tuple[Perm, Perm]:
    return tuple(a[0][x] for x in b[0]), tuple(a[1][x] for x in b[1])


def _closure(generators: list[tuple[Perm, Perm]], limit: int = MAX_GROUP) -> Symmetry:
    identity = (tuple(range(len(generators[0][0]))), tuple(range(len(generators[0][1]))))
    group, frontier = {identity}, [identity]
    while frontier:
        nxt = []
        for g in frontier:
            for h in generators:
                p = _compose(h, g)
                if p not in group:
                    group.add(p)
                    nxt.append(p)
                    if len(group) > limit:
                        return Symmetry(())
        frontier = nxt
    return Symmetry(tuple(sorted(group)))


def _bounded_closure(pairs: list[tuple[Perm, Perm]]) -> Symmetry:
    """The group the pairs generate, or, when that is too large, the largest one found greedily."""
    chosen: list[tuple[Perm, Perm]] = []
    group = Symmetry(())
    for p in sorted(pairs, key=lambda p: (_fixed(p[0]), -_order(p[0]), p)):
        if group.elements and p in group.elements:
            continue
        bigger = _closure(chosen + [p])
        if bigger.elements:
            chosen.append(p)
            group = bigger
    return group


def _order(sigma: Perm) -> int:
    k, p = 1, sigma
    identity = tuple(range(len(sigma)))
    while p != identity:
        p = tuple(sigma[x] for x in p)
        k += 1
    return k


def _fixed(sigma: Perm) -> int:
    return sum(1 for i, x in enumerate(sigma) if i == x)
