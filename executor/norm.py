"""The fused all-reduce + residual add + RMSNorm: its numpy definition, which plans can run it, and its proof.

A transformer layer ends ``h = x + all_reduce(y)`` and the next one starts ``rms_norm(h) * w``. Fused, one launch
returns both: ``new_residual = residual + sum(y)`` (the all-reduce with a residual, ``gpu_tables``) and
``normed = new_residual * rsqrt(mean(new_residual²) + eps) * w`` row by row, a row being the last dimension
(the hidden size). A row's norm needs all of it, so the thread block that completes a row's sum must hold the
whole row: the epilogue runs right after each reduction that adds the residual (``reference.residual_sums``),
over that reduction's output range, which must be whole rows (``rows_refusal``). Row-owning plans come from
``codegen.rows.own_rows``.

numpy's definition (``rms_norm``), in fp32 on the element type's values: ``mean`` of the squares, ``rstd = 1 /
sqrt(mean + eps)``, then ``(x * rstd) * w`` rounded once to the element type. The GPU's epilogue
(``executor/cuda/norm.cuh``) does the same operations; only its order of summing the squares differs.

>>> x = np.array([[3.0, 4.0]], np.float32)
>>> rms_norm(x, np.ones(2, np.float32), 0.0, "fp32").tolist()
[[0.8485281467437744, 1.1313709020614624]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from executor import reference
from executor.gpu_tables import DTYPE_BYTES, residual_refusal
from schedules.plan import Plan, PlanError, remote_target
from topologies.errors import CheckFailed


@dataclass(frozen=True)
class RowNorm:
    """The epilogue's parameters: elements per row (the hidden size) and the epsilon under the square root."""

    row_elems: int
    eps: float

    def row_bytes(self, dtype: str) -> int:
        return self.row_elems * DTYPE_BYTES[dtype]


def rms_norm(rows: np.ndarray, weight: np.ndarray, eps: float, dtype: str) -> np.ndarray:
    """numpy's definition: each row of ``rows`` (float32 holding ``dtype`` values) normalized, times ``weight``,
    rounded to ``dtype``."""
    x = np.asarray(rows, np.float32)
    mean = (np.sum(x.astype(np.float64) ** 2, axis=-1) / x.shape[-1]).astype(np.float32)
    rstd = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return reference.round_to((x * rstd[..., None]) * np.asarray(weight, np.float32), dtype)


def output_ranges(plan: Plan) -> dict[reference.OpKey, tuple[int, int]] | str:
    """(rank, thread block, op) -> (first output chunk, chunks) of each local reduction writing its rank's output,
    read from the plan's ops alone; or why the epilogue cannot follow them: on every rank they must write all the
    output chunks, once each, and no other op may write an output (a row that arrives as a copy was summed by no
    block of its rank)."""
    out = {}
    for rank, gpu in enumerate(plan.gpus):
        covered = []
        for tb in gpu.threadblocks:
            for k, op in enumerate(tb.ops):
                mine = [b for b in op.dst_buff if not b.remote and b.type == "o"]
                remote_out = [b for b in op.dst_buff if b.remote and remote_target(gpu, tb, op, b)[1] == "o"]
                if remote_out or (mine and not (op.spec.reduces and len(mine) == 1)):
                    return (f"plan {plan.name}: gpus[{rank}].threadblocks[{tb.id}].ops[{k}] ({op.name}) writes an "
                            "output other than by its rank's own sum, so no thread block holds those rows whole")
                if mine:
                    out[(rank, tb.id, k)] = (mine[0].index, mine[0].size)
                    covered += range(mine[0].index, mine[0].index + mine[0].size)
        if sorted(covered) != list(range(gpu.output_chunks)):
            return f"plan {plan.name}: rank {rank}'s reductions do not write each output chunk exactly once"
    return out


def norm_ranges(plan: Plan) -> dict[reference.OpKey, tuple[int, int]]:
    """(rank, thread block, op) -> (first output chunk, chunks) of each reduction after which the epilogue runs:
    those that add the residual (``reference.residual_sums``)."""
    out = {}
    for (rank, tb, index), chunk in reference.residual_sums(plan).items():
        op = plan.gpus[rank].threadblocks[tb].ops[index]
        sizes = {b.size for b in op.dst_buff if not b.remote and b.type == "o" and b.index == chunk}
        out[(rank, tb, index)] = (chunk, sizes.pop() if sizes else 0)
    return out


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


def rows_refusal(plan: Plan, nbytes: int, dtype: str, norm: RowNorm) -> str:
    """Why ``plan`` cannot normalize rows of ``norm.row_elems`` at ``nbytes``, or '' (its output writes, read
    from its ops: ``output_ranges``; ``plan_refusal`` proves they are where the residual is added)."""
    row = norm.row_bytes(dtype)
    if norm.row_elems <= 0 or not plan.accepts(nbytes) or nbytes % row:
        return f"plan {plan.name}: {nbytes} B is not a whole number of rows of {norm.row_elems} {dtype} it accepts"
    if row >= 2 ** 31:
        return f"plan {plan.name}: rows of {norm.row_elems} {dtype} are too long for the epilogue"
    ranges = output_ranges(plan)
    if isinstance(ranges, str):
        return ranges
    cb = plan.chunk_bytes(nbytes)
    for (rank, tb, _), (first, size) in sorted(ranges.items()):
        if (first * cb) % row or (size * cb) % row:
            return (f"plan {plan.name}: at {nbytes} B thread block {tb} of rank {rank} sums bytes "
                    f"{first * cb}..{(first + size) * cb}, not whole rows of {row} B")
    return ""


