"""Launch safety: which channels need an entry handshake so that a plan can run again on the same buffers.

A rank's launch k+1 follows only its own launch k (stream order), so a write by rank p into rank r's buffers
in launch k+1 may overtake r, which is still in launch k. The write is safe when every access of its slot in
the earlier launch that used the slot happens before it: launch k, or k-1 for a double scratch buffer (its
halves alternate). Within one launch, let ``reaches(e)`` be the ranks that an access e happens before (its own
rank included) and ``after(w)`` the ranks whose launch start happens before the write w. Across one launch
boundary, e precedes w when the two sets meet: e happens before the end of some rank's launch, whose next
launch starts before w. Across two boundaries, when some rank in ``reaches(e)`` starts a launch that happens
before the end of a launch of some rank in ``after(w)``.

The accesses of a slot are its rank's own actions on it and every send that lands in it; the input and output
buffers are also touched by the caller between launches (new input in, result out), so a write into a peer's
input or output needs the peer's launch start before it. Happens-before edges within a launch: thread-block
order, semaphores between thread blocks, signal -> wait for Simple sends and packet write -> packet read.
Every edge runs forward in ``(step, phase, seq)`` order, so one pass each way computes both sets.
"""

from __future__ import annotations

from collections import defaultdict

from codegen.ir import ARRIVE, NOTICES, SEND, Action


def unsafe_channels(
    actions: list[Action], needs: dict[int, dict[int, Action]], double_scratch: bool
) -> set[tuple[int, int, int]]:
    """(writer rank, reader rank, instance) of every channel whose writes may overtake the reader's previous launch.

    ``needs`` holds the semaphore edges: action seq -> thread block -> the action it waits for there.
    """
    ordered, after, reaches = launch_order(actions, needs)
    if double_scratch:  # an access reaches the ends of the launches that its reached ranks start next
        started: dict[int, int] = defaultdict(int)  # rank -> the ranks whose next launch it starts
        for a in ordered:
            for s in _ranks(after[a.seq]):
                started[s] |= 1 << a.rank
        reaches = {seq: _union(started[s] for s in _ranks(mask)) for seq, mask in reaches.items()}
    masks: dict[tuple, set[int]] = defaultdict(set)  # slot -> what its accesses reach
    for a in ordered:
        for slot in _slots(a.dst) if a.kind == SEND else _slots(a.src if a.kind != ARRIVE else ()) + _slots(a.dst):
            masks[slot].add(reaches[a.seq])
    unsafe: set[tuple[int, int, int]] = set()
    for w in ordered:
        if w.kind != SEND or w.peer is None:  # a send always names its peer
            continue
        channel = (w.rank, w.peer, w.instance)
        if channel in unsafe:
            continue
        for slot in _slots(w.dst):
            # input and output: the peer's caller reads and writes them between its launches
            safe = after[w.seq] >> w.peer & 1 if slot[1] != "s" else all(m & after[w.seq] for m in masks[slot])
            if not safe:
                unsafe.add(channel)
                break
    return unsafe


def launch_order(
    actions: list[Action], needs: dict[int, dict[int, Action]]
) -> tuple[list[Action], dict[int, int], dict[int, int]]:
    """(the actions in order, ``after``, ``reaches``): per action seq, the ranks (a bit mask) whose launch start
    happens before it, and those whose launch end it happens before, within one launch."""
    ordered = sorted(actions, key=lambda a: a.order)
    preds = _predecessors(ordered, needs)
    after: dict[int, int] = {}
    for a in ordered:
        after[a.seq] = 1 << a.rank
        for p in preds[a.seq]:
            after[a.seq] |= after[p]
    reaches = {a.seq: 1 << a.rank for a in ordered}
    for a in reversed(ordered):
        for p in preds[a.seq]:
            reaches[p] |= reaches[a.seq]
    return ordered, after, reaches


def _predecessors(ordered: list[Action], needs: dict[int, dict[int, Action]]) -> dict[int, list[int]]:
    """Action seq -> the seqs of the actions it directly happens after, within one launch."""
    preds: dict[int, list[int]] = defaultdict(list)
    last_in_tb: dict[tuple[int, int], int] = {}
    sends = {a.seq for a in ordered if a.kind == SEND or a.kind in NOTICES}
    packet_send: dict[tuple, int] = {}
    for a in ordered:
        tb = (a.rank, a.tb)
        if tb in last_in_tb:
            preds[a.seq].append(last_in_tb[tb])
        last_in_tb[tb] = a.seq
        preds[a.seq].extend(b.seq for b in needs.get(a.seq, {}).values())
        if a.kind == ARRIVE:
            preds[a.seq].extend(s for s in a.sends if s in sends)
        elif packet_send:
            preds[a.seq].extend(packet_send[s] for s in _slots(a.src) if s in packet_send)
        if a.kind == SEND and a.packet:
            for s in _slots(a.dst):
                packet_send[s] = a.seq
    return preds


def _slots(locs) -> list[tuple[int, str, int]]:
    """(rank, buffer, index) of every chunk slot of ``locs`` (tuples: lighter than Locs, and this runs per chunk)."""
    return [(loc.rank, loc.type, k) for loc in locs for k in range(loc.index, loc.index + loc.size)]


def _ranks(mask: int) -> list[int]:
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


def _union(masks) -> int:
    out = 0
    for m in masks:
        out |= m
    return out
