"""MILP synthesizer: a TACCL/TE-CCL-class time-expanded flow of chunks, solved with OR-Tools CP-SAT.

Why CP-SAT and not a MIP through pywraplp (SCIP, HiGHS): the model is almost all booleans (which chunk
crosses which link in which step) tied by implications (a rank forwards only what it already holds), with
a small max-plus objective. CP-SAT's portfolio (LP relaxation with cuts, clause learning, and large
neighbourhood search) finds good incumbents early on such models, uses every core, and reports each
incumbent with its proven bound through a solution callback, which is what ``--time-limit`` and progress
need. SCIP through pywraplp has no incumbent callback, and HiGHS stalls on the weak big-M step-time rows.

Why variable-length steps rather than TE-CCL's fixed epochs: the Schedule IR charges each step the max
over its links of α + load·β, so a step-indexed model with that max as the step's length optimizes exactly
the cost that ``schedules.cost`` reports. Fixed epochs would round every transfer up to an epoch.

>>> from topologies import Topology, Link
>>> ring = Topology("ring3", 3, tuple(Link(i, (i + 1) % 3, 25.0, 1.0) for i in range(3)))
>>> from schedules.collectives import Collective
>>> solve(ring, Collective("allgather", 3), MilpOptions(size=1 << 20, time_limit=10)).nsteps
2
"""

from synth.milp.sketch import FORMAT as SKETCH_FORMAT
from synth.milp.sketch import Sketch, SketchError, load_sketch, parse_sketch
from synth.milp.solver import MilpOptions, Outcome, default_chunks, rounds_for, solve

__all__ = [
    "MilpOptions",
    "Outcome",
    "SKETCH_FORMAT",
    "Sketch",
    "SketchError",
    "default_chunks",
    "load_sketch",
    "parse_sketch",
    "rounds_for",
    "solve",
]
