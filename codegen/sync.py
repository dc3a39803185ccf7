"""Synchronization: ops for every action, with signal/wait for cross-rank and semaphores for cross-block order.

Cross-rank: a Simple send is a ``put`` then a ``signal`` on the channel to the receiver; the matching arrival waits
on the receiver's end of that channel pair until that very signal came: the n-th wait pairs with the n-th signal, so
an arrival whose send was the n-th on its channel waits up to n (lowering emits arrivals in send order, so that is
one wait each; counting keeps the pairing right whatever the order). Packet sends need neither (a packet carries its
own flag). Within a rank, an action that reads a slot another thread block wrote (or writes a slot another thread
block wrote or still reads) waits for it: the producer block ``sem_release``s a semaphore kept for that (producer,
consumer) pair after the action, and the consumer ``sem_acquire``s it up to that release before its own action.
Every edge runs forward in ``(step, phase, seq)`` order, which every thread block follows, so the result cannot
deadlock.

Across launches: where a peer's write could overtake this rank's previous launch (``codegen.launches``), an
entry handshake orders it: the receiving rank signals on that channel as its first op, and the writer waits
for that signal right before its first send on it. The signal comes first and waits on nothing, so it
overlaps the writer's work before the send, and it runs against the data direction of the channel pair
(whose other counter only carries data signals), so it costs one signal and one wait per channel per launch.
"""

from __future__ import annotations

from collections import defaultdict

from codegen.ir import ARRIVE, COPY, NOTICES, REDUCE, SEND, UNPACK, Action, Channel, Draft, direction
from codegen.lamport import lamport_unsafe_channels
from codegen.launches import unsafe_channels


def insert_sync(
    actions: list[Action], double_scratch: bool = False, lamport: bool = False
) -> dict[int, dict[int, list[Draft]]]:
    """rank -> thread block -> its ops in order (``double_scratch``: the plan alternates scratch halves;
    ``lamport``: its scratch rotates and is reset, ``codegen.lamport``)."""
    by_rank: dict[int, list[Action]] = defaultdict(list)
    for a in sorted(actions, key=lambda a: a.order):
        by_rank[a.rank].append(a)
    signal = _signal_numbers(actions)
    needs = {rank: _dependencies(rank_actions) for rank, rank_actions in by_rank.items()}
    edges = {s: n for per in needs.values() for s, n in per.items()}
    gated = lamport_unsafe_channels(actions, edges) if lamport else unsafe_channels(actions, edges, double_scratch)
    programs = {
        rank: _rank_programs(rank_actions, needs[rank], signal, gated) for rank, rank_actions in sorted(by_rank.items())
    }
    add_entry_handshake(programs, actions, gated)
    return programs


def add_entry_handshake(
    programs: dict[int, dict[int, list[Draft]]], actions: list[Action], gated: set[tuple[int, int, int]]
) -> None:
    """Open every launch with a ready signal from each reader on its gated channels (writer, reader, instance).

    The writers' waits are placed by ``_rank_programs`` before their first send on each gated channel. A
    reader signals from the thread block that receives on the channel, or else from its first thread block.
    """
    receiver: dict[tuple[int, int, int], int] = {}
    first_tb: dict[int, int] = {}
    for a in sorted(actions, key=lambda a: a.order):
        first_tb.setdefault(a.rank, a.tb)
        if a.peer is not None and a.kind != SEND:
            receiver.setdefault((a.peer, a.rank, a.instance), a.tb)
    for writer, reader, instance in sorted(gated, reverse=True):  # each block's signals end up in channel order
        tb = receiver.get((writer, reader, instance), first_tb[reader])
        channel = Channel(writer, direction(writer, reader), instance)
        programs[reader].setdefault(tb, []).insert(0, Draft("signal", channels=(channel,)))


def _signal_numbers(actions: list[Action]) -> dict[int, int]:
    """Send seq -> how many signals its channel has carried once it signalled (Simple sends only)."""
    count: dict[tuple[int, int, int], int] = defaultdict(int)
    number = {}
    for a in sorted(actions, key=lambda a: a.order):
        if a.signals:
            key = (a.rank, a.partner, a.instance)
            count[key] += 1
            number[a.seq] = count[key]
    return number


