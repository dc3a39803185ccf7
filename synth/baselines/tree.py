"""NCCL-style binary trees: a double binary tree for allreduce, one binary tree for broadcast and reduce.

The tree over positions 0..N-1 is the in-order "ruler" tree: position 0 is the root, and every range of
positions hangs from its member with the most trailing zero bits, so odd positions are the leaves. The
second tree of the pair mirrors the first (N even) or shifts it by one (N odd), so that most ranks that
are leaves in one tree are inner nodes in the other and every link direction does work in both phases.
Positions are placed on ranks host-major, else along a Hamiltonian cycle, else by a networkx subgraph
search, so that every tree edge is a link.

Allreduce gives each tree half of the chunks; each chunk is reduced up its tree and broadcast back down,
pipelined: a rank at height h sends chunk m to its parent at step m + h. On several hosts with even
NVSwitch-like hosts, every host rotation of the placement adds a tree (pair), so that the chunks cross
between hosts through every GPU's NIC (NCCL's channels).

>>> ruler_tree(8)
{4: 0, 2: 4, 1: 2, 3: 2, 6: 4, 5: 6, 7: 6}
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator

import networkx as nx
import numpy as np
from networkx.algorithms.isomorphism import DiGraphMatcher

from schedules.collectives import NAMES, Chunking, Collective, Facts, facts_of
from schedules.loads import index_fabric
from schedules.schedule import Schedule, Send, Symmetry
from synth.baselines.common import assemble, check_ranks, check_size, host_major, host_rotations
from synth.baselines.ring import hamiltonian_cycle
from synth.errors import NotApplicable
from topologies.topology import Topology


def _fits(facts: Facts) -> bool:
    """Binary trees carry one shared slice down from the root or up into it, or allreduce's sums up and back down."""
    return facts.chunking is Chunking.SHARED or facts.sums_everywhere


SUPPORTED = tuple(name for name in NAMES if _fits(facts_of(name)))
MATCH_BUDGET = 20_000  # candidate pairs the subgraph search may try before it gives up


def tree(topology: Topology, collective: Collective) -> Schedule:
    """Double binary tree allreduce, or a single binary tree broadcast/reduce from the root."""
    started = time.perf_counter()
    if not _fits(collective.facts):
        raise NotApplicable(f"tree: exists for {', '.join(SUPPORTED)} only, not {collective.name}")
    check_ranks("tree", topology, collective)
    n = collective.nranks
    check_size("tree", topology.name, collective, tree_sends(collective))
    root = collective.root if collective.rooted else None
    shapes = [ruler_tree(n), _second_tree(ruler_tree(n), n)] if root is None else [ruler_tree(n)]
    order = _placement(topology, shapes, root)
    trees = [_on_ranks(shape, _rotate(placed, root)) for placed in host_rotations(topology, order) for shape in shapes]
    used = min(len(trees), collective.nchunks)
    waves = collective.nchunks // used
    if (
        root is None
        and collective.nchunks % used == 0
        and waves > 1
        and 2 * (n - 1) * collective.nchunks > COMPACT_FROM
    ):
        # the first chunk of every tree, and the shift that sends chunk m + used one step after chunk m
        first = [
            t
            for parents, q in zip(trees, range(used), strict=False)
            for t in _allreduce_phases(parents, range(q, q + 1))
        ]
        later = (np.arange(collective.nchunks) + used) % collective.nchunks
        shift = Symmetry(tuple(range(n)), tuple(later.tolist()), waves, shift=1)
        return assemble(
            "tree", topology, collective, _merge(*first), started, "a tree edge", (shift,), order=order, trees=used
        )
    # Tree q carries chunks q, q+used, ...; all trees run side by side, step for step.
    parts = [range(q, collective.nchunks, used) for q in range(used)]
    if root is None:
        timelines = [t for parents, part in zip(trees, parts, strict=False) for t in _allreduce_phases(parents, part)]
    elif collective.combining:
        timelines = [_reduce_up(parents, part) for parents, part in zip(trees, parts, strict=False)]
    else:
        timelines = [_broadcast_down(parents, part, 0) for parents, part in zip(trees, parts, strict=False)]
    return assemble("tree", topology, collective, _merge(*timelines), started, "a tree edge", order=order, trees=used)


def tree_sends(collective: Collective) -> int:
    """Every chunk crosses each of the N-1 tree edges once (allreduce: up, then down)."""
    return len(collective.phases) * (collective.nranks - 1) * collective.nchunks


COMPACT_FROM = 1_000_000  # sends past which the all-reduce is written as its first wave and a shift


def ruler_tree(n: int) -> dict[int, int]:
    """Parent of each position 1..n-1 in the in-order binary tree rooted at position 0."""
    parents: dict[int, int] = {}
    ranges = [(1, n, 0)]
    while ranges:
        lo, hi, parent = ranges.pop()
        if lo >= hi:
            continue
        top = max(range(lo, hi), key=lambda x: x & -x)  # unique: two equals have a higher one between
        parents[top] = parent
        ranges += [(top + 1, hi, top), (lo, top, top)]
    return parents


def _second_tree(first: dict[int, int], n: int) -> dict[int, int]:
    """The complementary tree: mirrored for even n, shifted by one for odd n."""
    move = (lambda p: n - 1 - p) if n % 2 == 0 else (lambda p: (p + 1) % n)
    return {move(child): move(parent) for child, parent in first.items()}


