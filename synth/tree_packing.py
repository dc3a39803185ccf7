"""Packing spanning out-trees of equal rate into a fabric, switches included (ForestColl's forest).

Rates are counted in a unit U (GB/s): a link of capacity C carries floor(C/U) trees, and every tree
carries U. A tree's edge is a hop between two ranks, either over a direct link or over the switch path
that the fabric's switch-free form uses for that rank pair; a switch never copies, so a hop through a
switch is exactly ForestColl's edge splitting (it pairs one unit of the switch's in-link with one unit
of its out-link), and the per-link loads are the switch-port loads that ``verify`` checks.

Trees are grown Prim-style, widest remaining hop first, then shallowest. On a symmetric fabric only one
root per orbit is grown; each of its trees is copied to the other roots of the orbit by a symmetry, and
every copy's load is charged as it is made, so the packing is exact whatever the symmetry group.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import cast

import networkx as nx
from networkx.algorithms.flow import dinitz

from schedules.symmetry import Permutation, rank_orbits, transversal
from synth.errors import Unknown
from topologies.topology import Topology, Vertex, _switch_paths

Key = tuple[Vertex, Vertex]
SOURCE = ("source",)  # the auxiliary root of Edmonds' packing; no rank (int) or switch (str) can clash


@dataclass(frozen=True, slots=True)
class Hop:
    """A rank-to-rank tree edge and the topology links it loads."""

    src: int
    dst: int
    links: tuple[Key, ...]


@dataclass(frozen=True)
class Tree:
    """A spanning out-tree: hops listed parent before child."""

    root: int
    hops: tuple[tuple[int, int], ...]

    def depths(self) -> dict[int, int]:
        depth = {self.root: 0}
        for parent, child in self.hops:
            depth[child] = depth[parent] + 1
        return depth


@lru_cache(maxsize=8)
def rank_hops(topology: Topology) -> dict[int, tuple[Hop, ...]]:
    """Every hop out of every rank: direct links to ranks and the switch-free form's switch paths."""
    table = {}
    for src in topology.ranks:
        hops = [Hop(src, link.dst, ((src, link.dst),)) for link in topology.out_links[src] if isinstance(link.dst, int)]
        for dst, path in sorted(_switch_paths(topology, src).items()):
            if not topology.has_link(src, dst):
                hops.append(Hop(src, dst, tuple((link.src, link.dst) for link in path)))
        table[src] = tuple(hops)
    return table


def trees_per_link(topology: Topology, unit: Fraction) -> dict[Key, int]:
    return {link.key: math.floor(Fraction(link.capacity).limit_denominator(10**9) / unit) for link in topology.links}


@dataclass
class _Packer:
    topology: Topology
    hops: dict[int, tuple[Hop, ...]]
    room: dict[Key, int]
    deadline: float
    into: dict[int, list[Hop]] = field(default_factory=dict)
    ties: Iterator[int] = field(default_factory=itertools.count)  # heap order among equal keys: first offered

    def _width(self, hop: Hop) -> int:
        return min(self.room[k] for k in hop.links)

    def _charge(self, hop: Hop, images: list[Permutation]) -> bool:
        """Load hop and its images; undo and say False if some link overflows."""
        charged: list[Key] = []
        for perm in images:
            for src, dst in hop.links:
                key = (perm[src], perm[dst])
                self.room[key] -= 1
                charged.append(key)
                if self.room[key] < 0:
                    for k in charged:
                        self.room[k] += 1
                    return False
        return True

    def grow(self, root: int, images: list[Permutation]) -> Tree | None:
        """One tree from root (and its images), or None when the remaining room cannot span the ranks.

        Prim's order: the frontier keeps, for each rank outside the tree, only the widest hop seen into
        it (then the shallowest), so each rank's hops are scanned once, when it joins.
        """
        placed = {root: 0}
        order: list[tuple[int, int]] = []
        best: dict[int, tuple[int, int]] = {}  # rank -> (width, depth) of the best hop offered into it
        heap: list = []

        def offer(u: int) -> None:
            depth = placed[u] + 1
            for hop in self.hops[u]:
                if hop.dst in placed:
                    continue
                width = self._width(hop)
                if width >= 1 and (width, -depth) > best.get(hop.dst, (0, 0)):
                    best[hop.dst] = (width, -depth)
                    heapq.heappush(heap, (-width, depth, next(self.ties), hop))

        offer(root)
        while len(placed) < self.topology.nranks:
            if time.monotonic() > self.deadline:
                raise Unknown(f"trees on {self.topology.name}: time limit reached while packing trees")
            if not heap:
                return None
            neg_width, depth, _, hop = heapq.heappop(heap)
            if hop.dst in placed:
                continue
            width = self._width(hop)
            if width < -neg_width or not self._charge(hop, images):
                # the room shrank since the offer: take it back at its width; hops into dst that lost to
                # it are offered again only once it runs out (rescanning on every shrink is quadratic)
                best[hop.dst] = (width, best[hop.dst][1])
                if width >= 1:
                    heapq.heappush(heap, (-width, depth, next(self.ties), hop))
                else:
                    self._reoffer(hop.dst, placed, heap)
                continue
            placed[hop.dst] = depth
            order.append((hop.src, hop.dst))
            offer(hop.dst)
        return Tree(root, tuple(order))

    def _reoffer(self, dst: int, placed: dict[int, int], heap: list) -> None:
        """Offer every usable hop from the tree into dst again (the best one offered has run out of room)."""
        for hop in self.into[dst]:
            if hop.src in placed:
                width = self._width(hop)
                if width >= 1:
                    heapq.heappush(heap, (-width, placed[hop.src] + 1, next(self.ties), hop))


