"""The time-expanded chunk flow as a CP-SAT model, for collectives that only copy.

One boolean ``x[c, (u, v), k]`` says that chunk c crosses link u->v in step k. A rank holds a chunk it started
with or received in an earlier step (store-and-forward); it receives each chunk at most once, so the chunk's
sends form a tree and the reversal in ``solver`` turns them into exact-once reductions. Switches have no
buffers: the links are those of ``Topology.without_switches()``, a path through switches is one link, and the
switch and NIC ports it crosses are sharing groups. Step k lasts ``T[k] >= α_l + load_l · β_l`` for every link
it uses and ``T[k] >= α_g + load_g · β_g`` for every sharing group it uses (α_g: the largest latency of
the group's links the step uses, as ``schedules.cost`` charges it); the objective ``Σ T[k]`` is the
schedule's finish time under the same α-β model as ``schedules.cost``. A step left empty costs nothing, so
``steps`` is an upper bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import networkx as nx
from ortools.sat.python import cp_model

from schedules.collectives import Collective
from synth.milp.symmetry import Symmetry
from synth.rank_links import rank_pair
from topologies import Topology

Key = tuple[int, int, int, int]  # (chunk, src, dst, step)
# Integer time units per µs are chosen so that the longest possible step is about this many units.
_STEP_UNITS = 2_000_000


@dataclass(frozen=True)
class FlowSpec:
    """What to encode: a switch-free topology, a copy-only collective, and how far to look."""

    topology: Topology
    collective: Collective
    steps: int
    chunk_bytes: float
    links: frozenset[tuple[int, int]]
    symmetry: Symmetry | None = None  # the group whose orbits share one variable
    deadline: float = math.inf  # time.monotonic() by which the model must be built, else OutOfTime
    chunk_links: tuple[frozenset[tuple[int, int]], ...] | None = None  # per chunk, a subset of links (hierarchy)

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise OutOfTime("the time limit ran out while the model was built")

    def links_of(self, chunk: int) -> frozenset[tuple[int, int]]:
        """The links chunk may cross: the hierarchy's for that chunk, else every allowed link."""
        return self.links if self.chunk_links is None else self.chunk_links[chunk]


class OutOfTime(Exception):
    """The model was not built by its deadline (a large instance takes longer to write down than to solve)."""


@dataclass
class FlowModel:
    """The CP-SAT model and the handles needed to read a schedule back out of it."""

    model: cp_model.CpModel
    sends: dict[Key, cp_model.IntVar]
    objective: cp_model.LinearExpr
    units_per_us: float
    variables: int = 0  # distinct send variables (one per orbit of sends)
    reduces: dict[Key, cp_model.IntVar] = field(default_factory=dict)  # sends that add a partial sum


def link_cost_us(link_latency: float, capacity: float, chunk_bytes: float) -> tuple[float, float]:
    """(α, β) in µs: a step that puts n chunks on the link lasts α + n·β (capacity in GB/s)."""
    return link_latency, chunk_bytes / (capacity * 1e3)


def bandwidth_bound(links, chunk_bytes: float) -> bool:
    """Whether a chunk takes longer on some link than that link's latency (the bytes, not the hops, set the time)."""
    return any(link_cost_us(link.latency, link.capacity, chunk_bytes)[1] > link.latency for link in links)


def hop_distances(ranks: range, links: frozenset[tuple[int, int]]) -> dict[int, dict[int, int]]:
    graph = nx.DiGraph()
    graph.add_nodes_from(ranks)
    graph.add_edges_from(links)
    return dict(nx.all_pairs_shortest_path_length(graph))


def _orbits(spec: FlowSpec) -> Callable[[Key], Key]:
    """The canonical (smallest) member of a send's orbit under the symmetry's group."""
    if spec.symmetry is None or not spec.symmetry.generators:
        return lambda key: key
    generators = spec.symmetry.generators

    def orbit_min(key: Key) -> Key:
        seen, todo = {key}, [key]
        while todo:
            c, u, v, k = todo.pop()
            for ranks, chunks in generators:
                image = (chunks[c], ranks[u], ranks[v], k)
                if image not in seen:
                    seen.add(image)
                    todo.append(image)
        return min(seen)

    return orbit_min


def _distances(spec: FlowSpec) -> Callable[[int], dict[int, dict[int, int]]]:
    """Hop distances over the links chunk c may cross, computed once per distinct link set."""
    cache: dict[frozenset, dict[int, dict[int, int]]] = {}

    def of(c: int) -> dict[int, dict[int, int]]:
        links = spec.links_of(c)
        if links not in cache:
            cache[links] = hop_distances(spec.topology.ranks, links)
        return cache[links]

    return of


