"""The Topology type: ranks, switch vertices, directed links and sharing groups.

A rank is an ``int`` in ``0..nranks-1`` (a GPU). A switch is a named ``str`` vertex that holds no data
(an NVSwitch, an IB switch, a NIC). Links are directed and carry ``bandwidth`` (GB/s per lane, per
direction), ``latency`` (µs) and ``count`` (bonded lanes). A sharing group says that several links share
one capacity, SCCL's form for a switch.

>>> t = Topology("pair", 2, (Link(0, 1, 25.0, 0.7), Link(1, 0, 25.0, 0.7)))
>>> t.link(0, 1).capacity
25.0
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

from topologies.canonical import canonical_bytes, legacy_bytes
from topologies.errors import TopologyError, UnreachableError
from weftcore.jsonfile import short_repr

Vertex = int | str
FORMAT = "weft.topology/1"
MAX_RANKS = 1 << 20  # far beyond any fabric, but keeps a corrupt nranks from allocating gigabytes
MAX_LANES = 1 << 16
# GB/s per lane: 1 KB/s to 1 EB/s spans every fabric, and keeps ratios of capacities finite (1e308 or 5e-324
# made the cost model divide into infinity)
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e-6, 1e9


@dataclass(frozen=True)
class Link:
    """A directed link; ``capacity`` is ``bandwidth × count`` in GB/s."""

    src: Vertex
    dst: Vertex
    bandwidth: float
    latency: float = 0.0
    count: int = 1

    @property
    def capacity(self) -> float:
        return self.bandwidth * self.count

    @property
    def key(self) -> tuple[Vertex, Vertex]:
        return (self.src, self.dst)


@dataclass(frozen=True)
class SharingGroup:
    """Links that together cannot carry more than ``bandwidth`` GB/s."""

    links: tuple[tuple[Vertex, Vertex], ...]
    bandwidth: float


@dataclass(frozen=True)
class Topology:
    """A fabric of ranks and switches. Construction validates; a bad topology cannot exist."""

    name: str
    nranks: int
    links: tuple[Link, ...]
    switches: tuple[str, ...] = ()
    sharing: tuple[SharingGroup, ...] = ()
    hosts: tuple[int, ...] = ()
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.hosts:
            fits = isinstance(self.nranks, int) and 0 < self.nranks <= MAX_RANKS
            object.__setattr__(self, "hosts", (0,) * self.nranks if fits else ())
        problem = find_problem(self)
        if problem:
            error = UnreachableError if problem.startswith("rank ") and "cannot reach" in problem else TopologyError
            raise error(f"topology {self.name}: {problem}")

    # ---- lookups -------------------------------------------------------------------------------
    @property
    def ranks(self) -> range:
        return range(self.nranks)

    @property
    def vertices(self) -> tuple[Vertex, ...]:
        return tuple(self.ranks) + self.switches

    @cached_property
    def _link_map(self) -> dict[tuple[Vertex, Vertex], Link]:
        return {link.key: link for link in self.links}

    def link(self, src: Vertex, dst: Vertex) -> Link:
        """The link src->dst; KeyError if there is none."""
        return self._link_map[(src, dst)]

    def has_link(self, src: Vertex, dst: Vertex) -> bool:
        return (src, dst) in self._link_map

    @cached_property
    def out_links(self) -> dict[Vertex, tuple[Link, ...]]:
        table: dict[Vertex, list[Link]] = {v: [] for v in self.vertices}
        for link in self.links:
            table[link.src].append(link)
        return {v: tuple(ls) for v, ls in table.items()}

    @cached_property
    def in_links(self) -> dict[Vertex, tuple[Link, ...]]:
        table: dict[Vertex, list[Link]] = {v: [] for v in self.vertices}
        for link in self.links:
            table[link.dst].append(link)
        return {v: tuple(ls) for v, ls in table.items()}

    @property
    def nhosts(self) -> int:
        return len(set(self.hosts))

    @cached_property
    def unit_bandwidth(self) -> float:
        """The smallest link or sharing-group capacity: one chunk per round in SCCL's units."""
        caps = [link.capacity for link in self.links] + [g.bandwidth for g in self.sharing]
        return min(caps) if caps else 1.0

    def chunk_capacity(self, src: Vertex, dst: Vertex) -> float:
        """Chunks per round that link src->dst carries, in units of ``unit_bandwidth``."""
        return self.link(src, dst).capacity / self.unit_bandwidth

    def group_capacity(self, group: SharingGroup) -> float:
        """Chunks per round that a sharing group carries, in units of ``unit_bandwidth``."""
        return group.bandwidth / self.unit_bandwidth

    # ---- identity and formats ------------------------------------------------------------------
    @cached_property
    def fingerprint(self) -> str:
        """A hash of the normalized fabric (links, switches, sharing, hosts); the topology's and its switches'
        names are ignored (``topologies.canonical``)."""
        return _hash(canonical_bytes(self))

    @cached_property
    def fingerprints(self) -> tuple[str, ...]:
        """Every fingerprint this fabric answers to: its own, then, where it has switches, the name-dependent one
        that plans and registries recorded before switch names stopped counting."""
        legacy = _hash(legacy_bytes(self)) if self.switches else self.fingerprint
        return (self.fingerprint,) if legacy == self.fingerprint else (self.fingerprint, legacy)

    def known_as(self, fingerprint: str) -> bool:
        """Whether a plan or registry entry that records ``fingerprint`` is for this fabric."""
        return fingerprint in self.fingerprints

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": FORMAT, "name": self.name}
        if self.description:
            doc["description"] = self.description
        doc["nranks"] = self.nranks
        if self.switches:
            doc["switches"] = list(self.switches)
        if any(self.hosts):
            doc["hosts"] = list(self.hosts)
        doc["links"] = [_link_json(link) for link in self.links]
        if self.sharing:
            doc["sharing"] = [{"links": [[s, d] for s, d in g.links], "bandwidth": g.bandwidth} for g in self.sharing]
        return doc

    def to_networkx(self) -> nx.DiGraph:
        """A DiGraph with rank (int) and switch (str) nodes; edges carry bandwidth, latency, count, capacity."""
        graph = nx.DiGraph(name=self.name)
        for r in self.ranks:
            graph.add_node(r, kind="rank", host=self.hosts[r])
        for s in self.switches:
            graph.add_node(s, kind="switch")
        for link in self.links:
            graph.add_edge(
                link.src,
                link.dst,
                bandwidth=link.bandwidth,
                latency=link.latency,
                count=link.count,
                capacity=link.capacity,
            )
        return graph

    def reversed(self) -> Topology:
        """The same fabric with every link and sharing group turned around (for combining collectives)."""
        links = tuple(Link(link.dst, link.src, link.bandwidth, link.latency, link.count) for link in self.links)
        sharing = tuple(SharingGroup(tuple((d, s) for s, d in g.links), g.bandwidth) for g in self.sharing)
        return Topology(
            self.name + "~reversed", self.nranks, links, self.switches, sharing, self.hosts, self.description
        )

    def without_switches(self) -> Topology:
        """The equivalent link-sharing form: rank-to-rank links through switches plus sharing groups.

        Every ordered rank pair joined only through switches gets one link along the lowest-latency
        switch path (bandwidth = the path's narrowest capacity, latency = the path's sum). Each
        switch-side edge that several such links cross becomes a sharing group with that edge's capacity.
        """
        if not self.switches:
            return self
        return self._switch_free_form

    @cached_property
    def _switch_free_form(self) -> Topology:
        # A frozen topology's switch-free form never changes, and verify, cost, bounds and solvers each ask
        # for it; at 1024 ranks building it takes most of a minute.
        return _switch_free(self)


