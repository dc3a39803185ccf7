"""Lower bounds on a collective's time: latency (path lengths) and bandwidth (ForestColl's cut bound).

The bandwidth bound for allgather is ForestColl's: with M the message size and N ranks,

    T ≥ (M/N) · max over vertex sets S that hold a rank and leave one out of |S ∩ ranks| / B⁺(S)

where B⁺(S) is the capacity (GB/s) of the links leaving S, and S may hold switches. The maximum,
``allgather_cut_bound(topology)``, is exact: a ``Fraction`` in 1/(GB/s), found by Dinkelbach's method over
networkx max-flows (each flow finds the most violated cut for one sink rank; the ratio of a real cut is
exact, so there is nothing to snap) and confirmed by a max-flow to every rank at the final ratio.
Switches stay vertices: the switch-free form has O(N²) links and is never built here.

Time in µs = bytes × factor / 1e3, with factor in 1/(GB/s) (1 GB/s = 1e3 bytes/µs).

All-reduce has no cut bound of ForestColl's form; twice the reduce-scatter bound, which nccl-tests'
bus factor suggests, is no bound at all on a fabric whose ranks differ (on line:n=3 the end ranks send and
receive the message once, and reduce-to-the-middle beats it). ``allreduce_factor`` takes the larger of two
valid forms, both counting element transfers (bytes of one element carry nothing about another):

* per cut: every cut S with a rank on each side carries at least M bytes out of S (the outside needs S's
  contribution to every element, reduced or not) and at least M bytes into it, so T ≥ M / λ where λ is the
  smallest rank-to-rank max-flow (one fixed rank against every other, both ways, finds it);
* per volume: an element reaches all N ranks' results only after 2(N-1) one-way transfers (the one-way
  gossip bound), each received by a rank, so T ≥ 2(N-1)·M / B⁻, where B⁻ is what the ranks together can
  receive: a max-flow from every rank to every rank through switches and sharing groups
  (``rank_ingress``; two GPUs behind one NIC count the NIC once, not each GPU's PCIe link). The same
  holds for H hosts (each with the switches only it uses): contracting each host to one vertex leaves a
  gossip among H, so T ≥ 2(H-1)·M / Σ_h B⁻(h). Switches forward and never reduce (weft's schedules run
  rank to rank), so a transfer relayed by a switch is still one transfer from a rank.

On uniform fabrics (switch, fully connected, rings) the volume form equals twice the reduce-scatter bound;
on a line of three both give M/25 GB/s, which reduce-to-the-middle reaches when pipelined.

Two things make the bound looser than a schedule can always reach, never wrong: sharing groups of the
topology file are left out of the cuts (dropping a constraint keeps a bound valid; only the all-reduce
volume form counts them), and a cut lets a switch vertex
feed several ranks from one delivery, as if it could multicast. Where a switch takes in less than it can
give out (a NIC shared by two GPUs), the best multicast-free schedule may stay below this bound.

>>> from topologies.topology import Link, Topology
>>> ring3 = Topology("ring3", 3, tuple(Link(i, (i + d) % 3, 10.0) for i in range(3) for d in (1, 2)))
>>> allgather_cut_bound(ring3)  # rank 0 receives 2 slices over 20 GB/s
Fraction(1, 10)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from math import lcm
from typing import Any

import networkx as nx
import numpy as np
from networkx.algorithms.flow import build_residual_network, dinitz

from schedules.collectives import Chunking, Collective
from schedules.symmetry import rank_orbit_representatives
from topologies.errors import UnreachableError
from topologies.topology import Topology, Vertex
from weftcore.errors import WeftError

BYTES_PER_US_PER_GBPS = 1e3
SOURCE = ("source",)  # the auxiliary flow source; a tuple, so no rank (int) or switch (str) can clash
TOLERANCE = 1e-9  # relative float slack of a max-flow before a cut counts as violated


class BoundError(WeftError):
    """A bound asked of a topology and collective that do not fit together."""


@dataclass(frozen=True)
class Cut:
    """A vertex set S with its rank count and exact leaving capacity B⁺(S) in GB/s."""

    vertices: frozenset[Vertex]
    ranks: int
    capacity: Fraction

    @property
    def ratio(self) -> Fraction:
        """|S ∩ ranks| / B⁺(S), in 1/(GB/s)."""
        return Fraction(self.ranks) / self.capacity


def exact(x: float) -> Fraction:
    """A link figure as the rational it was written as (12.5 -> 25/2, 0.1 -> 1/10)."""
    return Fraction(x).limit_denominator(10**9)


# ---- the flow graph -------------------------------------------------------------------------------


def _capacities(topology: Topology) -> dict[tuple[Vertex, Vertex], Fraction]:
    """Exact capacity per link. Sharing groups are left out: dropping a constraint keeps a bound valid."""
    return {link.key: exact(link.capacity) for link in topology.links}


def _cut(topology: Topology, inside: frozenset[Vertex]) -> Cut:
    leaving = sum(
        (exact(link.capacity) for v in inside for link in topology.out_links[v] if link.dst not in inside), Fraction(0)
    )
    return Cut(inside, sum(1 for v in inside if isinstance(v, int)), leaving)


def _flow_graph(topology: Topology) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(topology.vertices)
    graph.add_edges_from((link.src, link.dst, {"capacity": link.capacity}) for link in topology.links)
    return graph


def _unreachable(topology: Topology, cut: Cut) -> UnreachableError:
    outside = next(r for r in topology.ranks if r not in cut.vertices)
    inside = next(v for v in cut.vertices if isinstance(v, int))
    return UnreachableError(f"topology {topology.name}: rank {inside} cannot reach rank {outside}")


# ---- the cut bound ------------------------------------------------------------------------------


def _host_groups(topology: Topology) -> list[frozenset[Vertex]]:
    """Each host's ranks with the switches only it uses; empty for a one-host fabric."""
    hosts = topology.hosts
    if len(set(hosts)) < 2:
        return []
    owner: dict[Vertex, int | None] = {r: hosts[r] for r in topology.ranks}
    for s in topology.switches:
        near = {hosts[link.dst] for link in topology.out_links[s] if isinstance(link.dst, int)}
        near |= {hosts[link.src] for link in topology.in_links[s] if isinstance(link.src, int)}
        owner[s] = near.pop() if len(near) == 1 else None
    members: dict[int, set[Vertex]] = defaultdict(set)
    for v, h in owner.items():
        if h is not None:
            members[h].add(v)
    return [frozenset(g) for g in members.values()]


