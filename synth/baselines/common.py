"""What every baseline shares: the switch-free fabric, rank slices, and turning send lists into a Schedule.

A baseline writes its algorithm as a list of steps, each a list of sends; ``assemble`` checks that every
send has a link, gives each step just enough rounds for its busiest link and sharing group, and stamps the
schedule with the algorithm's name and provenance. A symmetric algorithm (a ring, all-pairs, halving and
doubling) may list one rank's or one chunk's sends and the symmetries that repeat them
(``assemble(..., symmetries=...)``, schedules.compact): the links and rounds are still counted on every
send, as arrays over the fabric index, so nothing is built per rank pair.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from schedules.collectives import Chunking, Collective, Facts
from schedules.compact import MAX_EXPANDED_SENDS, MAX_STATE, SendTable, TooLarge, listed_table, send_table, shape_table
from schedules.loads import index_fabric
from schedules.schedule import Schedule, ScheduleMeta, Send, Step, Symmetry
from synth.errors import NotApplicable
from topologies.topology import Topology

# capacity × rounds is a float; 2.9999999999 chunks of room is 3 (the verifier rounds the same way).
SLACK = 1e-9
P = TypeVar("P")


def own(collective: Collective, rank: int) -> range:
    """The chunks of rank's slice (its input in allgather, its output in reducescatter)."""
    c = collective.chunks
    return range(rank * c, (rank + 1) * c)


def block(collective: Collective, src: int, dst: int) -> range:
    """The alltoall chunks that src sends to dst."""
    n, c = collective.nranks, collective.chunks
    return range((src * n + dst) * c, (src * n + dst + 1) * c)


@dataclass(frozen=True)
class Programs(Generic[P]):
    """A baseline's hand-written programs, one for each way data moves; ``of`` picks a collective's from its facts
    (one program per phase: allreduce runs ``combine`` then ``spread``), never from its name."""

    spread: P  # each rank's slice to every rank (allgather)
    combine: P  # every rank's contributions to a slice summed into that slice's rank (reducescatter)
    from_root: P  # the root's chunks to every rank (broadcast)
    into_root: P  # every rank's contributions summed into the root (reduce)
    slices_from_root: P  # the root's slice for each rank to that rank (scatter)
    slices_into_root: P  # each rank's slice to the root (gather)
    exchange: P  # a block from every rank to every rank (alltoall)

    def of(self, collective: Collective) -> list[P]:
        return [self._one(phase.facts) for phase in collective.phases]

    def _one(self, facts: Facts) -> P:
        shared = facts.chunking is Chunking.SHARED
        if facts.chunking is Chunking.BLOCKS:
            return self.exchange
        if facts.from_root:
            return self.from_root if shared else self.slices_from_root
        if facts.to_root:
            return self.into_root if shared else self.slices_into_root
        return self.combine if facts.combining else self.spread


def slice_symmetric(collective: Collective) -> bool:
    """Whether every permutation of the ranks maps the collective to itself, each slice moving with its rank: one
    slice per rank and no root (allgather, reducescatter, allreduce). Rings and hypercubes list one rank's sends
    and the rotations or bit flips that give the others'."""
    return not collective.rooted and collective.facts.chunking is Chunking.SLICES


def run_programs(programs: Sequence[Callable[..., list[list[Send]]]], *args: Any, **kwargs: Any) -> list[list[Send]]:
    """The steps of each phase's program (``Programs.of``), one phase after the other."""
    return [step for program in programs for step in program(*args, **kwargs)]


def host_major(topology: Topology) -> list[int]:
    """Ranks ordered host by host, so that neighbours in the order share a host wherever they can."""
    return sorted(topology.ranks, key=lambda r: (topology.hosts[r], r))


def all_pairs(topology: Topology) -> bool:
    """Whether every ordered rank pair has a link (in the switch-free form)."""
    n = topology.nranks
    return index_fabric(topology).nlinks == n * (n - 1)


