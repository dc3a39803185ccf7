"""``weft synth COLLECTIVE -t TOPO --method pareto``: the fastest schedule per size range, over all fast solvers."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from schedules.collectives import Collective
from schedules.schedule import Schedule
from topologies import Topology
from weft.units import format_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    return None  # uses the common flags only


def synthesize(
    args: argparse.Namespace, topology: Topology, collective: Collective, progress: Callable[[str], None]
) -> list[Schedule]:
    from synth.pareto import candidates, frontier

    points = frontier(candidates(topology, collective, progress=progress), topology)
    out = []
    for p in points:
        hi = "∞" if p.max_bytes == 0 else format_bytes(p.max_bytes)
        progress(f"pareto: {format_bytes(max(p.min_bytes, 1))}..{hi}: {p.schedule.name}")
        options = {**p.schedule.meta.options, "min_bytes": p.min_bytes, "max_bytes": p.max_bytes}
        out.append(p.schedule.with_meta(options=options))
    return out
