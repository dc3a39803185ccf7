"""The GPU interpreter's Lamport tables (executor.gpu.lamport, executor.gpu.tables): the opt-in, the rotating scratch,
the reset shares, the sentinel fill word, and that other protocols' tables are as they were. The kernel itself runs
only in tests/gpu/test_lamport.py; tests/test_cuda_compile.py builds it."""

from dataclasses import replace

import numpy as np
import pytest

from codegen import compile_schedule
from executor.errors import ExecutorError
from executor.gpu import build, lamport
from executor.gpu.tables import LAMPORT, LAMPORT_RESET, PACKET, PAIRS, SCRATCH, SLOTS, TRANSFER, build_tables
from schedules.collectives import Collective
from schedules.lamport import SENTINEL_BITS, LamportBuffers
from synth.baselines import direct, twoshot
from topologies.catalog import build as build_topology


def _plan(baseline, n: int, protocol: str = "lamport"):
    return compile_schedule(
        baseline(build_topology(f"fully_connected:n={n}"), Collective("allreduce", n)), protocol=protocol
    )


def _refs(tables, field: str):
    return [op[field][k] for op in tables.ops for k in range(op["n" + field])]


@pytest.fixture
def opted_in(monkeypatch):
    monkeypatch.setenv(lamport.ENV, "1")


def test_the_interpreter_takes_a_lamport_plan_only_when_the_environment_opts_in(monkeypatch):
    plan = _plan(direct, 2)
    monkeypatch.delenv(lamport.ENV, raising=False)
    with pytest.raises(ExecutorError, match=f"set {lamport.ENV}=1 to try it"):
        build_tables(plan, 0, 1024)
    monkeypatch.setenv(lamport.ENV, "1")
    assert build_tables(plan, 0, 1024).lamport_buffers == 3


@pytest.mark.parametrize("baseline", [direct, twoshot])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_lamport_tables_rotate_the_scratch_and_move_the_data_alone(opted_in, baseline, dtype):
    plan = _plan(baseline, 4)
    nbytes = 64 << 10
    t = build_tables(plan, 1, nbytes, dtype=dtype)
    cb = plan.chunk_bytes(nbytes)
    assert t.scratch_bytes == max(g.scratch_chunks for g in plan.gpus) * cb  # 1x the data: no flag words
    assert (t.scratch_copies, t.scratch_stride, t.scratch_alloc) == (3, t.scratch_bytes, 3 * t.scratch_bytes)
    word = t.scratch_fill
    assert word == (SENTINEL_BITS["fp32"] if dtype == "fp32" else 0x80008000)
    transfers = [op for op in t.ops if op["type"] in (TRANSFER, PAIRS)]
    assert transfers and all(op["barrier_count"] == 3 for op in transfers)  # the kernel's copy count
    refs = _refs(t, "src") + _refs(t, "dst")
    scratch = [r for r in refs if r["buffer"] == SLOTS["s"] or r["flags"] & LAMPORT]
    assert not any(r["flags"] & PACKET for r in refs)  # no LL packets
    assert any(r["flags"] & LAMPORT for r in refs) and all(r["flags"] & SCRATCH for r in scratch)


def test_every_block_ends_with_its_share_of_the_reset_and_the_shares_tile_its_copy(opted_in):
    plan = _plan(direct, 4)
    nbytes = (1 << 20) + 48 * 4
    t = build_tables(plan, 2, nbytes, dtype="bf16")
    rotation = LamportBuffers()
    resets = []
    for b in range(t.nthreadblocks):
        last = t.ops[t.tb_start[b + 1] - 1]
        assert last["type"] == LAMPORT_RESET
        assert (last["barrier_id"], last["barrier_count"]) == (rotation.reset_ahead, rotation.buffers)
        assert last["dst"][0]["buffer"] == SLOTS["s"] and last["dst"][0]["flags"] == SCRATCH
        resets.append((int(last["dst"][0]["offset"]), int(last["bytes"])))
    assert sum(1 for op in t.ops if op["type"] == LAMPORT_RESET) == t.nthreadblocks
    own = plan.gpus[2].scratch_chunks * plan.chunk_bytes(nbytes)
    assert resets[0][0] == 0 and sum(b for _, b in resets) == own  # this rank's whole copy, once
    assert all(a + n == b for (a, n), (b, _) in zip(resets, resets[1:], strict=False))
    assert all(offset % t.vector_bytes == 0 and size % t.vector_bytes == 0 for offset, size in resets)


@pytest.mark.parametrize(("nbytes", "blocks"), [(0, 3), (16, 4), (1000, 3), (1 << 20, 7), (4100, 1)])
def test_reset_shares_tile_the_copy_in_whole_units(nbytes, blocks):
    shares = lamport.reset_shares(nbytes, blocks)
    assert len(shares) == blocks and sum(n for _, n in shares) == nbytes
    assert [first for first, _ in shares] == list(np.cumsum([0] + [n for _, n in shares[:-1]]))
    assert all(first % lamport.RESET_UNIT == 0 for first, _ in shares)
    assert max(n for _, n in shares) - min(n for _, n in shares[:-1] or shares) <= lamport.RESET_UNIT


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_the_fill_word_is_every_element_negative_zero(dtype):
    word = np.array([lamport.sentinel_word(dtype)], np.uint32)
    as_type = {"fp32": np.float32, "fp16": np.float16}.get(dtype)
    if as_type is None:  # bf16: the high halves of float32 words
        elements = (word.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        elements = word.view(as_type)
    assert (elements == 0).all() and np.signbit(elements).all()


@pytest.mark.parametrize("protocol", ["ll", "simple"])
def test_other_protocols_tables_are_unchanged_by_the_opt_in(monkeypatch, protocol):
    plan = _plan(twoshot, 2, protocol)
    monkeypatch.delenv(lamport.ENV, raising=False)
    before = build_tables(plan, 0, 64 << 10, dtype="bf16")
    monkeypatch.setenv(lamport.ENV, "1")
    t = build_tables(plan, 0, 64 << 10, dtype="bf16")
    assert np.array_equal(t.ops.view(np.uint8), before.ops.view(np.uint8))
    assert replace(t, ops=None, tb_start=None) == replace(before, ops=None, tb_start=None)
    assert (t.lamport_buffers, t.scratch_fill) == (0, 0)
    assert t.scratch_stride == (t.scratch_bytes if t.double_scratch else 0)  # the kernel's scratch_half, as before
    assert not any(op["type"] == LAMPORT_RESET for op in t.ops)
    assert not any(r["flags"] & LAMPORT for r in _refs(t, "src") + _refs(t, "dst"))


def test_a_lamport_plan_launches_the_lamport_twin_of_its_kernel():
    assert build.kernel_name("bf16", 16, 1024, lamport=True) == "weft_interpret_bf16_v16_lamport"
    assert build.kernel_name("fp16", 8, 256, lamport=True) == "weft_interpret_f16_v8_b256_lamport"
    assert build.kernel_name("fp32", 4) == "weft_interpret_f32_v4"


def test_a_residual_on_a_lamport_plan_is_refused_in_one_line(opted_in):
    with pytest.raises(ExecutorError, match="protocol Lamport: the interpreter adds no residual or norm"):
        build_tables(_plan(direct, 2), 0, 1024, residual=True)
