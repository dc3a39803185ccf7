"""Recursive halving and doubling: log2(N) steps, each between partners that differ in one bit of the rank.

Reducescatter halves (highest bit first: each rank reduces into its partner the half of its slices
that the partner's side owns); allgather doubles (lowest bit first: each rank copies everything it has to
its partner); allreduce is the one then the other. Broadcast, reduce, gather and scatter are the binomial
trees on the same partners, counted from the root (rank ``r ^ root``); alltoall is the hypercube
store-and-forward exchange. Needs a power-of-two rank count and a link both ways between partners.

>>> from topologies.topology import Link, Topology
>>> from schedules.collectives import Collective
>>> fc4 = Topology("fc4", 4, tuple(Link(s, d, 25.0) for s in range(4) for d in range(4) if s != d))
>>> rhd(fc4, Collective("allreduce", 4)).nsteps
4
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from schedules.collectives import Collective
from schedules.schedule import Schedule, Send, Symmetry
from synth.baselines.common import (
    Programs,
    assemble,
    block,
    check_ranks,
    check_size,
    own,
    require_links,
    run_programs,
    slice_map,
    slice_symmetric,
)
from synth.errors import NotApplicable
from topologies.topology import Topology


def rhd(topology: Topology, collective: Collective) -> Schedule:
    """Recursive halving/doubling for any of the eight collectives on a power-of-two rank count."""
    started = time.perf_counter()
    check_ranks("rhd", topology, collective)
    n = collective.nranks
    if n & (n - 1):
        raise NotApplicable(f"rhd: needs a power-of-two number of ranks; topology {topology.name} has {n}")
    check_size("rhd", topology.name, collective, rhd_sends(collective))
    for bit in _bits(n):
        require_links("rhd", topology, ((r, r ^ bit) for r in range(n)), f"partners at distance {bit}")
    if slice_symmetric(collective):
        # rank 0's sends, and the bit flips r -> r ^ 2^b that give every other rank's
        flips = tuple(_flip(collective, bit) for bit in _bits(n))
        steps = run_programs(_PROGRAMS.of(collective), collective, 0)
        return assemble("rhd", topology, collective, steps, started, "partners", flips)
    steps = run_programs(_PROGRAMS.of(collective), collective)
    return assemble("rhd", topology, collective, steps, started, "partners")


def rhd_sends(collective: Collective) -> int | None:
    """How many sends rhd makes, before any is built (None: the rooted and all-to-all forms, not estimated)."""
    n = collective.nranks
    if not slice_symmetric(collective):
        return None
    return len(collective.phases) * n * (n - 1) * collective.chunks


def _flip(collective: Collective, bit: int) -> Symmetry:
    ranks = np.arange(collective.nranks) ^ bit
    return Symmetry(tuple(ranks.tolist()), tuple(slice_map(collective, ranks).tolist()), 2)


def _bits(n: int) -> list[int]:
    """The partner distances 1, 2, 4, ... below n."""
    return [1 << b for b in range(n.bit_length() - 1)]


def _reducescatter(collective: Collective, only: int | None = None) -> list[list[Send]]:
    """Every rank's sends (``only``: that rank's)."""
    n = collective.nranks
    steps = []
    for bit in reversed(_bits(n)):
        # Rank r still owns the slices that agree with it on every bit above `bit`; it hands the partner's half on.
        steps.append(
            [
                Send(chunk, r, r ^ bit, "reduce")
                for r in _senders(n, only)
                for x in _near(r, 2 * bit)
                if x & bit != r & bit
                for chunk in own(collective, x)
            ]
        )
    return steps


def _allgather(collective: Collective, only: int | None = None) -> list[list[Send]]:
    n = collective.nranks
    steps = []
    for bit in _bits(n):
        # Rank r holds the slices of every rank that differs from it only in the bits below `bit`.
        steps.append(
            [Send(chunk, r, r ^ bit) for r in _senders(n, only) for x in _near(r, bit) for chunk in own(collective, x)]
        )
    return steps


def _senders(n: int, only: int | None) -> range | list[int]:
    return range(n) if only is None else [only]


def _near(r: int, span: int) -> range:
    """The ranks that agree with r on every bit from span (a power of two) up."""
    base = r & ~(span - 1)
    return range(base, base + span)


def _broadcast(collective: Collective) -> list[list[Send]]:
    n, root = collective.nranks, collective.root
    return [
        [Send(chunk, v ^ root, (v | bit) ^ root) for v in range(bit) for chunk in range(collective.nchunks)]
        for bit in _bits(n)
    ]


def _reduce(collective: Collective) -> list[list[Send]]:
    n, root = collective.nranks, collective.root
    return [
        [
            Send(chunk, v ^ root, (v ^ bit) ^ root, "reduce")
            for v in range(bit, 2 * bit)
            for chunk in range(collective.nchunks)
        ]
        for bit in reversed(_bits(n))
    ]


def _gather(collective: Collective) -> list[list[Send]]:
    """Relative rank v with lowest set bit `bit` sends the slices of v .. v+bit-1 to v - bit."""
    n, root = collective.nranks, collective.root
    return [
        [
            Send(chunk, v ^ root, (v - bit) ^ root)
            for v in range(bit, n, 2 * bit)
            for u in range(v, v + bit)
            for chunk in own(collective, u ^ root)
        ]
        for bit in _bits(n)
    ]


def _scatter(collective: Collective) -> list[list[Send]]:
    """Relative rank v, a multiple of 2·bit, sends the slices of v+bit .. v+2·bit-1 to v + bit."""
    n, root = collective.nranks, collective.root
    return [
        [
            Send(chunk, v ^ root, (v + bit) ^ root)
            for v in range(0, n, 2 * bit)
            for u in range(v + bit, v + 2 * bit)
            for chunk in own(collective, u ^ root)
        ]
        for bit in reversed(_bits(n))
    ]


def _alltoall(collective: Collective) -> list[list[Send]]:
    """After the bits done so far, rank r holds the blocks (s, d) with s like r on the bits to do and d on the rest."""
    n = collective.nranks
    steps = []
    done = 0
    for bit in _bits(n):
        sends = []
        for r in range(n):
            sources = [s for s in range(n) if (s ^ r) & ~done & (n - 1) == 0]
            targets = [d for d in range(n) if (d ^ r) & done == 0 and (d ^ r) & bit]
            sends += [Send(chunk, r, r ^ bit) for s in sources for d in targets for chunk in block(collective, s, d)]
        steps.append(sends)
        done |= bit
    return steps


# the programs in Programs' order; spread and combine also take only=, one rank's sends
_PROGRAMS: Programs[Callable[..., list[list[Send]]]] = Programs(
    _allgather, _reducescatter, _broadcast, _reduce, _scatter, _gather, _alltoall
)
