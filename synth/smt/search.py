"""Deciding instances: a per-instance portfolio, and independent instances in parallel processes.

z3's SAT core is fast on a symmetric formula and erratic on tight ones (the same instance takes 3 s or
60 s depending on the seed). An instance decided alone restarts: time slices that double, each a freshly
seeded solver, with the full formula (which alone can prove unsat) taking turns with the symmetric ones.
An unsat answer on a symmetric formula only rules that symmetry out. When there are fewer instances than
workers, each instance runs as racing copies (symmetric formulas in one, the full formula in another,
each searching without interruption) and the first decisive copy answers. The search's lead instance
(the one at the bound, which ends the search when sat) always runs alone on every worker first.

Independent instances run in forked processes, one a job with a pipe of its own (``synth.workers.start_jobs``),
so copies and instances that no longer matter are killed rather than left to run out their time limit, and
killing one never leaves a lock held that the search could wait on.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from schedules.collectives import Collective
from synth.smt.encoding import (
    MAX_SENDS,
    SAT,
    UNKNOWN,
    UNSAT,
    Formula,
    Instance,
    InstanceSolver,
    Outcome,
    OutOfTime,
    possible_sends,
)
from synth.smt.symmetry import Symmetry, symmetry_levels
from synth.workers import start_jobs, worker_init
from topologies.topology import Topology

FIRST_SLICE = 1.0  # seconds for each formula's first try; each round doubles it
GRACE = 1.0  # seconds past the deadline before a worker's answer is given up for unknown (z3 overruns a little)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Problem:
    """A non-combining collective on a switch-free fabric; ``fingerprint`` names the user's topology."""

    fabric: Topology
    fingerprint: str
    collective: Collective
    symmetry: bool = True

    def with_chunks(self, chunks: int) -> Problem:
        c = self.collective
        return replace(self, collective=Collective(c.name, c.nranks, chunks, c.root))


def decide(
    problem: Problem,
    instance: Instance,
    time_limit: float,
    copy: int = 0,
    copies: int = 1,
    deadline: float = float("inf"),
) -> Outcome:
    """Decide one instance within ``time_limit`` seconds and by ``deadline`` (``time.monotonic()``, the same
    clock in every process of the machine): sat with a schedule, unsat, or unknown.

    Alone (``copies`` 1) it restarts: time slices that double, each a freshly seeded solver, in turn over
    the full formula and the symmetric ones. As one of several racing copies, even copies search the
    symmetric formulas and odd copies the full one, without interruption.
    """
    start = time.monotonic()
    time_limit = min(time_limit, deadline - start)
    if time_limit <= 0:
        return Outcome(instance, UNKNOWN, 0.0)
    collective = problem.with_chunks(instance.chunks).collective
    if possible_sends(problem.fabric, collective, instance.steps) > MAX_SENDS:  # too large to write down in time
        return Outcome(instance, UNKNOWN, 0.0)
    levels = symmetry_levels(problem.fabric, collective) if problem.symmetry else []
    if copies > 1:
        levels = levels if copy % 2 == 0 else []
    # Alone, the full formula goes first: it settles unsat and easy instances.
    order: list[Symmetry | None] = [None] + levels if copies == 1 else levels + [None]
    formulas: dict[int, Formula] = {}
    running: dict[int, InstanceSolver] = {}
    budget = FIRST_SLICE if copies == 1 else time_limit
    turn = 0
    while True:
        for i, level in enumerate(order):
            if level is not None and level not in levels:
                continue
            if i not in formulas:
                try:
                    formulas[i] = Formula(problem.fabric, collective, instance, level, deadline=start + time_limit)
                except OutOfTime:
                    return Outcome(instance, UNKNOWN, time.monotonic() - start)
            left = time_limit - (time.monotonic() - start)
            if left <= 0:
                return Outcome(instance, UNKNOWN, time.monotonic() - start)
            if copies == 1 or i not in running:
                # Restarts with fresh seeds cut z3's heavy-tailed run times on these formulas.
                running[i] = InstanceSolver(formulas[i], 1000 * copy + turn, copy + turn)
            turn += 1
            slice_ = left if not levels else min(budget, left)
            out = running[i].run(problem.fingerprint, max(slice_, 0.001))
            if out.status == SAT or (out.status == UNSAT and level is None):
                return replace(out, elapsed=time.monotonic() - start)
            if out.status == UNSAT and level is not None:  # None returned above
                levels.remove(level)
        budget *= 2


