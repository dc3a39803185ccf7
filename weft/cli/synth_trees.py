"""``weft synth COLLECTIVE -t TOPO --method trees [--k K]``: the spanning-tree family's flags and entry point."""

from __future__ import annotations

import argparse
from math import lcm
from typing import Callable

from schedules.collectives import Collective
from schedules.schedule import Schedule
from topologies import Topology

PIPELINE = 8  # chunks per tree by default: the schedule takes (P + depth - 1)/P of the bound at α = 0
MAX_SENDS = 2_000_000  # default chunk counts stay under this many sends, so 1024-rank schedules fit in memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, default=None, metavar="K",
                        help="trees: trees per root (default: as many as the optimal rate needs, up to 128); "
                             "fewer trees give smaller plans at a reported %% of the optimum")


def default_chunks(topology: Topology, per_root: int, forests: int) -> int:
    """Chunks per rank: PIPELINE per tree, fewer where the schedule would pass MAX_SENDS sends."""
    sends_per_wave = topology.nranks * (topology.nranks - 1) * per_root * forests
    waves = max(1, min(PIPELINE, MAX_SENDS // max(1, sends_per_wave)))
    return per_root * waves


def synthesize(args: argparse.Namespace, topology: Topology, collective: Collective,
               progress: Callable[[str], None]) -> list[Schedule]:
    """One pipelined tree schedule; ``--chunks`` defaults to 8 chunks per tree."""
    import time

    from synth import trees

    start = time.monotonic()
    options = trees.TreeOptions(k=args.k, time_limit=args.time_limit)
    forests = trees.forests_for(topology, collective, options)
    for forest in forests:
        progress(f"trees: {forest.describe()}")
    per_root = lcm(*(f.per_root for f in forests))
    chunks = args.chunks or default_chunks(topology, per_root, len(forests))
    sized = Collective(collective.name, collective.nranks, chunks, collective.root)
    schedule = trees.schedule(topology, sized, forests)
    return [schedule.with_meta(solver="trees", options={"k": forests[-1].per_root},
                               solve_time=time.monotonic() - start,
                               notes="; ".join(f.describe() for f in forests))]
