"""``solve(topology, collective, options) -> Schedule``: sketch, encode, search, read back, reverse."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

from ortools.sat.python import cp_model

from schedules.bounds import lower_bound_us
from schedules.collectives import Collective
from schedules.schedule import Schedule, ScheduleMeta, Send, Step
from synth.errors import Interrupted, SynthesisError, Unknown, Unsat
from synth.milp import hierarchy, reduce_broadcast
from synth.milp.flow import FlowModel, FlowSpec, OutOfTime, build_flow, hop_distances
from synth.milp.flow import bandwidth_bound as flow_bandwidth_bound
from synth.milp.links import allowed_links, check_reachable
from synth.milp.sketch import Sketch
from synth.milp.symmetry import rank_symmetry
from synth.rank_links import rank_pair
from synth.workers import start_thread
from topologies import Topology
from weftcore.errors import WeftError

Progress = Callable[[str], None]
# The largest model built: chunks × links × steps possible sends (DGX-2 ×2 with 4 chunks per rank is about 1.4
# million). Far beyond it, writing the model down outlasts any time limit before CP-SAT starts.
MAX_SENDS = 2_000_000
# The largest reduce-broadcast all-reduce model tried (2 × chunks × links × steps possible sends). It has no
# symmetry or inter-/intra-host split to shrink it; past this, reducescatter then allgather is the answer alone.
MAX_REDUCE_BROADCAST = 60_000
RS_AG, REDUCE_BROADCAST = "reducescatter+allgather", "reduce-broadcast"
PROGRESS_EVERY = 5.0  # seconds between progress lines while CP-SAT searches, incumbent or not


@dataclass(frozen=True)
class MilpOptions:
    """How to synthesize: ``size`` in bytes (the message the finish time is minimized for).

    ``chunks`` (per rank) overrides the sketch's, which overrides the collective's; ``steps`` bounds the
    steps (default: the hop depth plus two steps per chunk, room for pipelining).
    """

    size: int = 1 << 20
    time_limit: float = 60.0
    sketch: Sketch | None = None
    chunks: int | None = None
    steps: int | None = None
    workers: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise SynthesisError(f"milp: size: must be a positive number of bytes, got {self.size!r}")
        if not isinstance(self.time_limit, (int, float)) or not self.time_limit > 0:
            raise SynthesisError(f"milp: time_limit: must be a positive number of seconds, got {self.time_limit!r}")
        for name in ("chunks", "steps", "workers"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise SynthesisError(f"milp: {name}: must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Outcome:
    """One CP-SAT search: the steps found and how good they are known to be."""

    steps: tuple[Step, ...]
    objective_us: float
    bound_us: float
    status: str
    seconds: float
    hierarchy: str = "none"  # the inter-host part the model used (rails, trees) or none
    symmetry_offset: int | None = None  # the rank shift the model's variables are shared under
    symmetry_local: int | None = None  # the rotation inside every host they are shared under

    @property
    def gap(self) -> float:
        return 0.0 if self.objective_us <= 0 else max(0.0, 1.0 - self.bound_us / self.objective_us)


@dataclass(frozen=True)
class _Job:
    """What every search of one ``solve`` call shares."""

    fabric: Topology
    options: MilpOptions
    sketch: Sketch
    progress: Progress | None
    requested: str = ""  # the collective the caller asked for, which labels every line (allreduce's halves too)

    @cached_property
    def switch_free(self) -> Topology:
        return self.fabric.without_switches()


def solve(
    topology: Topology, collective: Collective, options: MilpOptions = MilpOptions(), progress: Progress | None = None
) -> Schedule:
    """The fastest schedule for ``options.size`` bytes that CP-SAT finds within the time limit.

    ``meta.options`` holds the objective, the best bound (the larger of CP-SAT's and the fabric's lower
    bound from ``schedules.bounds``) and the gap between them.
    """
    sketch = options.sketch or Sketch()
    chunks = options.chunks or sketch.chunks or collective.chunks
    collective = Collective(collective.name, collective.nranks, chunks, collective.root)
    if collective.nranks != topology.nranks:
        raise SynthesisError(
            f"milp: collective has {collective.nranks} ranks, topology {topology.name} has {topology.nranks}"
        )
    start = time.monotonic()
    job = _Job(topology, options, sketch, progress, collective.name)
    form = None
    if collective.facts.phases:  # allreduce: reducescatter then allgather, or reduce-broadcast trees
        halves, form = _solve_allreduce(job, collective)
    else:
        halves = [_solve_one(job, collective, options.time_limit)]
    steps = tuple(step for outcome in halves for step in outcome.steps)
    objective = sum(o.objective_us for o in halves)
    bound = sum(o.bound_us for o in halves)
    meta = ScheduleMeta(
        solver="milp",
        options={
            "size": options.size,
            "time_limit": options.time_limit,
            "chunks": chunks,
            "steps": options.steps,
            "sketch": sketch.to_json() if options.sketch else None,
            "objective_us": objective,
            "best_bound_us": bound,
            "gap": 0.0 if objective <= 0 else max(0.0, 1.0 - bound / objective),
            "status": "+".join(o.status for o in halves),
            "hierarchy": halves[-1].hierarchy,
            "symmetry_offset": halves[-1].symmetry_offset,
            "symmetry_local": halves[-1].symmetry_local,
            **({"allreduce_form": form} if form else {}),
        },
        solve_time=time.monotonic() - start,
        notes="CP-SAT time-expanded flow; objective = finish time under the α-β step model",
    )
    # the size it was solved for is in the name: a sweep's schedules (and the plans compiled from them) differ
    return Schedule(
        collective, topology.fingerprint, steps, f"milp-{collective.name}-c{chunks}-{_size_label(options.size)}", meta
    )


def _size_label(nbytes: int) -> str:
    """``nbytes`` as a name part: 16MB, 4KB, 1000B (whole binary units only)."""
    for unit, shift in (("GB", 30), ("MB", 20), ("KB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


def default_chunks(topology: Topology, collective: Collective, size: int) -> int:
    """Chunks per rank when neither the caller nor the sketch says: room to pipeline at bandwidth-bound sizes.

    Up to 4 per rank while the model stays within 64 chunks, or 128 across hosts, where the inter-/intra-host
    split keeps the model small (DGX-2 x2 at 1 GB: 95.3 % of the cut bound with 4 per rank in 10 s; the whole
    model reached 73 % with 1 chunk per rank and 81 % with 2 in 120 s).
    """
    one = Collective(collective.name, collective.nranks, 1, collective.root)
    chunk_bytes = one.chunk_bytes(size)
    fabric = topology.without_switches()
    if not flow_bandwidth_bound(fabric.links, chunk_bytes):
        return 1
    return min(4, max(1, (128 if topology.nhosts > 1 else 64) // one.nchunks))


def _solve_allreduce(job: _Job, collective: Collective) -> tuple[list[Outcome], str]:
    """The faster of reducescatter then allgather and, where its model is small enough, reduce-broadcast
    (``reduce_broadcast``: each chunk reduced into a root of the model's choice and copied back), which starts
    from the faster of the first and pipelined trees. Returns the outcomes that make up the schedule and the
    form's name."""
    n, c, limit = collective.nranks, collective.chunks, job.options.time_limit
    start = time.monotonic()
    spec = _reduce_broadcast_spec(job, collective)
    share = limit / 2 if spec is None else limit / 3
    gather = _solve_one(job, Collective("allgather", n, c), share)
    if job.switch_free.reversed().fingerprint == job.switch_free.fingerprint:
        scatter = replace(gather, steps=_reverse(gather.steps))
    else:
        scatter = _solve_one(job, Collective("reducescatter", n, c), share)
    halves = [scatter, gather]
    if spec is None:
        return halves, RS_AG
    hint = min((scatter.steps + gather.steps, spec.hint), key=lambda steps: _price(job, collective, steps))
    spec = replace(spec, steps=job.options.steps or len(hint), hint=hint)
    if spec.possible_sends > MAX_REDUCE_BROADCAST:
        return halves, RS_AG
    floor = lower_bound_us(job.fabric, collective, job.options.size)
    try:
        joined = _solve_model(
            job,
            spec.topology,
            collective,
            reduce_broadcast.build(spec),
            f"{collective.name} as reduce-broadcast",
            spec.steps,
            floor,
            start,
            limit,
        )
    except (Unknown, Unsat):
        return halves, RS_AG  # no time left for it, nothing found, or too few --steps: the first form stands
    if joined.objective_us < sum(o.objective_us for o in halves) * (1 - 1e-9):
        return [joined], REDUCE_BROADCAST
    return halves, RS_AG


def _price(job: _Job, collective: Collective, steps: tuple[Step, ...]) -> float:
    from schedules.cost import predict_us

    steps = tuple(Step(rounds_for(job.switch_free, list(st.sends)), st.sends) for st in steps)
    return predict_us(Schedule(collective, job.fabric.fingerprint, steps), job.fabric, job.options.size)


def _reduce_broadcast_spec(job: _Job, collective: Collective) -> reduce_broadcast.ReduceBroadcastSpec | None:
    """The reduce-broadcast model for this all-reduce with pipelined trees as its hint, or None where a sketch
    narrows the search (relays, rails and symmetry are hints for the other form) or the model would pass
    MAX_REDUCE_BROADCAST possible sends at twice the depth plus a step per chunk."""
    if job.options.sketch is not None:
        return None
    topo = job.switch_free
    links = frozenset(rank_pair(link.key) for link in topo.links)
    depth = max(max(d.values()) for d in hop_distances(topo.ranks, links).values())
    steps = job.options.steps or 2 * depth + collective.nchunks - 1
    spec = reduce_broadcast.ReduceBroadcastSpec(topo, collective, steps, collective.chunk_bytes(job.options.size))
    if spec.possible_sends > MAX_REDUCE_BROADCAST:
        return None
    return replace(spec, hint=reduce_broadcast.pipelined_trees(job.fabric, topo, collective))


def _solve_one(job: _Job, collective: Collective, time_limit: float) -> Outcome:
    floor = lower_bound_us(job.fabric, collective, job.options.size)
    if collective.facts.from_dual:  # reduction trees are broadcast trees run backwards
        dual = collective.dual
        outcome = _search(job, job.switch_free.reversed(), dual, time_limit, floor, collective.name)
        return replace(outcome, steps=_reverse(outcome.steps))
    if collective.combining:
        raise SynthesisError(f"milp: {collective.name} has no copy-only dual")
    return _search(job, job.switch_free, collective, time_limit, floor, collective.name)


def _reverse(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """Run copy trees backwards as reduction trees: last step first, every send turned around."""
    return tuple(
        Step(st.rounds, tuple(Send(s.chunk, s.dst, s.src, "reduce") for s in st.sends)) for st in reversed(steps)
    )


def _search(
    job: _Job, topo: Topology, collective: Collective, time_limit: float, floor_us: float, label: str
) -> Outcome:
    """One CP-SAT search on a switch-free ``topo``; ``floor_us`` is a lower bound known beforehand.

    ``label`` names the collective the user asked for (reducescatter when this searches its allgather dual).
    """
    start = time.monotonic()
    sketch, options = job.sketch, job.options
    chunk_bytes = collective.chunk_bytes(options.size)
    links = allowed_links(topo, collective, sketch, chunk_bytes)
    depth = check_reachable(topo, collective, links, sketch)
    per_chunk, depth, split = _hierarchy(job, topo, collective, links, chunk_bytes, depth)
    steps = options.steps or depth + 2 * collective.chunks
    if steps < depth:
        raise Unsat(f"milp: {label} on {job.fabric.name} needs at least {depth} steps, got steps={steps}")
    per_step = collective.nchunks * len(links) if per_chunk is None else sum(map(len, per_chunk))
    possible = per_step * steps
    if possible > MAX_SENDS:
        over = f"{len(links)} links" if per_chunk is None else "the hierarchy's links"
        raise SynthesisError(
            f"milp: {label} on {job.fabric.name}: {collective.nchunks} chunks over {over} "
            f"in {steps} steps are {possible} possible sends, more than the model's "
            f"{MAX_SENDS} (it could not be built within a time limit): use fewer --chunks or "
            "--steps"
        )
    symmetry = None
    if sketch.rank_offset is not None or topo.nhosts > 1:  # symmetry across hosts unless the sketch says
        symmetry = rank_symmetry(topo, collective, links, sketch, per_chunk)
    deadline = start + time_limit
    try:
        flow = build_flow(FlowSpec(topo, collective, steps, chunk_bytes, links, symmetry, deadline, per_chunk))
    except OutOfTime:
        raise Unknown(
            f"milp: {label} on {job.fabric.name}: the model of {collective.nchunks} chunks in {steps} "
            f"steps was not built within the time limit of {time_limit:g} s (use fewer --chunks or "
            "--steps, or a longer --time-limit)"
        ) from None
    outcome = _solve_model(job, topo, collective, flow, label, steps, floor_us, start, time_limit)
    return replace(
        outcome,
        hierarchy=split,
        symmetry_offset=symmetry.offset if symmetry else None,
        symmetry_local=symmetry.local if symmetry else None,
    )


def _solve_model(
    job: _Job,
    topo: Topology,
    collective: Collective,
    flow: FlowModel,
    label: str,
    steps: int,
    floor_us: float,
    start: float,
    time_limit: float,
) -> Outcome:
    """CP-SAT on a built model, within what is left of ``time_limit`` since ``start``; the schedule read back."""
    deadline = start + time_limit
    solver = cp_model.CpSolver()
    # Reading the answer back walks every send (1.8 s a million on the idle 2-core machine, twice that under
    # load); CP-SAT loads the model before its clock starts (12 s for 330,000 variables under load) and winds
    # its workers down after the limit. All of it stays inside the limit.
    read_back = 0.5 + 4e-6 * (len(flow.sends) + len(flow.reduces))
    loading = 4e-5 * flow.variables
    left = deadline - time.monotonic() - read_back - min(2.0, 0.02 * time_limit)
    if left < loading:
        raise Unknown(
            f"milp: {label} on {job.fabric.name}: the model of {collective.nchunks} chunks in {steps} "
            f"steps was built with {max(0.0, left):.1f} s of the time limit of {time_limit:g} s left, "
            f"too little to load its {flow.variables} variables (use fewer --chunks or --steps, or a "
            "longer --time-limit)"
        )
    solver.parameters.max_time_in_seconds = max(0.1, left - loading)
    solver.parameters.num_workers = job.options.workers or max(2, min(8, os.cpu_count() or 2))
    # Full presolve probes every send variable and symmetry detection builds a graph of the whole model: 12 s
    # and 7 s on NDv2 and HGX before the first incumbent. Without them the shortest-path hint is the first
    # incumbent in about 1 s, and NDv2 at 1 GB still reaches 97.7 % of the cut bound in 120 s.
    solver.parameters.max_presolve_iterations = 1
    solver.parameters.cp_model_probing_level = 0
    solver.parameters.symmetry_level = 0
    # CP-SAT's own SIGINT handler would end the search and hand back the incumbent as if the time limit had
    # passed; instead Solve runs in a thread, the main thread keeps Python's Ctrl-C and a steady progress line
    solver.parameters.catch_sigint_signal = False
    if job.requested and not label.startswith(job.requested):
        label = f"{job.requested} ({label} part)"
    reporter = _Reporter(flow, job.progress, label, floor_us)
    status = _run(solver, flow, reporter, job, label, start, deadline - read_back)
    name = solver.StatusName(status)
    _final_line(job, label, name, reporter, solver, flow, floor_us)
    if status == cp_model.INFEASIBLE:
        raise Unsat(f"milp: no {label} schedule on {job.fabric.name} within {steps} step{'s' * (steps != 1)}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise Unknown(
            f"milp: no {label} schedule on {job.fabric.name} found within the time limit of "
            f"{time_limit:g} s (status {name})"
        )
    objective = solver.ObjectiveValue() / flow.units_per_us
    bound = max(solver.BestObjectiveBound() / flow.units_per_us, min(floor_us, objective))
    return Outcome(_read_steps(topo, flow, solver), objective, bound, name.lower(), solver.WallTime())


def _hierarchy(
    job: _Job, topo: Topology, collective: Collective, links: frozenset[tuple[int, int]], chunk_bytes: float, depth: int
) -> tuple[tuple[frozenset, ...] | None, int, str]:
    """The inter-/intra-host split's links per chunk, the hop depth they need and its name (rails, trees);
    (None, depth, "none") without it.

    The sketch's ``hierarchy`` decides; absent, rails across hosts at bandwidth-bound sizes (on DGX-2 x 2 at
    1 GB the trees' hops give 63.5% of the bound where rails give 95.3%: a packing balances rates, not the few
    chunks a model holds). A split that would leave some rank unreachable is dropped.
    """
    choice = job.sketch.hierarchy
    bandwidth_bound = flow_bandwidth_bound(topo.links, chunk_bytes)
    if choice is None:
        choice = "rails" if bandwidth_bound and job.sketch.relays is None else "none"
    if choice == "none" or not hierarchy.applies(topo, collective):
        return None, depth, "none"
    cross = None
    if choice == "trees" and collective.facts.same_to_all and not collective.rooted:  # every rank's slice to all
        cross = _tree_hops(job, topo, collective)
    if cross is None:
        choice, cross = "rails", hierarchy.rail_hops(topo, collective, links)
    per_chunk = hierarchy.chunk_links(topo, collective, links, cross)
    deepest = 0
    for c, allowed in enumerate(per_chunk):
        dist = hop_distances(topo.ranks, allowed)
        holders = [r for r in topo.ranks if c in collective.precondition(r)]
        for r in topo.ranks:
            if c in collective.postcondition(r) and r not in holders:
                hops = min((dist[s][r] for s in holders if r in dist[s]), default=None)
                if hops is None:
                    return None, depth, "none"
                deepest = max(deepest, hops)
    return per_chunk, deepest, choice


def _tree_hops(job: _Job, topo: Topology, collective: Collective) -> dict | None:
    """The cross-host hops of the tree packing's trees (on the fabric this search runs on), or None."""
    from synth.trees import TreeOptions, allgather_forest

    fabric = job.fabric if topo.fingerprint == job.switch_free.fingerprint else job.fabric.reversed()
    try:
        forest = allgather_forest(fabric, TreeOptions(k=collective.chunks, time_limit=job.options.time_limit / 4))
    except WeftError:
        return None
    trees_of = {r: [t.hops for t in forest.trees_of(r)] for r in topo.ranks}
    # the trees choose their own cross-host hops (not only the rails): any link of the fabric may carry one
    return hierarchy.tree_hops(topo, collective, trees_of, frozenset(rank_pair(link.key) for link in topo.links))


def _run(
    solver: cp_model.CpSolver,
    flow: FlowModel,
    reporter: _Reporter,
    job: _Job,
    label: str,
    start: float,
    stop_at: float,
) -> int:
    """``solver.Solve`` in a thread; a progress line every PROGRESS_EVERY s; Ctrl-C stops it and is raised.

    Past ``stop_at`` the search is told to stop as well: CP-SAT checks its own limit only between steps, and
    on a starved machine (a 120 s limit once ended at 304 s) one step can outlast it by minutes.
    """
    result: dict = {}

    def work() -> None:
        try:
            result["status"] = solver.Solve(flow.model, reporter)
        except BaseException as e:  # handed to the main thread
            result["error"] = e
        finally:
            solver.best_bound_callback = None  # a callback left set aborts the interpreter at exit

    solver.best_bound_callback = reporter.on_bound
    thread = start_thread(work, "cp-sat")  # it and CP-SAT's own threads leave Ctrl-C and SIGTERM to this one
    next_line = time.monotonic() + PROGRESS_EVERY
    try:
        while thread.is_alive():
            thread.join(timeout=0.2)
            if time.monotonic() > stop_at:
                solver.StopSearch()
            if job.progress is not None and time.monotonic() >= next_line and thread.is_alive():
                job.progress(reporter.line(time.monotonic() - start, "searching"))
                next_line += PROGRESS_EVERY
    except KeyboardInterrupt:
        # StopSearch before CP-SAT has started searching (while it loads or presolves) is forgotten: repeat it
        # until Solve returns, so that no solver thread outlives the interpreter (that aborts the process)
        while thread.is_alive():
            solver.StopSearch()
            thread.join(timeout=0.1)
        found = (
            f"its incumbent of {reporter.incumbent_us:.3f} µs (gap {reporter.gap:.1%}) was discarded"
            if reporter.incumbent_us is not None
            else "no schedule had been found"
        )
        raise Interrupted(
            f"milp {label} on {job.fabric.name} stopped after {time.monotonic() - start:.1f} s: "
            f"{found}; nothing written or committed"
        ) from None
    if "error" in result:
        raise result["error"]
    return result["status"]


def _final_line(
    job: _Job, label: str, name: str, reporter: _Reporter, solver: cp_model.CpSolver, flow: FlowModel, floor_us: float
) -> None:
    """The search's end: optimal, or the time limit with its gap and bound, or infeasible, or unknown."""
    if job.progress is None:
        return
    if name in ("OPTIMAL", "FEASIBLE"):
        value = solver.ObjectiveValue() / flow.units_per_us
        bound = min(value, max(solver.BestObjectiveBound() / flow.units_per_us, floor_us))
        gap = 0.0 if value <= 0 else 1.0 - bound / value
        how = "optimal" if name == "OPTIMAL" else f"time limit: gap {gap:.1%}, bound {bound:.3f} µs"
        job.progress(f"milp {label}: {how}, finish time {value:.3f} µs, {solver.WallTime():.1f} s")
    elif name == "INFEASIBLE":
        job.progress(f"milp {label}: infeasible within the step limit, {solver.WallTime():.1f} s")
    else:
        job.progress(f"milp {label}: unknown: no schedule within the time limit, {solver.WallTime():.1f} s")


class _Reporter(cp_model.CpSolverSolutionCallback):
    """Keeps the latest incumbent and bound, and reports each incumbent through ``progress``."""

    def __init__(self, flow: FlowModel, progress: Progress | None, label: str, floor_us: float) -> None:
        super().__init__()
        self._flow, self._progress, self._label, self._floor = flow, progress, label, floor_us
        self.incumbent_us: float | None = None
        self.bound: float = floor_us

    @property
    def gap(self) -> float:
        if self.incumbent_us is None or self.incumbent_us <= 0:
            return 0.0
        return max(0.0, 1.0 - min(self.bound, self.incumbent_us) / self.incumbent_us)

    def on_bound(self, bound: float) -> None:
        self.bound = max(self.bound, bound / self._flow.units_per_us)

    def line(self, seconds: float, what: str) -> str:
        if self.incumbent_us is None:
            return f"milp {self._label}: {what}, no incumbent yet, bound {self.bound:.3f} µs, {seconds:.1f} s"
        return (
            f"milp {self._label}: {what}, incumbent {self.incumbent_us:.3f} µs, "
            f"bound {min(self.bound, self.incumbent_us):.3f} µs, gap {self.gap:.1%}, {seconds:.1f} s"
        )

    def on_solution_callback(self) -> None:
        self.incumbent_us = self.ObjectiveValue() / self._flow.units_per_us
        self.bound = max(self.bound, self.BestObjectiveBound() / self._flow.units_per_us)
        if self._progress is not None:
            self._progress(
                f"milp {self._label}: incumbent {self.incumbent_us:.3f} µs, bound "
                f"{min(self.bound, self.incumbent_us):.3f} µs, gap {self.gap:.1%}, {self.WallTime():.1f} s"
            )


def _read_steps(topo: Topology, flow: FlowModel, solver: cp_model.CpSolver) -> tuple[Step, ...]:
    by_step: dict[int, list[Send]] = {}
    for op, sends in (("copy", flow.sends), ("reduce", flow.reduces)):
        for (c, u, v, k), var in sends.items():
            if solver.BooleanValue(var):
                by_step.setdefault(k, []).append(Send(c, u, v, op))
    return tuple(
        Step(rounds_for(topo, sends), tuple(sorted(sends, key=lambda s: (s.src, s.dst, s.chunk))))
        for _, sends in sorted(by_step.items())
    )


def rounds_for(topo: Topology, sends: list[Send]) -> int:
    """The fewest rounds in which every link and sharing group of ``topo`` can carry ``sends``."""
    load: dict[tuple[int, int], int] = {}
    for s in sends:
        load[(s.src, s.dst)] = load.get((s.src, s.dst), 0) + 1
    needs = [(n, topo.chunk_capacity(*key)) for key, n in load.items()]
    needs += [
        (sum(load.get(rank_pair(tuple(key)), 0) for key in g.links), topo.group_capacity(g)) for g in topo.sharing
    ]
    rounds = 1
    for n, capacity in needs:
        r = max(1, math.ceil(n / capacity - 1e-9))
        while math.floor(capacity * r + 1e-9) < n:
            r += 1
        rounds = max(rounds, r)
    return rounds