def _worker_init(parent: int) -> None:
    """Pool workers leave Ctrl-C to the main process, which stops them: z3 must not turn it into "unknown"."""
    import z3

    worker_init(parent)
    z3.set_param("ctrl_c", False)


def _decide_job(job: tuple[Problem, Instance, float, int, int, float]) -> Outcome:
    return decide(*job)


def workers(requested: int) -> int:
    return requested if requested > 0 else (os.cpu_count() or 1)


def decide_first(
    problem: Problem,
    instances: Iterable[Instance],
    time_limit: float,
    nworkers: int,
    progress: Progress,
    label: str,
    deadline: float = float("inf"),
) -> tuple[Outcome | None, list[Outcome]]:
    """The first instance, in the given order, that is sat while every earlier one is unsat or unknown.

    Instances (and seeded copies of them, when workers outnumber instances) run in parallel; once an
    instance is sat and all earlier ones are decided, the rest are stopped. Returns that outcome (None when
    none is sat) and the outcome of every instance decided before it, in order.
    """
    order = list(instances)
    if not order:
        return None, []
    deadline = min(deadline, time.monotonic() + time_limit * len(order))
    if nworkers > 1 and len(order) > 1:
        # The first instance is the one that ends the search when sat: give it every worker first.
        lead, seen = _race(problem, order[:1], time_limit, nworkers, progress, label, deadline)
        if lead is not None:
            return lead, seen
        out, more = _race(problem, order[1:], time_limit, nworkers, progress, label, deadline)
        return out, seen + more
    return _race(problem, order, time_limit, nworkers, progress, label, deadline)


def _race(
    problem: Problem,
    order: list[Instance],
    time_limit: float,
    nworkers: int,
    progress: Progress,
    label: str,
    deadline: float,
) -> tuple[Outcome | None, list[Outcome]]:
    for inst in order[: max(nworkers, 1)]:
        progress(f"smt: {label} {inst}: solving")
    if nworkers <= 1:
        return _sequential([(problem, inst, time_limit, 0, 1, deadline) for inst in order], progress, label)
    copies = max(1, nworkers // len(order))
    results: queue.Queue = queue.Queue()  # filled by the runner's thread, in this process
    jobs = [
        (index, (problem, inst, time_limit, copy, copies, deadline))
        for index, inst in enumerate(order)
        for copy in range(copies)
    ]
    stop = start_jobs(decide, jobs, min(nworkers, len(jobs)), results, _worker_init, (os.getpid(),))
    try:
        return _collect(order, copies, results, progress, label, deadline + GRACE)
    finally:
        stop()


def _collect(
    order: list[Instance], copies: int, results, progress: Progress, label: str, give_up: float = float("inf")
) -> tuple[Outcome | None, list[Outcome]]:
    """Read outcomes as they come until the first sat instance in order is known, or ``give_up`` passes
    (every instance not yet decided is then unknown)."""
    decided: dict[int, Outcome] = {}
    unknowns: dict[int, int] = {}
    seen: list[Outcome] = []
    started = time.monotonic()
    while True:
        try:
            i, out = results.get(timeout=min(max(0.01, give_up - time.monotonic()), 3600.0))
        except queue.Empty:
            i = next(k for k in range(len(order)) if k not in decided)
            out = Outcome(order[i], UNKNOWN, time.monotonic() - started)
        if isinstance(out, BaseException):
            raise out
        if out is None:  # its process died without an answer (killed, out of memory): unknown
            out = Outcome(order[i], UNKNOWN, time.monotonic() - started)
        if i in decided:
            continue
        if out.status == UNKNOWN:
            unknowns[i] = unknowns.get(i, 0) + 1
            if unknowns[i] < copies:
                continue
        decided[i] = out
        while len(seen) in decided:
            out = decided[len(seen)]
            seen.append(out)
            progress(_line(label, out))
            if out.status == SAT:
                return out, seen
        if len(seen) == len(order):
            return None, seen


def _sequential(jobs, progress: Progress, label: str) -> tuple[Outcome | None, list[Outcome]]:
    seen = []
    for job in jobs:
        out = _decide_job(job)
        seen.append(out)
        progress(_line(label, out))
        if out.status == SAT:
            return out, seen
    return None, seen


def _line(label: str, out: Outcome) -> str:
    how = " (symmetric)" if out.status == SAT and out.symmetric else ""
    return f"smt: {label} {out.instance}: {out.status}{how} in {out.elapsed:.2f} s"
