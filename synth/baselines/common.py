"""What every baseline shares: the switch-free fabric, rank slices, and turning send lists into a Schedule.

A baseline writes its algorithm as a list of steps, each a list of sends; ``assemble`` checks that every
send has a link, gives each step just enough rounds for its busiest link and sharing group, and stamps the
schedule with the algorithm's name and provenance.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any, Iterable, Sequence

from schedules.collectives import Collective
from schedules.schedule import Schedule, ScheduleMeta, Send, Step
from synth.errors import NotApplicable
from topologies.topology import Topology

# capacity × rounds is a float; 2.9999999999 chunks of room is 3 (the verifier rounds the same way).
SLACK = 1e-9


def own(collective: Collective, rank: int) -> range:
    """The chunks of rank's slice (its input in allgather, its output in reducescatter)."""
    c = collective.chunks
    return range(rank * c, (rank + 1) * c)


def block(collective: Collective, src: int, dst: int) -> range:
    """The alltoall chunks that src sends to dst."""
    n, c = collective.nranks, collective.chunks
    return range((src * n + dst) * c, (src * n + dst + 1) * c)


def host_major(topology: Topology) -> list[int]:
    """Ranks ordered host by host, so that neighbours in the order share a host wherever they can."""
    return sorted(topology.ranks, key=lambda r: (topology.hosts[r], r))


def all_pairs(fabric: Topology) -> bool:
    """Whether every ordered rank pair has a link."""
    return all(fabric.has_link(s, d) for s in fabric.ranks for d in fabric.ranks if s != d)


def even_hosts(fabric: Topology) -> bool:
    """Whether inside every host each rank has a link of one same capacity to every other (an NVSwitch, a
    full mesh): then the order of ranks inside a host does not matter."""
    capacities = set()
    for s in fabric.ranks:
        for d in fabric.ranks:
            if s != d and fabric.hosts[s] == fabric.hosts[d]:
                if not fabric.has_link(s, d):
                    return False
                capacities.add(fabric.link(s, d).capacity)
    return len(capacities) <= 1


def host_rotations(topology: Topology, order: list[int]) -> list[list[int]]:
    """Rotations of each host's run of ranks in order, one per GPU of the smallest host.

    On several hosts joined by all-pairs links with even hosts, each rotation is as good an order as the
    original, but crosses between hosts at other GPUs (so through other NICs), as NCCL's channels do;
    anywhere else this is just [order].
    """
    fabric = topology.without_switches()
    if topology.nhosts == 1 or not (all_pairs(fabric) and even_hosts(fabric)):
        return [order]
    hosts = dict.fromkeys(topology.hosts[r] for r in order)
    segments = [[r for r in order if topology.hosts[r] == h] for h in hosts]
    width = min(len(segment) for segment in segments)
    return [[r for segment in segments for r in segment[j:] + segment[:j]] for j in range(width)]


def check_ranks(method: str, topology: Topology, collective: Collective) -> None:
    if collective.nranks != topology.nranks:
        raise NotApplicable(f"{method}: collective {collective.name} has {collective.nranks} ranks, "
                            f"topology {topology.name} has {topology.nranks}")


def require_links(method: str, topology: Topology, pairs: Iterable[tuple[int, int]], why: str) -> None:
    """NotApplicable naming the first rank pair (in the switch-free form) that has no link."""
    fabric = topology.without_switches()
    for src, dst in pairs:
        if not fabric.has_link(src, dst):
            raise NotApplicable(f"{method}: topology {topology.name} has no link {src}->{dst} ({why})")


def step_rounds(fabric: Topology, sends: Sequence[Send]) -> int:
    """The fewest rounds in which every link and sharing group of the fabric carries its load."""
    per_link = Counter((s.src, s.dst) for s in sends)
    needs = [(n, fabric.chunk_capacity(*key)) for key, n in per_link.items()]
    for group in fabric.sharing:
        load = sum(per_link.get(tuple(key), 0) for key in group.links)
        if load:
            needs.append((load, fabric.group_capacity(group)))
    return max((_rounds_for(n, capacity) for n, capacity in needs), default=1)


def _rounds_for(load: int, capacity: float) -> int:
    rounds = max(1, math.ceil(load / capacity - SLACK))
    while math.floor(capacity * rounds + SLACK) < load:
        rounds += 1
    return rounds


def assemble(method: str, topology: Topology, collective: Collective, steps: Iterable[Sequence[Send]],
             started: float, why: str, **options: Any) -> Schedule:
    """A Schedule from per-step send lists; empty steps are dropped; ``why`` says what a missing link was for."""
    steps = [list(sends) for sends in steps if sends]
    require_links(method, topology, dict.fromkeys((s.src, s.dst) for sends in steps for s in sends), why)
    fabric = topology.without_switches()
    built = tuple(Step(step_rounds(fabric, sends), tuple(sends)) for sends in steps)
    meta = ScheduleMeta(solver=method, options={"chunks": collective.chunks, **options},
                        solve_time=time.perf_counter() - started)
    return Schedule(collective, topology.fingerprint, built, f"{method}-{collective.name}-{topology.name}", meta)
