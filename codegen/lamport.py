"""Launch safety for Lamport plans: which channels need an entry handshake so that no write overtakes a reset.

A Lamport plan's scratch rotates over ``buffers`` copies, and launch c resets copy (c + reset_ahead) % buffers to
the sentinel while it runs (``schedules.lamport``). With 3 copies reset 2 launches ahead, a packet write w into
rank r's scratch in launch m lands in the copy that r reset during launch m-2, so w must follow the end of r's
launch m-2, that is the start of r's launch m-1. That start precedes the end of launch m-1 of every rank that an
action of r in a launch reaches (r included); each of those ranks starts launch m afterwards. So w is safe when one
of those ranks' starts happens before w within the launch (``codegen.launches``' ``after``): a one-shot all-reduce
needs nothing, since every rank waits for every peer's data. Writes into a peer's input or output follow the same
rule as in any plan (the peer's launch start before them). Where a write is not ordered so, the channel opens the
launch with the entry handshake (``codegen.sync``).
"""

from __future__ import annotations

from codegen.ir import SEND, Action
from codegen.launches import _slots, launch_order


def lamport_unsafe_channels(actions: list[Action], needs: dict[int, dict[int, Action]]) -> set[tuple[int, int, int]]:
    """(writer rank, reader rank, instance) of every channel whose writes may overtake the reader's reset."""
    ordered, after, reaches = launch_order(actions, needs)
    ended: dict[int, int] = {}  # rank -> the ranks whose launch ends after this rank's launch starts
    for a in ordered:
        ended[a.rank] = ended.get(a.rank, 1 << a.rank) | reaches[a.seq]
    unsafe: set[tuple[int, int, int]] = set()
    for w in ordered:
        if w.kind != SEND or w.peer is None:
            continue
        channel = (w.rank, w.peer, w.instance)
        for slot in _slots(w.dst):
            # a scratch slot: after the reader's previous start; input and output: after the reader's own start
            need = ended.get(w.peer, 1 << w.peer) if slot[1] == "s" else 1 << w.peer
            if not need & after[w.seq]:
                unsafe.add(channel)
                break
    return unsafe
