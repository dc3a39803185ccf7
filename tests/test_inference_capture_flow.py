"""The executor's zero-copy capture flow on CPU: a InterpreterEngine over a fake CuPy, fake launches and a fake store.

``capture()`` writes disarmed records, ``execute_captured`` binds buffers to one and launches against it, leaving
``capture()`` exchanges peers' buffers in capture order and arms the records, and a replay of a disarmed record
(the tripwire word set) raises at the next host call. Nothing here touches a GPU: a launch is recorded, device
arrays are numpy bytes, and the buffers' addresses are made up (never dereferenced).
"""

from __future__ import annotations

import ctypes
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_inference_zero_copy import on_ranks, slots_of, walk

from executor.errors import ExecutorError
from executor.gpu import engine as comm_module
from executor.gpu.engine import GRAPH_RECORDS, InterpreterEngine, _Context
from executor.gpu.tables import build_tables, peer_mapping
from schedules.plan.io import load_plan

ROOT = Path(__file__).parent.parent
LL_ONE_SHOT = ROOT / "tests" / "gpu" / "plans" / "allreduce-direct-ll-x4.json"  # peers see only scratch
WRITES_PEER_OUTPUTS = ROOT / "tests" / "gpu" / "plans" / "allreduce-twoshot-simple-x8.json"
N = 16 << 10  # fp32 elements: 64 KB


class FakeArray:
    """A device array over host bytes: a real address, slices sharing the bytes, and ``set``."""

    def __init__(self, host: np.ndarray):
        self.host = host

    @property
    def data(self):
        return SimpleNamespace(ptr=self.host.ctypes.data)

    def __getitem__(self, part):
        return FakeArray(self.host[part])

    def set(self, values: np.ndarray) -> None:
        self.host[...] = values


class FakeCupy:
    uint8 = np.uint8

    def __init__(self) -> None:
        self.pinned: list[np.ndarray] = []
        self.syncs = 0
        self.cuda = SimpleNamespace(
            Device=lambda device: nullcontext(),
            runtime=SimpleNamespace(
                deviceSynchronize=self._sync, hostAlloc=self._host_alloc, freeHost=lambda pointer: None
            ),
        )

    def _sync(self) -> None:
        self.syncs += 1

    def _host_alloc(self, nbytes: int, flags: int) -> int:
        self.pinned.append(np.zeros(nbytes, np.uint8))
        return self.pinned[-1].ctypes.data

    def full(self, n: int, value: int, dtype) -> FakeArray:
        return FakeArray(np.full(n, value, dtype))

    def asarray(self, values: np.ndarray) -> FakeArray:
        return FakeArray(np.array(values))


@dataclass
class Buffer:
    """A CuPy-like fp32 array at a made-up device address."""

    pointer: int
    n: int = N
    device = SimpleNamespace(id=0)
    flags = SimpleNamespace(c_contiguous=True)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.n,), "typestr": "<f4", "data": (self.pointer, False), "strides": None, "version": 3}


def opened(shared) -> int:
    """A fake peer mapping of a fake export (the exporter's address, moved out of its range)."""
    return 0x7F00_0000_0000 + shared[1]


def fake_communicator(rank: int, world: int, gather, plan_path: Path, residual: bool = False) -> InterpreterEngine:
    """A InterpreterEngine with no GPU: fake CuPy, launches recorded in ``launches``, and a context for the plan
    (made with a residual, at 0xE000, where ``residual``)."""
    comm: Any = object.__new__(InterpreterEngine)  # a bare executor: the test sets the fields it reads
    comm.rank, comm.world_size, comm.device, comm.timeout_s = rank, world, 0, 5.0
    comm._cupy = FakeCupy()
    comm._error = np.zeros(8, np.int32)
    comm._plans, comm._contexts, comm._templates, comm._captured = {}, {}, {}, []
    comm._residual_refusals = {}
    comm._graph_mode, comm._marker, comm._tripwire, comm._ll128, comm._compiled = False, None, None, False, False
    comm._all_gather = gather
    comm._peers = SimpleNamespace(open=opened)
    comm.launches = []
    comm._launch = lambda ctx, dtype, framework, stream, args=None, compiled=False: comm.launches.append(args)
    plan = load_plan(plan_path)
    tables = build_tables(plan, rank, 4 * N, residual=residual)
    slots = (
        0xA000,
        0xB000,
        0xC000,
        *(0xD000 + 0x100 * k for k in range(len(tables.remote_buffers))),
        *([0xE000] if residual else []),
    )
    args = ("ops", "tb_start", "slots", "outbound", "inbound", "expected", "barriers", "semaphores", "state")
    comm._templates[(plan.content_hash, 4 * N, "fp32", False, residual)] = _Context(
        tables=tables,
        arrays=[],
        scratch=None,
        state=None,
        semaphore_init=np.zeros(0, np.uint32),  # never reset here: no launch runs
        args=args,
        vector_bytes=16,
        output=None,
        plan_hash=plan.content_hash,
        nbytes=4 * N,
        slots=slots,
        peers=peer_mapping(plan, rank),
    )
    comm.plan = plan
    return comm


