"""Any message size on the CPU reference executor: a plan run padded (``schedules.padding``), as the GPU runs it.

``run_any_size`` takes each rank's input at the caller's size, stages each part at its padded place (zeros
between), runs the plan at the padded size on the reference executor, and copies each output part back from its
padded place. Sizes that are multiples of the plan's granule run directly, unchanged.

>>> import numpy as np
>>> from schedules.plan import load_plan
>>> plan = load_plan("tests/fixtures/plans/allpairs_allreduce_2.json")
>>> plan.granule, plan.accepts(12), plan.runs(12)
(8, False, True)
>>> [y.tolist() for y in run_any_size(plan, [np.array([1., 2., 3.]), np.array([10., 20., 30.])], 12, "fp32")]
[[11.0, 22.0, 33.0], [11.0, 22.0, 33.0]]
"""

from __future__ import annotations

import numpy as np

from executor.reference.machine import DTYPES
from executor.reference.prove import run_reference
from schedules.padding import Padding
from schedules.plan.types import Plan, PlanError


def buffer_parts(plan: Plan, chunks: int) -> int:
    """How many of the message's parts a buffer of ``chunks`` chunks holds."""
    return chunks * plan.message_parts // plan.size_chunks


def part_elems(plan: Plan, padding: Padding, dtype: str) -> tuple[int, int]:
    """(elements of a part at the caller's size, elements of a padded part); PlanError where a part is not a whole
    number of ``dtype`` elements."""
    size = DTYPES[dtype]
    if padding.part_bytes % size:
        raise PlanError(
            f"plan {plan.name}: size {padding.nbytes} B: its parts of {padding.part_bytes} B are not "
            f"whole {dtype} elements"
        )
    return padding.part_bytes // size, padding.padded_part_bytes // size


def pad(x: np.ndarray, parts: int, elems: int, padded_elems: int) -> np.ndarray:
    """A caller's buffer of ``parts`` parts of ``elems`` elements, each part at its padded place (zeros between)."""
    out = np.zeros((parts, padded_elems), dtype=np.float32)
    out[:, :elems] = np.asarray(x, dtype=np.float32).reshape(parts, elems)
    return out.reshape(-1)


def unpad(y: np.ndarray, parts: int, elems: int, padded_elems: int) -> np.ndarray:
    """Each part of a padded buffer back at the caller's place."""
    return np.ascontiguousarray(np.asarray(y).reshape(parts, padded_elems)[:, :elems]).reshape(-1)


def run_any_size(plan: Plan, inputs: list[np.ndarray], nbytes: int, dtype: str) -> list[np.ndarray]:
    """Run ``plan`` at any size it runs (``Plan.runs``): every rank's input at the caller's size in, every rank's
    output at the caller's size out (float32 arrays holding ``dtype`` values)."""
    if dtype not in DTYPES:
        raise PlanError(f"dtype: must be fp32, fp16 or bf16, got {dtype!r}")
    padding = plan.padding(nbytes)
    if padding.direct:
        return run_reference(plan, inputs, nbytes, dtype)
    elems, padded = part_elems(plan, padding, dtype)
    if len(inputs) != plan.nranks:
        raise PlanError(f"plan {plan.name}: inputs: {len(inputs)} arrays for {plan.nranks} ranks")
    staged = []
    for r, (g, x) in enumerate(zip(plan.gpus, inputs, strict=True)):
        parts = buffer_parts(plan, g.input_chunks)
        if np.size(x) != parts * elems:
            raise PlanError(
                f"plan {plan.name}: inputs[{r}]: {np.size(x)} elements, expected {parts * elems} "
                f"({parts} parts of {elems} at {nbytes} B {dtype})"
            )
        staged.append(pad(x, parts, elems, padded))
    outputs = run_reference(plan, staged, padding.padded_bytes, dtype)
    return [
        unpad(y, buffer_parts(plan, g.output_chunks), elems, padded) for g, y in zip(plan.gpus, outputs, strict=True)
    ]
