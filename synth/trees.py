"""ForestColl-class spanning-tree schedules: throughput-optimal forests, pipelined into Schedules.

The optimal allgather rate per root is y* = 1 / max over cuts of |S ∩ ranks| / B⁺(S) (schedules.bounds,
exact). With U the largest unit that divides every link capacity and y*, K = y*/U trees of rate U per
root reach it (``TreeOptions(k=...)`` asks for fewer, at a unit as large as packs, and reports the % of
optimal). Each chunk goes down one tree; a tree forwards one chunk per hop per step, so a step carries
at most floor(C/U) chunks over a link of capacity C and lasts chunk/U at α = 0: with P chunks per tree and
depth D, the schedule takes (P + D - 1)/P of the bound and reaches it as chunks grow.

Reducescatter and reduce run the trees of the reversed fabric backwards (children reduce into parents);
allreduce is reducescatter then allgather; broadcast packs trees from the one root.

>>> from topologies.catalog import build
>>> from schedules.collectives import Collective
>>> s = solve(build("ring:n=4"), Collective("allgather", 4, chunks=4))
>>> s.nsteps, s.meta.notes
(3, '2 trees per root of 8.33333 GB/s each: 100.0% of the optimal 16.6667 GB/s')
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from math import gcd, lcm

from schedules.bounds import allgather_cut_bound, exact, rooted_cut_capacity
from schedules.collectives import Collective
from schedules.schedule import Schedule, Send, Step, Symmetry
from synth.errors import NotApplicable, SynthesisError
from synth.tree_packing import Tree, pack, pack_exact, rank_hops
from topologies.topology import Topology

SLACK = 1e-9  # the verifier's float slack on capacity × rounds
# Fractions of the optimal unit tried, in turn, when the greedy packing runs out of room at the optimum.
UNIT_STEPS = (
    1,
    Fraction(99, 100),
    Fraction(49, 50),
    Fraction(24, 25),
    Fraction(47, 50),
    Fraction(23, 25),
    Fraction(9, 10),
    Fraction(17, 20),
    Fraction(4, 5),
    Fraction(3, 4),
    Fraction(2, 3),
    Fraction(1, 2),
)


@dataclass(frozen=True)
class TreeOptions:
    """k: trees per root (default: as many as the optimum needs, up to max_trees). size: the message in bytes
    whose fastest chunk count (waves per tree, by the cost model) the schedule takes, as ``weft synth --size``
    does; None keeps the collective's chunks."""

    k: int | None = None
    max_trees: int = 128
    time_limit: float = 60.0
    symmetric: bool = True
    size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None and (not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1):
            raise SynthesisError(f"trees: size: must be a positive number of bytes, got {self.size!r}")


@dataclass(frozen=True)
class Forest:
    """Trees of one rate for every root, on a topology (the reversed one for combining collectives)."""

    topology: Topology
    trees: tuple[Tree, ...]
    per_root: int
    unit: Fraction
    optimum: Fraction

    @property
    def rate(self) -> Fraction:
        return self.per_root * self.unit

    @property
    def pct_of_optimal(self) -> float:
        return float(100 * self.rate / self.optimum)

    def trees_of(self, root: int) -> list[Tree]:
        return [t for t in self.trees if t.root == root]

    def describe(self) -> str:
        return (
            f"{self.per_root} tree{'s' * (self.per_root != 1)} per root of {float(self.unit):g} GB/s each: "
            f"{self.pct_of_optimal:.1f}% of the optimal {float(self.optimum):g} GB/s"
        )


def _rational_gcd(values: list[Fraction]) -> Fraction:
    denominator = lcm(*(v.denominator for v in values))
    return Fraction(gcd(*(int(v * denominator) for v in values)), denominator)


def _units(topology: Topology, optimum: Fraction, per_root: int) -> list[Fraction]:
    """The unit optimum/per_root, then smaller ones, each raised to where no link loses a tree."""
    caps = sorted({exact(link.capacity) for link in topology.links})
    units = []
    for step in UNIT_STEPS:
        unit = optimum / per_root * step
        unit = min(c / math.floor(c / unit) for c in caps if c >= unit) if any(c >= unit for c in caps) else unit
        if unit not in units and unit <= optimum / per_root:
            units.append(unit)
    return units


