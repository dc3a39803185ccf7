"""Range merging: consecutive actions of one thread block over consecutive chunks become one action.

A one-shot allreduce sends chunks 0..N-1 to a peer as N puts; merged, that is one put of N chunks, one
signal and one wait. Sends merge only when their arrivals on the receiver are consecutive in its thread
block too, and those arrivals merge with them, so that the k-th wait still matches the k-th signal.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from codegen.ir import ARRIVE, NOTICES, SEND, Action, Loc


def merge_ranges(actions: list[Action]) -> list[Action]:
    """The same work in fewer, larger actions (thread blocks must be assigned)."""
    programs = _programs(actions)
    arrive_of = {s: a for a in actions if a.kind == ARRIVE for s in a.sends}
    position = {id(a): (a.rank, a.tb, i) for prog in programs.values() for i, a in enumerate(prog)}
    merged_sends: dict[int, int] = {}
    out: list[Action] = []
    for prog in programs.values():
        sends = [a for a in prog if a.kind == SEND]
        for group in _runs(
            sends,
            lambda a, b: (
                _adjacent(a, b)
                and position[id(b)][2] == position[id(a)][2] + 1
                and _arrivals_adjacent(arrive_of.get(a.seq), arrive_of.get(b.seq), position)
            ),
        ):
            head = _combine(group)
            out.append(head)
            for a in group:
                merged_sends[a.seq] = head.seq
    result = []
    for prog in _programs(out + [a for a in actions if a.kind != SEND]).values():
        for group in _runs(prog, lambda a, b: _mergeable(a, b, merged_sends)):
            result.append(_combine(group))
    return sorted(result, key=lambda a: (a.rank, a.order))


def _programs(actions: list[Action]) -> dict[tuple[int, int], list[Action]]:
    programs: dict[tuple[int, int], list[Action]] = defaultdict(list)
    for a in sorted(actions, key=lambda a: a.order):
        programs[(a.rank, a.tb)].append(a)
    return programs


def _runs(prog: list[Action], joins) -> list[list[Action]]:
    runs: list[list[Action]] = []
    for a in prog:
        if runs and joins(runs[-1][-1], a):
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs


def _adjacent(a: Action, b: Action) -> bool:
    """b continues a: same kind, step, phase and peer, and every range picks up where a's ended."""
    return (
        (a.kind, a.step, a.phase, a.peer, a.packet, a.piece) == (b.kind, b.step, b.phase, b.peer, b.packet, b.piece)
        and len(a.src) == len(b.src)
        and len(a.dst) == len(b.dst)
        and all(y.follows(x) for x, y in zip(a.src, b.src, strict=True))
        and all(y.follows(x) for x, y in zip(a.dst, b.dst, strict=True))
    )


def _arrivals_adjacent(x: Action | None, y: Action | None, position: dict) -> bool:
    if x is None and y is None:
        return True  # packets: no arrival to keep in step
    if x is None or y is None:
        return False
    (r1, t1, i1), (r2, t2, i2) = position[id(x)], position[id(y)]
    return (r1, t1) == (r2, t2) and i2 == i1 + 1


def _mergeable(a: Action, b: Action, merged_sends: dict[int, int]) -> bool:
    if a.kind == SEND or a.kind in NOTICES or b.kind in NOTICES:
        return False  # sends are merged already; every notice is a signal of its own
    if a.kind == ARRIVE:
        return (
            b.kind == ARRIVE
            and (a.step, a.peer) == (b.step, b.peer)
            and all(s in merged_sends for s in a.sends + b.sends)
            and {merged_sends[s] for s in a.sends} == {merged_sends[s] for s in b.sends}
        )
    return _adjacent(a, b)


def _combine(group: list[Action]) -> Action:
    head = group[0]
    if len(group) == 1:
        return head
    if head.kind == ARRIVE:
        slots = sorted({s for a in group for loc in a.dst for s in loc.slots()})
        return replace(head, dst=_ranges(slots), sends=tuple(s for a in group for s in a.sends))
    size = sum(a.src[0].size if a.src else a.dst[0].size for a in group)
    return replace(
        head,
        src=tuple(replace(loc, size=size) for loc in head.src),
        dst=tuple(replace(loc, size=size) for loc in head.dst),
    )


def _ranges(slots: list[Loc]) -> tuple[Loc, ...]:
    out: list[Loc] = []
    for s in slots:
        if out and s.follows(out[-1]):
            out[-1] = replace(out[-1], size=out[-1].size + 1)
        else:
            out.append(s)
    return tuple(out)
