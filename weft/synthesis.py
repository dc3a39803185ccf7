"""``weft.synthesize``: one call for every solver family, from Python, with ``weft synth``'s sizes and defaults."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedules.collectives import Collective, collective_on
from schedules.schedule import Schedule
from synth.errors import SynthesisError
from topologies import Topology, resolve
from weft.units import parse_bytes

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
    what = (
        f"{where}: {collective.name} of {collective.nchunks} chunks on {collective.nranks} ranks "
        f"(at least {sends} sends)"
    )
    require(sends * BYTES_PER_SEND, what)
    if time_limit is not None and sends * SECONDS_PER_SEND > time_limit:
        raise SynthesisError(
            f"{what} takes about {sends * SECONDS_PER_SEND:.0f} s to build and verify, past the "
            f"time limit of {time_limit:g} s (use fewer --chunks, or a longer --time-limit)"
        )


DEFAULT_SIZE = "1MB"  # weft synth's --size


def synthesize(
    topology: Topology | str,
    collective: str | Collective,
    method: str = "ring",
    *,
    chunks: int | None = None,
    root: int = 0,
    size: int | str = DEFAULT_SIZE,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> Schedule:
    """A schedule for ``collective`` on ``topology`` (a Topology, catalog spec or file) by ``method`` (baselines,
    2dh, smt, milp or trees), as ``weft synth`` makes it.

    ``size`` ("1GB" or bytes) is the message milp optimizes for and trees picks its chunk count for; ``chunks``
    (per rank) defaults as the CLI's does (milp: ``milp.default_chunks`` at ``size``; trees: the fastest count
    at ``size``; otherwise 1). ``options`` go to the solver's options type (``steps=3, rounds=3`` for smt,
    ``time_limit=30``). ``progress`` gets a line now and then during long solves. The result is not yet
    verified; ``weft.verify`` proves it.
    """
    if isinstance(topology, str):
        topology = resolve(topology)
    nbytes = parse_bytes(size, "size") if isinstance(size, str) else size
    if isinstance(collective, str):
        collective = collective_on(collective, topology.name, topology.nranks, chunks or 1, root)
    require_affordable(collective, f"{method} on {topology.name}")
    if method in BASELINES:
        from synth import baselines

        return baselines.solver(method)(topology, collective)
    if method == "smt":
        from synth import smt

        return smt.solve(topology, collective, smt.SmtOptions(**options))
    if method == "milp":
        from synth import milp

        return milp.solve(topology, collective, milp_options(topology, collective, nbytes, chunks, **options), progress)
    if method == "trees":
        from synth import trees

        options.setdefault("size", None if chunks else nbytes)
        return trees.solve(topology, collective, trees.TreeOptions(**options), progress)
    raise SynthesisError(f"method: unknown method {method!r} (choose from {', '.join(BASELINES)}, smt, milp, trees)")


def milp_options(topology: Topology, collective: Collective, size: int, chunks: int | None, **options: Any):
    """``MilpOptions`` as ``weft synth --method milp`` builds them: chunks per rank from the caller, else the
    sketch's, else ``milp.default_chunks`` for the size."""
    from synth import milp

    sketch = options.get("sketch")
    if chunks is None and not (sketch and sketch.chunks):
        chunks = milp.default_chunks(topology, collective, size)
    return milp.MilpOptions(size=size, chunks=chunks, **options)
