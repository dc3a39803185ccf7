"""One-shot algorithms: every rank talks to every rank it must, straight over a link.

``direct`` moves each chunk once, from a rank that has it to the rank that wants it, in a single step.
Its allreduce is the one-shot form: each rank reduces its contribution to every chunk into every other
rank, so each rank adds up all N contributions itself. ``twoshot`` is the allreduce that first
reduces each slice into its owner (a direct reducescatter) and then copies the sums out (a direct allgather).

>>> from topologies.topology import Link, Topology
>>> from schedules.collectives import Collective
>>> fc3 = Topology("fc3", 3, tuple(Link(s, d, 25.0) for s in range(3) for d in range(3) if s != d))
>>> direct(fc3, Collective("allreduce", 3)).nsteps, twoshot(fc3, Collective("allreduce", 3)).nsteps
(1, 2)
"""

from __future__ import annotations

import time
from functools import cache

from schedules.collectives import Collective
from schedules.schedule import Schedule, Send, Symmetry
from synth.baselines.common import assemble, check_ranks, check_size, own, require_links, rotation
from synth.errors import NotApplicable
from topologies.topology import Topology


def direct(topology: Topology, collective: Collective) -> Schedule:
    """All-pairs, one step: every rank sends straight to every rank that needs its data."""
    started = time.perf_counter()
    check_ranks("direct", topology, collective)
    why = "direct sends every chunk straight from a rank that holds it to one that needs it"
    n = collective.nranks
    if collective.facts.sums_everywhere and n > 1:
        # rank 0's sends of chunk 0, the rotation r -> r+1 (every rank holds every chunk: no chunk moves with
        # it) and the chunk map c -> c+1, which moves no rank: verified and priced folded (schedules.compact),
        # n(n-1) rows for the n(n-1)·n sends
        check_size("direct", topology.name, collective, direct_sends(collective))
        ranks = tuple(range(1, n)) + (0,)
        chunks = tuple(range(1, collective.nchunks)) + (0,)
        everything = tuple(range(collective.nchunks))
        return assemble(
            "direct",
            topology,
            collective,
            [[Send(0, 0, dst, "reduce") for dst in range(1, n)]],
            started,
            why,
            (Symmetry(ranks, everything, n), Symmetry(tuple(range(n)), chunks, collective.nchunks)),
        )
    if not collective.rooted and n > 1:
        # rank 0's sends, and the rotation r -> r+1 that gives every other rank's
        check_size("direct", topology.name, collective, direct_sends(collective))
        return assemble(
            "direct",
            topology,
            collective,
            [_direct_sends(collective, only=0)],
            started,
            why,
            (rotation(collective, range(n)),),
        )
    require_links("direct", topology, _pairs(collective), why)  # before building N² sends of nothing
    return assemble("direct", topology, collective, [_direct_sends(collective)], started, why)


def twoshot(topology: Topology, collective: Collective) -> Schedule:
    """Allreduce as a direct reducescatter then a direct allgather: two steps."""
    started = time.perf_counter()
    if not collective.facts.phases:  # the reducescatter + allgather collective
        raise NotApplicable(
            f"twoshot: exists for allreduce only (it is reducescatter + allgather); "
            f"use --method direct for {collective.name}"
        )
    check_ranks("twoshot", topology, collective)
    n = collective.nranks
    check_size("twoshot", topology.name, collective, twoshot_sends(collective))
    # rank 0's sends, and the rotation r -> r+1 that gives every other rank's
    scatter = [Send(chunk, 0, dst, "reduce") for dst in range(1, n) for chunk in own(collective, dst)]
    gather = [Send(chunk, 0, dst) for dst in range(1, n) for chunk in own(collective, 0)]
    return assemble(
        "twoshot",
        topology,
        collective,
        [scatter, gather],
        started,
        "two-shot exchanges slices between every pair of ranks",
        (rotation(collective, range(n)),),
    )


def direct_sends(collective: Collective) -> int | None:
    """How many sends direct holds as arrays, before any is built (None: a rooted collective, N sends at most per
    chunk). The one-shot all-reduce holds one per rank pair: its chunk map is folded (schedules.compact)."""
    if collective.facts.sums_everywhere:
        return collective.nranks * (collective.nranks - 1)
    return pair_sends(collective)


def pair_sends(collective: Collective) -> int | None:
    """How many sends moving every rank's data straight to every rank makes (None: a rooted collective)."""
    n = collective.nranks
    if collective.rooted:
        return None
    # every rank needs every chunk's contribution from every other (allreduce), else one slice or block of each
    per_pair = collective.nchunks if collective.facts.sums_everywhere else collective.chunks
    return n * (n - 1) * per_pair


def twoshot_sends(collective: Collective) -> int:
    n = collective.nranks
    return 2 * n * (n - 1) * collective.chunks


def _pairs(collective: Collective, only: int | None = None) -> list[tuple[int, int]]:
    """The rank pairs a direct schedule talks over: to or from the root, or every pair (``only``: from that rank)."""
    n, root = collective.nranks, collective.root
    sources = range(n) if only is None else [only]
    if collective.facts.from_root:
        return [(root, d) for d in range(n) if d != root and root in sources]
    if collective.facts.to_root:
        return [(s, root) for s in sources if s != root]
    return [(s, d) for s in sources for d in range(n) if s != d]


def _direct_sends(collective: Collective, only: int | None = None) -> list[Send]:
    """Every send, or with ``only`` those from that rank, read off the pre- and postconditions: each rank pair
    moves the chunks that the source starts with and the destination must end with but lacks (in a combining
    collective every rank contributes to every chunk: all that the destination must end with)."""
    starts = cache(collective.precondition)
    ends = cache(collective.postcondition)
    op = "reduce" if collective.combining else "copy"
    sends = []
    for s, d in _pairs(collective, only):
        moved = ends(d) if collective.combining else (starts(s) & ends(d)) - starts(d)
        sends += [Send(chunk, s, d, op) for chunk in sorted(moved)]
    return sends
