"""Lowering: a Schedule becomes each rank's Actions, with every chunk given a buffer slot.

The schedule's step semantics carry over: every send of a step reads the sender's slot as it was at the
start of the step, and what arrives lands at the end. A copy lands straight in the receiver's home slot
(its output slot, or a scratch accumulator) unless the receiver still reads that chunk in the same step,
the slot still holds another chunk's input (in place), or the protocol uses packets; everything else lands in a fresh
scratch slot. Reductions of one chunk that arrive in one step are combined by a single REDUCE action: home = current
+ every arrival.
"""

from __future__ import annotations

from collections import defaultdict

from codegen.buffers import Placement
from codegen.ir import ARRIVE, COPY, DONE, READY, REDUCE, SEND, UNPACK, Action, Loc
from schedules.compact import expand
from schedules.schedule import Schedule


def lower(schedule: Schedule, placement: Placement, packets: bool, pull: bool = False) -> list[Action]:
    """Every rank's actions for ``schedule``; with ``packets`` each transfer is an LL packet write.

    With ``pull`` a send whose chunk still sits in the sender's input becomes a read by the receiver of the
    sender's input (a ``get``, or an ``rre`` where it is summed): no scratch, no transfer step of its own, and the
    sum streams as the data arrives. The sender signals READY at its start (its caller has written the input) and
    waits, at its end, for the reader's DONE (so its caller may write the next input).
    """
    schedule = expand(schedule)  # every send, a compact schedule's images included
    collective = placement.collective
    n = collective.nranks
    loc: list[dict[int, Loc]] = [{} for _ in range(n)]
    for r in range(n):
        for c in collective.precondition(r):
            held = placement.input_loc(r, c)
            assert held is not None  # a precondition's chunks start in the input buffer
            loc[r][c] = held
    actions: list[Action] = []

    def emit(rank: int, step: int, phase: int, kind: str, peer: int | None, src, dst, **extra) -> Action:
        action = Action(rank, step, phase, len(actions), kind, peer, tuple(src), tuple(dst), packets, **extra)
        actions.append(action)
        return action

    for t, step in enumerate(schedule.steps):
        read_now = {(s.src, s.chunk) for s in step.sends}
        arrivals: dict[int, dict[int, list[tuple[str, int, Loc]]]] = defaultdict(lambda: defaultdict(list))
        for send in step.sends:
            d, c = send.dst, send.chunk
            if pull and not packets and loc[send.src][c] == placement.input_loc(send.src, c):
                arrivals[d][c].append((send.op, send.src, loc[send.src][c]))  # d reads the peer's input slot
                continue
            direct = send.op == "copy" and not packets and (d, c) not in read_now and not placement.holds_other(d, c)
            landing = placement.home(d, c) if direct else placement.new_scratch(d)
            sent = emit(send.src, t, 0, SEND, d, [loc[send.src][c]], [landing])
            if not packets:  # arrivals in send order: the k-th wait on a channel pairs with its k-th signal
                emit(d, t, 1, ARRIVE, send.src, [], [landing], sends=(sent.seq,))
            arrivals[d][c].append((send.op, send.src, landing))
        for d in sorted(arrivals):
            for c, group in sorted(arrivals[d].items()):
                _land(emit, t, d, c, group, loc[d], placement, packets)
    final = len(schedule.steps)
    if pull:
        _notices(actions, emit, final)
    for r in range(n):
        for c in sorted(collective.postcondition(r)):
            out = placement.output_loc(r, c)
            if out is not None and loc[r].get(c) not in (None, out):
                emit(r, final, 3, COPY, None, [loc[r][c]], [out])
                loc[r][c] = out
    return actions


def _land(emit, t: int, d: int, c: int, group: list, held: dict[int, Loc], placement: Placement, packets: bool) -> None:
    """Actions on rank d that combine chunk c's arrivals of step t into its state (after their ARRIVEs)."""
    home = placement.home(d, c)
    copies = [(op, src, landing) for op, src, landing in group if op == "copy"]
    reductions = [(op, src, landing) for op, src, landing in group if op == "reduce"]
    for _, src, landing in copies:
        if landing != home:
            emit(d, t, 2, UNPACK if packets else COPY, src, [landing], [home])
        held[c] = home
    if not reductions:
        return
    slots = [landing for _, _, landing in reductions]
    first_peer = reductions[0][1]
    if c not in held:  # nothing to add to: the first arrival starts the sum
        emit(d, t, 2, UNPACK if packets else COPY, first_peer, [slots[0]], [home])
        held[c], slots = home, slots[1:]
        if not slots:
            return
    emit(d, t, 2, REDUCE, first_peer, [held[c]] + slots, [home])
    held[c] = home


def _notices(actions: list[Action], emit, final: int) -> None:
    """READY and DONE around every pull: the owner of the input signals READY first thing, the reader waits for it
    right before its pull and signals DONE once the pull (and a send fused with it) is done, and the owner waits
    for DONE at its very end. Notices travel in the thread blocks that pull (``via``), so each rank's signals to a
    peer leave from one thread block, in program order."""
    pulls = [
        (a, owner)
        for a in actions
        if a.kind in (REDUCE, COPY)
        for owner in sorted({loc.rank for loc in a.src if loc.rank != a.rank})
    ]
    pulling: dict[tuple[int, int], tuple] = {}
    for a, owner in pulls:
        pulling.setdefault((a.rank, owner), a.role)
    seen = set()
    for a, owner in pulls:
        if (a.rank, owner, a.step, a.role) in seen:
            continue  # one READY and one DONE cover every pull of a step from one thread block
        seen.add((a.rank, owner, a.step, a.role))
        ready = emit(owner, 0, 0, READY, a.rank, [], [], via=pulling.get((owner, a.rank), ()))
        emit(a.rank, a.step, 1, ARRIVE, owner, [], [], sends=(ready.seq,), via=a.role)
        done = emit(a.rank, a.step, 3, DONE, owner, [], [], via=a.role)
        emit(owner, final, 3, ARRIVE, a.rank, [], [], sends=(done.seq,), via=pulling.get((owner, a.rank), ()))