# ---- validation ---------------------------------------------------------------------------------


def _label(v: object) -> str:
    """A vertex as a message shows it: ranks and switch names bare, anything else as a short repr."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 10**9:
        return str(v)
    if isinstance(v, str) and v.isprintable() and 0 < len(v) <= 24:
        return v
    return short_repr(v, 24)


def _is_number(x: object) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an int beyond float's range
        return False


def find_problem(topo: Topology) -> str | None:
    """The first thing wrong with a topology, as 'field: reason', or None."""
    if not isinstance(topo.nranks, int) or isinstance(topo.nranks, bool) or topo.nranks < 1:
        return f"nranks: must be a positive integer, got {short_repr(topo.nranks)}"
    if topo.nranks > MAX_RANKS:
        return f"nranks: at most {MAX_RANKS} ranks, got {topo.nranks}"
    names: set[str] = set()
    for i, s in enumerate(topo.switches):
        if not isinstance(s, str) or not s:
            return f"switches[{i}]: a switch name must be a non-empty string, got {short_repr(s)}"
        if s in names:
            return f"switches[{i}]: duplicate switch {short_repr(s)}"
        names.add(s)
    if len(topo.hosts) != topo.nranks:
        return f"hosts: {len(topo.hosts)} entries for {topo.nranks} ranks"
    for r, h in enumerate(topo.hosts):
        if not isinstance(h, int) or isinstance(h, bool) or h < 0:
            return f"hosts[{r}]: must be a non-negative integer, got {short_repr(h)}"
    seen: set[tuple[Vertex, Vertex]] = set()
    for i, link in enumerate(topo.links):
        problem = _link_problem(link, topo.nranks, names, seen)
        if problem:
            return f"links[{i}] ({_label(link.src)}->{_label(link.dst)}){problem}"
        seen.add(link.key)
    problem = _sharing_problem(topo, names, seen)
    if problem:
        return problem
    return _reachability_problem(topo)


def _sharing_problem(topo: Topology, names: set[str], seen: set[tuple[Vertex, Vertex]]) -> str | None:
    """The first thing wrong with the sharing groups, given the switch names and the links already checked."""
    for i, group in enumerate(topo.sharing):
        if not _is_number(group.bandwidth) or not MIN_BANDWIDTH <= group.bandwidth <= MAX_BANDWIDTH * MAX_LANES:
            return (
                f"sharing[{i}].bandwidth: must be a number of GB/s from {MIN_BANDWIDTH:g} to "
                f"{MAX_BANDWIDTH * MAX_LANES:g}, got {short_repr(group.bandwidth)}"
            )
        if not group.links:
            return f"sharing[{i}].links: must list at least one link"
        for j, key in enumerate(group.links):
            if not _known_link(key, seen):
                problem = next(filter(None, (_vertex_problem(v, topo.nranks, names) for v in key)), None)
                return f"sharing[{i}].links[{j}]: " + (problem or f"no link {key[0]}->{key[1]} in the topology")
    return None


def _link_problem(link: Link, nranks: int, switches: set[str], seen: set[tuple[Vertex, Vertex]]) -> str | None:
    """What is wrong with one link, as '.field: reason' or ': reason' to follow its location."""
    for end in ("src", "dst"):
        problem = _vertex_problem(getattr(link, end), nranks, switches)
        if problem:
            return f".{end}: {problem}"
    if link.src == link.dst:
        return ": a link cannot join a vertex to itself"
    if link.key in seen:
        return ": duplicate link (bond lanes with 'count' instead)"
    if not _is_number(link.bandwidth) or not MIN_BANDWIDTH <= link.bandwidth <= MAX_BANDWIDTH:
        return (
            f".bandwidth: must be a number of GB/s from {MIN_BANDWIDTH:g} to {MAX_BANDWIDTH:g}, "
            f"got {short_repr(link.bandwidth)}"
        )
    if not _is_number(link.latency) or link.latency < 0:
        return f".latency: must be a non-negative number of µs, got {short_repr(link.latency)}"
    if not isinstance(link.count, int) or isinstance(link.count, bool) or not 1 <= link.count <= MAX_LANES:
        return f".count: must be an integer from 1 to {MAX_LANES}, got {short_repr(link.count)}"
    return None


def _known_link(key: Iterable[object], seen: set[tuple[Vertex, Vertex]]) -> bool:
    try:
        return tuple(key) in seen
    except TypeError:  # a vertex that cannot be hashed is no vertex at all
        return False


def _vertex_problem(v: object, nranks: int, switches: set[str]) -> str | None:
    if isinstance(v, bool):
        return f"not a rank or switch: {short_repr(v)}"
    if isinstance(v, int):
        return None if 0 <= v < nranks else f"rank {v} does not exist ({nranks} ranks)"
    if isinstance(v, str):
        return None if v in switches else f"unknown switch {short_repr(v)} (declare it under 'switches')"
    return f"not a rank or switch: {short_repr(v)}"


def _reachable(start: Vertex, edges: dict[Vertex, list[Vertex]]) -> set[Vertex]:
    seen = {start}
    queue = deque([start])
    while queue:
        for nxt in edges.get(queue.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _reachability_problem(topo: Topology) -> str | None:
    if topo.nranks == 1:
        return None
    fwd: dict[Vertex, list[Vertex]] = {}
    bwd: dict[Vertex, list[Vertex]] = {}
    for link in topo.links:
        fwd.setdefault(link.src, []).append(link.dst)
        bwd.setdefault(link.dst, []).append(link.src)
    down = _reachable(0, fwd)
    for r in range(topo.nranks):
        if r not in down:
            return f"rank 0 cannot reach rank {r} (the topology is disconnected)"
    up = _reachable(0, bwd)
    for r in range(topo.nranks):
        if r not in up:
            return f"rank {r} cannot reach rank 0 (the topology is disconnected)"
    return None


# ---- identity and formats -----------------------------------------------------------------------


def _hash(canonical: bytes) -> str:
    return "topo-" + hashlib.sha256(canonical).hexdigest()[:16]


def _link_json(link: Link) -> dict[str, Any]:
    doc: dict[str, Any] = {"src": link.src, "dst": link.dst, "bandwidth": link.bandwidth, "latency": link.latency}
    if link.count != 1:
        doc["count"] = link.count
    return doc


# ---- switch removal -----------------------------------------------------------------------------


def _switch_paths(topo: Topology, src: int) -> dict[int, list[Link]]:
    """Lowest-latency paths from rank src to every rank, passing through switches only."""
    import heapq

    best: dict[Vertex, tuple[float, int]] = {src: (0.0, 0)}
    via: dict[Vertex, Link] = {}
    heap: list[tuple[float, int, int, Vertex]] = [(0.0, 0, 0, src)]
    tie = 0
    paths: dict[int, list[Link]] = {}
    while heap:
        lat, hops, _, v = heapq.heappop(heap)
        if best.get(v, (math.inf, 0)) < (lat, hops):
            continue
        if isinstance(v, int) and v != src:
            path: list[Link] = []
            u: Vertex = v
            while u != src:
                path.append(via[u])
                u = via[u].src
            paths[v] = path[::-1]
            continue  # ranks are endpoints, never relays here
        for link in topo.out_links[v]:
            if v == src and isinstance(link.dst, int):
                continue  # direct rank links stay as they are
            cand = (lat + link.latency, hops + 1)
            if cand < best.get(link.dst, (math.inf, 0)):
                best[link.dst] = cand
                via[link.dst] = link
                tie += 1
                heapq.heappush(heap, (cand[0], cand[1], tie, link.dst))
    return paths


def _switch_free(topo: Topology) -> Topology:
    from topologies.switch_free import switch_free_arrays

    form = switch_free_arrays(topo)
    links = tuple(
        map(
            Link,
            form.src.tolist(),
            form.dst.tolist(),
            form.bandwidth.tolist(),
            form.latency.tolist(),
            form.count.tolist(),
        )
    )
    pairs = list(zip(form.src.tolist(), form.dst.tolist(), strict=True))
    ptr = form.group_ptr.tolist()
    members = form.group_links.tolist()
    sharing = tuple(
        SharingGroup(tuple(pairs[i] for i in members[ptr[k] : ptr[k + 1]]), bandwidth)
        for k, bandwidth in enumerate(form.group_bandwidth.tolist())
    )
    # A group over switch-side links becomes a group over the rank pairs routed across them; a pair that crosses
    # two of the group's links is counted once, so such a group is the one place this form is optimistic.
    # Valid by construction (existing ranks, positive capacities, one link per pair, connected when topo is),
    # so the checks, a third of the time at 1024 ranks, are skipped.
    return _trusted(
        name=topo.name + "~linksharing",
        nranks=topo.nranks,
        links=links,
        switches=(),
        sharing=sharing,
        hosts=topo.hosts,
        description=topo.description,
    )


def _trusted(**fields: object) -> Topology:
    """A Topology from parts derived from a valid one, built without re-running its checks."""
    topo = object.__new__(Topology)
    for name, value in fields.items():
        object.__setattr__(topo, name, value)
    return topo
