"""``weft.synthesize``: one call for every solver family, from Python."""

from __future__ import annotations

from typing import Any

from schedules.collectives import Collective, collective_on
from schedules.schedule import Schedule
from synth.errors import SynthesisError
from topologies import Topology

BASELINES = ("ring", "direct", "twoshot", "rhd", "tree", "2dh")


def synthesize(topology: Topology, collective: str | Collective, method: str = "ring", *, chunks: int = 1,
               root: int = 0, **options: Any) -> Schedule:
    """A schedule for ``collective`` on ``topology`` by ``method`` (baselines, 2dh, smt, milp or trees).

    ``options`` go to the solver's options type (for example ``steps=3, rounds=3`` for smt).
    The result is not yet verified; ``weft.verify`` proves it.
    """
    if isinstance(collective, str):
        collective = collective_on(collective, topology.name, topology.nranks, chunks, root)
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
