"""``weft synth COLLECTIVE -t TOPO --method trees [--k K]``: the spanning-tree family's flags and entry point."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from schedules.collectives import Collective
from schedules.schedule import Schedule
from topologies import Topology
from weft.units import parse_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--k",
        type=int,
        default=None,
        metavar="K",
        help="trees: trees per root (default: as many as the optimal rate needs, up to 128); "
        "fewer trees give smaller plans at a reported %% of the optimum",
    )


def synthesize(
    args: argparse.Namespace, topology: Topology, collective: Collective, progress: Callable[[str], None]
) -> list[Schedule]:
    """One pipelined tree schedule; ``--chunks`` defaults to the waves the cost model picks for ``--size``."""
    from synth import trees

    options = trees.TreeOptions(
        k=args.k, time_limit=args.time_limit, size=None if args.chunks else parse_bytes(args.size)
    )
    return [trees.solve(topology, collective, options, progress)]
