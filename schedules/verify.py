"""The independent verifier: re-simulate chunk possession step by step and check every rule.

It shares no code with any solver, so a solver bug cannot hide behind the check that is meant to catch it.
What each rank holds of each chunk is a set of rank contributions, kept as an ``int`` bitmask (bit r =
rank r's contribution). For collectives that only move data a held chunk is the mask 1. A ``copy``
overwrites the destination's mask with the source's, a ``reduce`` ORs it in, and an overlap between the
two masks is a contribution counted twice. Python ints make the copy free (the same object is shared) and
keep a 1024-rank allreduce in memory.

Checks, by name: ``topology`` (fingerprint), ``nranks``, ``sends`` (chunk and ranks exist), ``links``
(a link src->dst in the switch-free form), ``possession``, ``writes`` (a chunk that arrives by copy arrives
alone in its step), ``reductions`` (each contribution once; no reduce in a collective that does not
combine), ``capacity`` (per step and link, per step and sharing group) and ``postconditions``. Errors come
in stages, each in step order: sends and links, capacity, the simulation (possession, writes,
reductions), postconditions. Links, sharing groups and capacity are counted with numpy
(``schedules.loads``), on the topology's switch-free form.

>>> from schedules.collectives import Collective
>>> from schedules.schedule import Schedule, Send, Step
>>> from topologies.topology import Link, Topology
>>> pair = Topology("pair", 2, (Link(0, 1, 25.0), Link(1, 0, 25.0)))
>>> s = Schedule(Collective("allgather", 2), pair.fingerprint, (Step(1, (Send(0, 0, 1), Send(1, 1, 0))),))
>>> verify(s, pair).ok
True
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schedules import compact
from schedules.budget import require
from schedules.compact import SendTable, send_table
from schedules.loads import FabricIndex, count_loads, index_fabric
from schedules.schedule import Schedule, Send
from topologies.topology import SharingGroup, Topology
from weftcore.errors import CheckFailed

# indexed by rank * nchunks + chunk: a list over every slot, or a dict of the simulated chunks' slots
State = list[int] | dict[int, int]

CHECKS = ("topology", "nranks", "sends", "links", "possession", "writes", "reductions", "capacity", "postconditions")
MAX_LISTED = 1000  # errors kept verbatim; a badly wrong schedule can break every one of a million sends
QUICK_SLOTS = 1 << 20  # (rank, chunk) slots simulated in about a second; beyond, too few sends fail at once
SLACK = 1e-9  # capacity × rounds is a float; 2.9999999999 chunks of room is 3


class VerificationFailed(CheckFailed):
    """The schedule broke a rule; the message gives the first error and how many others there are."""


@dataclass(frozen=True)
class Verification:
    """The verdict; ``omitted`` counts errors beyond the first ``MAX_LISTED``, which are not spelled out."""

    ok: bool
    errors: tuple[str, ...]
    checks: tuple[str, ...]
    omitted: int = 0

    @property
    def nerrors(self) -> int:
        return len(self.errors) + self.omitted


@dataclass
class _Errors:
    """Collects error lines, keeping the first MAX_LISTED and counting the rest."""

    lines: list[str] = field(default_factory=list)
    omitted: int = 0

    def add(self, line: str) -> None:
        if len(self.lines) < MAX_LISTED:
            self.lines.append(line)
        else:
            self.omitted += 1


def require_valid(schedule: Schedule, topology: Topology, source: str | None = None) -> Verification:
    """``verify``, raising VerificationFailed unless the schedule passes. ``source``: the file it was read from,
    for the message (default: the schedule's name)."""
    result = verify(schedule, topology)
    if not result.ok:
        others = result.nerrors - 1
        tail = f" (and {others} more error{'s' if others != 1 else ''})" if others else ""
        name = source or schedule.name or schedule.collective.name
        raise VerificationFailed(f"schedule {name}: verification failed: {result.errors[0]}{tail}")
    return result


def verify(schedule: Schedule, topology: Topology) -> Verification:
    """Check a schedule against a topology; never raises for a wrong schedule, it reports."""
    errors = _Errors()
    collective = schedule.collective
    require(
        estimate_bytes(schedule),
        f"verifying schedule {schedule.name or collective.name} "
        f"({collective.nranks} ranks x {collective.nchunks} chunks)",
    )
    nsends = schedule.nsends  # a compact schedule's images counted
    if nsends < collective.min_sends and collective.nranks * collective.nchunks > QUICK_SLOTS:
        # refuted without simulating (which would take minutes); a smaller schedule is simulated for its errors
        return Verification(
            False,
            (
                f"postcondition: {nsends} send{'s' * (nsends != 1)}, but {collective.name} of "
                f"{collective.nchunks} chunks on {collective.nranks} ranks needs at least "
                f"{collective.min_sends}",
            ),
            ("sends", "postconditions"),
        )
    if not topology.known_as(schedule.topology):
        errors.add(_fingerprint_error(schedule.topology, topology))
    if collective.nranks != topology.nranks:
        errors.add(
            f"collective {collective.name}: nranks: {collective.nranks} ranks, "
            f"but topology {topology.name} has {topology.nranks}"
        )
        return Verification(False, tuple(errors.lines), ("topology", "nranks"))
    if schedule.symmetries:
        problems = compact.symmetry_errors(schedule)
        if problems:
            for line in problems:
                errors.add(line)
            return Verification(False, tuple(errors.lines), ("topology", "nranks", "symmetry"))
    fabric = index_fabric(topology)
    if compact.shifted(schedule):  # a pipeline's waves: the listed wave's links, and loads per shape of steps
        arrays = compact.listed_table(schedule)
        link = _check_sends(arrays, collective.nranks, collective.nchunks, fabric, errors)
        shaped, _ = compact.shape_table(schedule)
        _check_capacity(shaped, _links(shaped, collective.nranks, fabric), fabric, errors)
    else:
        arrays = send_table(schedule)
        link = _check_sends(arrays, collective.nranks, collective.nchunks, fabric, errors)
        _check_capacity(arrays, link, fabric, errors)
    # A compact schedule is simulated on one chunk per orbit of its symmetry (sound: schedules.compact);
    # sends over no link are left out of the simulation (reported above).
    keep = link >= 0
    wanted = compact.orbit_representatives(schedule) if schedule.symmetries else None
    if wanted is not None:
        keep &= wanted[np.clip(arrays.chunk, 0, len(wanted) - 1)]
    state = _initial_state(schedule, wanted)
    per_step: Sequence[Sequence[Send]]
    if keep.all() and not schedule.symmetries:
        per_step = [step.sends for step in schedule.steps]
    else:
        per_step = _sends_by_step(arrays, keep, len(schedule.steps))
    for index, sends in enumerate(per_step):
        _apply_step(index, sends, state, schedule, errors)
    _check_postconditions(state, schedule, errors, wanted)
    checks = CHECKS + ("symmetry",) if schedule.symmetries else CHECKS
    return Verification(not errors.lines, tuple(errors.lines), checks, errors.omitted)


def estimate_bytes(schedule: Schedule) -> int:
    """About the memory ``verify`` holds: a slot per (rank, chunk), each a contribution mask where the
    collective combines, and the send arrays (measured: 8 bytes a slot, 40 a mask, 100 a send)."""
    c = schedule.collective
    mask = 40 + c.nranks // 8 if c.combining else 0
    return c.nranks * c.nchunks * (8 + mask) + 64 * c.nchunks + 100 * sum(len(step.sends) for step in schedule.steps)


def _fingerprint_error(stated: str, topology: Topology) -> str:
    hint = ""
    if topology.switches and stated == topology.without_switches().fingerprint:
        hint = " (that is its switch-free form's fingerprint; schedules record the topology's own)"
    return f"topology: the schedule is for {stated}, not {topology.name} ({topology.fingerprint}){hint}"


def _describe(send: Send) -> str:
    return f"[{send.chunk}, {send.src}->{send.dst} {send.op}]"


def _ranks_in(mask: int, limit: int = 4) -> str:
    ranks: list[int] = []
    rank = 0
    while mask and len(ranks) <= limit:
        if mask & 1:
            ranks.append(rank)
        mask >>= 1
        rank += 1
    shown = ", ".join(map(str, ranks[:limit]))
    return shown + (", ..." if len(ranks) > limit else "")


def _initial_state(schedule: Schedule, wanted: np.ndarray | None = None) -> State:
    """Indexed by rank * nchunks + chunk: the contribution mask that rank holds of chunk. With ``wanted`` (the
    chunks a compact schedule is simulated on) a dict of those chunks' slots, missing slots holding nothing."""
    collective = schedule.collective
    nchunks = collective.nchunks
    if wanted is not None:
        reps = np.flatnonzero(wanted)
        rows, cols = np.nonzero(compact.condition_table(schedule, post=False)[:, reps])
        marks = [1 << r for r in range(collective.nranks)] if collective.combining else [1] * collective.nranks
        sparse: dict[int, int] = defaultdict(int)
        for rank, chunk in zip(rows.tolist(), reps[cols].tolist(), strict=True):
            sparse[rank * nchunks + chunk] = marks[rank]
        return sparse
    state = [0] * (collective.nranks * nchunks)
    for rank in range(collective.nranks):
        mark = 1 << rank if collective.combining else 1
        for chunk in collective.precondition(rank):
            state[rank * nchunks + chunk] = mark
    return state


def _sends_by_step(arrays: SendTable, keep: np.ndarray, nsteps: int) -> list[list[Send]]:
    """The kept sends as Send objects, one list per step."""
    step = arrays.step[keep]
    ops = np.where(arrays.reduce[keep], "reduce", "copy").tolist()
    sends = list(map(Send, arrays.chunk[keep].tolist(), arrays.src[keep].tolist(), arrays.dst[keep].tolist(), ops))
    bounds = np.searchsorted(step, np.arange(nsteps + 1)).tolist()
    return [sends[bounds[i] : bounds[i + 1]] for i in range(nsteps)]


def _links(arrays: SendTable, nranks: int, fabric: FabricIndex) -> np.ndarray:
    """The link of each send, -1 where a rank does not exist or there is no link (reported elsewhere)."""
    fine = (arrays.src >= 0) & (arrays.src < nranks) & (arrays.dst >= 0) & (arrays.dst < nranks)
    link = np.full(len(arrays.step), -1, np.int64)
    link[fine] = fabric.link_index(arrays.src[fine], arrays.dst[fine])
    return link


def _send_at(arrays: SendTable, i: int) -> Send:
    return Send(int(arrays.chunk[i]), int(arrays.src[i]), int(arrays.dst[i]), "reduce" if arrays.reduce[i] else "copy")


def _check_sends(arrays: SendTable, nranks: int, nchunks: int, fabric: FabricIndex, errors: _Errors) -> np.ndarray:
    """The link each send crosses, or -1 for a send that names no real chunk, rank or link (reported)."""
    bad_chunk = (arrays.chunk < 0) | (arrays.chunk >= nchunks)
    bad_rank = (arrays.src < 0) | (arrays.src >= nranks) | (arrays.dst < 0) | (arrays.dst >= nranks)
    link = np.full(len(arrays.step), -1, np.int64)
    fine = ~(bad_chunk | bad_rank)
    link[fine] = fabric.link_index(arrays.src[fine], arrays.dst[fine])
    for i in np.flatnonzero(link < 0)[: MAX_LISTED + 1].tolist():
        send = _send_at(arrays, i)
        where = f"step {arrays.step[i]} send {_describe(send)}"
        if bad_chunk[i]:
            errors.add(f"{where}: chunk {send.chunk} does not exist ({nchunks} chunks)")
        elif bad_rank[i]:
            errors.add(f"{where}: rank does not exist ({nranks} ranks)")
        else:
            errors.add(f"{where}: no link {send.src}->{send.dst} in topology {fabric.topology.name}")
    errors.omitted += max(0, int((link < 0).sum()) - (MAX_LISTED + 1))
    return link


def _check_capacity(arrays: SendTable, link: np.ndarray, fabric: FabricIndex, errors: _Errors) -> None:
    usable = link >= 0
    loads = arrays.counted(fabric)[1] if usable.all() else count_loads(fabric, arrays.step[usable], link[usable])
    unit = fabric.unit_bandwidth
    found = []
    link_chunks = fabric.capacity[loads.link] / unit
    link_room = np.floor(link_chunks * arrays.rounds[loads.link_step] + SLACK)
    for row in np.flatnonzero(loads.link_count > link_room).tolist():
        step, key = int(loads.link_step[row]), int(fabric.link_keys[loads.link[row]])
        src, dst = divmod(key, fabric.topology.nranks)
        found.append(
            (
                step,
                f"step {step}: link {src}->{dst} carries {loads.link_count[row]} chunks, over its "
                f"capacity of {link_room[row]:.0f} ({arrays.rounds[step]} rounds x "
                f"{link_chunks[row]:g} chunks per round)",
            )
        )
    group_chunks = fabric.group_bandwidth[loads.group] / unit
    group_room = np.floor(group_chunks * arrays.rounds[loads.group_step] + SLACK)
    for row in np.flatnonzero(loads.group_count > group_room).tolist():
        step, group = int(loads.group_step[row]), fabric.topology.sharing[loads.group[row]]
        found.append(
            (
                step,
                f"step {step}: sharing group {_describe_group(group)} carries {loads.group_count[row]} "
                f"chunks, over its capacity of {group_room[row]:.0f} ({arrays.rounds[step]} rounds x "
                f"{group_chunks[row]:g} chunks per round)",
            )
        )
    for _, line in sorted(found, key=lambda item: item[0]):
        errors.add(line)


def _describe_group(group: SharingGroup) -> str:
    shown = ", ".join(f"{s}->{d}" for s, d in group.links[:3])
    more = f", ... {len(group.links)} links" if len(group.links) > 3 else ""
    return f"[{shown}{more}; {group.bandwidth:g} GB/s]"


def _apply_step(index: int, sends: Sequence[Send], state: State, schedule: Schedule, errors: _Errors) -> None:
    """Read every source at the step's start, then land every write at its end."""
    nchunks = schedule.collective.nchunks
    combining = schedule.collective.combining
    writes: dict[int, list[Any]] = {}  # state slot -> [op, mask, first send]
    for send in sends:
        if send.op == "reduce" and not combining:
            errors.add(
                f"step {index} send {_describe(send)}: reduce in {schedule.collective.name}, "
                "a collective that does not combine"
            )
            continue
        mask = state[send.src * nchunks + send.chunk]
        if not mask:
            errors.add(f"step {index} send {_describe(send)}: rank {send.src} does not hold chunk {send.chunk}")
            continue
        slot = send.dst * nchunks + send.chunk
        pending = writes.get(slot)
        if pending is None:
            writes[slot] = [send.op, mask, send]
        elif pending[0] == "copy" or send.op == "copy":
            errors.add(
                f"step {index} send {_describe(send)}: rank {send.dst} also receives "
                f"{_describe(pending[2])} for chunk {send.chunk} in this step, and one of them is a copy"
            )
        elif pending[1] & mask:
            errors.add(
                f"step {index} send {_describe(send)}: double-counted: chunk {send.chunk} reaches rank "
                f"{send.dst} twice in this step with the contribution of rank(s) "
                f"{_ranks_in(pending[1] & mask)}"
            )
            pending[1] |= mask
        else:
            pending[1] |= mask
    for slot, (op, mask, send) in writes.items():
        if op == "copy":
            state[slot] = mask
            continue
        held = state[slot]
        if held & mask:
            errors.add(
                f"step {index} send {_describe(send)}: double-counted: rank {send.dst} already holds the "
                f"contribution of rank(s) {_ranks_in(held & mask)} to chunk {send.chunk}"
            )
        state[slot] = held | mask


def _check_postconditions(
    state: State, schedule: Schedule, errors: _Errors, wanted_chunks: np.ndarray | None = None
) -> None:
    """``wanted_chunks``: a mask of the chunks to check (a compact schedule's orbit representatives)."""
    collective = schedule.collective
    nchunks = collective.nchunks
    full = (1 << collective.nranks) - 1 if collective.combining else None
    if wanted_chunks is not None:
        reps = np.flatnonzero(wanted_chunks)
        needed = compact.condition_table(schedule, post=True)[:, reps]
    for rank in range(collective.nranks):
        base = rank * nchunks
        wanted = sorted(collective.postcondition(rank)) if wanted_chunks is None else reps[needed[rank]].tolist()
        if full is None:
            short = [c for c in wanted if not state[base + c]]
            if short:
                errors.add(f"postcondition: rank {rank} lacks chunk(s) {_first(short)} ({len(short)} of {len(wanted)})")
            continue
        short = [c for c in wanted if state[base + c] != full]
        if short:
            missing = full & ~state[base + short[0]]
            errors.add(
                f"postcondition: rank {rank} lacks the full sum of chunk(s) {_first(short)} "
                f"({len(short)} of {len(wanted)}; chunk {short[0]} misses rank(s) {_ranks_in(missing)})"
            )


def _first(chunks: list[int], limit: int = 6) -> str:
    shown = ", ".join(map(str, chunks[:limit]))
    return shown + (", ..." if len(chunks) > limit else "")