def _host_cuts(topology: Topology, caps: dict[tuple[Vertex, Vertex], Fraction]) -> list[Cut]:
    """Cheap candidates: each host with the switches only it uses, and each host's complement."""
    everything = frozenset(topology.vertices)
    cuts = []
    for group in _host_groups(topology):
        leaving = sum(
            (caps[link.key] for v in group for link in topology.out_links[v] if link.dst not in group), Fraction(0)
        )
        entering = sum(
            (caps[link.key] for v in group for link in topology.in_links[v] if link.src not in group), Fraction(0)
        )
        ranks = sum(1 for v in group if isinstance(v, int))
        cuts.append(Cut(frozenset(group), ranks, leaving))
        cuts.append(Cut(everything - group, topology.nranks - ranks, entering))
    return cuts


def _all_but(topology: Topology, caps: dict[tuple[Vertex, Vertex], Fraction], rank: int) -> Cut:
    entering = sum((caps[link.key] for link in topology.in_links[rank]), Fraction(0))
    return Cut(frozenset(topology.vertices) - {rank}, topology.nranks - 1, entering)


def _first_cuts(topology: Topology, sinks: tuple[int, ...]) -> list[Cut]:
    caps = _capacities(topology)
    cuts = [_all_but(topology, caps, v) for v in sinks] + _host_cuts(topology, caps)
    return [c for c in cuts if c.ranks and any(v not in c.vertices for v in sinks)]


