"""Ring algorithms over a directed Hamiltonian cycle of the topology.

The cycle is host-major when inside every host each rank pair has a link of one capacity and host-major
is a cycle (then the order inside a host does not matter and host-major crosses hosts least); otherwise a
depth-first search with a bounded number of expansions looks for one, trying same-host and fatter links
first. Position i of the cycle sends to position i+1.

A slice of several chunks spreads its chunks over several rings that run side by side: the cycle and its
reverse (when that is links too), and on multi-host fabrics one ring per GPU of a host, each crossing
between hosts at other GPUs (NCCL's channels). With one chunk per slice there is one ring.

>>> from topologies.topology import Link, Topology
>>> from schedules.collectives import Collective
>>> ring4 = Topology("ring4", 4, tuple(Link(r, (r + 1) % 4, 25.0) for r in range(4)))
>>> ring(ring4, Collective("allreduce", 4)).nsteps
6
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from itertools import zip_longest

import numpy as np

from schedules.collectives import Chunking, Collective, Facts
from schedules.loads import index_fabric
from schedules.schedule import Schedule, Send
from synth.baselines.common import (
    Programs,
    assemble,
    check_ranks,
    check_size,
    even_hosts,
    host_major,
    host_rotations,
    rotation,
    run_programs,
    slice_symmetric,
)
from synth.errors import NotApplicable
from topologies.topology import Topology

SEARCH_BUDGET = 200_000  # DFS expansions before the cycle search gives up

Lanes = Sequence[int]  # which chunks of each slice (0..chunks-1) one ring carries


def ring(topology: Topology, collective: Collective) -> Schedule:
    """The ring algorithm for any of the eight collectives, over a Hamiltonian cycle of the topology."""
    started = time.perf_counter()
    check_ranks("ring", topology, collective)
    check_size("ring", topology.name, collective, ring_sends(collective))
    order = hamiltonian_cycle(topology)
    routes = _routes(topology, order)
    programs = _PROGRAMS.of(collective)
    used = min(collective.chunks, len(routes))
    if used == 1 and slice_symmetric(collective) and collective.nranks > 1 and order == sorted(order):
        # one chunk's trajectory, and the rotation along the ring that gives every other slice's (on a ring in
        # rank order, whose expansion lists each step's sends in ring order, as the explicit form does)
        steps = run_programs(programs, order, collective, range(collective.chunks), only=order[0])
        return assemble(
            "ring",
            topology,
            collective,
            steps,
            started,
            "a ring edge",
            (rotation(collective, order),),
            order=order,
            rings=[list(order)],
        )
    # Route q carries chunks q, q+used, ... of every slice; all routes run side by side, step for step.
    per_route = [run_programs(programs, routes[q], collective, range(q, collective.chunks, used)) for q in range(used)]
    steps = [[send for sends in step for send in sends] for step in zip_longest(*per_route, fillvalue=[])]
    return assemble(
        "ring",
        topology,
        collective,
        steps,
        started,
        "a ring edge",
        order=order,
        rings=[list(route) for route in routes[:used]],
    )


def ring_sends(collective: Collective) -> int:
    """How many sends the ring algorithm makes, before any is built."""
    n = collective.nranks
    return (n - 1) * collective.chunks * sum(_per_hop(phase.facts, n) for phase in collective.phases)


def _per_hop(facts: Facts, n: int) -> int:
    """Slices (or blocks) each of a phase's N-1 steps sends, on average: one shared slice streams down a chain;
    every rank's slice moves each step; a rooted slice crosses half the chain; a block half the ring."""
    if facts.chunking is Chunking.SHARED:
        return 1
    if facts.chunking is Chunking.BLOCKS:
        return n * n // 2
    return n // 2 if facts.rooted else n


def _routes(topology: Topology, order: list[int]) -> list[list[int]]:
    """The rings that may share the chunks: each host rotation of the cycle, and its reverse if that is links."""
    n = len(order)
    at = np.asarray(order, np.int64)
    reversible = n > 2 and bool(index_fabric(topology).has_links(np.roll(at, -1), at).all())
    cycles = host_rotations(topology, order)
    return [route for cycle in cycles for route in ([cycle, cycle[::-1]] if reversible else [cycle])]


def hamiltonian_cycle(topology: Topology, budget: int = SEARCH_BUDGET) -> list[int]:
    """A directed cycle through every rank of the switch-free form, as a rank order; NotApplicable if none."""
    order = host_major(topology)
    n = len(order)
    at = np.asarray(order, np.int64)
    if n == 1 or (even_hosts(topology) and bool(index_fabric(topology).has_links(at, np.roll(at, -1)).all())):
        return order
    found, exhausted = _search(topology.without_switches(), order[0], budget)
    if found:
        return found
    if exhausted:
        raise NotApplicable(
            f"ring: topology {topology.name} has no Hamiltonian cycle (a directed cycle "
            "through every rank over its links)"
        )
    raise NotApplicable(f"ring: no Hamiltonian cycle found in topology {topology.name} within {budget} search steps")


