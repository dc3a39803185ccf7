"""All-reduce that reduces along the way: each chunk summed up a tree into a root of the solver's choice, then
copied back down a tree from it, every chunk on its own trees and steps (ForestColl's and the all-reduce
literature's reduce-then-broadcast, as one time-expanded model).

Reduce-scatter then all-gather fixes each chunk's root (its owner) and runs every reduction before any copy.
On a fabric whose ranks differ that costs bandwidth: on ``line:n=3`` every chunk should meet in the middle
rank, and the copies of one chunk should overlap the reductions of the next.

Booleans per chunk c, switch-free link u->v and step k: ``r[c, u, v, k]`` (u adds its partial sum of c into
v) and ``b[c, u, v, k]`` (u copies the finished sum of c to v); ``root[c, u]``; ``late[c, u, k]``, "a partial
of c still reaches u in step k or later". Every rank but the root sends its partial exactly once and
receives the sum exactly once; a rank sends (either) only once no partial arrives any more, so each partial
carries every contribution below it exactly once; a copy leaves a rank that is the root or already holds
the sum. Steps are priced as in ``flow`` (links and sharing groups, α-β), so the objective is
``schedules.cost``'s price.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from schedules.collectives import Collective
from schedules.schedule import Send, Step
from synth.milp.flow import (
    FlowModel,
    FlowSpec,
    StepTerm,
    group_terms,
    hop_distances,
    link_cost_us,
    step_objective,
)
from synth.rank_links import rank_pair
from topologies import Topology

Key = tuple[int, int, int, int]  # (chunk, src, dst, step)


@dataclass(frozen=True)
class ReduceBroadcastSpec:
    """A switch-free topology, an all-reduce and its step budget; ``hint`` is a schedule to start from."""

    topology: Topology
    collective: Collective
    steps: int
    chunk_bytes: float
    hint: tuple[Step, ...] = ()

    @property
    def possible_sends(self) -> int:
        return 2 * self.collective.nchunks * len(self.topology.links) * self.steps


def build(spec: ReduceBroadcastSpec) -> FlowModel:
    """The CP-SAT model; ``FlowModel.sends`` holds the copies and ``FlowModel.reduces`` the partial sums."""
    model = cp_model.CpModel()
    topo, coll, steps = spec.topology, spec.collective, spec.steps
    links = sorted(rank_pair(link.key) for link in topo.links)
    chunks, ranks, every = range(coll.nchunks), topo.ranks, range(1, steps + 1)
    r = {(c, u, v, k): model.new_bool_var(f"r{c}_{u}_{v}_{k}") for c in chunks for u, v in links for k in every}
    b = {(c, u, v, k): model.new_bool_var(f"b{c}_{u}_{v}_{k}") for c in chunks for u, v in links for k in every}
    root = {(c, u): model.new_bool_var(f"root{c}_{u}") for c in chunks for u in ranks}
    out = {u: [v for s, v in links if s == u] for u in ranks}
    into = {v: [u for u, d in links if d == v] for v in ranks}
    for c in chunks:
        model.add_exactly_one(root[c, u] for u in ranks)
        for u in ranks:
            model.add(sum(r[c, u, v, k] for v in out[u] for k in every) + root[c, u] == 1)
            model.add(sum(b[c, w, u, k] for w in into[u] for k in every) + root[c, u] == 1)
            late = {k: model.new_bool_var("") for k in every}  # a partial of c reaches u in step k or later
            held = root[c, u]  # u holds the sum of c at the start of step k (root: once no partial is late)
            for k in every:
                if k < steps:
                    model.add_implication(late[k + 1], late[k])
                for w in into[u]:
                    model.add_implication(r[c, w, u, k], late[k])
                if k > 1:
                    now = model.new_bool_var("")
                    model.add(now == held + sum(b[c, w, u, k - 1] for w in into[u]))
                    held = now
                for v in out[u]:
                    model.add_implication(r[c, u, v, k], late[k].Not())
                    model.add_implication(b[c, u, v, k], late[k].Not())
                    model.add(b[c, u, v, k] <= held)
    _hint(model, spec, r, b, root)
    on_link: dict[tuple[tuple[int, int], int], list] = {}
    for (_, u, v, k), var in list(r.items()) + list(b.items()):
        on_link.setdefault(((u, v), k), []).append(var)
    terms = [
        StepTerm(k, *link_cost_us(topo.link(*key).latency, topo.link(*key).capacity, spec.chunk_bytes), vs, vs)
        for (key, k), vs in on_link.items()
    ]
    flow_spec = FlowSpec(topo, coll, steps, spec.chunk_bytes, frozenset(links))
    for group in topo.sharing:
        terms += group_terms(flow_spec, group, tuple(sorted(rank_pair(tuple(key)) for key in group.links)), on_link)
    objective, units_per_us = step_objective(model, terms, steps, len(r) + len(b))
    model.minimize(objective)
    return FlowModel(model, b, objective, units_per_us, len(r) + len(b), reduces=r)


def _hint(model: cp_model.CpModel, spec: ReduceBroadcastSpec, r: dict, b: dict, root: dict) -> None:
    """Start from ``spec.hint`` (reduce-scatter then all-gather: each chunk's root is the rank that never sends
    its partial), where it fits in the steps."""
    if not spec.hint or len(spec.hint) > spec.steps:
        return
    reduces: set[Key] = set()
    copies: set[Key] = set()
    for k, step in enumerate(spec.hint, start=1):
        for s in step.sends:
            (reduces if s.op == "reduce" else copies).add((s.chunk, s.src, s.dst, k))
    senders = {(c, u) for c, u, _, _ in reduces}
    for key, var in r.items():
        model.add_hint(var, key in reduces)
    for key, var in b.items():
        model.add_hint(var, key in copies)
    for (c, u), var in root.items():
        model.add_hint(var, (c, u) not in senders)


def pipelined_trees(fabric: Topology, topo: Topology, collective: Collective) -> tuple[Step, ...]:
    """A first schedule to start from: chunk c reduced up a shortest-path tree into its root and copied back
    down one, the chunks one after another, each hop in the first step after its inputs where the link has
    room (``floor(chunk capacity)`` chunks a step). Roots take turns among the ranks that can take in and
    send out the most of ``fabric`` (on a line of three, the middle).
    """
    links = frozenset(rank_pair(link.key) for link in topo.links)
    toward = {r: d for r, d in hop_distances(topo.ranks, frozenset((v, u) for u, v in links)).items()}
    away = hop_distances(topo.ranks, links)
    score = {
        r: min(sum(link.capacity for link in fabric.in_links[r]), sum(link.capacity for link in fabric.out_links[r]))
        for r in topo.ranks
    }
    best = max(score.values())
    roots = [r for r in topo.ranks if score[r] >= best * (1 - 1e-9)]
    room = {key: max(1, int(topo.chunk_capacity(*key) + 1e-9)) for key in links}
    used: dict[tuple[tuple[int, int], int], int] = {}
    sends: dict[int, list[Send]] = {}

    def place(c: int, u: int, v: int, after: int, op: str) -> int:
        k = after + 1
        while used.get(((u, v), k), 0) >= room[u, v]:
            k += 1
        used[(u, v), k] = used.get(((u, v), k), 0) + 1
        sends.setdefault(k, []).append(Send(c, u, v, op))
        return k

    n = topo.nranks
    for c in range(collective.nchunks):
        root = roots[c % len(roots)]
        ready = {u: 0 for u in topo.ranks}  # the step after which u holds its whole partial (then the sum)
        for u in sorted((u for u in topo.ranks if u != root), key=lambda u: -toward[root][u]):
            parent = min(
                (v for v in topo.ranks if (u, v) in links and toward[root][v] == toward[root][u] - 1),
                key=lambda v: (v - c) % n,
            )
            ready[parent] = max(ready[parent], place(c, u, parent, ready[u], "reduce"))
        for v in sorted((v for v in topo.ranks if v != root), key=lambda v: away[root][v]):
            parent = min(
                (u for u in topo.ranks if (u, v) in links and away[root][u] == away[root][v] - 1),
                key=lambda u: (u - c) % n,
            )
            ready[v] = place(c, parent, v, ready[parent], "copy")
    return tuple(Step(1, tuple(sends.get(k, ()))) for k in range(1, max(sends, default=0) + 1))