def best_norm_plan(candidates: list[tuple[Plan, float]], nbytes: int, dtype: str, norm: RowNorm,
                   refusal=None) -> tuple[Plan | None, str]:
    """The plan that runs the fused call at ``nbytes`` among ``candidates`` ((plan, estimated µs) serving that
    size), or (None, why none can): those that pass ``refusal`` (default ``fused_refusal``; pass a cached one)
    and whose rows fit, then the most row-owning thread blocks (rows normalized in parallel), then the fastest
    (a row-owning plan, never benched alone, is estimated by the plan it was regrouped from: ``row_base``)."""
    refusal = refusal or fused_refusal
    fit = [(p, t) for p, t in candidates if not rows_refusal(p, nbytes, dtype, norm)]
    fit.sort(key=lambda pt: (-len(output_ranges(pt[0])) // pt[0].nranks, pt[1], pt[0].name))
    for plan, _ in fit:  # the proof (a reference run) only for the best candidates, in order
        if not refusal(plan):
            return plan, ""
    return None, (f"no plan's rows fit {nbytes} B in rows of {norm.row_elems} {dtype} ({len(candidates)} plans "
                  "for this size, none with whole rows in each thread block)")


def row_base(name: str) -> str:
    """The plan a row-owning plan was regrouped from (``codegen.rows.own_rows`` names it ``BASE-rowsG``), else
    ``name`` itself."""
    head, sep, groups = name.rpartition("-rows")
    return head if sep and groups.isdigit() else name


class Epilogue:
    """The reference executor's epilogue (``run_reference(..., epilogue=)``): called with each residual-adding
    reduction's sum, it normalizes those rows into ``normed[rank]`` and counts every element's writes."""

    def __init__(self, plan: Plan, elems: int, dtype: str, norm: RowNorm, weight: np.ndarray):
        self.elems, self.dtype, self.norm, self.weight = elems, dtype, norm, np.asarray(weight, np.float32)
        self.ranges = norm_ranges(plan)
        self.normed = [np.zeros(g.output_chunks * elems, np.float32) for g in plan.gpus]
        self.writes = [np.zeros(g.output_chunks * elems, np.int64) for g in plan.gpus]

    def __call__(self, key: reference.OpKey, chunk: int, total: np.ndarray) -> None:
        first = chunk * self.elems
        values = np.asarray(total, np.float32).reshape(-1)
        if values.size % self.norm.row_elems or first % self.norm.row_elems:
            raise PlanError(f"epilogue: rank {key[0]} thread block {key[1]} op {key[2]}: elements "
                            f"{first}..{first + values.size} are not whole rows of {self.norm.row_elems}")
        rows = values.reshape(-1, self.norm.row_elems)
        self.normed[key[0]][first:first + values.size] = rms_norm(rows, self.weight, self.norm.eps,
                                                                  self.dtype).reshape(-1)
        self.writes[key[0]][first:first + values.size] += 1

    def check_once(self) -> None:
        """Every normalized element was written exactly once, on every rank."""
        for rank, count in enumerate(self.writes):
            wrong = np.flatnonzero(count != 1)
            if wrong.size:
                raise CheckFailed(f"epilogue: rank {rank}: element {int(wrong[0])} normalized {int(count[wrong[0]])} "
                                  "times, not once")


def run_fused(plan: Plan, inputs: list[np.ndarray], nbytes: int, dtype: str, residual: np.ndarray,
              weight: np.ndarray, norm: RowNorm) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The fused all-reduce on the reference executor: every rank's (normed, new residual), the epilogue proven
    to run once per element (``Epilogue.check_once``)."""
    why = plan_refusal(plan) or rows_refusal(plan, nbytes, dtype, norm)
    if why:
        raise PlanError(why)
    elems = reference.chunk_elems(plan, nbytes, dtype)
    epilogue = Epilogue(plan, elems, dtype, norm, weight)
    outputs = reference.run_reference(plan, inputs, nbytes, dtype, [residual] * plan.nranks, epilogue=epilogue)
    epilogue.check_once()
    return epilogue.normed, outputs


def fused_refusal(plan: Plan) -> str:
    """Why ``plan`` cannot run the fused all-reduce, or '': ``plan_refusal``, then a run on the reference executor
    (bf16, small integers, so every sum is exact) whose outputs must equal numpy's definition bit for bit."""
    why = plan_refusal(plan)
    if why:
        return why
    dtype = "bf16"
    nbytes = reference.smallest_size(plan)
    elems = reference.chunk_elems(plan, nbytes, dtype)
    spans = [size for first, size in norm_ranges(plan).values()] + [first for first, _ in norm_ranges(plan).values()]
    norm = RowNorm(math.gcd(*spans) * elems, 1e-5)
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-8, 8, g.input_chunks * elems).astype(np.float32) for g in plan.gpus]
    residual = rng.integers(-8, 8, plan.gpus[0].output_chunks * elems).astype(np.float32)
    weight = reference.round_to(rng.normal(1.0, 0.1, norm.row_elems), dtype)
    try:
        normed, outputs = run_fused(plan, inputs, nbytes, dtype, residual, weight, norm)
    except (PlanError, CheckFailed) as e:
        return f"plan {plan.name}: with the norm epilogue: {e}"
    want = reference.round_to(np.sum(inputs, axis=0) + residual, dtype)
    want_normed = rms_norm(want.reshape(-1, norm.row_elems), weight, norm.eps, dtype).reshape(-1)
    for rank in range(plan.nranks):
        if not (np.array_equal(outputs[rank], want) and np.array_equal(normed[rank], want_normed)):
            return f"plan {plan.name}: rank {rank}'s normalized rows differ from numpy's definition"
    return ""
