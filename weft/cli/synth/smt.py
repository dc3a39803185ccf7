"""``weft synth COLLECTIVE -t TOPO --method smt [--steps S --rounds R | --least-steps | --pareto]``.

The SMT family's own flags and entry point. ``--chunks``, ``--time-limit`` (per instance), ``--root``, ``-o``
and ``--json`` are the common flags of ``weft synth``. With ``--pareto -o DIR`` a ``frontier.json``
(``weft.frontier/1``) lands beside the schedule files, for ``weft plot frontier``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from schedules.collectives import Collective
from schedules.schedule import Schedule
from topologies import Topology
from weft.cli import ArgumentError
from weft.cli.words import counted
from weftcore.jsonfile import make_directory, write_text

FRONTIER_FORMAT = "weft.frontier/1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("smt (z3)")
    group.add_argument("--steps", type=int, default=None, metavar="S", help="smt: solve the instance with S steps")
    group.add_argument(
        "--rounds", type=int, default=None, metavar="R", help="smt: total rounds (default: one per step)"
    )
    group.add_argument(
        "--least-steps", action="store_true", help="smt: the fewest steps that work (the default without --steps)"
    )
    group.add_argument(
        "--pareto",
        action="store_true",
        help="smt: the whole (steps, rounds per chunk) Pareto frontier, one schedule per point",
    )


def _options(args: argparse.Namespace):
    from synth.smt import SmtOptions

    for flag, value in (("--steps", args.steps), ("--rounds", args.rounds)):
        if value is not None and value < 1:
            raise ArgumentError(f"weft synth: {flag} must be a positive integer, got {value}")
    if args.steps is not None and (args.least_steps or args.pareto):
        raise ArgumentError("weft synth: --steps names one instance; drop it for --least-steps or --pareto")
    if args.least_steps and args.pareto:
        raise ArgumentError("weft synth: choose one of --least-steps and --pareto")
    if args.pareto and args.rounds is not None:
        raise ArgumentError("weft synth: --pareto walks the rounds itself; drop --rounds")
    if args.steps is not None and args.rounds is not None and args.rounds < args.steps:
        raise ArgumentError(
            f"weft synth: --rounds {args.rounds} cannot fill --steps {args.steps} (every step takes at least one round)"
        )
    return SmtOptions(
        steps=args.steps, rounds=args.rounds, time_limit=args.time_limit, workers=getattr(args, "workers", 0)
    )


def synthesize(
    args: argparse.Namespace, topology: Topology, collective: Collective, progress: Callable[[str], None]
) -> list[Schedule]:
    """The instance, the least-steps schedule, or one schedule per Pareto point (``--pareto``)."""
    from synth import smt
    from synth.errors import Unknown

    options = _options(args)
    start = time.monotonic()
    if not args.pareto:
        return [smt.solve(topology, collective, options, progress)]
    frontier = smt.pareto(topology, collective, options, progress)
    progress(
        f"smt: frontier of {counted(len(frontier.points), 'point')} in {time.monotonic() - start:.1f} s"
        + ("" if frontier.complete else f" (the walk stopped before reaching the LP bound: {frontier.stopped})")
    )
    if not frontier.points:
        raise Unknown(
            f"smt: {collective.name} on {topology.name}: no frontier point found within the time limit of "
            f"{args.time_limit:g} s and the step limit"
        )
    schedules = [p.schedule for p in frontier.points]
    if args.output:
        _write_frontier(Path(args.output), topology, collective, frontier)
    return schedules


def _write_frontier(out: Path, topology: Topology, collective: Collective, frontier) -> None:
    """frontier.json beside the schedule files, under the names ``weft synth`` gives them; verified first."""
    from schedules.verify import require_valid

    for point in frontier.points:
        require_valid(point.schedule, topology)
    folder = out.parent if out.suffix == ".json" else out
    make_directory(folder, "output", ArgumentError)
    doc = {
        "format": FRONTIER_FORMAT,
        "topology": topology.name,
        "fingerprint": topology.fingerprint,
        "collective": collective.name,
        "nranks": collective.nranks,
        "points": [
            {
                "steps": p.steps,
                "rounds": p.rounds,
                "chunks": p.chunks,
                "rounds_per_chunk": float(p.rounds_per_chunk),
                "predicted_us": p.predicted_us,
                "schedule_file": f"{p.schedule.name or p.schedule.collective.name}-{p.schedule.content_hash[:8]}.json",
            }
            for p in frontier.points
        ],
        "lp_bound": float(frontier.lp_bound),
        "lp_bound_fraction": str(frontier.lp_bound),
        "complete": frontier.complete,
    }
    write_text(folder / "frontier.json", json.dumps(doc, indent=2) + "\n", "frontier", ArgumentError)