def _source_side(residual: nx.DiGraph, source: Hashable, scale: float) -> frozenset[Vertex]:
    """Vertices reachable from source over links with residual capacity: the source side of a min cut."""
    seen: set[Any] = {source}
    stack = [source]
    while stack:
        u = stack.pop()
        for v, attr in residual.succ[u].items():
            if v not in seen and attr["capacity"] - attr["flow"] > TOLERANCE * scale:
                seen.add(v)
                stack.append(v)
    return frozenset(seen)


def _violated_cut(topology: Topology, graph: nx.DiGraph, y: Fraction, sinks: tuple[int, ...]) -> Cut | None:
    """A cut with B⁺(S) < y·|S ∩ ranks| that leaves out one of the sinks, or None if y is feasible."""
    for r in topology.ranks:
        graph[SOURCE][r]["capacity"] = float(y)
    residual = build_residual_network(graph, "capacity")
    need = float(y) * topology.nranks
    for sink in sinks:
        flow = dinitz(graph, SOURCE, sink, residual=residual, cutoff=need)
        if flow.graph["flow_value"] >= need * (1 - TOLERANCE):
            continue
        cut = _cut(topology, _source_side(flow, SOURCE, need) - {SOURCE})
        if cut.capacity == 0:
            raise _unreachable(topology, cut)
        if cut.ranks and cut.ratio > 1 / y:
            return cut
    return None


@lru_cache(maxsize=32)
def bottleneck_cut(topology: Topology, sinks: tuple[int, ...] | None = None) -> Cut:
    """The cut S (leaving out one of ``sinks``, default every rank) that maximizes |S ∩ ranks| / B⁺(S).

    With every rank a sink, one max-flow per orbit of the fabric's symmetries suffices: an automorphism
    maps each cut to one of equal capacity and rank count.
    """
    if topology.nranks < 2:
        raise BoundError(f"topology {topology.name}: a cut bound needs at least 2 ranks")
    if sinks is None:
        ring = _ring_cut(topology)
        if ring is not None:
            return ring
        sinks = rank_orbit_representatives(topology)
    best = max(_first_cuts(topology, sinks), key=lambda c: c.ratio if c.capacity else float("inf"))
    if best.capacity == 0:
        raise _unreachable(topology, best)
    graph = _flow_graph(topology)
    graph.add_edges_from((SOURCE, r, {"capacity": 0.0}) for r in topology.ranks)
    while True:
        better = _violated_cut(topology, graph, 1 / best.ratio, sinks)
        if better is None:
            return best
        best = better


MIN_FLOW_S_PER_ELEMENT = 1e-7  # a networkx max-flow visits every vertex and link at least once, at <= 10 M per s


def cut_bound_floor_s(topology: Topology) -> tuple[float, int]:
    """(a floor on the seconds ``bottleneck_cut`` takes, the max-flows it runs at least): its last round runs one
    max-flow per orbit of ranks, each visiting every vertex and link; 0 where the closed form answers. A floor, so
    a command may refuse at once where even it is past the time limit, and nothing that would finish is refused."""
    if topology.nranks < 2 or _ring_cut(topology) is not None:
        return 0.0, 0
    sinks = len(rank_orbit_representatives(topology))
    return sinks * (len(topology.vertices) + len(topology.links)) * MIN_FLOW_S_PER_ELEMENT, sinks


@lru_cache(maxsize=4)
def _ring_cut(topology: Topology) -> Cut | None:
    """On a ring (no switches, every rank linked both ways to exactly two others, one cycle, one capacity c) the
    best cut is every rank but one, with no max-flow: a set S of ranks that leaves one out is k >= 1 arcs, each
    with its own two links leaving, so |S ∩ ranks| / B⁺(S) <= (N-1) / 2kc <= (N-1) / 2c. None on anything else."""
    n = topology.nranks
    if topology.switches or n < 3 or len(topology.links) != 2 * n:
        return None
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    table = np.array([(link.src, link.dst, link.capacity) for link in topology.links], float)
    src, dst = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
    keys = np.unique(src * n + dst)
    if len(keys) != 2 * n or len(np.unique(table[:, 2])) != 1 or (src == dst).any():
        return None
    if not np.isin(dst * n + src, keys).all():  # every link has its reverse
        return None
    if (np.bincount(src, minlength=n) != 2).any():  # two neighbours each (in-degree follows from the reverses)
        return None
    pieces, _ = connected_components(csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n)), directed=False)
    if pieces != 1:
        return None
    left_out = topology.ranks[0]
    entering = sum((exact(link.capacity) for link in topology.in_links[left_out]), Fraction(0))
    return Cut(frozenset(topology.vertices) - {left_out}, n - 1, entering)


