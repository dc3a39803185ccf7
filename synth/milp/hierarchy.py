"""The MILP split into an inter-host part and an intra-host part (TACCL's sketches; TE-CCL splits time instead).

Inter-host part: for every chunk and every host that wants it but starts with no copy, the cross-host hops it
may enter that host by. ``rails``: from the chunk's owner to the rank of the same local index on that host.
``trees``: the cross-host hops of the trees the tree packing (``synth.trees``, max-flow, optimal rate) gives
the chunk's root, chunk j of a root riding its tree j mod k, so the packing's balance of the NICs carries over.

Intra-host part: inside a host a chunk spreads from the ranks that hold it there (its owners, or the ranks it
enters by). On a host whose ranks are all linked to each other (an NVSwitch tray) it goes one hop from those
ranks: a relay inside such a host spends a second crossing of some rank's port and reaches no one sooner.
Elsewhere (a DGX-1 cube mesh) it may take any intra-host link.

CP-SAT then decides, in one model, which step every hop of both parts takes. On DGX-2 × 2 a chunk has 31
possible sends per step in place of 512 (the rail-allowed links), which is what lets the model hold 4 chunks
per rank and pipeline them. The split is a restriction, and an optimum within it is not the fabric's.
"""

from __future__ import annotations

from schedules.collectives import Collective
from synth.rank_links import rank, rank_pair
from topologies import Topology

INTER_HOST = ("rails", "trees")


def applies(topo: Topology, collective: Collective) -> bool:
    """Whether the split fits: several hosts, and chunks that are only copied from the ranks that own them."""
    return topo.nhosts > 1 and not collective.combining


def _complete(topo: Topology, members: list[int], links: frozenset[tuple[int, int]]) -> bool:
    return all((u, v) in links for u in members for v in members if u != v)


def rail_offsets(topo: Topology) -> tuple[int, ...]:
    """The local-index offsets a rail may cross hosts by: 0 (the same index), and 1 (the next GPU's) where
    every GPU has a NIC of its own.

    The cut bound counts every GPU's NIC as ingress, and with one rail per GPU a NIC carries only its GPU's
    share of the other host's data, so the rest of each GPU's ingress waits on its NVSwitch port (96.4% of
    the bound on hgx_h100:nodes=2 at 1 GB, the split's optimum). A second route lets a NIC take part of a
    neighbour's data as well (99.6%). Where GPUs share a NIC (dgx2, ndv2) it has no spare capacity to give.
    ``topo`` is switch-free: a NIC of one's own is a sharing group whose cross-host links leave one rank.
    """
    if topo.nhosts < 2:
        return (0,)
    cross = {link.key for link in topo.links if topo.hosts[rank(link.src)] != topo.hosts[rank(link.dst)]}
    own_port: set[tuple[int, int]] = set()
    for group in topo.sharing:
        keys = [rank_pair(tuple(key)) for key in group.links if tuple(key) in cross]
        sources, targets = {k[0] for k in keys}, {k[1] for k in keys}
        if len(sources) > 1 and len(targets) > 1:
            return (0,)  # a NIC (or port) several GPUs send through
        if len(sources) == 1:
            own_port.update(keys)
    return (0, 1) if cross and cross <= own_port else (0,)


def rail_hops(topo: Topology, collective: Collective, links: frozenset[tuple[int, int]]) -> dict[int, set]:
    """Per chunk, the cross-host hops from its owners to the ranks of the same local index elsewhere (and of
    the next one, per ``rail_offsets``)."""
    members = _members(topo)
    local = {r: members[topo.hosts[r]].index(r) for r in topo.ranks}
    offsets = rail_offsets(topo)
    hops: dict[int, set] = {}
    for c in range(collective.nchunks):
        for owner in (r for r in topo.ranks if c in collective.precondition(r)):
            for host, ranks in members.items():
                if host == topo.hosts[owner] or local[owner] >= len(ranks):
                    continue
                for d in offsets:
                    hop = (owner, ranks[(local[owner] + d) % len(ranks)])
                    if hop in links:
                        hops.setdefault(c, set()).add(hop)
    return hops


def tree_hops(
    topo: Topology,
    collective: Collective,
    trees_of: dict[int, list[tuple[tuple[int, int], ...]]],
    links: frozenset[tuple[int, int]],
) -> dict[int, set]:
    """Per chunk, the cross-host hops of its root's tree: ``trees_of[root]`` lists each tree's hops (ranks)."""
    hops: dict[int, set] = {}
    for c in range(collective.nchunks):
        for owner in (r for r in topo.ranks if c in collective.precondition(r)):
            trees = trees_of.get(owner, [])
            if not trees:
                continue
            tree = trees[(c % collective.chunks) % len(trees)]
            hops.setdefault(c, set()).update(
                (u, v) for u, v in tree if topo.hosts[u] != topo.hosts[v] and (u, v) in links
            )
    return hops


def _members(topo: Topology) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for r in topo.ranks:
        members.setdefault(topo.hosts[r], []).append(r)
    return members


def chunk_links(
    topo: Topology, collective: Collective, links: frozenset[tuple[int, int]], cross: dict[int, set]
) -> tuple[frozenset[tuple[int, int]], ...]:
    """Per chunk, the links of both parts: ``cross`` (the inter-host hops) and the intra-host spread."""
    members = _members(topo)
    complete = {h: _complete(topo, ranks, links) for h, ranks in members.items()}
    intra = {h: frozenset((u, v) for u, v in links if topo.hosts[u] == topo.hosts[v] == h) for h in members}
    out = []
    for c in range(collective.nchunks):
        hops = cross.get(c, set())
        sources = {r for r in topo.ranks if c in collective.precondition(r)} | {v for _, v in hops}
        allowed = set(hops)
        for h, ranks in members.items():
            if complete[h]:
                allowed.update((u, v) for u in ranks if u in sources for v in ranks if v != u)
            else:
                allowed.update(intra[h])
        out.append(frozenset(allowed))
    return tuple(out)