def even_hosts(topology: Topology) -> bool:
    """Whether inside every host each rank has a link of one same capacity to every other (an NVSwitch, a
    full mesh): then the order of ranks inside a host does not matter."""
    fabric = index_fabric(topology)
    hosts = np.asarray(topology.hosts, np.int64)
    sizes = np.bincount(hosts)
    if int((sizes * (sizes - 1)).sum()) > fabric.nlinks:
        return False  # not even enough links for that (a 100,000-rank ring on one host)
    order = np.argsort(hosts, kind="stable")
    starts = np.cumsum(sizes) - sizes
    srcs, dsts = [], []
    for start, size in zip(starts.tolist(), sizes.tolist(), strict=True):
        members = order[start : start + size]
        grid_src, grid_dst = np.meshgrid(members, members, indexing="ij")
        off = grid_src != grid_dst
        srcs.append(grid_src[off])
        dsts.append(grid_dst[off])
    link = fabric.link_index(np.concatenate(srcs), np.concatenate(dsts))
    return bool((link >= 0).all()) and len(np.unique(fabric.capacity[link])) <= 1


def host_rotations(topology: Topology, order: list[int]) -> list[list[int]]:
    """Rotations of each host's run of ranks in order, one per GPU of the smallest host.

    On several hosts joined by all-pairs links with even hosts, each rotation is as good an order as the
    original, but crosses between hosts at other GPUs (so through other NICs), as NCCL's channels do;
    anywhere else this is just [order].
    """
    if topology.nhosts == 1 or not (all_pairs(topology) and even_hosts(topology)):
        return [order]
    hosts = dict.fromkeys(topology.hosts[r] for r in order)
    segments = [[r for r in order if topology.hosts[r] == h] for h in hosts]
    width = min(len(segment) for segment in segments)
    return [[r for segment in segments for r in segment[j:] + segment[:j]] for j in range(width)]


def check_size(method: str, fabric: str, collective: Collective, sends: int | None) -> None:
    """TooLarge, before anything is built, where the schedule has more sends than this machine expands, or its
    collective more rank × chunk cells than the verifier simulates (an all-to-all of 1024 ranks has a billion);
    ``fabric``: the topology's name, for the message."""
    if sends is not None and sends > MAX_EXPANDED_SENDS:
        raise TooLarge(
            f"{method}: {collective.name} on {fabric} is {sends:,} sends, over the "
            f"{MAX_EXPANDED_SENDS:,} this machine expands to check links and capacity (MAX_EXPANDED_SENDS)"
        )
    cells = collective.nranks * collective.nchunks
    if cells > MAX_STATE:
        raise TooLarge(
            f"{method}: {collective.name} on {fabric} is {collective.nranks:,} ranks × {collective.nchunks:,} chunks, "
            f"over the {MAX_STATE:,} cells this machine simulates to verify it (MAX_STATE)"
        )


def check_ranks(method: str, topology: Topology, collective: Collective) -> None:
    if collective.nranks != topology.nranks:
        raise NotApplicable(
            f"{method}: collective {collective.name} has {collective.nranks} ranks, "
            f"topology {topology.name} has {topology.nranks}"
        )


def require_links(method: str, topology: Topology, pairs: Iterable[tuple[int, int]], why: str) -> None:
    """NotApplicable naming the first rank pair (in the switch-free form) that has no link."""
    table = np.array(list(pairs), np.int64).reshape(-1, 2)
    _require(method, topology, table[:, 0], table[:, 1], why)


def _require(method: str, topology: Topology, src: np.ndarray, dst: np.ndarray, why: str) -> None:
    missing = np.flatnonzero(~index_fabric(topology).has_links(src, dst))
    if len(missing):
        i = int(missing[0])
        raise NotApplicable(f"{method}: topology {topology.name} has no link {src[i]}->{dst[i]} ({why})")