def allgather_cut_bound(topology: Topology) -> Fraction:
    """ForestColl's optimum: max over cuts of |S ∩ ranks| / B⁺(S), exact, in 1/(GB/s)."""
    return bottleneck_cut(topology).ratio


@lru_cache(maxsize=16)
def _reversed(topology: Topology) -> Topology:
    flipped = topology.reversed()
    return topology if flipped.fingerprint == topology.fingerprint else flipped


@lru_cache(maxsize=64)
def rooted_cut_capacity(topology: Topology, root: int) -> Fraction:
    """The smallest exact min-cut capacity (GB/s) from root to any other rank."""
    graph = _flow_graph(topology)
    residual = build_residual_network(graph, "capacity")
    smallest: Fraction | None = None
    for sink in topology.ranks:
        if sink == root:
            continue
        flow = dinitz(graph, root, sink, residual=residual)
        cut = _cut(topology, _source_side(flow, root, max(flow.graph["flow_value"], 1.0)))
        if cut.capacity == 0:
            raise UnreachableError(f"topology {topology.name}: rank {root} cannot reach rank {sink}")
        smallest = cut.capacity if smallest is None else min(smallest, cut.capacity)
    return smallest if smallest is not None else Fraction(0)


def _alltoall_factor(topology: Topology) -> Fraction:
    """Each cut S carries |S ∩ ranks|·|ranks \\ S|/N² of the per-rank buffer out; rank and host cuts."""
    n = topology.nranks
    caps = _capacities(topology)
    cuts = [_cut(topology, frozenset({r})) for r in topology.ranks]
    cuts += [_all_but(topology, caps, r) for r in topology.ranks]
    cuts += _host_cuts(topology, caps)
    worst = Fraction(0)
    for cut in cuts:
        if cut.capacity == 0:
            raise _unreachable(topology, cut)
        worst = max(worst, Fraction(cut.ranks * (n - cut.ranks), n * n) / cut.capacity)
    return worst * n  # bytes counted against the per-rank buffer of N slices


@lru_cache(maxsize=32)
def smallest_rank_cut(topology: Topology) -> Fraction:
    """min over ordered rank pairs (u, v) of the max-flow u -> v, exact, in GB/s.

    A cut S separating two ranks either holds rank 0 (then some v outside has λ(0, v) ≤ B⁺(S)) or not
    (then some v inside has λ(v, 0) ≤ B⁺(S)), so 2(N-1) flows from and to rank 0 find the minimum.
    """
    fast = _smallest_rank_cut_integral(topology)
    if fast is not None:
        return fast
    forward, backward = _flow_graph(topology), _flow_graph(topology).reverse(copy=True)
    best: Fraction | None = None
    anchor = topology.ranks[0]
    for graph in (forward, backward):
        residual = build_residual_network(graph, "capacity")
        for sink in topology.ranks:
            if sink == anchor:
                continue
            cutoff = None if best is None else float(best) * (1 + TOLERANCE)
            flow = dinitz(graph, anchor, sink, residual=residual, cutoff=cutoff)
            if best is not None and cutoff is not None and flow.graph["flow_value"] >= float(best) * (1 - TOLERANCE):
                continue  # no smaller cut here (a flow stopped at its cutoff has no min cut to read)
            source_side = _source_side(flow, anchor, max(flow.graph["flow_value"], 1.0))
            if graph is backward:
                source_side = frozenset(topology.vertices) - source_side  # S is the side that reaches rank 0
            cut = _cut(topology, source_side)
            if cut.capacity == 0:
                raise _unreachable(topology, cut)
            if best is None or cut.capacity < best:
                best = cut.capacity
    return best if best is not None else Fraction(0)