def lone_gather(world: int):
    calls = []

    def gather(what, value):
        calls.append(what)
        return [value] * world

    return gather, calls


def record_of(comm: InterpreterEngine, index: int) -> tuple[np.ndarray, object]:
    ctx = next(iter(comm._templates.values()))
    assert ctx.records is not None  # made by capture()
    layout = ctx.records.layout
    at = index % GRAPH_RECORDS * layout.stride
    return ctx.records.chunks[index // GRAPH_RECORDS].host[at : at + layout.stride], ctx


def test_a_captured_execution_launches_against_a_disarmed_record_then_leaving_capture_arms_it():
    gather, calls = lone_gather(2)
    comm = fake_communicator(0, 2, gather, LL_ONE_SHOT)
    with comm.capture():
        assert comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000)) == ""
        record, ctx = record_of(comm, 0)
        layout = ctx.records.layout
        assert walk(record, layout)[0] == [len(ctx.tables.ops)] and not any(walk(record, layout)[1:])
    address = ctx.records.address(0)
    assert comm.launches == [("ops", np.uint64(address), np.uint64(address + layout.tb_bytes), *ctx.args[3:])]
    assert calls == ["graph-bind", "graph-buffers"]  # the ranks agree to bind, then register
    assert slots_of(record, layout) == [0x10000, 0x20000, *ctx.slots[2:]]
    assert walk(record, layout) == [
        list(range(ctx.tables.tb_start[b], ctx.tables.tb_start[b + 1])) for b in range(ctx.tables.nthreadblocks)
    ]


def test_a_captured_execution_with_a_residual_binds_the_captured_residual_in_the_last_slot():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT, residual=True)
    with comm.capture():
        assert comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000), residual=Buffer(0x30000)) == ""
        why = comm.execute_captured(comm.plan, Buffer(0x40000), Buffer(0x50000))
    assert why.startswith("rank 0: no context for plan") and "residual" not in why  # only the residual's context exists
    record, ctx = record_of(comm, 0)
    assert ctx.tables.residual and len(ctx.slots) == ctx.tables.nslots
    assert slots_of(record, ctx.records.layout) == [0x10000, 0x20000, *ctx.slots[2:-1], 0x30000]
    assert len(comm.launches) == 1


