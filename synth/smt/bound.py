"""Lower bounds that steer the SMT search: steps from hop distances, rounds per chunk from an LP.

The rounds-per-chunk bound is a multicommodity-flow LP (OR-Tools GLOP): each chunk of the collective with
one chunk per rank-slice is a commodity that flows from the ranks holding it to every rank needing it;
flows to different ranks may share a link (``x[c, link]`` carries chunk c once however many ranks it
feeds), and every link and sharing group carries at most ``capacity × T``. Any schedule with R rounds and
C chunks gives a feasible point with T = R/C, so R/C >= T*.

>>> from topologies.topology import Link, Topology
>>> from schedules.collectives import Collective
>>> ring = Topology("ring4", 4, tuple(Link(i, (i + 1) % 4, 1.0) for i in range(4)))
>>> rounds_per_chunk_bound(ring, Collective("allgather", 4))
Fraction(3, 1)
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from ortools.linear_solver import pywraplp

from schedules.collectives import Collective
from synth.errors import SynthesisError
from synth.smt.encoding import hop_distances
from topologies.topology import Topology, Vertex

MAX_LP_VARIABLES = 400_000  # past this the in-capacity bound is used: weaker, but instant


def steps_bound(fabric: Topology, collective: Collective) -> int:
    """The fewest steps any schedule needs: the farthest (holder, needer) hop distance of any chunk."""
    dist = hop_distances(fabric)
    worst = 0
    for _, holders, needers in _demands(collective):
        for r in needers:
            worst = max(worst, min(dist[h].get(r, 10**9) for h in holders))
    return max(worst, 1)


def rounds_per_chunk_bound(fabric: Topology, collective: Collective) -> Fraction:
    """A lower bound on rounds/chunks for a non-combining collective on a switch-free fabric."""
    unit = Collective(collective.name, collective.nranks, 1, collective.root)
    demands = [d for d in _demands(unit) if d[2]]
    size = sum(len(needers) + 1 for _, _, needers in demands) * len(fabric.links)
    if not demands:
        return Fraction(0)
    if size > MAX_LP_VARIABLES:
        return _in_capacity_bound(fabric, unit)
    return _lp_bound(fabric, demands)


def _demands(collective: Collective) -> list[tuple[int, list[int], list[int]]]:
    holders: dict[int, list[int]] = {c: [] for c in range(collective.nchunks)}
    needers: dict[int, list[int]] = {c: [] for c in range(collective.nchunks)}
    for r in range(collective.nranks):
        for c in collective.precondition(r):
            holders[c].append(r)
    for r in range(collective.nranks):
        for c in collective.postcondition(r):
            if r not in holders[c]:
                needers[c].append(r)
    return [(c, holders[c], needers[c]) for c in range(collective.nchunks)]


def _lp_bound(fabric: Topology, demands: list[tuple[int, list[int], list[int]]]) -> Fraction:
    lp = pywraplp.Solver.CreateSolver("GLOP")
    t = lp.NumVar(0, lp.infinity(), "T")
    keys = [link.key for link in fabric.links]
    load: dict[tuple[Vertex, Vertex], list[Any]] = {key: [] for key in keys}  # link -> its LP send variables
    for c, holders, needers in demands:
        carried = {key: lp.NumVar(0, lp.infinity(), f"x_{c}_{key[0]}_{key[1]}") for key in keys}
        for key, var in carried.items():
            load[key].append(var)
        for d in needers:
            flow = {key: lp.NumVar(0, lp.infinity(), f"f_{c}_{d}_{key[0]}_{key[1]}") for key in keys}
            for key, var in flow.items():
                lp.Add(var <= carried[key])
            for v in fabric.ranks:
                if v in holders:
                    continue
                net = sum(flow[link.key] for link in fabric.in_links[v]) - sum(
                    flow[link.key] for link in fabric.out_links[v]
                )
                lp.Add(net == (1 if v == d else 0))
    for link in fabric.links:
        lp.Add(sum(load[link.key]) <= fabric.chunk_capacity(*link.key) * t)
    for group in fabric.sharing:
        lp.Add(sum(v for key in group.links for v in load[(key[0], key[1])]) <= fabric.group_capacity(group) * t)
    lp.Minimize(t)
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        raise SynthesisError(f"smt: topology {fabric.name}: the rounds-per-chunk LP has no optimum")
    return Fraction(t.solution_value()).limit_denominator(1000)


def _in_capacity_bound(fabric: Topology, collective: Collective) -> Fraction:
    """Each rank receives what it lacks through its in-links: R/C >= lacking / in-capacity."""
    best = Fraction(0)
    for r in fabric.ranks:
        lacking = len(collective.postcondition(r) - collective.precondition(r))
        capacity = sum(fabric.chunk_capacity(link.src, link.dst) for link in fabric.in_links[r])
        if lacking:
            best = max(best, Fraction(lacking) / Fraction(capacity).limit_denominator(1000))
    return best
