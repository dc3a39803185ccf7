"""SCCL's (steps S, rounds R, chunks C) instance as a Boolean/pseudo-Boolean formula for z3.

One instance, one non-combining collective, one switch-free fabric. Variables:

- ``has[c, r, s]``: rank r holds chunk c at the end of step s (step 0 is the start);
- ``send[c, u, v, s]``: chunk c crosses link u->v during step s (1..S);
- ``rounds[s, k]``: step s lasts k rounds (one-hot, only when R > S).

Constraints: preconditions fix ``has[., ., 0]``; postconditions require ``has[., ., S]``; a send needs its
source to hold the chunk at the step's start and its destination not to (causality, no redundant copies);
a rank holds a chunk at step s iff it held it before or one send brought it (one source per arrival: at
most one such send); per step at most floor(chunk_capacity × k) chunks per link and floor(group_capacity ×
k) per sharing group when the step lasts k rounds, the verifier's rule; the rounds add up to R.

Sends of a chunk that cannot have reached the source yet (hop distance), or that cannot reach any rank
still needing it in the steps left, are never created: that pruning keeps the formula small.

A ``Symmetry`` group, when given, names one variable per orbit, so the solver only sees schedules that
the group maps onto themselves: fast when they exist, and the caller falls back to the full formula.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import networkx as nx
import z3

from schedules.collectives import Collective
from schedules.schedule import Schedule, ScheduleMeta, Send, Step
from synth.rank_links import rank_pair
from synth.smt.symmetry import Symmetry
from topologies.topology import Topology

SLACK = 1e-9  # the verifier's: capacity × rounds is a float and 2.9999999999 chunks of room is 3
SAT, UNSAT, UNKNOWN = "sat", "unsat", "unknown"
PB_ENCODINGS = ("totalizer", "sorting")  # both beat z3's native PB solver on tight capacity constraints


@dataclass(frozen=True)
class Instance:
    """Steps, total rounds and chunks per rank-slice: one point SCCL's search visits."""

    steps: int
    rounds: int
    chunks: int

    def __str__(self) -> str:
        return f"(S={self.steps}, R={self.rounds}, C={self.chunks})"


@dataclass(frozen=True)
class Outcome:
    """What z3 said about one instance; ``schedule`` is set when sat."""

    instance: Instance
    status: str
    elapsed: float
    schedule: Schedule | None = None
    symmetric: bool = False


def hop_distances(fabric: Topology) -> dict[int, dict[int, int]]:
    """Hops from every rank to every rank over the fabric's links."""
    return dict(nx.all_pairs_shortest_path_length(fabric.to_networkx()))


def solve_instance(
    fabric: Topology,
    fingerprint: str,
    collective: Collective,
    instance: Instance,
    time_limit: float,
    symmetry: Symmetry | None = None,
    seed: int = 0,
) -> Outcome:
    """Decide one instance for a non-combining collective; the schedule names ``fingerprint`` as its topology."""
    start = time.monotonic()
    solver = InstanceSolver(Formula(fabric, collective, instance, symmetry), seed)
    return solver.run(fingerprint, max(0.001, time_limit - (time.monotonic() - start)))


# The largest encoding the search writes down: chunks × links × steps possible sends. z3's Python API takes about
# 0.3 ms a variable, and setting up an instance (its symmetries, its step bound) grows with the chunks too, so far
# beyond this the time limit would be spent before the solver starts (SCCL-class instances stay far below it).
MAX_SENDS = 500_000


def possible_sends(fabric: Topology, collective: Collective, steps: int) -> int:
    """An upper bound on an instance's send variables: every chunk on every link at every step."""
    return collective.nchunks * len(fabric.links) * steps


class OutOfTime(Exception):
    """A formula's deadline passed while it was being written; the search reports the instance as unknown."""


class InstanceSolver:
    """A formula in one z3 solver; ``run`` may be called again to search on where it stopped.

    ``seed`` is z3's random seed and ``encoding`` its pseudo-Boolean encoding (an index into
    PB_ENCODINGS), so differently seeded solvers of the same instance explore differently.
    """

    def __init__(self, formula: Formula, seed: int = 0, encoding: int = 0) -> None:
        self.instance, self.collective, self.symmetry = formula.instance, formula.collective, formula.symmetry
        self.formula = formula
        self.solver = z3.SolverFor("QF_FD")
        self.solver.set("sat.random_seed", seed)
        self.solver.set("sat.pb.solver", PB_ENCODINGS[encoding % len(PB_ENCODINGS)])
        self.solver.add(self.formula.constraints)
        self.spent = 0.0

    def run(self, fingerprint: str, time_limit: float) -> Outcome:
        start = time.monotonic()
        self.solver.set("timeout", max(1, int(time_limit * 1000)))
        answer = self.solver.check()
        self.spent += time.monotonic() - start
        symmetric = self.symmetry is not None
        if answer == z3.unsat:
            return Outcome(self.instance, UNSAT, self.spent, symmetric=symmetric)
        if answer != z3.sat:
            if "keyboard" in self.solver.reason_unknown():
                raise KeyboardInterrupt  # z3 turned Ctrl-C into "unknown": the user's stop, not a time limit
            return Outcome(self.instance, UNKNOWN, self.spent, symmetric=symmetric)
        inst, name = self.instance, self.collective.name
        schedule = Schedule(
            self.collective,
            fingerprint,
            self.formula.read(self.solver.model()),
            f"smt-{name}-S{inst.steps}R{inst.rounds}C{inst.chunks}",
            ScheduleMeta(
                solver="smt",
                options={"steps": inst.steps, "rounds": inst.rounds, "chunks": inst.chunks},
                solve_time=self.spent,
            ),
        )
        return Outcome(inst, SAT, self.spent, schedule, symmetric=symmetric)