def forest(topology: Topology, roots: tuple[int, ...], optimum: Fraction, options: TreeOptions) -> Forest:
    """Trees for ``roots`` reaching ``optimum`` GB/s per root, or as close as the packing gets."""
    if options.k is not None and options.k < 1:
        raise SynthesisError(f"trees: k: must be a positive number of trees per root, got {options.k}")
    natural = optimum / _rational_gcd([exact(link.capacity) for link in topology.links] + [optimum])
    per_root = options.k or min(int(natural), options.max_trees)
    deadline = time.monotonic() + options.time_limit
    for unit in _units(topology, optimum, per_root):
        if topology.switches:
            trees = pack(topology, roots, per_root, unit, deadline, options.symmetric)
        else:
            trees = pack_exact(topology, roots, per_root, unit, deadline)
        if trees is not None:
            return Forest(topology, trees, per_root, unit, optimum)
    raise NotApplicable(
        f"trees on {topology.name}: no packing of {per_root} tree{'s' * (per_root != 1)} per root found "
        f"at {float(UNIT_STEPS[-1]):.0%} of the optimal rate or above"
    )


# ---- from trees to steps ------------------------------------------------------------------------


def _broadcast_sends(forest: Forest, root: int, chunks: list[int]) -> dict[int, list[Send]]:
    """Step -> sends that pipeline ``chunks`` of root down its trees, chunk j on tree j mod k."""
    steps: dict[int, list[Send]] = defaultdict(list)
    trees = forest.trees_of(root)
    for j, chunk in enumerate(chunks):
        tree = trees[j % len(trees)]
        depth = tree.depths()
        wave = j // len(trees)
        for parent, child in tree.hops:
            steps[wave + depth[child] - 1].append(Send(chunk, parent, child))
    return steps


def _tree_steps(forest: Forest, chunks_of: dict[int, list[int]], reduce: bool) -> list[list[Send]]:
    merged: dict[int, list[Send]] = defaultdict(list)
    for root, chunks in chunks_of.items():
        for step, sends in _broadcast_sends(forest, root, chunks).items():
            merged[step].extend(sends)
    ordered = [merged[s] for s in range(max(merged) + 1)] if merged else []
    if not reduce:
        return ordered
    return [[Send(s.chunk, s.dst, s.src, "reduce") for s in sends] for sends in reversed(ordered)]


@dataclass(frozen=True)
class _Fabric:
    """Chunk capacities of the switch-free form, per rank pair and per shared switch-side link."""

    pair_links: dict[tuple[int, int], tuple]
    pair_capacity: dict[tuple[int, int], float]
    shared: dict[tuple, float]


def _fabric(topology: Topology) -> _Fabric:
    capacity = {link.key: link.capacity for link in topology.links}
    pair_links: dict[tuple[int, int], tuple] = {}
    pair_capacity: dict[tuple[int, int], float] = {}
    users: Counter[tuple] = Counter()
    for hops in rank_hops(topology).values():
        for hop in hops:
            pair_links[(hop.src, hop.dst)] = hop.links
            pair_capacity[(hop.src, hop.dst)] = min(capacity[k] for k in hop.links)
            if len(hop.links) > 1:
                users.update(hop.links)
    shared = {k: capacity[k] for k, n in users.items() if n > 1}
    unit = min(list(pair_capacity.values()) + list(shared.values()))
    return _Fabric(
        pair_links, {p: c / unit for p, c in pair_capacity.items()}, {k: c / unit for k, c in shared.items()}
    )


def _rounds(sends: list[Send], fabric: _Fabric) -> int:
    """The fewest rounds under which every pair link and shared switch link carries its sends."""
    per_pair = Counter((s.src, s.dst) for s in sends)
    per_link: Counter = Counter()
    need = 1
    for pair, n in per_pair.items():
        need = max(need, math.ceil(n / fabric.pair_capacity[pair] - SLACK))
        for key in fabric.pair_links[pair]:
            if key in fabric.shared:
                per_link[key] += n
    for key, n in per_link.items():
        need = max(need, math.ceil(n / fabric.shared[key] - SLACK))
    return need


