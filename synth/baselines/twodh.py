"""Tutel's two-dimensional hierarchical ("2DH") all-to-all, for fabrics of several hosts.

A flat (direct) all-to-all sends every block straight to its destination, so each GPU sends G·(H-1) small
messages across hosts (G GPUs per host, H hosts). 2DH sends each one once per host pair and local GPU:

1. inside each host (NVLink), rank (h, g) hands every block bound for GPU (h', j) of another host to its own
   host's GPU j, the one with the destination's local index, and delivers its blocks for its own host directly;
2. across hosts, GPU (h, j) sends host h' everything its host holds for (h', j): the G blocks that came to it in
   step 1 plus its own, one message of G·c chunks per remote host, to the GPU of the same local index.

The data crosses the hosts' links exactly as much as in the flat schedule; what changes is the number of
messages (H-1 instead of G·(H-1) per GPU) and their size (G times larger), which is what Tutel measured to
matter at scale (a step of many small network messages is bound by their per-message cost). The α-β model
prices bytes, not messages, so it predicts 2DH at the flat schedule's time plus its NVLink step; ``weft synth
--method 2dh`` prints both and the cut bound. Tutel's local layout transforms (the stride copies that make each
message contiguous) are not steps here: a schedule addresses chunks by index, and codegen lays them out.

Ranks are grouped by ``topology.hosts``; every host must hold the same number of GPUs and the ranks of one
local index must be linked across hosts.

>>> from topologies.catalog import build
>>> from schedules.collectives import Collective
>>> s = twodh(build("hgx_h100:nodes=2,gpus=2"), Collective("alltoall", 4))
>>> s.nsteps, [len(step.sends) for step in s.steps]
(2, [8, 8])
"""

from __future__ import annotations

import time

from schedules.collectives import Chunking, Collective
from schedules.compact import expand
from schedules.schedule import Schedule, Send
from synth.baselines.common import assemble, block, check_ranks
from synth.errors import NotApplicable
from topologies.topology import Topology


def host_grid(topology: Topology) -> list[list[int]]:
    """The ranks of each host, hosts in order of their first rank, ranks ascending: grid[h][j] is GPU j of host h."""
    hosts = dict.fromkeys(topology.hosts[r] for r in topology.ranks)
    return [sorted(r for r in topology.ranks if topology.hosts[r] == h) for h in hosts]


def host_messages(schedule: Schedule, topology: Topology) -> int:
    """The most messages one rank sends to other hosts over the schedule: its distinct (step, destination) pairs
    across hosts, what 2DH cuts from G·(H-1) to H-1.

    >>> from topologies.catalog import build
    >>> from schedules.collectives import Collective
    >>> from synth.baselines.direct import direct
    >>> t = build("hgx_h100:nodes=2")
    >>> host_messages(twodh(t, Collective("alltoall", 16)), t), host_messages(direct(t, Collective("alltoall", 16)), t)
    (1, 8)
    """
    sent: dict[int, set[tuple[int, int]]] = {}
    for k, step in enumerate(expand(schedule).steps):  # a compact schedule's images counted
        for s in step.sends:
            if topology.hosts[s.src] != topology.hosts[s.dst]:
                sent.setdefault(s.src, set()).add((k, s.dst))
    return max((len(v) for v in sent.values()), default=0)


def twodh(topology: Topology, collective: Collective) -> Schedule:
    """Two-level all-to-all: an intra-host exchange that gathers blocks by destination GPU index, then one
    message per (remote host, local index)."""
    started = time.perf_counter()
    if collective.facts.chunking is not Chunking.BLOCKS:
        raise NotApplicable(f"2dh: is an all-to-all algorithm (Tutel's 2DH); use --method direct for {collective.name}")
    check_ranks("2dh", topology, collective)
    grid = host_grid(topology)
    sizes = {len(ranks) for ranks in grid}
    if len(grid) < 2:
        raise NotApplicable(f"2dh: topology {topology.name} is one host; 2DH needs several (use --method direct)")
    if len(sizes) != 1:
        raise NotApplicable(
            f"2dh: topology {topology.name} has hosts of {sorted(sizes)} GPUs; 2DH needs the same "
            "number of GPUs on every host"
        )
    gather, cross = _steps(collective, grid)
    return assemble(
        "2dh",
        topology,
        collective,
        [gather, cross],
        started,
        "2DH exchanges inside each host, then between GPUs of the same local index across hosts",
    )


def _steps(collective: Collective, grid: list[list[int]]) -> tuple[list[Send], list[Send]]:
    """(the intra-host step, the inter-host step) as send lists. In the inter-host step each relay sends what it
    forwards before its own blocks, an order codegen keeps on each channel: the port engine's closed groups
    (``executor.port.program``) then cut where the first send across hosts needs the intra-host step, and a GPU's
    own blocks cross with the ones it forwards, one network round trip. Own blocks first, they joined the
    intra-host group on the ranks whose first send was its own, and crossing took two."""
    where = {rank: (h, j) for h, ranks in enumerate(grid) for j, rank in enumerate(ranks)}
    gather: list[Send] = []
    forwarded: list[Send] = []
    own: list[Send] = []
    for src, (h, _) in where.items():
        for dst, (h2, j) in where.items():
            if src == dst:
                continue
            relay = grid[h][j]  # on the source's host, the GPU with the destination's local index
            chunks = block(collective, src, dst)
            if relay != src:
                gather += [Send(c, src, relay) for c in chunks]
            if h2 != h:
                (own if relay == src else forwarded).extend(Send(c, relay, dst) for c in chunks)
    return gather, forwarded + own