def _search(fabric: Topology, start: int, budget: int) -> tuple[list[int] | None, bool]:
    """Depth-first search for a Hamiltonian cycle from start: (cycle or None, whether the search was exhaustive).

    Iterative, with one candidate iterator per depth, so that thousands of ranks do not hit Python's recursion limit.
    """
    nexts = {r: [link.dst for link in fabric.out_links[r] if isinstance(link.dst, int)] for r in fabric.ranks}
    capacity = {link.key: link.capacity for link in fabric.links}
    path, seen = [start], {start}

    def candidates(rank: int) -> Iterator[int]:
        # Same host first, fat links next, then Warnsdorff's rule: the rank with fewest ways on.
        free = [d for d in nexts[rank] if d not in seen]
        return iter(
            sorted(
                free,
                key=lambda d: (
                    fabric.hosts[d] != fabric.hosts[rank],
                    -capacity[(rank, d)],
                    sum(x not in seen for x in nexts[d]),
                    d,
                ),
            )
        )

    pending = [candidates(start)]
    while pending:
        if len(path) == fabric.nranks and fabric.has_link(path[-1], start):
            return path, True
        step = next(pending[-1], None) if len(path) < fabric.nranks else None
        if step is None:
            pending.pop()
            seen.discard(path.pop())
            continue
        budget -= 1
        if budget < 0:
            return None, False
        path.append(step)
        seen.add(step)
        pending.append(candidates(step))
    return None, True


def _slice(collective: Collective, rank: int, lanes: Lanes) -> list[int]:
    return [rank * collective.chunks + j for j in lanes]


def _block(collective: Collective, src: int, dst: int, lanes: Lanes) -> list[int]:
    """The alltoall chunks src sends to dst."""
    return [(src * collective.nranks + dst) * collective.chunks + j for j in lanes]


def _allgather(order: list[int], collective: Collective, lanes: Lanes, only: int | None = None) -> list[list[Send]]:
    """At step k position i forwards the slice that started k positions back (``only``: that rank's slice alone)."""
    n = len(order)
    if only is not None:
        j = order.index(only)
        return [
            [Send(chunk, order[(j + k) % n], order[(j + k + 1) % n]) for chunk in _slice(collective, only, lanes)]
            for k in range(n - 1)
        ]
    return [
        [
            Send(chunk, order[i], order[(i + 1) % n])
            for i in range(n)
            for chunk in _slice(collective, order[(i - k) % n], lanes)
        ]
        for k in range(n - 1)
    ]


def _reducescatter(order: list[int], collective: Collective, lanes: Lanes, only: int | None = None) -> list[list[Send]]:
    """The slice of the rank at position j starts at j+1 and gathers one contribution per hop."""
    n = len(order)
    if only is not None:
        j = order.index(only)
        return [
            [
                Send(chunk, order[(j + 1 + k) % n], order[(j + 2 + k) % n], "reduce")
                for chunk in _slice(collective, only, lanes)
            ]
            for k in range(n - 1)
        ]
    return [
        [
            Send(chunk, order[i], order[(i + 1) % n], "reduce")
            for i in range(n)
            for chunk in _slice(collective, order[(i - 1 - k) % n], lanes)
        ]
        for k in range(n - 1)
    ]


def _chain_from(order: list[int], root: int) -> list[int]:
    """The cycle cut open so that it starts at root."""
    at = order.index(root)
    return order[at:] + order[:at]


def _chain_to(order: list[int], root: int) -> list[int]:
    """The cycle cut open so that it ends at root."""
    at = order.index(root) + 1
    return order[at:] + order[:at]


def _broadcast(order: list[int], collective: Collective, lanes: Lanes) -> list[list[Send]]:
    """Chunks stream down the chain: hop h carries the chunk m = t-h at step t."""
    chain = _chain_from(order, collective.root)
    return [
        [Send(lanes[t - h], chain[h], chain[h + 1]) for h in range(len(chain) - 1) if 0 <= t - h < len(lanes)]
        for t in range(len(lanes) + len(chain) - 2)
    ]


def _reduce(order: list[int], collective: Collective, lanes: Lanes) -> list[list[Send]]:
    """Chunks stream up the chain into root, each hop adding its rank's contribution."""
    chain = _chain_to(order, collective.root)
    return [
        [Send(lanes[t - h], chain[h], chain[h + 1], "reduce") for h in range(len(chain) - 1) if 0 <= t - h < len(lanes)]
        for t in range(len(lanes) + len(chain) - 2)
    ]


def _gather(order: list[int], collective: Collective, lanes: Lanes) -> list[list[Send]]:
    """Hop h sends its own slice first, then relays what came in: slice of chain[h-t] at step t."""
    chain = _chain_to(order, collective.root)
    n = len(chain)
    return [
        [
            Send(chunk, chain[h], chain[h + 1])
            for h in range(t, n - 1)
            for chunk in _slice(collective, chain[h - t], lanes)
        ]
        for t in range(n - 1)
    ]


def _scatter(order: list[int], collective: Collective, lanes: Lanes) -> list[list[Send]]:
    """The farthest slice leaves root first; hop h carries the slice of chain[n-1-(t-h)] at step t."""
    chain = _chain_from(order, collective.root)
    n = len(chain)
    return [
        [
            Send(chunk, chain[h], chain[h + 1])
            for h in range(t + 1)
            for chunk in _slice(collective, chain[n - 1 - (t - h)], lanes)
        ]
        for t in range(n - 1)
    ]


def _alltoall(order: list[int], collective: Collective, lanes: Lanes) -> list[list[Send]]:
    """Every block travels forward around the ring; at step t those with more than t hops to go move on."""
    n = len(order)
    steps = []
    for t in range(n - 1):
        sends = []
        for i in range(n):
            src = order[(i - t) % n]
            for hops in range(t + 1, n):
                dst = order[(i - t + hops) % n]
                sends += [Send(chunk, order[i], order[(i + 1) % n]) for chunk in _block(collective, src, dst, lanes)]
        steps.append(sends)
    return steps


# the programs in Programs' order, each taking (order, collective, lanes); spread and combine also take only=
_PROGRAMS: Programs[Callable[..., list[list[Send]]]] = Programs(
    _allgather, _reducescatter, _broadcast, _reduce, _scatter, _gather, _alltoall
)