def _candidate_sends(spec: FlowSpec) -> list[Key]:
    """Sends that could be part of some schedule within ``steps`` steps (distance pruning)."""
    coll, topo, steps = spec.collective, spec.topology, spec.steps
    distances = _distances(spec)
    holders = {c: [r for r in topo.ranks if c in coll.precondition(r)] for c in range(coll.nchunks)}
    wanted = {
        c: [r for r in topo.ranks if c in coll.postcondition(r) and r not in holders[c]] for c in range(coll.nchunks)
    }
    keys = []
    for c in range(coll.nchunks):
        spec.check_time()
        if not wanted[c]:
            continue
        dist = distances(c)
        earliest = {r: min((dist[s].get(r, steps + 1) for s in holders[c]), default=steps + 1) for r in topo.ranks}
        to_go = {r: min((dist[r].get(d, steps + 1) for d in wanted[c]), default=steps + 1) for r in topo.ranks}
        for u, v in sorted(spec.links_of(c)):
            if v in holders[c]:
                continue
            for k in range(earliest[u] + 1, steps + 1 - to_go[v]):
                keys.append((c, u, v, k))
    return keys


def shortest_path_sends(spec: FlowSpec) -> set[Key]:
    """A schedule that sends each chunk down a shortest-path tree, one hop per step: CP-SAT's first hint.

    Among a rank's possible parents it takes the one at the smallest rank offset, so the tree is the same on
    every node up to the shift when the fabric is symmetric, as a shared variable's hint must be. A rank's
    j-th chunk starts j steps late where the steps allow (the chunks of a slice pipelined down their tree
    rather than all crossing the first hop at once), and at once otherwise.
    """
    coll, topo, n = spec.collective, spec.topology, spec.topology.nranks
    distances = _distances(spec)
    sends: set[Key] = set()
    tree_sends: dict[int, list[tuple[int, int, int]]] = {}
    for c in range(coll.nchunks):
        dist = distances(c)
        into: dict[int, list[int]] = {}
        for u, v in spec.links_of(c):
            into.setdefault(v, []).append(u)
        tree = tree_sends.setdefault(c, [])
        holders = [r for r in topo.ranks if c in coll.precondition(r)]
        depth = {r: min(dist[s].get(r, n + 1) for s in holders) for r in topo.ranks}
        todo = [r for r in topo.ranks if c in coll.postcondition(r) and depth[r] > 0]
        reached = set(holders)
        while todo:
            v = todo.pop()
            if v in reached:
                continue
            reached.add(v)
            parent = min((u for u in into.get(v, []) if depth[u] == depth[v] - 1), key=lambda u: (u - v) % n)
            tree.append((parent, v, depth[v]))
            todo.append(parent)
    deepest = max((k for tree in tree_sends.values() for _, _, k in tree), default=0)
    delay = coll.chunks - 1 if deepest + coll.chunks - 1 <= spec.steps else 0
    for c, tree in tree_sends.items():
        late = min(c % coll.chunks, delay)
        sends.update((c, u, v, k + late) for u, v, k in tree)
    return sends


def build_flow(spec: FlowSpec) -> FlowModel:
    """The CP-SAT model of ``spec``; infeasible exactly when no schedule fits in ``spec.steps`` steps."""
    model = cp_model.CpModel()
    coll, topo = spec.collective, spec.topology
    sends: dict[Key, cp_model.IntVar] = {}
    orbit_min = _orbits(spec)
    canonical: set[Key] = set()
    for key in _candidate_sends(spec):
        spec.check_time()
        rep = orbit_min(key)
        if rep == key:
            canonical.add(key)
        if rep not in sends:
            sends[rep] = model.new_bool_var("x{}_{}_{}_{}".format(*rep))
        sends[key] = sends[rep]
    hint = shortest_path_sends(spec)
    for key, var in sends.items():
        if key in canonical:
            model.add_hint(var, key in hint)

    into: dict[tuple[int, int], list[Key]] = {}
    for key in sends:
        into.setdefault((key[0], key[2]), []).append(key)
    for c in range(coll.nchunks):
        spec.check_time()
        for r in topo.ranks:
            # under the symmetry a (chunk, rank) pair's images constrain the same variables: one row per orbit
            if c in coll.precondition(r) or orbit_min((c, r, r, 0)) != (c, r, r, 0):
                continue
            arrivals = [sends[k] for k in into.get((c, r), [])]
            if c in coll.postcondition(r):
                model.add_exactly_one(arrivals)
            elif arrivals:
                model.add_at_most_one(arrivals)
    for key, var in sends.items():
        spec.check_time()
        c, u, _, k = key
        if key not in canonical or c in coll.precondition(u):
            continue
        earlier = [sends[a] for a in into.get((c, u), []) if a[3] < k]
        model.add(var <= sum(earlier))

    _host_entries(model, spec, sends)
    objective, units_per_us = _step_times(model, spec, sends, _link_orbits(spec))
    model.minimize(objective)
    return FlowModel(model, sends, objective, units_per_us, len(canonical))


