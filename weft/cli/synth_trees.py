"""``weft synth COLLECTIVE -t TOPO --method trees [--k K]``: the spanning-tree family's flags and entry point."""

from __future__ import annotations

import argparse
from typing import Callable

from schedules.collectives import Collective
from schedules.schedule import Schedule
from topologies import Topology
from weft.units import format_bytes, parse_bytes

MAX_SENDS = 4_000_000  # a written-out schedule stays under this many sends, so 1024-rank schedules fit in memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, default=None, metavar="K",
                        help="trees: trees per root (default: as many as the optimal rate needs, up to 128); "
                             "fewer trees give smaller plans at a reported %% of the optimum")


def default_waves(pipe, size: int, progress: Callable[[str], None]) -> int:
    """Chunks per tree: the count the cost model finds fastest at ``size`` (pipeline fill against per-step
    latency), capped where the written-out schedule would pass MAX_SENDS sends."""
    best = pipe.best_waves(size)
    cap = max(1, MAX_SENDS // max(1, pipe.sends_per_wave))
    if best > cap:
        progress(f"trees: {best} waves are fastest at {format_bytes(size)} ({pipe.predict_us(size, best):.1f} µs); "
                 f"the written-out schedule stops at {cap} ({pipe.predict_us(size, cap):.1f} µs, {MAX_SENDS} sends); "
                 "synth.trees.pipeline keeps the compact form")
    return min(best, cap)


def synthesize(args: argparse.Namespace, topology: Topology, collective: Collective,
               progress: Callable[[str], None]) -> list[Schedule]:
    """One pipelined tree schedule; ``--chunks`` defaults to the waves the cost model picks for ``--size``."""
    import time

    from synth import trees

    start = time.monotonic()
    options = trees.TreeOptions(k=args.k, time_limit=args.time_limit)
    forests = trees.forests_for(topology, collective, options)
    for forest in forests:
        progress(f"trees: {forest.describe()}")
    pipe = trees.pipeline(topology, collective, forests)
    if collective.name == "allgather" and not args.chunks:
        # the compact form (one wave and the shift to the next): the fastest wave count, whatever its size
        schedule = pipe.with_waves(pipe.best_waves(parse_bytes(args.size))).compact()
    else:
        chunks = args.chunks or pipe.per_root * default_waves(pipe, parse_bytes(args.size), progress)
        sized = Collective(collective.name, collective.nranks, chunks, collective.root)
        schedule = trees.schedule(topology, sized, forests)
    return [schedule.with_meta(solver="trees", options={"k": forests[-1].per_root, "size": parse_bytes(args.size)},
                               solve_time=time.monotonic() - start,
                               notes="; ".join(f.describe() for f in forests))]
