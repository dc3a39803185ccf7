"""The fused all-reduce + residual add + RMSNorm: its numpy definition, which plans can run it, and its proof.

A transformer layer ends ``h = x + all_reduce(y)`` and the next one starts ``rms_norm(h) * w``. Fused, one launch
returns both: ``new_residual = residual + sum(y)`` (the all-reduce with a residual, ``gpu.tables``) and
``normed = new_residual * rsqrt(mean(new_residual²) + eps) * w`` row by row, a row being the last dimension
(the hidden size). A row's norm needs the sum of squares of all of it: the epilogue runs right after each
reduction that adds the residual (``machine.residual_sums``), over that reduction's output range, which is
either whole rows (the block normalizes them alone; row-owning plans come from ``codegen.rows.own_rows``) or an
aligned, equal slice of one row whose other slices other blocks complete; those blocks exchange their slices'
sums of squares, then each normalizes its slice (``row_spans``, ``RowSpan``). The reference executor's
``Epilogue`` normalizes a row once, after the last of its slices is summed.

numpy's definition (``rms_norm``), in fp32 on the element type's values: ``mean`` of the squares, ``rstd = 1 /
sqrt(mean + eps)``, then ``(x * rstd) * w`` rounded once to the element type. The GPU's epilogue
(``executor/gpu/cuda/norm.cuh``) does the same operations; only its order of summing the squares differs (per
thread, the block, then a split row's slices in slot order), which moves rstd by an ulp at most in practice, so
a normalized element may differ from the definition by one bf16 ulp (the GPU tests' bound).

>>> x = np.array([[3.0, 4.0]], np.float32)
>>> rms_norm(x, np.ones(2, np.float32), 0.0, "fp32").tolist()
[[0.8485281467437744, 1.1313709020614624]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from executor.reference import machine
from executor.reference.prove import run_launches, run_reference
from registry.index import MODES, Mode, interpolate
from registry.norms import norm_key
from schedules.plan.types import Plan, PlanError, remote_target
from weftcore.errors import CheckFailed


@dataclass(frozen=True)
class RowNorm:
    """The epilogue's parameters: elements per row (the hidden size) and the epsilon under the square root."""

    row_elems: int
    eps: float

    def row_bytes(self, dtype: str) -> int:
        return self.row_elems * machine.DTYPES[dtype]


def rms_norm(rows: np.ndarray, weight: np.ndarray, eps: float, dtype: str) -> np.ndarray:
    """numpy's definition: each row of ``rows`` (float32 holding ``dtype`` values) normalized, times ``weight``,
    rounded to ``dtype``."""
    x = np.asarray(rows, np.float32)
    mean = (np.sum(x.astype(np.float64) ** 2, axis=-1) / x.shape[-1]).astype(np.float32)
    rstd = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return machine.round_to((x * rstd[..., None]) * np.asarray(weight, np.float32), dtype)


def output_ranges(plan: Plan) -> dict[machine.OpKey, tuple[int, int]] | str:
    """(rank, thread block, op) -> (first output chunk, chunks) of each local reduction writing its rank's output,
    read from the plan's ops alone; or why the epilogue cannot follow them: on every rank they must write all the
    output chunks, once each, and no other op may write an output (a row that arrives as a copy was summed by no
    block of its rank)."""
    out = {}
    for rank, gpu in enumerate(plan.gpus):
        covered: list[int] = []
        for tb in gpu.threadblocks:
            for k, op in enumerate(tb.ops):
                mine = [b for b in op.dst_buff if not b.remote and b.type == "o"]
                remote_out = [b for b in op.dst_buff if b.remote and remote_target(gpu, tb, op, b)[1] == "o"]
                if remote_out or (mine and not (op.spec.reduces and len(mine) == 1)):
                    return (
                        f"plan {plan.name}: gpus[{rank}].threadblocks[{tb.id}].ops[{k}] ({op.name}) writes an "
                        "output other than by its rank's own sum, so no thread block holds those rows whole"
                    )
                if mine:
                    out[(rank, tb.id, k)] = (mine[0].index, mine[0].size)
                    covered += range(mine[0].index, mine[0].index + mine[0].size)
        if sorted(covered) != list(range(gpu.output_chunks)):
            return f"plan {plan.name}: rank {rank}'s reductions do not write each output chunk exactly once"
    return out


