"""Schedule transforms for combining collectives: the dual on the reversed fabric, scaling, and allreduce.

A reducescatter (reduce) on a fabric is an allgather (broadcast) on the reversed fabric, run backwards:
the allgather sends chunk c over u->v at step s, so the reducescatter reduces chunk c over v->u at step
S+1-s. Each rank receives each chunk once in the allgather, so in the dual each rank's contribution
travels up one tree exactly once, after everything below it has arrived.

Chunk ids are global and shared by the three collectives (chunk r·C+j is rank r's j-th slice in
reducescatter, allgather and allreduce alike), so allreduce is the reducescatter's steps followed by the
allgather's, with no renumbering at all.
"""

from __future__ import annotations

from schedules.collectives import Collective
from schedules.schedule import Schedule, ScheduleMeta, Send, Step


def dual_collective(collective: Collective) -> Collective:
    """The non-combining collective whose reversal solves ``collective``."""
    return collective.dual


def from_dual(schedule: Schedule, collective: Collective, fingerprint: str) -> Schedule:
    """The combining schedule for ``collective`` read backwards out of its dual's schedule."""
    steps = tuple(
        Step(
            step.rounds,
            tuple(
                sorted(
                    (Send(s.chunk, s.dst, s.src, "reduce") for s in step.sends), key=lambda x: (x.chunk, x.src, x.dst)
                )
            ),
        )
        for step in reversed(schedule.steps)
    )
    name = schedule.name.replace(schedule.collective.name, collective.name, 1)
    return Schedule(collective, fingerprint, steps, name, schedule.meta)


def scale_chunks(schedule: Schedule, factor: int) -> Schedule:
    """The same algorithm with every chunk split into ``factor`` chunks (and ``factor`` times the rounds)."""
    if factor == 1:
        return schedule
    coll = schedule.collective
    scaled = Collective(coll.name, coll.nranks, coll.chunks * factor, coll.root)
    steps = tuple(
        Step(
            step.rounds * factor,
            tuple(Send(s.chunk * factor + i, s.src, s.dst, s.op) for s in step.sends for i in range(factor)),
        )
        for step in schedule.steps
    )
    return Schedule(scaled, schedule.topology, steps, schedule.name, schedule.meta)


def allreduce(reducescatter: Schedule, allgather: Schedule) -> Schedule:
    """Reducescatter then allgather, at the chunk count both share (each is scaled to the lcm)."""
    from math import lcm

    c = lcm(reducescatter.collective.chunks, allgather.collective.chunks)
    rs = scale_chunks(reducescatter, c // reducescatter.collective.chunks)
    ag = scale_chunks(allgather, c // allgather.collective.chunks)
    coll = Collective("allreduce", rs.collective.nranks, c)
    steps = rs.steps + ag.steps
    rounds = sum(s.rounds for s in steps)
    meta = ScheduleMeta(
        solver="smt",
        options={"steps": len(steps), "rounds": rounds, "chunks": c, "reducescatter": rs.name, "allgather": ag.name},
        solve_time=rs.meta.solve_time + ag.meta.solve_time,
    )
    return Schedule(coll, rs.topology, steps, f"smt-allreduce-S{len(steps)}R{rounds}C{c}", meta)
