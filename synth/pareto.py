"""The latency/bandwidth frontier over message size: which schedule is fastest at which size.

Every candidate is scored with the α-β cost model at each size from ``min_bytes`` to ``max_bytes`` (powers of
two); the frontier is the sequence of size ranges, each with the schedule that is fastest there. Adjacent sizes
won by the same schedule merge into one range. Candidates come from any solver; ``candidates`` gathers the
baselines and the tree packing, which run in seconds on every catalog topology.

>>> from topologies.catalog import build
>>> from schedules.collectives import Collective
>>> topo = build("hgx_h100")
>>> [p.schedule.meta.solver for p in frontier(candidates(topo, Collective("allreduce", 8)), topo)][:1]
['direct']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schedules.collectives import Collective
from schedules.cost import predict_us
from schedules.schedule import Schedule, ScheduleMeta, Step
from synth.errors import NotApplicable, SynthesisError
from topologies import Topology

SIZES = tuple(1 << k for k in range(10, 31))  # 1 KB .. 1 GB
MAX_REDUCE_BROADCAST_RANKS = 64  # its greedy looks at every rank pair for every chunk


@dataclass(frozen=True)
class SizeBand:
    """``schedule`` is the fastest candidate for every size in [min_bytes, max_bytes]."""

    min_bytes: int
    max_bytes: int
    schedule: Schedule
    predicted_us: dict[int, float]


def candidates(
    topology: Topology,
    collective: Collective,
    chunk_options: Iterable[int] = (1, 2, 8),
    progress: Callable[[str], None] | None = None,
) -> list[Schedule]:
    """Every baseline (2DH included, on several hosts) and tree schedule that exists for this topology and
    collective, at several chunkings."""
    from synth import baselines, trees

    found: dict[str, Schedule] = {}
    makers = [(m, baselines.solver(m)) for m in (*baselines.METHODS, *baselines.HIERARCHICAL)]
    makers.append(("trees", lambda t, c: trees.solve(t, c, trees.TreeOptions(time_limit=30.0))))
    if collective.facts.sums_everywhere:  # a reduce into one rank, then a broadcast from it
        makers.append(("reduce-broadcast", reduce_broadcast_trees))
    for chunks in chunk_options:
        c = Collective(collective.name, collective.nranks, chunks * collective.chunks, collective.root)
        for method, make in makers:
            try:
                s = make(topology, c)
            except NotApplicable as e:
                if progress:
                    progress(f"pareto: {method} chunks={c.chunks}: not applicable ({e})")
                continue
            found.setdefault(s.content_hash, s)
            if progress:
                progress(f"pareto: {method} chunks={c.chunks}: {s.nsteps} step{'s' * (s.nsteps != 1)}")
    return list(found.values())


def reduce_broadcast_trees(topology: Topology, collective: Collective) -> Schedule:
    """All-reduce with every chunk reduced into a root and copied back, pipelined down shortest-path trees
    (the MILP's reduce-broadcast starting point; on a line of three, 92% of the bound at 1 GB with 4 chunks)."""
    from synth.milp import rounds_for
    from synth.milp.reduce_broadcast import pipelined_trees

    if topology.nranks > MAX_REDUCE_BROADCAST_RANKS:
        raise NotApplicable(
            f"reduce-broadcast trees are built for up to {MAX_REDUCE_BROADCAST_RANKS} ranks, "
            f"{topology.name} has {topology.nranks}"
        )
    fabric = topology.without_switches()
    steps = tuple(
        Step(rounds_for(fabric, list(st.sends)), st.sends) for st in pipelined_trees(topology, fabric, collective)
    )
    return Schedule(
        collective,
        topology.fingerprint,
        steps,
        f"reduce-broadcast-allreduce-{topology.name}",
        ScheduleMeta(solver="reduce-broadcast", options={"chunks": collective.chunks}),
    )


def frontier(schedules: Iterable[Schedule], topology: Topology, sizes: tuple[int, ...] = SIZES) -> list[SizeBand]:
    """The fastest schedule per size range, in increasing size."""
    pool = list(schedules)
    if not pool:
        raise SynthesisError("pareto: no candidate schedule exists for this topology and collective")
    times = {s.content_hash: {n: predict_us(s, topology, n) for n in sizes} for s in pool}
    points: list[SizeBand] = []
    for n in sizes:
        best = min(pool, key=lambda s: (times[s.content_hash][n], s.nsends, s.content_hash))
        if points and points[-1].schedule.content_hash == best.content_hash:
            last = points[-1]
            points[-1] = SizeBand(last.min_bytes, n, last.schedule, last.predicted_us)
        else:
            lo = points[-1].max_bytes + 1 if points else 0
            points.append(SizeBand(lo, n, best, times[best.content_hash]))
    last = points[-1]
    points[-1] = SizeBand(last.min_bytes, 0, last.schedule, last.predicted_us)  # 0: no upper limit
    return points