def _host_entries(model: cp_model.CpModel, spec: FlowSpec, sends: dict[Key, cp_model.IntVar]) -> None:
    """A chunk wanted on a host that has no copy of it must enter that host at least once.

    Redundant for integer solutions, but the LP relaxation otherwise lets a sliver of a chunk cross
    and multiply inside the host, and its bound on the cross-host (NIC) groups falls far below the cut bound.
    """
    coll, hosts = spec.collective, spec.topology.hosts
    entering: dict[tuple[int, int], list[cp_model.IntVar]] = {}
    for (c, u, v, _), var in sends.items():
        if hosts[u] != hosts[v]:
            entering.setdefault((c, hosts[v]), []).append(var)
    for c in range(coll.nchunks):
        spec.check_time()
        held = {hosts[r] for r in spec.topology.ranks if c in coll.precondition(r)}
        wanted = {hosts[r] for r in spec.topology.ranks if c in coll.postcondition(r)}
        for host in sorted(wanted - held):
            model.add(sum(entering.get((c, host), [])) >= 1)


def _link_orbits(spec: FlowSpec) -> Callable[[tuple[tuple[int, int], ...]], tuple[tuple[int, int], ...]]:
    """The canonical image of a set of links under the symmetry's rank permutations (identity without one)."""
    if spec.symmetry is None or not spec.symmetry.generators:
        return lambda links: links
    perms = [ranks for ranks, _ in spec.symmetry.generators]

    def canonical(links: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        seen, todo = {links}, [links]
        while todo:
            current = todo.pop()
            for perm in perms:
                image = tuple(sorted((perm[u], perm[v]) for u, v in current))
                if image not in seen:
                    seen.add(image)
                    todo.append(image)
        return min(seen)

    return canonical


def _step_times(
    model: cp_model.CpModel,
    spec: FlowSpec,
    sends: dict[Key, cp_model.IntVar],
    canonical: Callable[[tuple[tuple[int, int], ...]], tuple[tuple[int, int], ...]],
):
    """Add ``T[k] >= α + load·β`` for every link and sharing group; return (Σ T[k], units per µs).

    Under the symmetry a link's (or group's) images load the same variables, so each orbit gets one row.
    """
    topo, b = spec.topology, spec.chunk_bytes
    on_link: dict[tuple[tuple[int, int], int], list[cp_model.IntVar]] = {}
    for (_, u, v, k), var in sends.items():
        on_link.setdefault(((u, v), k), []).append(var)
    terms: list[StepTerm] = []
    for (key, k), vars_ in on_link.items():
        spec.check_time()
        if canonical((key,)) != (key,):
            continue
        link = topo.link(*key)
        terms.append(StepTerm(k, *link_cost_us(link.latency, link.capacity, b), vars_, vars_))
    for group in topo.sharing:
        spec.check_time()
        members = tuple(sorted(rank_pair(tuple(key)) for key in group.links))
        if canonical(members) != members:
            continue
        terms += group_terms(spec, group, members, on_link)
    return step_objective(model, terms, spec.steps, len(sends))


@dataclass(frozen=True)
class StepTerm:
    """``T[step] >= alpha + per_chunk · Σ load`` whenever one of ``used`` is set (µs)."""

    step: int
    alpha: float
    per_chunk: float
    load: list
    used: list


def group_terms(
    spec: FlowSpec, group, members: tuple[tuple[int, int], ...], on_link: dict[tuple[tuple[int, int], int], list]
) -> list[StepTerm]:
    """A sharing group's rows per step: as ``schedules.cost`` prices it, α of the slowest link it uses plus
    the group's load at its bandwidth; one row per distinct latency a, set by the links of latency >= a."""
    topo = spec.topology
    beta = link_cost_us(0.0, group.bandwidth, spec.chunk_bytes)[1]
    latencies = sorted({topo.link(*key).latency for key in members})
    out = []
    for k in range(1, spec.steps + 1):
        load = [v for key in members for v in on_link.get((key, k), [])]
        if not load:
            continue
        for a in latencies:
            used = [v for key in members if topo.link(*key).latency >= a for v in on_link.get((key, k), [])]
            if used:
                out.append(StepTerm(k, a, beta, load, used))
    return out


def step_objective(model: cp_model.CpModel, terms: list[StepTerm], steps: int, nsends: int):
    """Step-time variables bounded below by every term; return (Σ T[k], integer units per µs)."""
    longest = max((t.alpha + len(t.load) * t.per_chunk for t in terms), default=1.0)
    scale = _STEP_UNITS / longest
    times = [model.new_int_var(0, _STEP_UNITS + nsends + 1, f"T{k}") for k in range(steps + 1)]
    for term in terms:
        a, per_chunk = round(term.alpha * scale), max(1, round(term.per_chunk * scale))
        load = sum(term.load)
        if a:
            used = model.new_bool_var("")
            model.add(sum(term.used) <= len(term.used) * used)
            model.add(times[term.step] >= a * used + per_chunk * load)
        else:
            model.add(times[term.step] >= per_chunk * load)
    return sum(times), scale
