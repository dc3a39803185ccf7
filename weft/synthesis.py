"""``weft.synthesize``: one call for every solver family, from Python."""

from __future__ import annotations

from typing import Any

from schedules.collectives import Collective, collective_on
from schedules.schedule import Schedule
from synth.errors import SynthesisError
from topologies import Topology

BASELINES = ("ring", "direct", "twoshot", "rhd", "tree", "2dh")
# What one send of a synthesized schedule costs until it is verified and written: memory and time, measured on
# ring and direct baselines of 0.25-2.2 million sends (280-370 bytes and 15-17 µs a send on a 2-core machine).
BYTES_PER_SEND = 400
SECONDS_PER_SEND = 1.5e-5


def require_affordable(collective: Collective, where: str, time_limit: float | None = None) -> None:
    """Refuse, before any solver runs, a collective whose every schedule has more sends than the memory budget
    holds or than ``time_limit`` seconds can build (``Collective.min_sends``: no method writes fewer). Solvers
    keep to their own time limits; a baseline's time is bounded here only."""
    from schedules.budget import require

    sends = collective.min_sends
    what = (f"{where}: {collective.name} of {collective.nchunks} chunks on {collective.nranks} ranks "
            f"(at least {sends} sends)")
    require(sends * BYTES_PER_SEND, what)
    if time_limit is not None and sends * SECONDS_PER_SEND > time_limit:
        raise SynthesisError(f"{what} takes about {sends * SECONDS_PER_SEND:.0f} s to build and verify, past the "
                             f"time limit of {time_limit:g} s (use fewer --chunks, or a longer --time-limit)")


def synthesize(topology: Topology, collective: str | Collective, method: str = "ring", *, chunks: int = 1,
               root: int = 0, **options: Any) -> Schedule:
    """A schedule for ``collective`` on ``topology`` by ``method`` (baselines, 2dh, smt, milp or trees).

    ``options`` go to the solver's options type (for example ``steps=3, rounds=3`` for smt).
    The result is not yet verified; ``weft.verify`` proves it.
    """
    if isinstance(collective, str):
        collective = collective_on(collective, topology.name, topology.nranks, chunks, root)
    require_affordable(collective, f"{method} on {topology.name}")
    if method in BASELINES:
        from synth import baselines

        return baselines.solver(method)(topology, collective)
    if method == "smt":
        from synth import smt

        return smt.solve(topology, collective, smt.SmtOptions(**options))
    if method == "milp":
        from synth import milp

        return milp.solve(topology, collective, milp.MilpOptions(**options))
    if method == "trees":
        from synth import trees

        return trees.solve(topology, collective, trees.TreeOptions(**options))
    raise SynthesisError(f"method: unknown method {method!r} (choose from {', '.join(BASELINES)}, smt, milp, trees)")