def _steps(topology: Topology, phases: list[list[Send]]) -> tuple[Step, ...]:
    fabric = _fabric(topology)
    return tuple(Step(_rounds(sends, fabric), tuple(sends)) for sends in phases if sends)


# ---- collectives --------------------------------------------------------------------------------


def _check(topology: Topology, collective: Collective) -> None:
    if collective.nranks != topology.nranks:
        raise SynthesisError(
            f"trees: collective {collective.name} has {collective.nranks} ranks, "
            f"topology {topology.name} has {topology.nranks}"
        )
    if not collective.facts.spanning:
        raise NotApplicable(
            f"trees: {collective.name} sends different data to each rank; spanning trees "
            "carry the same data to all (use direct or milp)"
        )
    if topology.nranks < 2:
        raise NotApplicable(f"trees: {topology.name} has one rank; there is nothing to send")


def allgather_forest(topology: Topology, options: TreeOptions) -> Forest:
    return forest(topology, tuple(topology.ranks), 1 / allgather_cut_bound(topology), options)


def broadcast_forest(topology: Topology, root: int, options: TreeOptions) -> Forest:
    return forest(topology, (root,), rooted_cut_capacity(topology, root), options)


def forests_for(topology: Topology, collective: Collective, options: TreeOptions) -> list[Forest]:
    """The forests a collective runs on, in order (allreduce: the reversed fabric's, then the fabric's)."""
    _check(topology, collective)
    forests = []
    for phase in collective.phases:
        fabric = topology.reversed() if phase.combining else topology  # sums flow up the reversed fabric's trees
        rooted = phase.rooted
        forests.append(broadcast_forest(fabric, phase.root, options) if rooted else allgather_forest(fabric, options))
    return forests


def schedule(topology: Topology, collective: Collective, forests: list[Forest]) -> Schedule:
    """The pipelined schedule of a collective over its forests (from ``forests_for``)."""
    c = collective.chunks
    phases = [
        layer
        for phase, forest in zip(collective.phases, forests, strict=False)
        for layer in _tree_steps(forest, _sources(phase, topology, c), reduce=phase.combining)
    ]
    k = forests[-1].per_root
    return Schedule(collective, topology.fingerprint, _steps(topology, phases), f"trees-{collective.name}-k{k}-c{c}")


def _sources(phase: Collective, topology: Topology, c: int) -> dict[int, list[int]]:
    """The chunks each tree root starts from, ``c`` per root: the root's, or every rank's slice."""
    if phase.rooted:
        return {phase.root: list(range(c))}
    return {r: list(range(r * c, (r + 1) * c)) for r in topology.ranks}


def _spreads_slices(collective: Collective) -> bool:
    """Every rank's slice copied to every rank (allgather): the one collective the compact pipeline writes."""
    return not collective.combining and not collective.rooted


def solve(
    topology: Topology,
    collective: Collective,
    options: TreeOptions = TreeOptions(),
    progress: Callable[[str], None] | None = None,
) -> Schedule:
    """A pipelined spanning-tree schedule; ``collective.chunks`` chunks per tree root, one tree each, or with
    ``options.size`` the chunk count fastest at that size."""
    start = time.monotonic()
    forests = forests_for(topology, collective, options)
    for forest in forests:
        if progress:
            progress(f"trees: {forest.describe()}")
    if options.size is not None and _spreads_slices(collective):
        # the compact form (one wave and the shift to the next): the fastest wave count, whatever its size
        pipe = pipeline(topology, collective, forests)
        result = pipe.with_waves(pipe.best_waves(options.size)).compact()
    else:
        if options.size is not None:
            pipe = pipeline(topology, collective, forests)
            chunks = pipe.per_root * default_waves(pipe, options.size, progress)
            collective = Collective(collective.name, collective.nranks, chunks, collective.root)
        result = schedule(topology, collective, forests)
    notes = "; ".join(f.describe() for f in forests)
    options_doc = {"k": forests[-1].per_root, "symmetric": options.symmetric}
    if options.size is not None:
        options_doc["size"] = options.size
    return result.with_meta(solver="trees", options=options_doc, solve_time=time.monotonic() - start, notes=notes)


