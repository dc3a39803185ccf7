"""Deciding instances: a per-instance portfolio, and independent instances in parallel processes.

z3's SAT core is fast on a symmetric formula and erratic on tight ones (the same instance takes 3 s or
60 s depending on the seed), so one instance is decided by restarts: symmetric formulas with growing time
slices and fresh seeds, interleaved with the full formula, which alone can prove unsat. An unsat answer on
a symmetric formula only rules that symmetry out.

Independent instances run in a ``multiprocessing`` pool; a pool (unlike concurrent.futures) can be
terminated, so instances that no longer matter are stopped rather than left to run out their time limit.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from schedules.collectives import Collective
from synth.smt_encoding import SAT, UNKNOWN, UNSAT, Instance, Outcome, solve_instance
from synth.smt_symmetry import symmetry_levels
from topologies.topology import Topology

FIRST_SLICE = 1.0  # seconds for each formula's first try; each round doubles it

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Problem:
    """A non-combining collective on a switch-free fabric; ``fingerprint`` names the user's topology."""

    fabric: Topology
    fingerprint: str
    collective: Collective
    symmetry: bool = True

    def with_chunks(self, chunks: int) -> "Problem":
        c = self.collective
        return replace(self, collective=Collective(c.name, c.nranks, chunks, c.root))


def decide(problem: Problem, instance: Instance, time_limit: float) -> Outcome:
    """Decide one instance within ``time_limit`` seconds: sat with a schedule, unsat, or unknown."""
    start = time.monotonic()
    collective = problem.with_chunks(instance.chunks).collective
    levels = symmetry_levels(problem.fabric, collective) if problem.symmetry else []
    budget = FIRST_SLICE
    attempt = 0
    while True:
        for level in [None] + list(levels):
            left = time_limit - (time.monotonic() - start)
            if left <= 0:
                return Outcome(instance, UNKNOWN, time.monotonic() - start)
            slice_ = left if not levels else min(budget, left)
            out = solve_instance(problem.fabric, problem.fingerprint, collective, instance, slice_, level, attempt)
            attempt += 1
            if out.status == SAT or (out.status == UNSAT and level is None):
                return replace(out, elapsed=time.monotonic() - start)
            if out.status == UNSAT:
                levels.remove(level)
        budget *= 2


def _decide_job(job: tuple[Problem, Instance, float]) -> Outcome:
    return decide(*job)


def workers(requested: int) -> int:
    return requested if requested > 0 else (os.cpu_count() or 1)


def decide_first(problem: Problem, instances: Iterable[Instance], time_limit: float, nworkers: int,
                 progress: Progress, label: str) -> tuple[Outcome | None, list[Outcome]]:
    """The first instance, in the given order, that is sat while every earlier one is unsat or unknown.

    Instances run in parallel; once an instance is sat and all earlier ones are decided, the rest are
    stopped. Returns that outcome (None when none is sat) and every outcome seen, in order.
    """
    order = list(instances)
    if not order:
        return None, []
    jobs = [(problem, inst, time_limit) for inst in order]
    for inst in order[:nworkers]:
        progress(f"smt: {label} {inst}: solving")
    if nworkers <= 1 or len(order) == 1:
        return _sequential(jobs, progress, label)
    pool = multiprocessing.get_context("fork").Pool(min(nworkers, len(order)))
    try:
        pending = [pool.apply_async(_decide_job, (job,)) for job in jobs]
        seen: list[Outcome] = []
        for handle in pending:
            out = handle.get()
            seen.append(out)
            progress(_line(label, out))
            if out.status == SAT:
                return out, seen
        return None, seen
    finally:
        pool.terminate()
        pool.join()


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