def pack(
    topology: Topology, roots: tuple[int, ...], per_root: int, unit: Fraction, deadline: float, symmetric: bool = True
) -> tuple[Tree, ...] | None:
    """per_root trees of rate ``unit`` for every root, or None if the greedy packing runs out of room.

    With ``symmetric``, roots that share an orbit of the fabric's symmetries get copies of one root's trees.
    """
    hops = rank_hops(topology)
    into: dict[int, list[Hop]] = {r: [] for r in topology.ranks}
    for out in hops.values():
        for hop in out:
            into[hop.dst].append(hop)
    packer = _Packer(topology, hops, trees_per_link(topology, unit), deadline, into)
    groups = _root_groups(topology, roots) if symmetric else [(r, {r: None}) for r in roots]
    made: dict[int, list[Tree]] = {r: [] for r in roots}
    for _ in range(per_root):
        for rep, maps in groups:
            images = [perm if perm is not None else _identity(topology) for perm in maps.values()]
            tree = packer.grow(rep, images)
            if tree is None:
                return None
            for root, perm in maps.items():
                made[root].append(tree if perm is None else _mapped(tree, perm))
    return tuple(t for r in roots for t in made[r])


def _identity(topology: Topology) -> Permutation:
    return {v: v for v in topology.vertices}


def _root_groups(topology: Topology, roots: tuple[int, ...]) -> list[tuple[int, dict[int, Permutation | None]]]:
    wanted = set(roots)
    groups = []
    for orbit in rank_orbits(topology):
        members = [r for r in orbit if r in wanted]
        if len(members) == len(orbit) and len(orbit) > 1:
            rep = orbit[0]
            maps: dict[int, Permutation | None] = dict(transversal(topology, rep))
            maps[rep] = None
            groups.append((rep, maps))
        else:
            groups += [(r, {r: None}) for r in members]
    return groups


def _mapped(tree: Tree, perm: Permutation) -> Tree:
    """The tree moved by a symmetry, which takes ranks to ranks."""
    image = cast(dict[int, int], perm)
    return Tree(image[tree.root], tuple((image[a], image[b]) for a, b in tree.hops))


def pack_exact(
    topology: Topology, roots: tuple[int, ...], per_root: int, unit: Fraction, deadline: float
) -> tuple[Tree, ...] | None:
    """Edmonds' packing by Lovász's construction, for switch-free fabrics: exact, one max-flow per arc tried.

    A source s links to every root with ``per_root`` units. A tree grows from s through its root; an arc
    (a, b) may join it while every vertex set X that holds b but not a keeps ρ(X) ≥ trees left - 1 in the
    remaining capacity, which is one max-flow from {s, a} to b. Lovász proved an arc that passes always
    exists while the trees still owed fit, so the result is optimal when the rate is feasible.
    """
    room = trees_per_link(topology, unit)
    graph = nx.DiGraph()
    graph.add_nodes_from(topology.ranks)
    graph.add_node(SOURCE)
    for (src, dst), n in room.items():
        graph.add_edge(src, dst, capacity=n)
    for r in roots:
        graph.add_edge(SOURCE, r, capacity=per_root)
    left = per_root * len(roots)
    made: dict[int, list[Tree]] = {r: [] for r in roots}
    for _ in range(per_root):
        for root in roots:
            tree = _grow_exact(topology, graph, root, left, deadline)
            if tree is None:
                return None
            made[root].append(tree)
            left -= 1
    return tuple(t for r in roots for t in made[r])


def _keeps_cuts(graph: nx.DiGraph, a: Hashable, b: int, need: int) -> bool:
    """Take one unit off a->b if every set holding b but not a still has ``need`` units entering it."""
    graph[a][b]["capacity"] -= 1
    added = a != SOURCE and not graph.has_edge(SOURCE, a)
    saved = None if added or a == SOURCE else graph[SOURCE][a]["capacity"]
    if a != SOURCE:
        graph.add_edge(SOURCE, a, capacity=float("inf"))
    ok = need <= 0 or nx.maximum_flow_value(graph, SOURCE, b, flow_func=dinitz, cutoff=need) >= need
    if added:
        graph.remove_edge(SOURCE, a)
    elif saved is not None:
        graph[SOURCE][a]["capacity"] = saved
    if not ok:
        graph[a][b]["capacity"] += 1
    return ok


def _grow_exact(topology: Topology, graph: nx.DiGraph, root: int, left: int, deadline: float) -> Tree | None:
    if not _keeps_cuts(graph, SOURCE, root, left - 1):
        return None
    placed = {root: 0}
    order: list[tuple[int, int]] = []
    while len(placed) < topology.nranks:
        if time.monotonic() > deadline:
            raise Unknown(f"trees on {topology.name}: time limit reached while packing trees")
        # shallowest first keeps the pipeline short; then the widest remaining arc
        candidates = sorted(
            (placed[a], -graph[a][b]["capacity"], a, b)
            for a in placed
            for b in graph.successors(a)
            if b not in placed and b != SOURCE and graph[a][b]["capacity"] >= 1
        )
        chosen = next(((a, b) for _, _, a, b in candidates if _keeps_cuts(graph, a, b, left - 1)), None)
        if chosen is None:
            return None
        placed[chosen[1]] = placed[chosen[0]] + 1
        order.append(chosen)
    return Tree(root, tuple(order))