# ---- the compact form: one wave and a wave count --------------------------------------------------

MAX_WAVES = 1024  # the most waves (chunks per tree) best_waves considers
MAX_SENDS = 4_000_000  # a written-out schedule stays under this many sends, so 1024-rank schedules fit in memory


def default_waves(pipe: Pipeline, size: int, progress: Callable[[str], None] | None = None) -> int:
    """Chunks per tree: the count the cost model finds fastest at ``size`` (pipeline fill against per-step
    latency), capped where the written-out schedule would pass MAX_SENDS sends."""
    best = pipe.best_waves(size)
    cap = max(1, MAX_SENDS // max(1, pipe.sends_per_wave))
    if best > cap and progress:
        progress(
            f"trees: {best} waves are fastest at {size} B ({pipe.predict_us(size, best):.1f} µs); "
            f"the written-out schedule stops at {cap} ({pipe.predict_us(size, cap):.1f} µs, {MAX_SENDS} sends); "
            "synth.trees.pipeline keeps the compact form"
        )
    return min(best, cap)


@dataclass(frozen=True, eq=False)
class Pipeline:
    """A pipelined tree schedule in compact form: one wave (one chunk per tree) and how many waves.

    Wave w carries chunk r·K·P + w·K + j of root r down tree j (K trees per root, P waves); each phase
    (allreduce has two) is a list of layers, and layer d of wave w runs in step w + d of its phase, so a
    phase of D layers takes P + D - 1 steps whose shapes are the intervals of layers active together.
    ``predict_us`` prices those shapes with the cost model without writing out P × (sends of a wave)
    sends (10 million at 1024 ranks and 10 waves); ``expand`` writes the schedule out, for compile and
    verify, and prices the same.
    """

    topology: Topology
    collective: Collective  # chunks: trees per root (one wave)
    forests: tuple[Forest, ...]
    phases: tuple[tuple[tuple[Send, ...], ...], ...]
    waves: int = 1

    @property
    def per_root(self) -> int:
        return self.collective.chunks

    @property
    def sends_per_wave(self) -> int:
        return sum(len(layer) for phase in self.phases for layer in phase)

    def with_waves(self, waves: int) -> Pipeline:
        if not isinstance(waves, int) or waves < 1:
            raise SynthesisError(f"trees: waves: must be a positive integer, got {waves!r}")
        return Pipeline(self.topology, self.collective, self.forests, self.phases, waves)

    def sized(self, waves: int | None = None) -> Collective:
        c = self.collective
        return Collective(c.name, c.nranks, c.chunks * (waves or self.waves), c.root)

    def expand(self) -> Schedule:
        """The explicit schedule (what ``schedule`` builds for ``waves`` chunks per tree)."""
        return schedule(self.topology, self.sized(), list(self.forests))

    def _intervals(self) -> list[tuple[int, int, int]]:
        return [
            (p, a, b) for p, phase in enumerate(self.phases) for a in range(len(phase)) for b in range(a, len(phase))
        ]

    @cached_property
    def _shape_loads(self):
        """Loads of every interval of layers of every phase, as the steps of one ScheduleLoads."""
        import numpy as np

        from schedules.cost import step_loads
        from schedules.loads import index_fabric

        fabric = index_fabric(self.topology)
        layer_src, layer_dst = [], []
        for phase in self.phases:
            for layer in phase:
                layer_src.append(np.fromiter((s.src for s in layer), np.int64, len(layer)))
                layer_dst.append(np.fromiter((s.dst for s in layer), np.int64, len(layer)))
        first = np.cumsum([0] + [len(phase) for phase in self.phases])
        steps, links = [], []
        for shape, (p, a, b) in enumerate(self._intervals()):
            for d in range(a, b + 1):
                i = first[p] + d
                steps.append(np.full(len(layer_src[i]), shape, np.int64))
                links.append(fabric.link_index(layer_src[i], layer_dst[i]))
        link = np.concatenate(links) if links else np.zeros(0, np.int64)
        if (link < 0).any():
            raise SynthesisError(f"trees: a tree hop has no link in topology {self.topology.name}")
        step = np.concatenate(steps) if steps else np.zeros(0, np.int64)
        return step_loads(self.collective, fabric, step, link, len(self._intervals()))

    def shape_counts(self, waves: int | None = None) -> Counter:
        """How many steps of each interval shape (phase, first layer, last layer) P waves take."""
        p_waves = waves or self.waves
        counts: Counter = Counter()
        for p, phase in enumerate(self.phases):
            depth = len(phase)
            for t in range(p_waves + depth - 1):
                counts[(p, max(0, t - p_waves + 1), min(depth - 1, t))] += 1
        return counts

    def predict_us(self, nbytes: float, waves: int | None = None) -> float:
        """The cost model's time for nbytes with ``waves`` (default: this pipeline's) chunks per tree."""
        chunk_bytes = self.sized(waves).chunk_bytes(nbytes)
        index = {shape: i for i, shape in enumerate(self._intervals())}
        steps = self._shape_loads.steps
        return math.fsum(n * steps[index[shape]].time_us(chunk_bytes) for shape, n in self.shape_counts(waves).items())

    def compact(self) -> Schedule:
        """The pipelined allgather in compact form (``weft.schedule/2``): the first wave listed, layer by layer,
        and the symmetry that moves it to the next chunk of every tree one step later (schedules.compact).
        It expands to ``expand()``'s schedule and prices the same, without writing out P × a wave's sends."""
        if not _spreads_slices(self.collective) or len(self.phases) != 1:
            raise SynthesisError(f"trees: the compact pipeline is written for allgather, not {self.collective.name}")
        import numpy as np

        k, p, n = self.per_root, self.waves, self.collective.nranks
        sized = self.sized()
        root, lane = np.divmod(np.arange(sized.nchunks), k * p)
        wave, tree = np.divmod(lane, k)
        tau = root * k * p + ((wave + 1) % p) * k + tree
        layers = [
            [Send((s.chunk // k) * k * p + s.chunk % k, s.src, s.dst, s.op) for s in layer] for layer in self.phases[0]
        ]
        fabric = _fabric(self.topology)
        rounds_of: dict[tuple[int, int], int] = {}
        step_rounds = []
        for t in range(p + len(layers) - 1):
            span = (max(0, t - p + 1), min(len(layers) - 1, t))
            if span not in rounds_of:
                rounds_of[span] = _rounds([s for d in range(span[0], span[1] + 1) for s in layers[d]], fabric)
            step_rounds.append(rounds_of[span])
        steps = tuple(Step(_rounds(layer, fabric), tuple(layer)) for layer in layers)
        symmetry = Symmetry(tuple(range(n)), tuple(tau.tolist()), p, shift=1)
        return Schedule(
            sized,
            self.topology.fingerprint,
            steps,
            f"trees-allgather-k{k}-c{sized.chunks}",
            symmetries=(symmetry,),
            step_rounds=tuple(step_rounds),
        )

    def best_waves(self, nbytes: float, max_waves: int = MAX_WAVES) -> int:
        """The wave count the cost model finds fastest for nbytes: enough to fill the pipeline, and no more
        than the per-step latency pays for."""
        return min(range(1, max_waves + 1), key=lambda p: (self.predict_us(nbytes, p), p))


def pipeline(
    topology: Topology,
    collective: Collective,
    forests: list[Forest] | None = None,
    options: TreeOptions = TreeOptions(),
) -> Pipeline:
    """The compact pipelined schedule of a collective: one wave over its forests (waves=1; see Pipeline)."""
    forests = forests if forests is not None else forests_for(topology, collective, options)
    k = lcm(*(f.per_root for f in forests))
    one = Collective(collective.name, collective.nranks, k, collective.root)
    phases = [
        _tree_steps(forest, _sources(phase, topology, k), reduce=phase.combining)
        for phase, forest in zip(collective.phases, forests, strict=False)
    ]
    layers = tuple(tuple(tuple(layer) for layer in phase if layer) for phase in phases)
    return Pipeline(topology, one, tuple(forests), layers)
