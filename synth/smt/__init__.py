"""The SMT synthesizer (z3): SCCL's (steps, rounds, chunks) instances, least steps, and the Pareto frontier.

Strategies:

- ``solve`` with ``steps`` (and ``rounds``, default one per step): one instance;
- ``solve`` without ``steps``: least steps, from the hop-distance bound upward;
- ``pareto``: for each step count from the bound upward, the fewest rounds per chunk, walking the ratios
  R/C upward from the LP bound; it stops when R/C reaches the bound.

Combining collectives are solved through their duals on the reversed fabric (see ``synth.smt.dual``);
allreduce is reducescatter + allgather. Every schedule is for the caller's topology (its fingerprint), with
capacities taken on its switch-free form.

>>> from topologies.topology import Link, Topology
>>> from schedules.collectives import Collective
>>> ring = Topology("ring4", 4, tuple(Link(i, (i + d) % 4, 25.0) for i in range(4) for d in (1, 3)))
>>> solve(ring, Collective("allgather", 4), SmtOptions(steps=2, workers=1)).nsteps
2
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

from schedules.collectives import Collective
from schedules.schedule import Schedule
from synth.errors import Interrupted, SynthesisError, Unknown, Unsat
from synth.smt import dual as smt_dual
from synth.smt.bound import rounds_per_chunk_bound, steps_bound
from synth.smt.encoding import MAX_SENDS, UNKNOWN, Instance, Outcome, possible_sends
from synth.smt.search import Problem, decide_first, workers
from topologies.topology import Topology

Progress = Callable[[str], None]
STEP_CEILING = 64  # least steps gives up here unless told otherwise
REPORT_SIZES = {"1KB": 1 << 10, "1MB": 1 << 20, "1GB": 1 << 30}  # the sizes `weft synth` reports


@dataclass(frozen=True)
class SmtOptions:
    """How to search. ``time_limit`` (seconds) is the whole call's: ``solve`` and ``pareto`` set ``deadline``
    (``time.monotonic()``) from it, and every instance, split or step count gets what is left; ``workers`` 0
    means one per CPU.

    ``max_chunks`` caps the chunks the Pareto walk tries (default: the LP bound's denominator, at least 2).
    """

    steps: int | None = None
    rounds: int | None = None
    time_limit: float = 60.0
    symmetry: bool = True
    workers: int = 0
    max_chunks: int | None = None
    max_steps: int | None = None
    deadline: float | None = None

    def started(self) -> SmtOptions:
        """These options with the deadline set, if it is not yet."""
        return self if self.deadline is not None else replace(self, deadline=time.monotonic() + self.time_limit)

    def left(self) -> float:
        """Seconds left before the deadline (the whole time limit when none is set)."""
        return self.time_limit if self.deadline is None else min(self.time_limit, self.deadline - time.monotonic())

    def until(self) -> float:
        """The deadline, or never when none is set (``left()`` then bounds each search)."""
        return math.inf if self.deadline is None else self.deadline

    def check(self) -> None:
        for name in ("steps", "rounds", "max_chunks", "max_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SynthesisError(f"smt: {name}: must be a positive integer, got {value!r}")
        if self.rounds is not None and self.steps is not None and self.rounds < self.steps:
            raise SynthesisError(
                f"smt: rounds: {self.rounds} rounds cannot fill {self.steps} steps "
                "(every step takes at least one round)"
            )
        if not self.time_limit > 0:
            raise SynthesisError(f"smt: time_limit: must be positive seconds, got {self.time_limit!r}")


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-optimal (steps, rounds per chunk) trade-off and its verified-by-caller schedule."""

    steps: int
    rounds: int
    chunks: int
    schedule: Schedule
    predicted_us: dict[str, float]

    @property
    def rounds_per_chunk(self) -> Fraction:
        return Fraction(self.rounds, self.chunks)


@dataclass(frozen=True)
class Frontier:
    """The Pareto frontier, its LP bound on rounds per chunk, whether the walk reached that bound, and where it
    did not, why (the time limit, or the chunk cap and step ceiling it walked up to)."""

    points: tuple[FrontierPoint, ...]
    lp_bound: Fraction
    complete: bool
    stopped: str = ""


def _quiet(line: str) -> None:
    """The default progress callback: library code never prints."""


def solve(
    topology: Topology, collective: Collective, options: SmtOptions = SmtOptions(), progress: Progress = _quiet
) -> Schedule:
    """One schedule: the instance (steps, rounds, collective.chunks) when steps is given, else least steps."""
    options.check()
    options = options.started()
    if collective.nranks != topology.nranks:
        raise SynthesisError(
            f"smt: collective {collective.name} has {collective.nranks} ranks, topology "
            f"{topology.name} has {topology.nranks}"
        )
    if collective.facts.phases:  # reducescatter then allgather, each solved alone
        return _allreduce(topology, collective, options, progress)
    return _solve_part(topology, collective, options, progress)


def check_size(problem: Problem, steps: int, label: str) -> None:
    """Refuse, in one line naming the options, an instance too large for the SMT encoding (MAX_SENDS)."""
    c = problem.collective
    sends = possible_sends(problem.fabric, c, steps)
    if sends > MAX_SENDS:
        raise SynthesisError(
            f"smt: {label}: {c.nchunks} chunks ({c.chunks} per rank-slice) over "
            f"{len(problem.fabric.links)} links in {steps} step{'s' * (steps != 1)} are {sends} "
            f"possible sends, more than the SMT encoding's {MAX_SENDS}: use fewer --chunks or "
            "--steps, or --method milp or trees"
        )


def _solve_part(topology: Topology, collective: Collective, options: SmtOptions, progress: Progress) -> Schedule:
    problem = _problem(topology, collective, options)
    label = f"{collective.name} on {topology.name}"
    check_size(problem, options.steps or 1, label)
    if options.steps is not None:
        inst = Instance(options.steps, options.rounds or options.steps, collective.chunks)
        out, seen = decide_first(
            problem, [inst], options.left(), workers(options.workers), progress, label, options.until()
        )
        if out is None:
            raise _failure(label, inst, seen[-1].status)
        return _finish(out, topology, collective)
    low = steps_bound(problem.fabric, problem.collective)
    ceiling = options.max_steps or options.rounds or STEP_CEILING
    n = workers(options.workers)
    for first in range(low, ceiling + 1, n):
        check_size(problem, first, label)
        if options.left() <= 0:
            raise Unknown(f"smt: {label}: the time limit of {options.time_limit:g} s ran out before {first} steps")
        batch = [Instance(s, options.rounds or s, collective.chunks) for s in range(first, min(first + n, ceiling + 1))]
        out, seen = decide_first(problem, batch, options.left(), n, progress, label, options.until())
        unknown = [o.instance for o in seen if o.status == UNKNOWN]
        if out is not None:
            schedule = _finish(out, topology, collective)
            if unknown:
                schedule = schedule.with_meta(notes=f"fewest steps not proven: {unknown[0]} is unknown")
            return schedule
        if unknown:
            raise Unknown(
                f"smt: {label}: instance {unknown[0]} is unknown: no answer within the time limit "
                f"of {options.time_limit:g} s"
            )
    raise Unsat(
        f"smt: {label}: no schedule with {low}..{ceiling} steps"
        + (f" and {options.rounds} rounds" if options.rounds else "")
        + f" and {collective.chunks} chunks"
    )


def _problem(topology: Topology, collective: Collective, options: SmtOptions) -> Problem:
    """The non-combining problem that answers ``collective``: its dual on the reversed fabric if it combines."""
    fabric = topology.without_switches()
    if collective.facts.from_dual:
        return Problem(fabric.reversed(), topology.fingerprint, smt_dual.dual_collective(collective), options.symmetry)
    return Problem(fabric, topology.fingerprint, collective, options.symmetry)


def _finish(out: Outcome, topology: Topology, collective: Collective) -> Schedule:
    """The schedule of a sat outcome (``decide_first`` returns no other), mapped back from the dual if need be."""
    schedule = out.schedule
    assert schedule is not None, "a sat outcome carries its schedule"
    if collective.facts.from_dual:
        return smt_dual.from_dual(schedule, collective, topology.fingerprint)
    return schedule


def _failure(label: str, inst: Instance, status: str) -> Exception:
    if status == UNKNOWN:
        return Unknown(f"smt: {label}: instance {inst} is unknown: no answer within the time limit")
    return Unsat(f"smt: {label}: instance {inst} is unsat: no schedule exists")


def _allreduce(topology: Topology, collective: Collective, options: SmtOptions, progress: Progress) -> Schedule:
    """Reducescatter + allgather; with steps given, the first split of (steps, rounds) that both halves meet."""
    rs, ag = collective.phases
    if options.steps is None:
        half = None if options.rounds is None else options.rounds // 2
        if half == 0:
            raise SynthesisError("smt: rounds: allreduce needs at least 2 rounds (one per half)")
        first = _solve_part(topology, rs, replace(options, rounds=half), progress)
        rest = None if options.rounds is None or half is None else options.rounds - half
        second = _solve_part(topology, ag, replace(options, rounds=rest), progress)
        return smt_dual.allreduce(first, second)
    if options.steps < 2:
        raise SynthesisError("smt: steps: allreduce as reducescatter + allgather needs at least 2 steps")
    total_rounds = options.rounds or options.steps
    failures = []
    for s1, r1 in _splits(options.steps, total_rounds):
        try:
            first = _solve_part(topology, rs, replace(options, steps=s1, rounds=r1), progress)
            second = _solve_part(
                topology, ag, replace(options, steps=options.steps - s1, rounds=total_rounds - r1), progress
            )
            return smt_dual.allreduce(first, second)
        except (Unsat, Unknown) as e:
            failures.append(e)
    inst = Instance(options.steps, total_rounds, collective.chunks)
    if any(isinstance(e, Unknown) for e in failures):
        raise Unknown(
            f"smt: allreduce on {topology.name}: instance {inst} is unknown: some split of it into "
            "reducescatter + allgather hit the time limit"
        )
    raise Unsat(
        f"smt: allreduce on {topology.name}: instance {inst} is unsat as reducescatter + allgather "
        "(no split of its steps and rounds works)"
    )


def _splits(steps: int, rounds: int) -> list[tuple[int, int]]:
    """(steps, rounds) of the reducescatter half, the most even splits first."""
    pairs = [(s1, r1) for s1 in range(1, steps) for r1 in range(s1, rounds - (steps - s1) + 1)]
    return sorted(pairs, key=lambda p: (abs(2 * p[0] - steps), abs(2 * p[1] - rounds), -p[0], -p[1]))


# ---- the Pareto frontier ------------------------------------------------------------------------


def pareto(
    topology: Topology, collective: Collective, options: SmtOptions = SmtOptions(), progress: Progress = _quiet
) -> Frontier:
    """The (steps, rounds per chunk) Pareto frontier, each point with its schedule and α-β cost.

    Where the time limit ends the walk, the frontier holds what was found and ``complete`` is False.
    """
    options.check()
    options = options.started()
    if collective.facts.phases:
        n = collective.nranks
        fabric = topology.without_switches()
        if fabric.reversed().fingerprint == fabric.fingerprint:
            # reducescatter's dual is an allgather on the same fabric: one walk serves both halves
            ag = _walk(topology, Collective("allgather", n), options, progress)
            rs = replace(ag, points=tuple(_reduce_point(p, topology) for p in ag.points))
            progress(
                f"smt: reducescatter on {topology.name}: the allgather frontier run backwards "
                "(the fabric is its own reverse)"
            )
        else:
            half = replace(options, deadline=time.monotonic() + options.left() / 2)  # the rest for allgather
            rs = _walk(topology, Collective("reducescatter", n), half, progress)
            ag = _walk(topology, Collective("allgather", n), options, progress)
        points = [(smt_dual.allreduce(a.schedule, b.schedule)) for a in rs.points for b in ag.points]
        stopped = "; ".join(
            f"{half.stopped} ({name})" for half, name in ((rs, "reducescatter"), (ag, "allgather")) if half.stopped
        )
        return _frontier(topology, points, rs.lp_bound + ag.lp_bound, rs.complete and ag.complete, stopped)
    return _walk(topology, collective, options, progress)


def _reduce_point(point: FrontierPoint, topology: Topology) -> FrontierPoint:
    """An allgather point's reducescatter: its schedule backwards, every send a reduction."""
    c = point.schedule.collective
    schedule = smt_dual.from_dual(point.schedule, Collective("reducescatter", c.nranks, c.chunks), topology.fingerprint)
    return replace(point, schedule=schedule)


def _walk(topology: Topology, collective: Collective, options: SmtOptions, progress: Progress) -> Frontier:
    problem = _problem(topology, collective, options)
    label = f"{collective.name} on {topology.name}"
    bound = rounds_per_chunk_bound(problem.fabric, problem.collective)
    low = steps_bound(problem.fabric, problem.collective)
    max_chunks = options.max_chunks or max(bound.denominator, 2)
    progress(
        f"smt: {label}: at least {low} step{'s' * (low != 1)} and {bound} rounds per chunk (LP); "
        f"chunks up to {max_chunks}"
    )
    found: list[Schedule] = []
    best: Fraction | None = None
    ceiling = options.max_steps or low + 2 * max_chunks + 2
    cap = "max_chunks" if options.max_chunks else "the LP bound's denominator, at least 2"
    stopped = f"chunks per rank capped at {max_chunks} ({cap}) and steps at {ceiling}"
    for steps in range(low, ceiling + 1):
        if options.left() <= 0:
            stopped = f"the time limit of {options.time_limit:g} s ran out at {steps} steps"
            progress(f"smt: {label}: {stopped}")
            break
        candidates = _candidates(steps, bound, best, max_chunks, problem.with_chunks(1).collective.nchunks)
        try:
            out, _ = decide_first(
                problem, candidates, options.left(), workers(options.workers), progress, label, options.until()
            )
        except KeyboardInterrupt:
            kept = ", ".join(f"(S={s.nsteps}, R={s.total_rounds}, C={s.collective.chunks})" for s in found)
            raise Interrupted(
                f"smt: {label}: stopped at {steps} steps; "
                + (f"found {kept}, " if found else "no point found, ")
                + "nothing written or committed"
            ) from None
        if out is None:
            continue
        sized = Collective(collective.name, collective.nranks, out.instance.chunks, collective.root)
        found.append(_finish(out, topology, sized))
        best = Fraction(out.instance.rounds, out.instance.chunks)
        progress(
            f"smt: {label}: frontier point {len(found)}: {out.instance}, R/C {best}"
            + (" (the LP bound)" if best <= bound else "")
            + f"; {max(0.0, options.left()):.0f} s of the time limit of {options.time_limit:g} s left"
        )
        if best <= bound:
            return _frontier(topology, found, bound, True)
    return _frontier(topology, found, bound, False, stopped)


def _candidates(steps: int, bound: Fraction, best: Fraction | None, max_chunks: int, nchunks: int) -> list[Instance]:
    """Instances with this many steps whose R/C lies in [bound, best), by R/C, each ratio at its fewest chunks."""
    ratios: dict[Fraction, Instance] = {}
    for chunks in range(1, max_chunks + 1):
        # Every link carries at least one chunk per round, so steps × nchunks rounds always suffice.
        for rounds in range(max(steps, math.ceil(bound * chunks)), steps * nchunks * chunks + 1):
            q = Fraction(rounds, chunks)
            if best is not None and q >= best:
                break
            if q not in ratios:
                ratios[q] = Instance(steps, rounds, chunks)
    return [ratios[q] for q in sorted(ratios)]


def _frontier(
    topology: Topology, schedules: list[Schedule], bound: Fraction, complete: bool, stopped: str = ""
) -> Frontier:
    from schedules.cost import predict_us

    keep: list[Schedule] = []
    for s in schedules:
        q = Fraction(s.total_rounds, s.collective.chunks)
        dominated = any(
            (o.nsteps <= s.nsteps and Fraction(o.total_rounds, o.collective.chunks) <= q)
            and (o.nsteps, Fraction(o.total_rounds, o.collective.chunks)) != (s.nsteps, q)
            for o in schedules
        )
        if not dominated and all(
            (k.nsteps, Fraction(k.total_rounds, k.collective.chunks)) != (s.nsteps, q) for k in keep
        ):
            keep.append(s)
    keep.sort(key=lambda s: s.nsteps)
    points = tuple(
        FrontierPoint(
            s.nsteps,
            s.total_rounds,
            s.collective.chunks,
            s,
            {label: predict_us(s, topology, n) for label, n in REPORT_SIZES.items()},
        )
        for s in keep
    )
    return Frontier(points, bound, complete, stopped)
