"""Symmetries of a fabric: rank permutations that map every link onto one of the same capacity and latency.

Bounds and tree packing do one max-flow per rank; on a symmetric fabric one per orbit suffices. Finding
the full automorphism group is hard, so a few natural maps are tried (a rotation of all ranks, a shift
of every rank to the same place on the next host, a rotation of the ranks inside every host) and each
is kept only if it checks out link by link. Every orbit returned is therefore sound; on an irregular
fabric they are just single ranks.

>>> from topologies.topology import Link, Topology
>>> ring4 = Topology("ring4", 4, tuple(Link(i, (i + d) % 4, 10.0) for i in range(4) for d in (1, 3)))
>>> rank_orbit_representatives(ring4)
(0,)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import lru_cache
from typing import cast

from topologies.topology import Topology, Vertex

Permutation = dict[Vertex, Vertex]
Signature = tuple[frozenset[Vertex], frozenset[Vertex]]  # a switch's (in, out) neighbours


def _host_ranks(topology: Topology) -> list[list[int]]:
    by_host: dict[int, list[int]] = defaultdict(list)
    for r in topology.ranks:
        by_host[topology.hosts[r]].append(r)
    return [by_host[h] for h in sorted(by_host)]


def _candidates(topology: Topology) -> list[dict[int, int]]:
    n = topology.nranks
    maps = [{r: (r + 1) % n for r in topology.ranks}]
    hosts = _host_ranks(topology)
    if len(hosts) > 1 and len({len(h) for h in hosts}) == 1:
        maps.append({r: hosts[(h + 1) % len(hosts)][i] for h, ranks in enumerate(hosts) for i, r in enumerate(ranks)})
    if any(len(h) > 1 for h in hosts):
        maps.append({r: ranks[(i + 1) % len(ranks)] for ranks in hosts for i, r in enumerate(ranks)})
    return maps


def _extend_to_switches(topology: Topology, ranks: dict[int, int]) -> Permutation | None:
    """Map each switch to the one whose neighbours are its neighbours' images; None if none fits."""
    perm: Permutation = {r: image for r, image in ranks.items()}
    pending = list(topology.switches)
    while pending:
        known = {s for s in topology.switches if s not in pending} | set(topology.ranks)
        by_signature: dict[Signature, list[str]] = defaultdict(list)
        for s in pending:
            by_signature[_signature(topology, known, s, _identity)].append(s)
        placed = []
        for s in pending:
            targets = by_signature.get(_signature(topology, known, s, perm.__getitem__))
            if not targets or not any(_signature(topology, known, s, _identity)):
                continue
            perm[s] = targets.pop(0)
            placed.append(s)
        if not placed:
            return None
        pending = [s for s in pending if s not in placed]
    return perm


def _identity(v: Vertex) -> Vertex:
    return v


def _signature(topology: Topology, known: set[Vertex], s: str, image: Callable[[Vertex], Vertex]) -> Signature:
    """A switch's neighbours among the ``known`` vertices, each mapped through ``image``: (in, out)."""
    ins = frozenset(image(link.src) for link in topology.in_links[s] if link.src in known)
    outs = frozenset(image(link.dst) for link in topology.out_links[s] if link.dst in known)
    return ins, outs


def _is_automorphism(topology: Topology, perm: Permutation) -> bool:
    if set(perm.values()) != set(perm):
        return False
    for link in topology.links:
        image = (perm[link.src], perm[link.dst])
        if not topology.has_link(*image):
            return False
        twin = topology.link(*image)
        if abs(twin.capacity - link.capacity) > 1e-9 or abs(twin.latency - link.latency) > 1e-9:
            return False
    return True


@lru_cache(maxsize=32)
def automorphisms(topology: Topology) -> tuple[Permutation, ...]:
    """The candidate maps that check out, each extended to every vertex."""
    found = []
    for ranks in _candidates(topology):
        perm = _extend_to_switches(topology, ranks)
        if perm is not None and _is_automorphism(topology, perm):
            found.append(perm)
    return tuple(found)


def transversal(topology: Topology, rank: int) -> dict[int, Permutation]:
    """For each rank in rank's orbit, one symmetry (a composition of the found ones) that takes rank there."""
    reached: dict[int, Permutation] = {rank: {v: v for v in topology.vertices}}
    frontier = [reached[rank]]
    generators = automorphisms(topology)
    while frontier:
        perm = frontier.pop()
        for g in generators:
            composed = {v: g[image] for v, image in perm.items()}
            target = cast(int, composed[rank])  # a symmetry takes ranks to ranks
            if target not in reached:
                reached[target] = composed
                frontier.append(composed)
    return reached


@lru_cache(maxsize=32)
def rank_orbits(topology: Topology) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by the orbits of the symmetries found; each orbit sorted, orbits by first rank."""
    parent = list(topology.ranks)

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for perm in automorphisms(topology):
        for r in topology.ranks:
            image = cast(int, perm[r])  # a symmetry takes ranks to ranks
            a, b = root(r), root(image)
            if a != b:
                parent[max(a, b)] = min(a, b)
    orbits: dict[int, list[int]] = defaultdict(list)
    for r in topology.ranks:
        orbits[root(r)].append(r)
    return tuple(tuple(o) for _, o in sorted(orbits.items()))


def rank_orbit_representatives(topology: Topology) -> tuple[int, ...]:
    """The first rank of each orbit."""
    return tuple(orbit[0] for orbit in rank_orbits(topology))