SINK = ("sink",)


def _ingress_graph(topology: Topology) -> nx.DiGraph:
    """Ranks split into a sending and a receiving vertex, switches kept, each sharing group a vertex pair.

    A link in sharing groups runs through each group's pair, whose middle edge has the group's bandwidth.
    That lets flow change links inside a group (a relaxation: every flow of the fabric is one of this graph
    too), so a cut here still bounds what the fabric carries. Edges hold their exact capacity as well.
    """

    def vertex(v: Vertex, side: str) -> Any:
        return (side, v) if isinstance(v, int) else v

    graph = nx.DiGraph()

    def add(a: Hashable, b: Hashable, capacity: Fraction) -> None:
        exact_total = graph[a][b]["exact"] + capacity if graph.has_edge(a, b) else capacity
        graph.add_edge(a, b, capacity=float(exact_total), exact=exact_total)

    groups: dict[tuple[Vertex, Vertex], list[int]] = defaultdict(list)
    for i, group in enumerate(topology.sharing):
        for key in group.links:
            groups[(key[0], key[1])].append(i)
        add(("group", i, "in"), ("group", i, "out"), exact(group.bandwidth))
    for link in topology.links:
        hops = [vertex(link.src, "send")]
        hops += [v for i in groups[link.key] for v in (("group", i, "in"), ("group", i, "out"))]
        hops.append(vertex(link.dst, "receive"))
        for a, b in zip(hops, hops[1:], strict=False):
            if not (a[0] == "group" and b[0] == "group" and a[1] == b[1]):
                add(a, b, exact(link.capacity))
    for r in topology.ranks:
        graph.add_edge(SOURCE, ("send", r))  # no capacity attribute: unbounded
        graph.add_edge(("receive", r), SINK)
    return graph


@lru_cache(maxsize=32)
def rank_ingress(topology: Topology) -> Fraction:
    """How many GB/s all ranks together can receive, exact: a min cut between every rank's sending side and
    every rank's receiving side, through switches that only forward and sharing groups that cap their links.

    Where two GPUs share a NIC (dgx2), the NIC's bandwidth counts once, not each GPU's PCIe link.
    """
    graph = _ingress_graph(topology)
    _, (inside, _) = nx.minimum_cut(graph, SOURCE, SINK)
    # any cut bounds the max-flow, so the float cut's exact capacity is a valid (and, here, tight) bound
    return sum((attr["exact"] for a, b, attr in graph.edges(data=True) if a in inside and b not in inside), Fraction(0))


def _smallest_rank_cut_integral(topology: Topology) -> Fraction | None:
    """``smallest_rank_cut`` by scipy's max-flow in C over capacities scaled to integers (exact: an integral
    max-flow's value is its min cut's capacity); None where the scaled capacities would not fit in int32.

    The same 2(N-1) flows as the networkx form, a hundred times faster: at 1024 ranks a minute became a second.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    caps = _capacities(topology)
    scale = lcm(*(c.denominator for c in caps.values())) if caps else 1
    ints = [c * scale for c in caps.values()]
    if not caps or max(ints) * len(ints) >= 2**31:
        return None
    index = {v: i for i, v in enumerate(topology.vertices)}
    rows = np.array([index[s] for s, _ in caps], np.int32)
    cols = np.array([index[d] for _, d in caps], np.int32)
    size = len(index)
    forward = csr_matrix((np.array([int(c) for c in ints], np.int32), (rows, cols)), shape=(size, size))
    anchor = topology.ranks[0]
    best: int | None = None
    for graph, backward in ((forward, False), (forward.T.tocsr(), True)):
        for sink in topology.ranks:
            if sink == anchor:
                continue
            value = maximum_flow(graph, index[anchor], index[sink], method="dinic").flow_value
            if value == 0:
                a, b = (sink, anchor) if backward else (anchor, sink)
                raise UnreachableError(f"topology {topology.name}: rank {a} cannot reach rank {b}")
            best = value if best is None else min(best, value)
    return Fraction(best if best is not None else 0, scale)


def allreduce_factor(topology: Topology) -> Fraction:
    """All-reduce's bandwidth bound per message byte, 1/(GB/s): the larger of the cut and volume forms."""
    n = topology.nranks
    if n < 2:
        return Fraction(0)
    caps = _capacities(topology)
    ingress = min(
        rank_ingress(topology),
        sum((caps[link.key] for r in topology.ranks for link in topology.in_links[r]), Fraction(0)),
    )
    best = max(1 / smallest_rank_cut(topology), Fraction(2 * (n - 1)) / ingress)
    groups = _host_groups(topology)
    if len(groups) > 1:
        host_ingress = sum(
            (caps[link.key] for g in groups for v in g for link in topology.in_links[v] if link.src not in g),
            Fraction(0),
        )
        best = max(best, Fraction(2 * (len(groups) - 1)) / host_ingress)
    return best