def _dependencies(actions: list[Action]) -> dict[int, dict[int, Action]]:
    """For each action (by seq), the latest action of every other thread block it must follow."""
    writer: dict = {}
    readers: dict = defaultdict(list)
    needs: dict[int, dict[int, Action]] = defaultdict(dict)

    def need(a: Action, b: Action | None) -> None:
        if b is not None and b.tb != a.tb:
            held = needs[a.seq].get(b.tb)
            if held is None or held.order < b.order:
                needs[a.seq][b.tb] = b

    for a in actions:
        reads, writes = a.reads(), a.writes()
        for slot in reads:
            need(a, writer.get(slot))
        for slot in writes:
            need(a, writer.get(slot))
            for r in readers[slot]:
                need(a, r)
        for slot in reads:
            readers[slot].append(a)
        for slot in writes:
            writer[slot], readers[slot] = a, []
    return needs


def _rank_programs(
    actions: list[Action], needs: dict[int, dict[int, Action]], signal: dict[int, int], gated: set[tuple[int, int, int]]
) -> dict[int, list[Draft]]:
    semaphore: dict[tuple[int, int], int] = {}
    releases: dict[tuple[int, int], list[int]] = defaultdict(list)  # (producer, consumer) -> producer seqs
    for a in actions:
        for tb, b in needs[a.seq].items():
            key = (tb, a.tb)
            semaphore.setdefault(key, len(semaphore))
            if b.seq not in releases[key]:
                releases[key].append(b.seq)
    order = {a.seq: a.order for a in actions}
    for key in releases:
        releases[key].sort(key=order.__getitem__)
    release_after: dict[int, list[int]] = defaultdict(list)
    for key, seqs in releases.items():
        for s in seqs:
            release_after[s].append(semaphore[key])
    acquired: dict[tuple[int, int], int] = defaultdict(int)
    waited: dict[tuple[int, int], int] = defaultdict(int)  # (peer, instance) -> waits done on that channel end
    programs: dict[int, list[Draft]] = defaultdict(list)
    for a in actions:
        ops = programs[a.tb]
        for tb, b in sorted(needs[a.seq].items()):
            key = (tb, a.tb)
            count = releases[key].index(b.seq) + 1
            for _ in range(count - acquired[key]):
                ops.append(Draft("sem_acquire", semaphores=(semaphore[key],)))
            acquired[key] = max(acquired[key], count)
        if a.kind == ARRIVE:
            key = (a.partner, a.instance)
            upto = max(signal[s] for s in a.sends if s in signal)
            ops.extend(_ops(a) * max(0, upto - waited[key]))
            waited[key] = max(waited[key], upto)
        elif a.kind == SEND and (a.rank, a.peer, a.instance) in gated:
            gated = gated - {(a.rank, a.partner, a.instance)}  # the first send on the channel waits; the rest follow it
            ops.append(Draft("wait", channels=(Channel(a.partner, direction(a.rank, a.partner), a.instance),)))
            ops.extend(_ops(a))
        else:
            ops.extend(_ops(a))
        for sem in sorted(release_after[a.seq]):
            ops.append(Draft("sem_release", semaphores=(sem,)))
    return dict(sorted(programs.items()))


def _ops(a: Action) -> list[Draft]:
    if a.kind in NOTICES:
        return [Draft("signal", channels=(Channel(a.partner, direction(a.rank, a.partner), a.instance),))]
    pulled = tuple(Channel(loc.rank, direction(loc.rank, a.rank), a.instance) for loc in a.src if loc.rank != a.rank)
    if a.kind == SEND:
        channel = Channel(a.partner, direction(a.rank, a.partner), a.instance)
        if a.packet:
            return [Draft("ppkt", a.src, a.dst, (channel,))]
        return [Draft("put", a.src, a.dst, (channel,)), Draft("signal", channels=(channel,))]
    if a.kind == ARRIVE:
        return [Draft("wait", channels=(Channel(a.partner, direction(a.partner, a.rank), a.instance),))]
    if a.kind == REDUCE:
        if a.packet:
            return [Draft("repkt", a.src, a.dst, packet_src=(False,) + (True,) * (len(a.src) - 1))]
        return [Draft("rre" if pulled else "re", a.src, a.dst, pulled)]
    if a.kind == UNPACK:
        return [Draft("upkt", a.src, a.dst, packet_src=(True,))]
    assert a.kind == COPY
    return [Draft("get", a.src, a.dst, pulled) if pulled else Draft("copy", a.src, a.dst)]