def step_rounds(topology: Topology, table: SendTable, nsteps: int) -> list[int]:
    """Per step, the fewest rounds in which every link and sharing group carries its load (every send of a
    compact schedule counted)."""
    fabric = index_fabric(topology)
    _, loads = table.counted(fabric)
    unit = fabric.unit_bandwidth
    need = np.ones(nsteps, np.int64)
    for step, count, capacity in (
        (loads.link_step, loads.link_count, fabric.capacity[loads.link] / unit),
        (loads.group_step, loads.group_count, fabric.group_bandwidth[loads.group] / unit),
    ):
        rounds = np.maximum(1, np.ceil(count / capacity - SLACK)).astype(np.int64)
        for _ in range(3):  # capacity × rounds is a float: raise rounds until floor(capacity × rounds) holds the load
            rounds += np.floor(capacity * rounds + SLACK) < count
        np.maximum.at(need, step, rounds)
    return need.tolist()


def assemble(
    method: str,
    topology: Topology,
    collective: Collective,
    steps: Iterable[Sequence[Send]],
    started: float,
    why: str,
    symmetries: tuple[Symmetry, ...] = (),
    **options: Any,
) -> Schedule:
    """A Schedule from per-step send lists; empty steps are dropped; ``why`` says what a missing link was for.
    With ``symmetries`` the steps are listed once and stand for all their images (a compact schedule)."""
    meta = ScheduleMeta(
        solver=method, options={"chunks": collective.chunks, **options}, solve_time=time.perf_counter() - started
    )
    name = f"{method}-{collective.name}-{topology.name}"
    if any(g.shift for g in symmetries):
        return _assemble_waves(
            method, topology, collective, [tuple(sends) for sends in steps], why, symmetries, meta, name
        )
    listed = [tuple(sends) for sends in steps if sends]
    draft = Schedule(collective, topology.fingerprint, tuple(Step(1, sends) for sends in listed), symmetries=symmetries)
    table = send_table(draft)  # refuses past MAX_EXPANDED_SENDS before any link is looked up
    _require(method, topology, table.src, table.dst, why)
    rounds = step_rounds(topology, table, len(listed))
    built = tuple(Step(r, sends) for r, sends in zip(rounds, listed, strict=True))
    return Schedule(collective, topology.fingerprint, built, name, meta, symmetries)


def _assemble_waves(
    method: str,
    topology: Topology,
    collective: Collective,
    steps: list[tuple[Send, ...]],
    why: str,
    symmetries: tuple[Symmetry, ...],
    meta: ScheduleMeta,
    name: str,
) -> Schedule:
    """A pipeline's first wave and the shift to the next: rounds counted once per shape of listed steps."""
    g = symmetries[0]
    listed = tuple(Step(1, sends) for sends in steps)
    nsteps = len(steps) + (g.order - 1) * g.shift
    draft = Schedule(collective, topology.fingerprint, listed, symmetries=symmetries, step_rounds=(1,) * nsteps)
    own = listed_table(draft)
    _require(method, topology, own.src, own.dst, why)  # the waves use the listed rank pairs
    shaped, first = shape_table(draft)
    rounds = np.asarray(step_rounds(topology, shaped, nsteps), np.int64)[first]
    alone = step_rounds(topology, own, len(steps))
    built = tuple(Step(r, sends) for r, sends in zip(alone, steps, strict=True))
    return Schedule(collective, topology.fingerprint, built, name, meta, symmetries, tuple(rounds.tolist()))


def rotation(collective: Collective, order: Sequence[int]) -> Symmetry:
    """The symmetry that moves every rank one place on along ``order`` and every rank's slice with it."""
    ranks = np.empty(collective.nranks, np.int64)
    at = np.asarray(order, np.int64)
    ranks[at] = np.roll(at, -1)
    return Symmetry(tuple(ranks.tolist()), tuple(slice_map(collective, ranks).tolist()), collective.nranks)


def slice_map(collective: Collective, ranks: np.ndarray) -> np.ndarray:
    """The chunk permutation that moves each rank's slice (alltoall: each block (s, d)) where ``ranks`` moves
    the rank."""
    n, c = collective.nranks, collective.chunks
    lane = np.arange(c)
    if collective.facts.chunking is Chunking.BLOCKS:
        s, d = np.divmod(np.arange(n * n), n)
        return ((ranks[s] * n + ranks[d])[:, None] * c + lane).ravel()
    return (ranks[:, None] * c + lane).ravel()
