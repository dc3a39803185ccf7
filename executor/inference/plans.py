"""The registry's plans for one job: this topology and rank count only, chosen per collective, size and dtype.

Pure Python (no GPU), so selection is tested on CPU. Entries are read once when the job starts; a choice is
cached per (collective, size, dtype), so a decode loop never touches the registry after its first step.

>>> from registry.store import Registry
>>> PlanChoice(Registry("memory://doctest-choice"), "topo-0", 2).plan("allreduce", 1024, "bf16") is None
True
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from executor.gpu.protocols import protocol_refusal
from executor.reference.proofs import proven
from registry import norms
from registry.index import Mode
from registry.store import Entry, Registry, fingerprints, nccl_faster, nccl_reason
from schedules.plan.types import Plan

# Solvers whose plans reduce every element once, on one rank, and copy the sum to the others (or reduce along
# one fixed chain): every rank ends with the same bits. A one-shot ("direct") plan sums on every rank in that
# rank's own order, which is the same bits only for two ranks (a + b == b + a).
FIXED_ORDER_SOLVERS = frozenset({"ring", "twoshot", "rhd", "tree"})


def fixed_reduction_order(plan: Plan) -> bool:
    """Whether ``plan`` gives bitwise-identical sums on every rank and every run."""
    if plan.facts is None or not plan.facts.sums_everywhere:
        return True  # every other collective's sums land on one rank each: there is nothing for ranks to disagree on
    return plan.weft.solver in FIXED_ORDER_SOLVERS or (plan.weft.solver == "direct" and plan.nranks <= 2)


def call_refusal(plan: Plan, topology: tuple[str, ...], collective: str, nranks: int, nbytes: int) -> str:
    """Why ``plan`` must not run this call (another collective, rank count, topology or size), else ''.

    Asked of the plan itself, right before the executor takes it for a call: a registry entry's key is what a
    shared folder says, and only the plan says what the plan does (issue 27: a forged key served an allgather
    plan for an all-reduce)."""
    if plan.collective != collective:
        return f"plan {plan.name} is a {plan.collective}, not a {collective}"
    if plan.nranks != nranks:
        return f"plan {plan.name} is for {plan.nranks} ranks, not {nranks}"
    if plan.weft.topology and plan.weft.topology not in topology:
        return f"plan {plan.name} is for topology {plan.weft.topology}, not {topology[0]}"
    if not plan.runs(nbytes):  # directly, or padded to its granule (Plan.padding)
        return f"plan {plan.name} does not run {nbytes} bytes"
    return ""


def safe_back_to_back(plan: Plan) -> bool:
    """Whether ``plan`` can run again on the same buffers with no synchronization between the two executions.

    An inference loop executes on the same staging buffers call after call, and nothing orders one rank's next
    execution after its peers' end of the previous one. LL plans with a double scratch buffer write peers only
    in their scratch, in the half of this execution, behind flags; a rank can only be one execution ahead
    (it needs the peers' packets to finish), so it never overwrites what a peer still reads. Any other plan
    qualifies only with a proof: its verification record (for this very plan) shows the reference executor ran
    it back to back on the same buffers, with every rank's launches ordered by its own stream alone, and found
    no race (codegen adds an entry handshake where a peer's write could overtake; ``codegen.launches``).
    Three launches where scratch halves alternate (the third meets the first's half), else two.
    """
    if (
        plan.protocol == "LL"
        and plan.use_double_scratch_buffer
        and all(b.type == "s" for g in plan.gpus for b in g.remote_buffers)
    ):
        return True
    record = plan.weft.verification or {}
    needed = 3 if plan.use_double_scratch_buffer else 2
    return (
        bool(record.get("ok"))
        and record.get("plan_hash") == plan.content_hash
        and int(record.get("back_to_back", 1)) >= needed
    )


def split_refusal(
    output_shape: tuple[int, ...], input_shape: tuple[int, ...], same_dtype: bool, same_device: bool, world_size: int
) -> str:
    """Why an equal-split ``all_to_all_single(output, input)`` is malformed (torch.distributed's rules), else ''.

    >>> split_refusal((8, 4), (8, 4), True, True, 4), split_refusal((6,), (6,), True, True, 4)
    ('', "the input's first dimension (6) must split into 4 equal blocks, one per rank")
    """
    if not same_dtype or not same_device:
        return "output and input must have one dtype and one device"
    if math.prod(output_shape) != math.prod(input_shape):
        return f"output {list(output_shape)} and input {list(input_shape)} must hold as many elements (equal splits)"
    for name, shape in (("input", input_shape), ("output", output_shape)):
        if not shape or shape[0] % world_size:
            first = f"first dimension ({shape[0]})" if shape else "scalar"
            return f"the {name}'s {first} must split into {world_size} equal blocks, one per rank"
    return ""


def disagreement(seen: list) -> str:
    """Given every rank's view of the plans (its topology and registry entry ids, or the reason it has none): the
    first rank's reason, or that the views differ (ranks would pick different plans), or '' where all agree."""
    reasons = [v for v in seen if isinstance(v, str)]
    if reasons:
        return reasons[0]
    if any(v != seen[0] for v in seen):
        return (
            "ranks see different topologies, registry entries or recorded times, or pass different options "
            "(is $WEFT_REGISTRY the same everywhere, and not being written?)"
        )
    return ""


@dataclass
class PlanChoice:
    """The best registry plan for a (collective, size, dtype) on one topology, or None (use NCCL).

    A plan is served only once this machine has proven it on the reference executor (``trust``, default
    ``executor.reference.proofs.proven``: the first time this machine serves it, then remembered by its content), so a
    forged entry is refused before it runs and the next best is tried."""

    registry: Registry
    topology: str | tuple[str, ...]  # the fabric's fingerprint(s): entries keyed by any other are never considered
    nranks: int
    deterministic: bool = False
    ll128: bool = False  # the executor can move LL packets as LL128 lines: their measured times count too
    compiled: bool = False  # the executor can run a plan as its own compiled kernel: those measured times count too
    trust: Callable[[Plan], str] = proven  # plan -> '' or why it must not run
    entries: list[Entry] = field(init=False)
    nccl_us: dict[str, dict[int, float]] = field(init=False)  # NCCL's measured times here, per collective
    # the fused call's measured times here (norm.json): row length -> plan hash + mode suffix -> {bytes: µs}
    norm_us: dict[int, dict[str, dict[int, float]]] = field(init=False)
    norm_warning: str = field(init=False, default="")  # why norm.json was ignored ('' where it was read or absent)
    _chosen: dict[tuple[str, int, str], tuple[Plan, Mode] | None] = field(init=False, default_factory=dict)
    _reasons: dict[tuple[str, int, str], str] = field(init=False, default_factory=dict)
    _trusted: dict[str, str] = field(init=False, default_factory=dict)  # entry id -> '' or why ``trust`` refused it

    def __post_init__(self) -> None:
        self.topology = fingerprints(self.topology)
        self.entries = [
            e
            for e in self.registry.entries(topology=self.topology)
            if e.key.nranks == self.nranks
            and safe_back_to_back(e.plan)
            and not protocol_refusal(e.plan)  # a protocol no GPU engine runs yet (Lamport) is never chosen
            and (not self.deterministic or fixed_reduction_order(e.plan))
        ]
        self.nccl_us = {c: self.registry.nccl_times(self.topology, c) for c in {e.key.collective for e in self.entries}}
        doc, self.norm_warning = self.registry.norms_or_none()  # advisory: damaged, all-reduce times rank the call
        lengths = {int(r) for f in self.topology for r in doc["norm_us"].get(f, {})}
        self.norm_us = {r: norms.times_for(doc, self.topology, r) for r in sorted(lengths)}

    def basis(self) -> str:
        """A digest of everything that decides a choice here (the entries, their recorded times, NCCL's, and the
        options): ranks whose bases differ could pick different plans or lines for one call, and hang each other."""
        seen = {
            "entries": sorted((e.id, e.predicted_us, e.measured_tables()) for e in self.entries),
            "nccl_us": self.nccl_us,
            "norm_us": self.norm_us,
            "options": [self.nranks, self.deterministic, self.ll128, self.compiled],
        }
        return hashlib.sha256(json.dumps(seen, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def plan(self, collective: str, nbytes: int, dtype: str) -> Plan | None:
        chosen = self.choose(collective, nbytes, dtype)
        return chosen[0] if chosen else None

    def lines(self, collective: str, nbytes: int, dtype: str) -> bool:
        """Whether the chosen plan runs with LL128 lines (measured faster so at this size), else with its packets."""
        return self.mode(collective, nbytes, dtype).lines

    def mode(self, collective: str, nbytes: int, dtype: str) -> Mode:
        """How the chosen plan runs (``Mode``: LL128 lines, its own compiled kernel), as measured fastest at this
        size; ``Mode()`` where no plan is chosen."""
        chosen = self.choose(collective, nbytes, dtype)
        return chosen[1] if chosen else Mode()

    def choose(self, collective: str, nbytes: int, dtype: str) -> tuple[Plan, Mode] | None:
        """(plan, how it runs) for this call, or None (NCCL)."""
        key = (collective, nbytes, dtype)
        if key not in self._chosen:
            chosen = self._best(collective, nbytes, dtype)
            why = chosen and call_refusal(chosen[0], fingerprints(self.topology), collective, self.nranks, nbytes)
            if why:  # never reached while Entry.serves holds; the last word before a plan runs is the plan's own
                self._reasons[key], chosen = f"refused: {why}", None
            self._chosen[key] = chosen
        return self._chosen[key]

    def reason(self, collective: str, nbytes: int, dtype: str) -> str:
        """Why ``choose`` gives None for this call (no plan fits, or NCCL measured faster), else ''."""
        return "" if self.choose(collective, nbytes, dtype) else self._reasons[(collective, nbytes, dtype)]

    def _best(self, collective: str, nbytes: int, dtype: str) -> tuple[Plan, Mode] | None:
        fits = [
            e
            for e in self.entries
            if e.serves(self.topology, collective, self.nranks, nbytes)  # key and plan
            and (not e.dtypes or dtype in e.dtypes)
        ]
        if not fits:
            self._reasons[(collective, nbytes, dtype)] = "no plan"
            return None
        refused: list[str] = []
        while True:
            best = self._fastest(fits, nbytes)
            if best.id not in self._trusted:
                self._trusted[best.id] = self.trust(best.plan)
            if not self._trusted[best.id]:
                break
            refused.append(f"{best.id}: {self._trusted[best.id]}")
            fits.remove(best)
            if not fits:
                self._reasons[(collective, nbytes, dtype)] = "refused: " + "; ".join(refused)
                return None
        basis, time_us, mode = best.estimate(nbytes, self.ll128, self.compiled)
        nccl = nccl_faster(self.nccl_us.get(collective, {}), nbytes, basis, time_us)
        if nccl is not None and time_us is not None:  # nccl_faster says None without a time
            self._reasons[(collective, nbytes, dtype)] = nccl_reason(collective, nbytes, nccl, best.plan.name, time_us)
            return None
        return best.plan, mode

    def _fastest(self, fits: list[Entry], nbytes: int) -> Entry:
        # As in Registry.select, measurements beat predictions: where any candidate was measured, only measured
        # ones compete. The cost model does not price the protocol, so among equal predictions LL (no flag round
        # trip per step) goes first.
        ranked = [e for e in fits if e.measured(self.ll128, self.compiled)] or fits
        return min(
            ranked,
            key=lambda e: (
                e.estimate_us(nbytes, self.ll128, self.compiled)[1] or math.inf,
                e.plan.protocol != "LL",
                e.id,
            ),
        )
