"""Proving a plan on the reference machine (``executor.reference.machine``): run it, back to back, on random
non-zero data for every size and dtype, and compare with numpy's collective. A Lamport plan runs on its own machine
(``executor.reference.lamport``), which this module picks, so that the machine never imports its variants."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from executor.errors import WrongResult
from executor.reference.lamport import LamportMachine, refuse_racy_reset
from executor.reference.machine import (
    DTYPES,
    _check_dtype,
    _Machine,
    chunk_elems,
    estimate_bytes,
    estimate_ops,
    round_to,
)
from schedules.collectives import Collective
from schedules.plan.types import (
    Plan,
    PlanError,
)


def run_reference(
    plan: Plan,
    inputs: list[np.ndarray],
    nbytes: int,
    dtype: str,
    residuals: list[np.ndarray] | None = None,
    epilogue: Callable | None = None,
) -> list[np.ndarray]:
    """Run ``plan`` on every rank's input buffer; returns every rank's output buffer (float32 arrays).

    ``inputs[r]`` holds rank r's input buffer (``input_chunks × chunk elements`` values; bf16 as float32).
    ``residuals[r]``: rank r's residual (output-sized), added where ``residual_chunk`` says.
    ``epilogue``: called as ``epilogue((rank, tb, op), chunk, sum, launch)`` with each such reduction's sum plus
    residual (``executor.reference.norm.Epilogue``).
    """
    return run_launches(plan, [inputs], nbytes, dtype, residuals, epilogue)[0]


def run_launches(
    plan: Plan,
    inputs: list[list[np.ndarray]],
    nbytes: int,
    dtype: str,
    residuals: list[np.ndarray] | None = None,
    epilogue: Callable | None = None,
) -> list[list[np.ndarray]]:
    """Run ``plan`` once per entry of ``inputs``, back to back on the same buffers; every launch's outputs.

    ``inputs[k][r]`` is rank r's input for launch k. Rank r's launch k+1 starts after its own launch k only.
    """
    elems = chunk_elems(plan, nbytes, dtype)
    flat: list[list[np.ndarray]] = []
    for k, launch in enumerate(inputs):
        name = f"inputs[{k}]" if len(inputs) > 1 else "inputs"
        if len(launch) != plan.nranks:
            raise PlanError(f"plan {plan.name}: {name}: {len(launch)} arrays for {plan.nranks} ranks")
        flat.append([])
        for r, (g, x) in enumerate(zip(plan.gpus, launch, strict=True)):
            x = np.asarray(x, dtype=np.float32).reshape(-1)
            if x.size != g.input_chunks * elems:
                raise PlanError(
                    f"plan {plan.name}: {name}[{r}]: {x.size} elements, expected "
                    f"{g.input_chunks * elems} ({g.input_chunks} chunks of {elems})"
                )
            flat[-1].append(x)
    machine = _Machine if plan.lamport is None else LamportMachine
    m = machine(plan, elems, dtype, flat, residuals, epilogue=epilogue)
    m.run(deadline_ops=10 * sum(len(t.ops) for t in m.threads) + 100)
    return m.outputs


def expected_outputs(
    collective: Collective, inputs: list[np.ndarray], elems: int, dtype: str
) -> list[dict[int, np.ndarray]]:
    """numpy's definition of the collective: for each rank, output index -> the chunk it must hold."""
    n = collective.nranks
    value: dict[int, np.ndarray] = {}
    for r in range(n):
        x = np.asarray(inputs[r], dtype=np.float32).reshape(-1, elems)
        held = collective.precondition(r)
        for idx, chunk in enumerate(collective.input_map(r)):
            if chunk not in held:
                continue
            if collective.combining:
                value[chunk] = value[chunk] + x[idx] if chunk in value else x[idx].copy()
            else:
                value[chunk] = x[idx]
    if collective.combining:
        value = {c: round_to(v, dtype) for c, v in value.items()}
    expected = []
    for r in range(n):
        need = collective.postcondition(r)
        expected.append({idx: value[c] for idx, c in enumerate(collective.output_map(r)) if c in need})
    return expected


def random_inputs(plan: Plan, elems: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Non-zero random integers small enough that every sum is exact in fp16 and bf16."""
    bound = max(1, 256 // (2 * plan.nranks))
    inputs = []
    for g in plan.gpus:
        x = rng.integers(1, bound + 1, size=g.input_chunks * elems) * rng.choice([-1, 1], size=g.input_chunks * elems)
        inputs.append(x.astype(np.float32))
    return inputs


@dataclass(frozen=True)
class VerificationRecord:
    """What ``check_plan`` proved: the plan's hash, the sizes and dtypes it ran, and the outcome."""

    plan_hash: str
    ok: bool
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    seed: int
    checks: tuple[str, ...]
    executor: str = "reference"
    back_to_back: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "plan_hash": self.plan_hash,
            "ok": self.ok,
            "executor": self.executor,
            "sizes": list(self.sizes),
            "dtypes": list(self.dtypes),
            "seed": self.seed,
            "back_to_back": self.back_to_back,
            "checks": list(self.checks),
        }