class Formula:
    """Builds the constraints once and reads a model back into steps."""

    def __init__(
        self,
        fabric: Topology,
        collective: Collective,
        instance: Instance,
        symmetry: Symmetry | None,
        deadline: float = math.inf,
    ) -> None:
        """``deadline``: the ``time.monotonic()`` by which the formula must be written, else OutOfTime (a large
        instance can take longer to write down, at about 0.3 ms per send variable, than its time limit)."""
        self.fabric, self.collective, self.instance, self.symmetry = fabric, collective, instance, symmetry
        self.deadline = deadline
        self.constraints: list = []
        self._vars: dict[tuple, z3.BoolRef] = {}
        self._plan_chunks()
        self._encode_rounds()
        self._encode_chunks()
        self._encode_capacity()

    # ---- variables ---------------------------------------------------------------------------
    def _var(self, key: tuple) -> z3.BoolRef:
        """The variable of ``key``'s orbit under the symmetry group (its own when there is none)."""
        if time.monotonic() > self.deadline:
            raise OutOfTime(f"{self.instance}: the time limit ran out while the formula was written")
        if self.symmetry is not None:
            key = self.symmetry.canonical(key)
        var = self._vars.get(key)
        if var is None:
            var = self._vars[key] = z3.Bool("_".join(map(str, key)))
        return var

    def _plan_chunks(self) -> None:
        """Which (chunk, rank, step) can hold and which sends are worth a variable."""
        coll, steps = self.collective, self.instance.steps
        dist = hop_distances(self.fabric)
        self.holders: dict[int, set[int]] = {c: set() for c in range(coll.nchunks)}
        self.needers: dict[int, set[int]] = {c: set() for c in range(coll.nchunks)}
        for r in range(coll.nranks):
            for c in coll.precondition(r):
                self.holders[c].add(r)
        for r in range(coll.nranks):
            for c in coll.postcondition(r):
                if r not in self.holders[c]:
                    self.needers[c].add(r)
        big = coll.nranks + steps + 1
        self.earliest = {
            c: [min((dist[h].get(r, big) for h in hs), default=big) for r in range(coll.nranks)]
            for c, hs in self.holders.items()
        }
        self.to_need = {
            c: [min((dist[r].get(n, big) for n in ns), default=big) for r in range(coll.nranks)]
            for c, ns in self.needers.items()
        }
        self.sends: dict[tuple[int, int, int, int], z3.BoolRef] = {}
        for c in range(coll.nchunks):
            if not self.needers[c]:
                continue
            held = self.holders[c]
            for link in self.fabric.links:
                u, v = rank_pair(link.key)
                if v in held:
                    continue
                for s in range(1, steps + 1):
                    if self.earliest[c][u] <= s - 1 and self.to_need[c][v] <= steps - s:
                        self.sends[(c, u, v, s)] = self._var(("send", c, u, v, s))

    def has(self, c: int, r: int, s: int):
        if r in self.holders[c]:
            return True
        if self.earliest[c][r] > s or not self.needers[c]:
            return False
        return self._var(("has", c, r, s))

    # ---- constraints -------------------------------------------------------------------------
    def _encode_rounds(self) -> None:
        steps, rounds = self.instance.steps, self.instance.rounds
        extra = rounds - steps
        if extra == 0:
            self.step_rounds = {s: {1: True} for s in range(1, steps + 1)}
            return
        self.step_rounds = {
            s: {k: z3.Bool(f"rounds_{s}_{k}") for k in range(1, extra + 2)} for s in range(1, steps + 1)
        }
        total = []
        for choice in self.step_rounds.values():
            self.constraints.append(z3.PbEq([(b, 1) for b in choice.values()], 1))
            total += [(b, k) for k, b in choice.items()]
        self.constraints.append(z3.PbEq(total, rounds))

    def _encode_chunks(self) -> None:
        coll, steps = self.collective, self.instance.steps
        into: dict[tuple[int, int, int], list[z3.BoolRef]] = {}
        for (c, u, v, s), var in self.sends.items():
            into.setdefault((c, v, s), []).append(var)
            self.constraints.append(z3.Implies(var, _lit(self.has(c, u, s - 1))))
            before = self.has(c, v, s - 1)
            if before is not False:
                self.constraints.append(z3.Implies(var, z3.Not(before)))
        for c in range(coll.nchunks):
            for r in range(coll.nranks):
                if r in self.holders[c]:
                    continue
                for s in range(1, steps + 1):
                    now = self.has(c, r, s)
                    arrivals = into.get((c, r, s), [])
                    if len(arrivals) > 1:
                        self.constraints.append(z3.AtMost(*arrivals, 1))
                    if now is False:
                        continue
                    self.constraints.append(now == z3.Or(_lit(self.has(c, r, s - 1)), *arrivals))
        for r in range(coll.nranks):
            for c in coll.postcondition(r):
                self.constraints.append(_lit(self.has(c, r, steps)))

    def _encode_capacity(self) -> None:
        per_link: dict[tuple[int, int, int], list[z3.BoolRef]] = {}
        for (_, u, v, s), var in self.sends.items():
            per_link.setdefault((u, v, s), []).append(var)
        full = self._saturated_ranks()
        for (u, v, s), load in per_link.items():
            self._cap(load, self.fabric.chunk_capacity(u, v), s, exact=v in full)
        for group in self.fabric.sharing:
            members = {tuple(k) for k in group.links}
            per_step: dict[int, list[z3.BoolRef]] = {}
            for (u, v, s), load in per_link.items():
                if (u, v) in members:
                    per_step.setdefault(s, []).extend(load)
            for s, load in per_step.items():
                self._cap(load, self.fabric.group_capacity(group), s)

    def _saturated_ranks(self) -> set[int]:
        """Ranks that lack at least R × their in-capacity in chunks: each of their in-links is full every step.

        A rank receives at most R × in-capacity chunks and must receive everything it lacks, so the
        capacity bounds of its in-links are met with equality; saying so outright lets the solver propagate
        instead of search (dgx1's bandwidth-optimal allgather goes from ~25 s to ~3 s). Only for ranks whose
        in-links have whole chunk capacities and belong to no sharing group, where the sum is exact.
        """
        grouped = {tuple(k) for g in self.fabric.sharing for k in g.links}
        lacking: Counter[int] = Counter(r for needers in self.needers.values() for r in needers)
        full = set()
        for r in range(self.collective.nranks):
            links = self.fabric.in_links[r]
            caps = [self.fabric.chunk_capacity(link.src, link.dst) for link in links]
            if any(link.key in grouped for link in links) or any(abs(c - round(c)) > SLACK for c in caps):
                continue
            if lacking[r] >= self.instance.rounds * round(sum(caps)):
                full.add(r)
        return full

    def _cap(self, load: list[z3.BoolRef], chunks_per_round: float, s: int, exact: bool = False) -> None:
        # Under a symmetry two sends can share one variable; a weighted sum still counts each send.
        weights = Counter(load)
        for k, chosen in self.step_rounds[s].items():
            room = math.floor(chunks_per_round * k + SLACK)
            if room >= len(load) and not exact:
                continue
            terms = [(var, n) for var, n in weights.items()]
            bound = z3.PbEq(terms, room) if exact else z3.PbLe(terms, room)
            self.constraints.append(bound if chosen is True else z3.Implies(chosen, bound))

    # ---- reading a model ---------------------------------------------------------------------
    def read(self, model: z3.ModelRef) -> tuple[Step, ...]:
        """The chosen sends per step, each step with the fewest rounds its loads need.

        Rounds come from the loads rather than the round variables, which z3's SAT core may have
        eliminated while simplifying; any rounds left of R go to the last step.
        """
        chosen: dict[int, list[Send]] = {s: [] for s in range(1, self.instance.steps + 1)}
        for (c, u, v, s), var in self.sends.items():
            if z3.is_true(model.eval(var, model_completion=True)):
                chosen[s].append(Send(c, u, v))
        rounds = {s: self._rounds_needed(sends) for s, sends in chosen.items()}
        rounds[self.instance.steps] += max(0, self.instance.rounds - sum(rounds.values()))
        return tuple(
            Step(rounds[s], tuple(sorted(sends, key=lambda x: (x.chunk, x.src, x.dst)))) for s, sends in chosen.items()
        )

    def _rounds_needed(self, sends: list[Send]) -> int:
        per_link = Counter((x.src, x.dst) for x in sends)
        loads = [(n, self.fabric.chunk_capacity(*key)) for key, n in per_link.items()]
        for group in self.fabric.sharing:
            n = sum(per_link.get(rank_pair(tuple(key)), 0) for key in group.links)
            if n:
                loads.append((n, self.fabric.group_capacity(group)))
        k = 1
        while any(n > math.floor(cap * k + SLACK) for n, cap in loads):
            k += 1
        return k


def _lit(value) -> z3.BoolRef:
    return z3.BoolVal(value) if isinstance(value, bool) else value
