"""Which links the flow may use: the sketch's relays, rails across hosts, and no slow detours.

At sizes where a chunk's transfer time exceeds the link latency (bandwidth-bound), two pruning rules cut the
model to the links a good schedule uses anyway, so CP-SAT spends its time on pipelining:

- rails: a cross-host send goes between GPUs of the same local index (or the next one where every GPU has
  its own NIC: ``hierarchy.rail_offsets``). The NICs' capacity is what limits these sizes, and fanning a
  chunk out to many remote GPUs spends it for nothing;
- detours: a link through a shared port (a member of a sharing group) is dropped when some rank relays
  between its ends over two strictly faster links (an NDv2 GPU pair joined through the PCIe switch, whose
  port the NIC traffic needs, as well as over NVLink through a neighbour).

The sketch's ``rails`` overrides the first rule (and ``relays`` replaces it); both rules are dropped if
they would disconnect the collective.
"""

from __future__ import annotations

from schedules.collectives import Collective
from synth.errors import Unsat
from synth.milp.flow import bandwidth_bound as flow_bandwidth_bound
from synth.milp.flow import hop_distances
from synth.milp.hierarchy import rail_offsets
from synth.milp.sketch import Sketch, SketchError
from synth.rank_links import rank_pair
from topologies import Topology

LinkSet = frozenset[tuple[int, int]]


def allowed_links(topo: Topology, collective: Collective, sketch: Sketch, chunk_bytes: float) -> LinkSet:
    """The links sends may use on the switch-free ``topo`` for chunks of ``chunk_bytes``."""
    everything = frozenset(rank_pair(link.key) for link in topo.links)
    bandwidth_bound = flow_bandwidth_bound(topo.links, chunk_bytes)
    if sketch.relays is not None:
        links = _relayed(topo, sketch)
    elif sketch.rails or (sketch.rails is None and bandwidth_bound):
        links = _railed(topo)
        if sketch.rails is None and not connected(topo, collective, links):
            links = everything  # uneven hosts leave some GPU without a rail; rails were only a guess
    else:
        links = everything
    if bandwidth_bound:
        direct = _without_detours(topo, links)
        if connected(topo, collective, direct):
            links = direct
    return links


def _relayed(topo: Topology, sketch: Sketch) -> LinkSet:
    for i, rank in enumerate(sketch.relays or ()):
        if rank >= topo.nranks:
            raise SketchError(f"sketch {sketch.source}: relays[{i}]: rank {rank} does not exist ({topo.nranks} ranks)")
    relays = set(sketch.relays or ())
    return frozenset(
        (src, dst)
        for src, dst in (rank_pair(link.key) for link in topo.links)
        if topo.hosts[src] == topo.hosts[dst] or (src in relays and dst in relays)
    )


def _railed(topo: Topology) -> LinkSet:
    local: list[int] = []
    seen: dict[int, int] = {}
    for r in topo.ranks:
        local.append(seen.get(topo.hosts[r], 0))
        seen[topo.hosts[r]] = local[-1] + 1
    offsets = rail_offsets(topo)
    return frozenset(
        (src, dst)
        for src, dst in (rank_pair(link.key) for link in topo.links)
        if topo.hosts[src] == topo.hosts[dst] or (local[dst] - local[src]) % seen[topo.hosts[dst]] in offsets
    )


def _without_detours(topo: Topology, links: LinkSet) -> LinkSet:
    capacity = {key: topo.link(*key).capacity for key in links}
    shared = {tuple(key) for group in topo.sharing for key in group.links}
    out: dict[int, list[int]] = {}
    for u, v in links:
        out.setdefault(u, []).append(v)

    def detoured(u: int, v: int) -> bool:
        slow = capacity[(u, v)]
        return (u, v) in shared and any(
            w != v and capacity[(u, w)] > slow and capacity.get((w, v), 0.0) > slow for w in out[u]
        )

    return frozenset(key for key in links if not detoured(*key))


def connected(topo: Topology, collective: Collective, links: LinkSet) -> bool:
    """Whether every chunk can reach every rank that wants it over ``links``."""
    dist = hop_distances(topo.ranks, links)
    return all(
        r in dist[s]
        for c in range(collective.nchunks)
        for s in topo.ranks
        if c in collective.precondition(s)
        for r in topo.ranks
        if c in collective.postcondition(r)
    )


def check_reachable(topo: Topology, collective: Collective, links: LinkSet, sketch: Sketch) -> int:
    """The hop depth every chunk needs; Unsat naming the cut-off host when the relays disconnect one."""
    if sketch.relays is not None and topo.nhosts > 1:
        for host in sorted(set(topo.hosts)):
            if not any(topo.hosts[r] == host for r in sketch.relays):
                members = [r for r in topo.ranks if topo.hosts[r] == host]
                raise Unsat(
                    f"sketch {sketch.source}: relays: host {host} (ranks {members[0]}..{members[-1]}) has "
                    "no relay, so no data can enter or leave it"
                )
    dist = hop_distances(topo.ranks, links)
    depth = 0
    for c in range(collective.nchunks):
        holders = [r for r in topo.ranks if c in collective.precondition(r)]
        for r in topo.ranks:
            if c in collective.postcondition(r) and r not in holders:
                hops = min((dist[s][r] for s in holders if r in dist[s]), default=None)
                if hops is None:
                    raise Unsat(
                        f"sketch {sketch.source}: relays: rank {r} cannot receive chunk {c} "
                        f"from rank {holders[0]} over the links the relays allow"
                    )
                depth = max(depth, hops)
    return depth