BACK_TO_BACK = 3  # launches: the third reuses the first one's half of a double scratch buffer


def check_plan(
    plan: Plan,
    sizes: Iterable[int],
    dtypes: Iterable[str] = ("fp32", "fp16", "bf16"),
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    back_to_back: int = BACK_TO_BACK,
) -> VerificationRecord:
    """Run ``plan`` on random non-zero data for every size and dtype and compare with numpy's collective.

    The first size and dtype run ``back_to_back`` launches on the same buffers, each on fresh inputs (races
    are found per chunk, so one size proves launch safety for all); two launches suffice without a double
    scratch buffer, and a Lamport plan runs one more than its scratch copies (each reused after its reset), after
    its rotation passed ``executor.reference.lamport.refuse_racy_reset``. Raises WrongResult, PlanDeadlock or
    PlanRace on the first failure.
    """
    sizes, dtypes = tuple(sizes), tuple(dtypes)
    if plan.lamport is not None:  # every scratch copy reused after its reset, each reset checked against its peers
        refuse_racy_reset(plan)
        back_to_back = max(back_to_back, plan.lamport.calls_to_prove)
    elif not plan.use_double_scratch_buffer:  # a third launch only meets the first again in the same scratch half
        back_to_back = min(back_to_back, 2)
    _require_memory(plan, sizes, dtypes, back_to_back)
    work = sum(estimate_ops(plan, back_to_back if i == 0 else 1) for i in range(len(sizes) * len(dtypes)))
    threads = sum(len(g.threadblocks) for g in plan.gpus)
    if progress:
        progress(
            f"reference: proving plan {plan.name} ({threads} thread blocks, about {work} ops in "
            f"{len(sizes) * len(dtypes)} runs)"
        )
    collective = plan.collective_spec() if plan.checkable else None
    rng = np.random.default_rng(seed)
    checks: list[str] = []
    for nbytes in sizes:
        for dtype in dtypes:
            launches = back_to_back if not checks else 1
            elems = chunk_elems(plan, nbytes, dtype)
            inputs = [random_inputs(plan, elems, rng) for _ in range(launches)]
            for k, outputs in enumerate(run_launches(plan, inputs, nbytes, dtype)):
                at = f"{nbytes} B {dtype}" + (f" launch {k} of {launches}" if launches > 1 else "")
                if collective is not None:
                    _compare(plan, expected_outputs(collective, inputs[k], elems, dtype), outputs, elems, at)
            after = f" ({launches} launches back to back)" if launches > 1 else ""
            what = "ok" if collective is not None else "ran clean (no race, deadlock or range error; no result defined)"
            checks.append(f"{plan.collective} {nbytes}B {dtype}: {what}{after}")
            if progress:
                progress(f"reference: {checks[-1]}")
    return VerificationRecord(
        plan.content_hash, True, sizes, dtypes, seed, tuple(checks), back_to_back=max(1, back_to_back)
    )


def _require_memory(plan: Plan, sizes: tuple[int, ...], dtypes: tuple[str, ...], back_to_back: int) -> None:
    """Refuse the proof in one line, before anything is allocated, when its largest run would pass the budget."""
    from schedules.budget import require

    for dtype in dtypes:
        _check_dtype(dtype)
    widest = min(dtypes, key=DTYPES.__getitem__, default="fp32")  # the most elements per byte (held as float32)
    runs = [(chunk_elems(plan, n, widest) and n, back_to_back if i == 0 else 1) for i, n in enumerate(sizes)]
    need, nbytes, launches = max((estimate_bytes(plan, n, widest, k), n, k) for n, k in runs)
    require(need, f"plan {plan.name}: the reference proof at {nbytes} B ({launches} launch{'es' * (launches != 1)})")


def _compare(plan: Plan, expected: list[dict[int, np.ndarray]], outputs: list[np.ndarray], elems: int, at: str) -> None:
    for r, want in enumerate(expected):
        got = outputs[r].reshape(-1, elems)
        for idx, chunk_value in want.items():
            if not np.array_equal(got[idx], chunk_value):
                bad = int(np.flatnonzero(got[idx] != chunk_value)[0])
                raise WrongResult(
                    f"plan {plan.name}: wrong result at {at}: rank {r} output chunk {idx} "
                    f"element {bad} is {got[idx][bad]!r}, expected {chunk_value[bad]!r}"
                )