def norm_ranges(plan: Plan) -> dict[machine.OpKey, tuple[int, int]]:
    """(rank, thread block, op) -> (first output chunk, chunks) of each reduction after which the epilogue runs:
    those that add the residual (``machine.residual_sums``)."""
    out = {}
    for (rank, tb, index), chunk in machine.residual_sums(plan).items():
        op = plan.gpus[rank].threadblocks[tb].ops[index]
        sizes = {b.size for b in op.dst_buff if not b.remote and b.type == "o" and b.index == chunk}
        out[(rank, tb, index)] = (chunk, sizes.pop() if sizes else 0)
    return out


def residual_refusal(plan: Plan) -> str:
    """Why ``plan`` cannot add a residual in its launch (``executor.gpu.tables.build_tables(residual=True)``), or ''.

    Each reduction that completes a sum and writes an output adds the residual of the rank it runs on, so the
    residual must hold the same values on every rank (a transformer's residual stream does), and every output
    element must come out of exactly one such reduction, directly or copied. The CPU reference executor checks
    that: it runs the plan with the same rule on integer data, where every sum is exact, and every rank's output
    must be the inputs' sum plus the residual, once."""
    if plan.facts is None or not plan.facts.sums_everywhere:
        return f"plan {plan.name} runs {plan.collective}; only an all-reduce adds a residual"
    nbytes = machine.smallest_size(plan)
    elems = machine.chunk_elems(plan, nbytes, "fp32")
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-64, 64, g.input_chunks * elems).astype(np.float32) for g in plan.gpus]
    residual = rng.integers(1, 64, plan.gpus[0].output_chunks * elems).astype(np.float32)
    try:
        outputs = run_reference(plan, inputs, nbytes, "fp32", [residual] * plan.nranks)
    except (PlanError, CheckFailed) as e:
        return f"plan {plan.name}: with a residual: {e}"
    want = np.sum(inputs, axis=0) + residual
    for rank, out in enumerate(outputs):
        if not np.array_equal(out, want):
            return f"plan {plan.name}: rank {rank}'s output would not hold the sum plus the residual exactly once"
    return ""


def plan_refusal(plan: Plan) -> str:
    """Why ``plan`` cannot run the epilogue at any size, or '': its outputs must all be its ranks' own sums
    (``output_ranges``), each adding the residual exactly once (``residual_refusal``), so that the reductions
    that add the residual are exactly those output writes."""
    ranges = output_ranges(plan)
    if isinstance(ranges, str):
        return ranges
    why = residual_refusal(plan)
    if why:
        return why
    if norm_ranges(plan) != ranges:
        return f"plan {plan.name}: some output write does not complete its sum (the residual is added elsewhere)"
    return ""


@dataclass(frozen=True)
class RowSpan:
    """Where one output-writing reduction's epilogue runs, in output bytes ``first``..``first + nbytes``: whole
    rows (``slices`` 1), or slice ``index`` of the ``slices`` equal slices of row ``row`` that as many thread
    blocks sum, which then exchange their sums of squares (``executor/gpu/cuda/norm.cuh``, kNormSlice)."""

    first: int
    nbytes: int
    slices: int = 1
    index: int = 0
    row: int = 0


