"""The fused all-reduce + residual add + RMSNorm on Lamport plans (issue 33): the reference epilogue's proof back to
back over the rotating scratch copies, the interpreter's tables (the residual, the epilogue after the sum, the reset
after the epilogue, the norm's slots past every copy), and the two-shot's refusal of the norm, with its reason. The
kernel runs in tests/gpu/test_lamport_gpu.py; tests/test_cuda_compile.py builds it."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import compile_schedule
from executor.errors import ExecutorError
from executor.gpu import tables as gpu_tables
from executor.reference import machine as reference
from executor.reference.norm import RowNorm, fused_refusal, rms_norm, run_fused, run_fused_launches
from executor.reference.prove import run_launches
from schedules.collectives import Collective
from schedules.lamport import LamportBuffers
from schedules.plan.types import PlanError
from synth.baselines import direct, twoshot
from topologies.catalog import build as build_topology

HIDDEN = 64
TWO_SHOT_NORM = "writes an output other than by its rank's own sum"


def _plan(baseline, n: int, instances: int = 1):
    topology = build_topology(f"fully_connected:n={n}")
    return compile_schedule(baseline(topology, Collective("allreduce", n)), protocol="lamport", instances=instances)


def _launches(plan, nbytes: int, dtype: str, count: int, seed: int = 0):
    """``count`` launches' inputs (different each time, with -0.0 among them: the sentinel a sender maps; small
    integers, so that every sum is exact in any order the ranks add), one residual and one weight."""
    rng = np.random.default_rng(seed)
    elems = reference.chunk_elems(plan, nbytes, dtype)
    inputs = []
    for _ in range(count):
        launch = [rng.integers(-8, 8, g.input_chunks * elems).astype(np.float32) for g in plan.gpus]
        launch[0][:2] = -0.0
        inputs.append(launch)
    residual = rng.integers(-8, 8, plan.gpus[0].output_chunks * elems).astype(np.float32)
    weight = reference.round_to(rng.normal(1, 0.2, HIDDEN), dtype)
    return inputs, residual, weight


def _definition(inputs, residual, weight, dtype):
    total = inputs[0]
    for x in inputs[1:]:
        total = reference.round_to(total + x, dtype)
    new_residual = reference.round_to(total + residual, dtype)
    return new_residual, rms_norm(new_residual.reshape(-1, HIDDEN), weight, 1e-5, dtype).reshape(-1)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("n,instances,rows", [(2, 1, 2), (2, 2, 1), (4, 1, 4)])
def test_a_lamport_one_shot_runs_the_epilogue_back_to_back_over_every_copys_reuse(dtype, n, instances, rows):
    """Whole rows per block, and one row split over two blocks (instances 2), for launches enough to reuse every
    scratch copy after its reset; every launch's rows equal numpy's definition bit for bit."""
    plan = _plan(direct, n, instances)
    nbytes = rows * HIDDEN * reference.DTYPES[dtype]
    count = LamportBuffers().calls_to_prove
    inputs, residual, weight = _launches(plan, nbytes, dtype, count)
    runs = run_fused_launches(plan, inputs, nbytes, dtype, residual, weight, RowNorm(HIDDEN, 1e-5))
    assert len(runs) == count
    for launch, (normed, outputs) in zip(inputs, runs, strict=True):
        new_residual, want = _definition(launch, residual, weight, dtype)
        for rank in range(n):
            assert np.array_equal(outputs[rank], new_residual)
            assert np.array_equal(normed[rank], want)


def test_each_launch_of_a_back_to_back_run_has_its_own_epilogue():
    """Two launches with different inputs: the second's rows are normalized from its own sums, not the first's."""
    plan = _plan(direct, 2)
    nbytes = HIDDEN * 4
    inputs, residual, weight = _launches(plan, nbytes, "fp32", 2)
    inputs[1] = [2 * x for x in inputs[1]]
    (first, _), (second, _) = run_fused_launches(plan, inputs, nbytes, "fp32", residual, weight, RowNorm(HIDDEN, 1e-5))
    assert np.array_equal(second[0], _definition(inputs[1], residual, weight, "fp32")[1])
    assert not np.array_equal(first[0], second[0])


@pytest.mark.parametrize("instances", [1, 2])
def test_the_engines_proof_of_a_lamport_plan_runs_it_back_to_back_over_every_copys_reuse(monkeypatch, instances):
    """fused_refusal (the engine's norm_refusal) passes the one-shot after runs of calls_to_prove launches."""
    from executor.reference import norm

    counts = []
    real = norm.run_fused_launches

    def counted(plan, inputs, *rest):
        counts.append(len(inputs))
        return real(plan, inputs, *rest)

    monkeypatch.setattr(norm, "run_fused_launches", counted)
    assert fused_refusal(_plan(direct, 2, instances)) == ""
    assert counts and set(counts) == {LamportBuffers().calls_to_prove}


def test_a_lamport_two_shot_adds_the_residual_back_to_back():
    """The residual alone: the reducing rank adds it before its sum goes out as Lamport data, once per element."""
    plan = _plan(twoshot, 4)
    nbytes = 4 * HIDDEN * 2
    inputs, residual, _ = _launches(plan, nbytes, "bf16", LamportBuffers().calls_to_prove)
    runs = run_launches(plan, inputs, nbytes, "bf16", [residual] * plan.nranks)
    for launch, outputs in zip(inputs, runs, strict=True):
        want = _definition(launch, residual, np.ones(HIDDEN, np.float32), "bf16")[0]
        assert all(np.array_equal(out, want) for out in outputs)


@pytest.mark.parametrize("n", [2, 4])
def test_a_lamport_two_shot_refuses_the_norm_because_its_rows_arrive_as_copies(n):
    plan = _plan(twoshot, n)
    nbytes = n * HIDDEN * 2
    inputs, residual, weight = _launches(plan, nbytes, "bf16", 1)
    with pytest.raises(PlanError, match=TWO_SHOT_NORM):
        run_fused(plan, inputs[0], nbytes, "bf16", residual, weight, RowNorm(HIDDEN, 1e-5))


# ---------------------------------------------------------------------------------------------- device tables


def _blocks(t):
    return [t.ops[t.tb_start[b] : t.tb_start[b + 1]] for b in range(t.nthreadblocks)]


@pytest.mark.parametrize("n", [2, 4])
def test_lamport_tables_reset_then_add_the_residual_then_the_epilogue(n):
    """The reducing block: its reset comes before the reduction that polls the peers' Lamport data (its stores
    issue before the block waits), the reduction adds the plain residual last, and the epilogue reads the output it
    wrote (never a scratch copy), last."""
    plan = _plan(direct, n)
    t = gpu_tables.build_tables(plan, 1, n * HIDDEN * 2, residual=True, norm=RowNorm(HIDDEN, 1e-5), dtype="bf16")
    residual_slot = gpu_tables.PEER_SLOTS + len(plan.gpus[1].remote_buffers)
    assert t.residual and t.norm and t.nslots == residual_slot + 3 and t.lamport_buffers == 3
    for ops in _blocks(t):
        kinds = [int(op["type"]) for op in ops if op["type"] != gpu_tables.NOP]
        assert kinds.count(gpu_tables.LAMPORT_RESET) == 1
        if gpu_tables.NORM_ROWS in kinds:
            assert kinds[-1] == gpu_tables.NORM_ROWS  # after the reduction it normalizes
            assert kinds.index(gpu_tables.LAMPORT_RESET) < kinds.index(gpu_tables.NORM_ROWS) - 1
    norms = [k for k, op in enumerate(t.ops) if op["type"] == gpu_tables.NORM_ROWS]
    assert len(norms) == 1
    norm, reduction = t.ops[norms[0]], t.ops[norms[0] - 1]
    assert reduction["type"] == gpu_tables.TRANSFER and reduction["barrier_count"] == 3
    last = reduction["src"][reduction["nsrc"] - 1]
    assert (last["buffer"], last["flags"]) == (residual_slot, 0)  # plain: no poll, no copy shift
    polled = [reduction["src"][k] for k in range(reduction["nsrc"] - 1) if reduction["src"][k]["flags"]]
    assert len(polled) == n - 1 and all(r["flags"] == gpu_tables.LAMPORT | gpu_tables.SCRATCH for r in polled)
    assert (reduction["dst"][0]["buffer"], reduction["dst"][0]["flags"]) == (gpu_tables.SLOTS["o"], 0)
    assert (norm["src"][0]["buffer"], norm["src"][0]["flags"]) == (gpu_tables.SLOTS["o"], 0)
    assert norm["dst"][0]["buffer"] == residual_slot + 2


def test_lamport_tables_put_a_split_rows_slots_past_all_three_copies():
    """One row over two blocks (kNormSlice): the sums of squares live past the three copies, which the fill and
    the resets stop short of, so no copy's sentinel or peer data lands on them."""
    plan = _plan(direct, 2, instances=2)
    t = gpu_tables.build_tables(plan, 0, HIDDEN * 2, residual=True, norm=RowNorm(HIDDEN, 1e-5), dtype="bf16")
    slices = [op for op in t.ops if op["type"] == gpu_tables.NORM_SLICE]
    assert len(slices) == 2
    at = (3 * t.scratch_bytes + 15) // 16 * 16
    assert t.norm_at == at and t.norm_slots == 2 * 8 and t.scratch_alloc == at + 16
    assert all(
        (op["src"][2]["buffer"], int(op["src"][2]["offset"]), op["src"][2]["flags"]) == (2, at, 0) for op in slices
    )
    resets = [op for op in t.ops if op["type"] == gpu_tables.LAMPORT_RESET]
    assert max(int(op["dst"][0]["offset"] + op["bytes"]) for op in resets) <= t.scratch_bytes
    assert t.scratch_bytes * t.lamport_buffers <= t.norm_at  # fill_scratch's sentinel ends before the slots


def test_lamport_tables_refuse_a_two_shots_norm_with_the_reason_and_take_its_residual():
    plan = _plan(twoshot, 4)
    with pytest.raises(ExecutorError, match=TWO_SHOT_NORM):
        gpu_tables.build_tables(plan, 0, 4 * HIDDEN * 2, residual=True, norm=RowNorm(HIDDEN, 1e-5))
    t = gpu_tables.build_tables(plan, 0, 4 * HIDDEN * 2, residual=True)
    added = [
        op for op in t.ops if op["type"] == gpu_tables.TRANSFER and op["src"][op["nsrc"] - 1]["buffer"] == t.nslots - 1
    ]
    assert len(added) == 1 and t.nslots == gpu_tables.PEER_SLOTS + len(plan.gpus[0].remote_buffers) + 1
