"""Thread-block and channel assignment: which thread block of a rank runs each action.

A thread block serves at most one send peer and one receive peer (per instance), as in MSCCL: every
ordered pair of ranks then has exactly one sending and one receiving thread block, so signals and waits on
their channel pair match in order. Receive and send roles are paired where chunks flow through the rank
(received from a, forwarded to b, as on a ring), so that the combine and the forward share a thread block
and fuse into one op; the other roles get thread blocks of their own, which run in parallel. Local copies
get one more thread block. Channels are named by ``(peer, direction, instance)``; ``codegen.assemble``
numbers them.

``duplex``: a receive role whose chunks flow nowhere shares the thread block of the send role to the same peer
(and instance), so one block per peer both writes the peer and waits for it. In a direct all-to-all every
receive role only waits (the peer writes the data), so per-peer blocks spin on half the SMs they hold; duplex
blocks keep them all writing, and twice the instances fit the GPU (``weft tune --duplex``). The plan's proof on
the reference executor decides whether a schedule's order allows it (a block waiting before its own put would
deadlock there).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from codegen.ir import SEND, Action


def assign_threadblocks(actions: list[Action], duplex: bool = False) -> None:
    """Set ``action.tb`` for every action, numbering each rank's thread blocks from 0."""
    by_rank: dict[int, list[Action]] = defaultdict(list)
    for a in actions:
        by_rank[a.rank].append(a)
    for rank_actions in by_rank.values():
        tb_of_role = _pair_roles(rank_actions, duplex)
        for a in rank_actions:
            a.tb = tb_of_role[a.role]


def _pair_roles(actions: list[Action], duplex: bool = False) -> dict[tuple, int]:
    """Role -> thread block: receive roles matched to the send role their chunks flow into, greedily; with
    ``duplex``, each receive role left over with the send role to its peer."""
    writer: dict = {}
    flows: Counter = Counter()
    for a in sorted(actions, key=lambda a: a.order):
        if a.kind == SEND:
            for slot in a.src[0].slots():
                source = writer.get(slot)
                if source is not None and source[0] == "recv" and source[2] == a.instance:
                    flows[(source, a.role)] += 1
        for slot in a.writes():
            writer[slot] = a.role
    roles = sorted({a.role for a in actions}, key=lambda r: (r[2], r[0], r[1]))
    partner: dict[tuple, tuple] = {}
    for (recv, send), _ in sorted(flows.items(), key=lambda kv: (-kv[1], kv[0])):
        if recv not in partner and send not in partner:
            partner[recv], partner[send] = send, recv
    if duplex:
        for recv in (r for r in roles if r[0] == "recv" and r not in partner):
            send = ("send", recv[1], recv[2])
            if send in roles and send not in partner:
                partner[recv], partner[send] = send, recv
    tb_of_role: dict[tuple, int] = {}
    for role in roles:
        if role in tb_of_role:
            continue
        tb_of_role[role] = len(set(tb_of_role.values()))
        if role in partner:
            tb_of_role[partner[role]] = tb_of_role[role]
    return tb_of_role