def bandwidth_factor(topology: Topology, collective: Collective) -> Fraction:
    """The bandwidth bound per byte of message, in 1/(GB/s): bound_us = nbytes × factor / 1e3."""
    _check(topology, collective)
    n = collective.nranks
    if n < 2:
        return Fraction(0)
    facts = collective.facts
    if facts.phases:
        return allreduce_factor(topology)
    if facts.chunking is Chunking.BLOCKS:
        return _alltoall_factor(topology)
    if facts.rooted and facts.chunking is Chunking.SLICES:
        # every slice crosses the cut around the root: into it (gather), or out of it (scatter, reversed)
        return bottleneck_cut(_reversed(topology) if facts.from_root else topology, (collective.root,)).ratio / n
    # a combining collective's bound is its copy-only dual's on the reversed fabric
    fabric = _reversed(topology) if facts.combining else topology
    if facts.rooted:
        return 1 / rooted_cut_capacity(fabric, collective.root)
    return allgather_cut_bound(fabric) / n


def bandwidth_bound_us(topology: Topology, collective: Collective, nbytes: float) -> float:
    """No schedule moves nbytes (the nccl-tests size) faster than this over the fabric's cuts."""
    return float(nbytes * bandwidth_factor(topology, collective)) / BYTES_PER_US_PER_GBPS


# ---- the latency bound --------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _farthest_us(topology: Topology, sources: tuple[int, ...]) -> float:
    graph = _flow_graph(topology)
    for link in topology.links:
        graph[link.src][link.dst]["latency"] = link.latency
    far = 0.0
    for src in sources:
        reach = nx.single_source_dijkstra_path_length(graph, src, weight="latency")
        far = max(far, max(reach[r] for r in topology.ranks))
    return far


def latency_bound_us(topology: Topology, collective: Collective) -> float:
    """The longest of the lowest-latency paths that the collective's data must travel, in µs.

    Every rank needs something from every other rank, except in rooted collectives, where data only
    leaves the root (broadcast, scatter) or only reaches it (reduce, gather).
    """
    _check(topology, collective)
    if collective.facts.from_root:
        return _farthest_us(topology, (collective.root,))
    if collective.facts.to_root:
        return _farthest_us(_reversed(topology), (collective.root,))
    # an automorphism preserves path latencies, so the farthest pair starts at some orbit's representative
    return _farthest_us(topology, rank_orbit_representatives(topology))


def lower_bound_us(topology: Topology, collective: Collective, nbytes: float) -> float:
    """The larger of the latency and bandwidth bounds, in µs."""
    return max(latency_bound_us(topology, collective), bandwidth_bound_us(topology, collective, nbytes))


def _check(topology: Topology, collective: Collective) -> None:
    if collective.nranks != topology.nranks:
        raise BoundError(
            f"collective {collective.name}: nranks: {collective.nranks} ranks, "
            f"but topology {topology.name} has {topology.nranks}"
        )