def test_a_residual_of_another_size_is_refused_with_one_line():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT, residual=True)
    with comm.capture(), pytest.raises(ExecutorError, match="the residual must be fp32 of"):
        comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000), residual=Buffer(0x30000, N // 2))


def test_each_captured_execution_gets_its_own_record():
    comm = fake_communicator(1, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with comm.capture():
        for k in range(3):
            assert comm.execute_captured(comm.plan, Buffer(out_of(1, k) - 0x80000), Buffer(out_of(1, k))) == ""
    for k in range(3):
        record, ctx = record_of(comm, k)
        assert slots_of(record, ctx.records.layout)[:2] == [out_of(1, k) - 0x80000, out_of(1, k)]
    assert len({args[1] for args in comm.launches}) == 3


def test_peers_outputs_are_exchanged_in_capture_order_when_capture_closes(monkeypatch):
    monkeypatch.setattr(comm_module.ipc, "export", lambda pointer: ("handle", pointer))
    monkeypatch.setattr(comm_module, "ipc_capable", lambda pointer: True)

    def body(rank, gather):
        comm = fake_communicator(rank, 2, gather, WRITES_PEER_OUTPUTS)
        with comm.capture():
            for k in range(3):
                assert (
                    comm.execute_captured(comm.plan, Buffer(out_of(rank, k) - 0x80000), Buffer(out_of(rank, k))) == ""
                )
        ctx = next(iter(comm._templates.values()))
        return ctx.peers, [slots_of(record_of(comm, k)[0], ctx.records.layout) for k in range(3)]

    for rank, (peers, slots) in enumerate(on_ranks(2, body)):
        assert peers.collective and peers.exported == ("o",) and [t for _, _, t in peers.deferred] == ["o"]
        ((slot, peer, _),) = peers.deferred
        for k in range(3):
            assert slots[k][slot] == opened(("handle", out_of(peer, k)))
            assert slots[k][:2] == [out_of(rank, k) - 0x80000, out_of(rank, k)]


def out_of(rank: int, k: int) -> int:
    return 0x1_0000_0000 * (rank + 1) + 0x100000 * k


def test_a_buffer_one_rank_cannot_share_sends_every_rank_to_the_fallback(monkeypatch):
    unshareable = out_of(1, 0)
    monkeypatch.setattr(comm_module, "ipc_capable", lambda pointer: pointer != unshareable)

    def body(rank, gather):
        comm = fake_communicator(rank, 2, gather, WRITES_PEER_OUTPUTS)
        with comm.capture():
            why = comm.execute_captured(comm.plan, Buffer(out_of(rank, 0) - 0x80000), Buffer(out_of(rank, 0)))
            pending = len(comm._captured)
        return why, pending, comm.launches

    results = on_ranks(2, body)
    assert [why for why, _, _ in results] == [
        ("rank 1: a buffer cannot be shared by CUDA IPC (expandable segments or virtual memory)")
    ] * 2
    assert all(pending == 0 and launches == [] for _, pending, launches in results)


def test_a_buffer_misaligned_for_the_plans_vectors_is_not_bound():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with comm.capture():
        why = comm.execute_captured(comm.plan, Buffer(0x8002), Buffer(0x20000))
    assert why == "rank 0: a buffer is not aligned to the plan's 16-byte vectors" and comm.launches == []


def test_a_size_without_an_eager_context_is_not_bound():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with comm.capture():
        why = comm.execute_captured(comm.plan, Buffer(0x10000, N // 2), Buffer(0x20000, N // 2))
    assert why.startswith("rank 0: no context for plan") and "execute it once before capturing" in why


def test_a_capture_that_takes_every_record_stages_the_rest():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with comm.capture():
        next(iter(comm._templates.values())).records.used = GRAPH_RECORDS
        why = comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000))
    assert why == f"rank 0: all {GRAPH_RECORDS} free binding records of this plan and size are taken in this capture()"


def test_each_capture_tops_the_records_up_again():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with comm.capture():
        next(iter(comm._templates.values())).records.used = GRAPH_RECORDS - 3
    with comm.capture():
        assert next(iter(comm._templates.values())).records.free == GRAPH_RECORDS + 3


def test_a_replay_before_registration_raises_at_the_next_host_call_once():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with comm.capture():
        comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000))
    comm._tripwire[0] = 0x5E5E5E5E  # what a disarmed record's tripwire op copies in
    with pytest.raises(
        ExecutorError,
        match="replayed executions captured inside comm.capture\\(\\) before their buffers were registered",
    ):
        comm.synchronize()
    comm.synchronize()


def test_the_disarmed_records_point_the_tripwire_at_the_host_word():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with comm.capture():
        record, ctx = record_of(comm, 5)
        assert slots_of(record, ctx.records.layout)[:2] == [comm._marker.data.ptr, ctypes.addressof(comm._tripwire)]
        assert (comm._marker.host != 0).all()


def test_an_error_inside_capture_registers_nothing_and_leaves_the_records_disarmed():
    gather, calls = lone_gather(2)
    comm = fake_communicator(0, 2, gather, LL_ONE_SHOT)
    with pytest.raises(RuntimeError, match="model failed"), comm.capture():
        comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000))
        raise RuntimeError("model failed")
    record, ctx = record_of(comm, 0)
    assert calls == ["graph-bind"] and comm._captured == []  # the ranks agreed to bind; no registration followed
    assert walk(record, ctx.records.layout)[0] == [len(ctx.tables.ops)]


def test_captured_executions_belong_inside_one_capture_block():
    comm = fake_communicator(0, 2, lone_gather(2)[0], LL_ONE_SHOT)
    with pytest.raises(ExecutorError, match="runs inside comm.capture\\(\\) only"):
        comm.execute_captured(comm.plan, Buffer(0x10000), Buffer(0x20000))
    with comm.capture(), pytest.raises(ExecutorError, match="already open"), comm.capture():
        pass
