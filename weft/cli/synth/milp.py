"""``weft synth COLLECTIVE -t TOPO --method milp [--sketch FILE]``: the MILP family's flags and entry point."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from schedules.collectives import Collective
from schedules.schedule import Schedule
from topologies import Topology
from weft.units import parse_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sketch",
        metavar="FILE",
        help="milp: a weft.sketch/1 file with hints (symmetry, relays, rails, chunks per rank)",
    )


def synthesize(
    args: argparse.Namespace, topology: Topology, collective: Collective, progress: Callable[[str], None]
) -> list[Schedule]:
    """One schedule minimizing the finish time for ``--size`` within ``--time-limit``.

    Chunks per rank: ``--chunks``, else the sketch's, else ``milp.default_chunks`` for the size.
    """
    from synth import milp
    from weft.synthesis import milp_options

    sketch = milp.load_sketch(args.sketch) if args.sketch else None
    options = milp_options(
        topology, collective, parse_bytes(args.size), args.chunks, time_limit=args.time_limit, sketch=sketch
    )
    return [milp.solve(topology, collective, options, progress)]