def row_spans(plan: Plan, nbytes: int, dtype: str, norm: RowNorm) -> dict[machine.OpKey, RowSpan] | str:
    """(rank, thread block, op) -> the RowSpan of each output-writing reduction at ``nbytes`` in rows of
    ``norm.row_elems`` ``dtype``, or why the epilogue cannot run there. Each reduction's range must be whole rows,
    or one slice of a row whose equal slices (an exact fraction of it, aligned) other reductions of its rank
    complete; such a reduction must be its thread block's last op, so that its wait for the row's other sums of
    squares holds back nothing that another block waits for."""
    row = norm.row_bytes(dtype)
    if norm.row_elems <= 0 or not plan.accepts(nbytes) or nbytes % row:
        return f"plan {plan.name}: {nbytes} B is not a whole number of rows of {norm.row_elems} {dtype} it accepts"
    if row >= 2**31:
        return f"plan {plan.name}: rows of {norm.row_elems} {dtype} are too long for the epilogue"
    ranges = output_ranges(plan)
    if isinstance(ranges, str):
        return ranges
    cb = plan.chunk_bytes(nbytes)
    spans: dict[tuple[int, int, int], RowSpan] = {}
    split: dict[tuple[int, int], set[int]] = {}  # (rank, row) -> the slice sizes it is cut into
    for (rank, tb, k), (first, size) in sorted(ranges.items()):
        f, n = first * cb, size * cb
        if f % row == 0 and n % row == 0:
            spans[(rank, tb, k)] = RowSpan(f, n)
            continue
        if row % n or f % n:
            return (
                f"plan {plan.name}: at {nbytes} B thread block {tb} of rank {rank} sums bytes {f}..{f + n}, "
                f"neither whole rows of {row} B nor an aligned fraction of one"
            )
        if k != len(plan.gpus[rank].threadblocks[tb].ops) - 1 or plan.num_threads_per_block < 32:
            return (
                f"plan {plan.name}: at {nbytes} B thread block {tb} of rank {rank} sums a slice of a row, so it "
                "waits for the row's other slices: that must be its last op, in blocks of 32 threads or more"
            )
        spans[(rank, tb, k)] = RowSpan(f, n, row // n, f % row // n, f // row)
        split.setdefault((rank, f // row), set()).add(n)
    uneven = [key for key, sizes in split.items() if len(sizes) > 1]
    if uneven:
        return (
            f"plan {plan.name}: at {nbytes} B row {uneven[0][1]} of rank {uneven[0][0]} is split into slices "
            "of unequal sizes"
        )
    return spans


def rows_refusal(plan: Plan, nbytes: int, dtype: str, norm: RowNorm) -> str:
    """Why ``plan`` cannot normalize rows of ``norm.row_elems`` at ``nbytes``, or '' (its output writes, read
    from its ops: ``output_ranges``, as whole rows or slices of rows: ``row_spans``; ``plan_refusal`` proves they
    are where the residual is added)."""
    spans = row_spans(plan, nbytes, dtype, norm)
    return spans if isinstance(spans, str) else ""


def best_norm_plan(
    candidates: list[tuple[Plan, float]], nbytes: int, dtype: str, norm: RowNorm, refusal=None
) -> tuple[Plan | None, str]:
    """The plan that runs the fused call at ``nbytes`` among ``candidates`` ((plan, estimated µs) serving that
    size), or (None, why none can): those that pass ``refusal`` (default ``fused_refusal``; pass a cached one)
    and whose rows fit (whole rows or equal slices of rows per thread block: ``row_spans``), then the fastest (a
    row-owning plan, never benched alone, is estimated by the plan it was regrouped from: ``row_base``), then the
    most thread blocks completing sums (so a plan's own reduction spread, rows split over its blocks, before any
    regrouping of it into fewer blocks)."""
    refusal = refusal or fused_refusal
    for plan, _ in ranked_norm_plans(candidates, nbytes, dtype, norm):  # the proof only for the best, in order
        if not refusal(plan):
            return plan, ""
    return None, (
        f"no plan's rows fit {nbytes} B in rows of {norm.row_elems} {dtype} ({len(candidates)} plans "
        "for this size, none with whole rows or equal slices of rows in each thread block)"
    )


def ranked_norm_plans(
    candidates: list[tuple[Plan, float]], nbytes: int, dtype: str, norm: RowNorm
) -> list[tuple[Plan, float]]:
    """``candidates`` whose rows fit ``nbytes`` in rows of ``norm``, in ``best_norm_plan``'s order: the fastest
    first, then the most thread blocks completing sums, then by name (the refusal, a proof, is not run here)."""
    fit = [(p, t) for p, t in candidates if not rows_refusal(p, nbytes, dtype, norm)]
    return sorted(fit, key=lambda pt: (pt[1], -len(output_ranges(pt[0])) // pt[0].nranks, pt[0].name))


def row_base(name: str) -> str:
    """The plan a row-owning plan was regrouped from (``codegen.rows.own_rows`` names it ``BASE-rowsG``), else
    ``name`` itself."""
    head, sep, groups = name.rpartition("-rows")
    return head if sep and groups.isdigit() else name


def norm_candidates(entries: list, nbytes: int, ll128: bool, compiled: bool = False) -> list[tuple]:
    """(plan, estimated µs) of registry entries serving a size: a row-owning plan (never benched alone) takes the
    time measured for the plan it was regrouped from, whose sends it keeps; any other its own estimate (with LL128
    lines where ``ll128``, compiled kernels where ``compiled``: the ways the engine can run it)."""
    by_name = {e.plan.name: e for e in entries}
    return [
        (e.plan, (by_name.get(row_base(e.plan.name), e).estimate_us(nbytes, ll128, compiled)[1] or math.inf))
        for e in entries
    ]


def fused_time(
    plan: Plan, fused: dict[str, dict[int, float]], nbytes: int, ll128: bool, compiled: bool = False
) -> tuple[float, Mode] | None:
    """``plan``'s fastest fused-call time at ``nbytes`` and its mode, among its times in ``fused`` (registry norm.json
    for one row length: plan hash + mode suffix -> {bytes: µs}) that cover the size (recorded at it, or on both sides
    of it: log-log between them) in a mode the engine may run (``ll128``, ``compiled``); None where none does."""
    times = []
    for mode in (m for m in MODES if (ll128 or not m.lines) and (compiled or not m.compiled)):
        table = fused.get(norm_key(plan.content_hash, mode), {})
        if table and min(table) <= nbytes <= max(table):
            times.append((interpolate(table, nbytes), mode))
    return min(times) if times else None


def fused_tiers(
    entries: list, fused: dict[str, dict[int, float]], nbytes: int, ll128: bool, compiled: bool = False
) -> tuple[list[tuple[Plan, float, Mode]], list[tuple[Plan, float, Mode]]]:
    """(plan, estimated µs, the mode to run it in) of registry entries serving a size, for the fused call to rank,
    in two tiers: the entries with fused-call times covering ``nbytes`` (``fused_time``), each by its fastest (the
    call was timed with them), then the others by their all-reduce times (``norm_candidates``, ``norm_mode``), which
    leave out the epilogue and so are weighed only where no timed plan can run the call."""
    first, second = [], []
    allreduce = {p.content_hash: us for p, us in norm_candidates(entries, nbytes, ll128, compiled)}
    for e in entries:
        t = fused_time(e.plan, fused, nbytes, ll128, compiled)
        if t:
            first.append((e.plan, *t))
        else:
            second.append((e.plan, allreduce[e.plan.content_hash], norm_mode(entries, e.plan, nbytes, ll128, compiled)))
    return first, second


def best_fused_plan(
    tiers: tuple[list, list], nbytes: int, dtype: str, norm: RowNorm, refusal=None
) -> tuple[Plan | None, str]:
    """``best_norm_plan`` over ``fused_tiers``' tiers in turn: the fastest plan timed for the fused call that can run
    it, else the fastest by all-reduce times; (None, why) where none can."""
    why = ""
    for tier in tiers:
        plan, why = best_norm_plan([(p, t) for p, t, _ in tier], nbytes, dtype, norm, refusal)
        if plan is not None:
            return plan, ""
    return None, why


def norm_mode(entries: list, plan: Plan, nbytes: int, ll128: bool, compiled: bool = False) -> Mode:
    """How the fused call runs ``plan`` at ``nbytes``: the mode its registry entry (a row-owning plan's: its base
    plan's) measured fastest at that size among those the engine can run (``ll128``, ``compiled``); ``Mode()``
    where no entry of it serves the size."""
    by_name = {e.plan.name: e for e in entries}
    entry = by_name.get(row_base(plan.name)) or by_name.get(plan.name)
    return entry.estimate(nbytes, ll128, compiled)[2] if entry is not None else Mode()


class Epilogue:
    """The reference executor's epilogue (``run_reference(..., epilogue=)``): called with each residual-adding
    reduction's sum, it keeps the sum, and normalizes a row into ``normed[rank]`` once every element of it has
    been summed (a row split over several reductions is normalized once, after the last of them), counting every
    element's sums and normalized writes."""

    def __init__(self, plan: Plan, elems: int, dtype: str, norm: RowNorm, weight: np.ndarray):
        self.elems, self.dtype, self.norm, self.weight = elems, dtype, norm, np.asarray(weight, np.float32)
        self.ranges = norm_ranges(plan)
        size = [g.output_chunks * elems for g in plan.gpus]
        self.sums = [np.zeros(n, np.float32) for n in size]
        self.summed = [np.zeros(n, np.int64) for n in size]
        self.normed = [np.zeros(n, np.float32) for n in size]
        self.writes = [np.zeros(n, np.int64) for n in size]

    def __call__(self, key: machine.OpKey, chunk: int, total: np.ndarray, launch: int = 0) -> None:
        """``launch``: which launch of a back-to-back run summed it (one Epilogue holds one launch; ``Epilogues``
        keeps one per launch)."""
        rank, first, row = key[0], chunk * self.elems, self.norm.row_elems
        values = np.asarray(total, np.float32).reshape(-1)
        end = first + values.size
        if end > self.sums[rank].size or self.sums[rank].size % row:
            raise PlanError(
                f"epilogue: rank {rank} thread block {key[1]} op {key[2]}: elements {first}..{end} of "
                f"{self.sums[rank].size}: the output is not whole rows of {row}"
            )
        self.sums[rank][first:end] = values
        self.summed[rank][first:end] += 1
        for r in range(first // row, (end + row - 1) // row):
            at = slice(r * row, (r + 1) * row)
            if (self.summed[rank][at] > 0).all() and not self.writes[rank][at].any():
                self.normed[rank][at] = rms_norm(
                    self.sums[rank][at][None], self.weight, self.norm.eps, self.dtype
                ).reshape(-1)
                self.writes[rank][at] += 1

    def check_once(self) -> None:
        """Every element was summed and normalized exactly once, on every rank."""
        for rank, (summed, count) in enumerate(zip(self.summed, self.writes, strict=True)):
            for what, counts in (("summed", summed), ("normalized", count)):
                wrong = np.flatnonzero(counts != 1)
                if wrong.size:
                    raise CheckFailed(
                        f"epilogue: rank {rank}: element {int(wrong[0])} {what} {int(counts[wrong[0]])} times, not once"
                    )


class Epilogues:
    """The epilogues of a back-to-back run (``run_launches(..., epilogue=)``): one ``Epilogue`` per launch, each
    called with its own launch's sums."""

    def __init__(self, launches: list[Epilogue]):
        self.launches = launches

    def __call__(self, key: machine.OpKey, chunk: int, total: np.ndarray, launch: int = 0) -> None:
        self.launches[launch](key, chunk, total)


def run_fused(
    plan: Plan,
    inputs: list[np.ndarray],
    nbytes: int,
    dtype: str,
    residual: np.ndarray,
    weight: np.ndarray,
    norm: RowNorm,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The fused all-reduce on the reference executor: every rank's (normed, new residual), the epilogue proven
    to run once per element (``Epilogue.check_once``)."""
    return run_fused_launches(plan, [inputs], nbytes, dtype, residual, weight, norm)[0]


def run_fused_launches(
    plan: Plan,
    inputs: list[list[np.ndarray]],
    nbytes: int,
    dtype: str,
    residual: np.ndarray,
    weight: np.ndarray,
    norm: RowNorm,
) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """``run_fused`` once per entry of ``inputs``, back to back on the same buffers (``run_launches``; a Lamport
    plan's scratch copies rotate and are reset between them): each launch's (normed, new residual), each launch's
    epilogue proven to run once per element."""
    why = plan_refusal(plan) or rows_refusal(plan, nbytes, dtype, norm)
    if why:
        raise PlanError(why)
    elems = machine.chunk_elems(plan, nbytes, dtype)
    epilogues = [Epilogue(plan, elems, dtype, norm, weight) for _ in inputs]
    outputs = run_launches(plan, inputs, nbytes, dtype, [residual] * plan.nranks, Epilogues(epilogues))
    for epilogue in epilogues:
        epilogue.check_once()
    return [(epilogue.normed, out) for epilogue, out in zip(epilogues, outputs, strict=True)]


def fused_refusal(plan: Plan) -> str:
    """Why ``plan`` cannot run the fused all-reduce, or '': ``plan_refusal``, then runs on the reference executor
    (bf16, small integers, so every sum is exact) whose outputs must equal numpy's definition bit for bit: in rows
    that each reduction owns whole, and, where the plan's reductions can split it, in one row split over all of
    them (so the epilogue is proven to follow the last slice's sum, once); a Lamport plan's back to back, over
    every scratch copy's reuse."""
    why = plan_refusal(plan)
    if why:
        return why
    dtype = "bf16"
    nbytes = machine.smallest_size(plan)
    elems = machine.chunk_elems(plan, nbytes, dtype)
    ranges = norm_ranges(plan).values()
    whole = RowNorm(math.gcd(*[size for _, size in ranges], *[first for first, _ in ranges]) * elems, 1e-5)
    one_row = RowNorm(plan.gpus[0].output_chunks * elems, 1e-5)  # every rank's reductions split one row
    shapes = [whole] + ([one_row] if one_row != whole and not rows_refusal(plan, nbytes, dtype, one_row) else [])
    for norm in shapes:
        why = _fused_mismatch(plan, nbytes, dtype, elems, norm)
        if why:
            return why
    return ""


def _fused_mismatch(plan: Plan, nbytes: int, dtype: str, elems: int, norm: RowNorm) -> str:
    """'' where the reference executor's fused run in rows of ``norm`` equals numpy's definition bit for bit; a
    Lamport plan's over launches back to back that reuse every scratch copy after its reset."""
    rng = np.random.default_rng(0)
    launches = plan.lamport.calls_to_prove if plan.lamport is not None else 1
    inputs = [
        [rng.integers(-8, 8, g.input_chunks * elems).astype(np.float32) for g in plan.gpus] for _ in range(launches)
    ]
    residual = rng.integers(-8, 8, plan.gpus[0].output_chunks * elems).astype(np.float32)
    weight = machine.round_to(rng.normal(1.0, 0.1, norm.row_elems), dtype)
    try:
        runs = run_fused_launches(plan, inputs, nbytes, dtype, residual, weight, norm)
    except (PlanError, CheckFailed) as e:
        return f"plan {plan.name}: with the norm epilogue: {e}"
    for k, (launch, (normed, outputs)) in enumerate(zip(inputs, runs, strict=True)):
        want = machine.round_to(np.sum(launch, axis=0) + residual, dtype)
        want_normed = rms_norm(want.reshape(-1, norm.row_elems), weight, norm.eps, dtype).reshape(-1)
        for rank in range(plan.nranks):
            if not (np.array_equal(outputs[rank], want) and np.array_equal(normed[rank], want_normed)):
                at = f"launch {k}: " if launches > 1 else ""
                return f"plan {plan.name}: {at}rank {rank}'s normalized rows differ from numpy's definition"
    return ""