def _on_ranks(shape: dict[int, int], order: list[int]) -> dict[int, int]:
    return {order[child]: order[parent] for child, parent in shape.items()}


def _edges(shapes: list[dict[int, int]]) -> set[tuple[int, int]]:
    """Directed position pairs the trees use: child to parent and back."""
    return {e for shape in shapes for c, p in shape.items() for e in ((c, p), (p, c))}


def _placement(topology: Topology, shapes: list[dict[int, int]], root: int | None) -> list[int]:
    """A rank for each tree position such that every tree edge is a link (root at position 0 if given)."""
    edges = sorted(_edges(shapes))
    ends = np.array(edges, np.int64).reshape(-1, 2)
    index = index_fabric(topology)
    for order in _candidate_orders(topology, root):
        at = np.asarray(order, np.int64)
        if index.has_links(at[ends[:, 0]], at[ends[:, 1]]).all():
            return order
    fabric = topology.without_switches()
    found = _match(fabric, set(edges), root)
    if found:
        return found
    first = _rotate(host_major(topology), root)
    lacking = next(f"{first[a]}->{first[b]}" for a, b in edges if not fabric.has_link(first[a], first[b]))
    raise NotApplicable(
        f"tree: no placement of the binary tree{'s' if len(shapes) > 1 else ''} on topology "
        f"{topology.name} puts every tree edge on a link (host-major order lacks {lacking}; "
        "the ring order and a bounded subgraph search found none)"
    )


def _candidate_orders(topology: Topology, root: int | None) -> Iterator[list[int]]:
    yield _rotate(host_major(topology), root)
    try:
        yield _rotate(hamiltonian_cycle(topology), root)
    except NotApplicable:
        return


def _rotate(order: list[int], root: int | None) -> list[int]:
    if root is None:
        return order
    at = order.index(root)
    return order[at:] + order[:at]


class _Bounded(DiGraphMatcher):
    """VF2 that gives up after ``budget`` candidate pairs: its search is exponential when no match exists."""

    def __init__(self, fabric: nx.DiGraph, pattern: nx.DiGraph, budget: int) -> None:
        super().__init__(fabric, pattern)
        self.budget = budget

    def syntactic_feasibility(self, fabric_node: int, pattern_node: int) -> bool:
        self.budget -= 1
        if self.budget < 0:
            raise _OutOfBudget
        return super().syntactic_feasibility(fabric_node, pattern_node)

    def semantic_feasibility(self, fabric_node: int, pattern_node: int) -> bool:
        return self.G1.nodes[fabric_node].get("root") == self.G2.nodes[pattern_node].get("root")


class _OutOfBudget(Exception):
    pass


def _match(fabric: Topology, edges: set[tuple[int, int]], root: int | None) -> list[int] | None:
    """A placement found by subgraph monomorphism of the tree edges into the fabric's links, or None."""
    links = nx.DiGraph([link.key for link in fabric.links])
    links.add_nodes_from(fabric.ranks)
    pattern = nx.DiGraph(list(edges))
    pattern.add_nodes_from(range(fabric.nranks))
    if root is not None:
        nx.set_node_attributes(links, {root: True}, "root")
        nx.set_node_attributes(pattern, {0: True}, "root")
    try:
        mapping = next(_Bounded(links, pattern, MATCH_BUDGET).subgraph_monomorphisms_iter(), None)
    except _OutOfBudget:
        return None
    if mapping is None:
        return None
    order = [0] * fabric.nranks
    for rank, position in mapping.items():
        order[position] = rank
    return order


def _heights(parents: dict[int, int]) -> dict[int, int]:
    """Edges from each rank down to its deepest descendant (leaves are 0)."""
    heights: dict[int, int] = defaultdict(int)
    for child in sorted(parents, key=lambda c: -_depth(parents, c)):
        heights[parents[child]] = max(heights[parents[child]], heights[child] + 1)
    return heights


def _depth(parents: dict[int, int], rank: int) -> int:
    depth = 0
    while rank in parents:
        rank, depth = parents[rank], depth + 1
    return depth


def _reduce_up(parents: dict[int, int], chunks: range) -> dict[int, list[Send]]:
    """A rank at height h adds chunk m into its parent at step m + h, once all its children have."""
    heights = _heights(parents)
    steps: dict[int, list[Send]] = defaultdict(list)
    for m, chunk in enumerate(chunks):
        for child, parent in parents.items():
            steps[m + heights[child]].append(Send(chunk, child, parent, "reduce"))
    return steps


def _broadcast_down(parents: dict[int, int], chunks: range, start: int) -> dict[int, list[Send]]:
    """A rank at depth d copies chunk m to its children at step start + m + d."""
    steps: dict[int, list[Send]] = defaultdict(list)
    for m, chunk in enumerate(chunks):
        for child, parent in parents.items():
            steps[start + m + _depth(parents, parent)].append(Send(chunk, parent, child))
    return steps


def _allreduce_phases(parents: dict[int, int], chunks: range) -> tuple[dict[int, list[Send]], ...]:
    root_height = max(_heights(parents).values(), default=0)
    return _reduce_up(parents, chunks), _broadcast_down(parents, chunks, root_height)


def _merge(*timelines: dict[int, list[Send]]) -> list[list[Send]]:
    """Step lists from several {step: sends} timelines that run side by side."""
    last = max((step for t in timelines for step in t), default=-1)
    return [[send for t in timelines for send in t.get(step, ())] for step in range(last + 1)]
