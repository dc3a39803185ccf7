"""Zero-copy graph capture without GPUs: binding records, the tripwire, and the exchange of captured buffers.

Executions captured in a CUDA graph inside ``comm.capture()`` run through binding records written before the
capture (disarmed) and armed when the buffers are registered; peers' buffers are exchanged in capture order.
The GPU side is tests/gpu/test_zero_copy.py; here every host-side piece runs with fake stores and handles.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor.errors import ExecutorError
from executor.gpu import bootstrap
from executor.gpu.engine import GRAPH_RECORDS, _Records, binding_verdict, context_refusal
from executor.gpu.tables import (
    OP_DTYPE,
    TRANSFER,
    TRIPWIRE_BYTES,
    BindingLayout,
    CapturedExecution,
    build_tables,
    peer_slots,
    share_records,
    tripwire_op,
    with_tripwire,
)
from schedules.plan.io import load_plan

PLANS = Path(__file__).parent / "gpu" / "plans"


class FakeStore:
    """The part of a torch.distributed Store that gpu_bootstrap uses, shared by threads playing ranks."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.changed = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: all(k in self.values for k in keys), timeout.total_seconds()):
                raise RuntimeError(f"wait timed out on {keys}")

    def get(self, key: str) -> bytes:
        return self.values[key]


def on_ranks(world: int, body) -> list:
    """``body(rank, all_gather)`` on ``world`` threads sharing one fake store; each rank's result."""
    store = FakeStore()

    def run(rank: int):
        counter = iter(range(1 << 20))

        def all_gather(what, value):
            return bootstrap.all_gather(store, f"t/{next(counter)}/{what}", rank, world, value, 10.0)

        return body(rank, all_gather)

    with ThreadPoolExecutor(world) as pool:
        return list(pool.map(run, range(world)))


def walk(record: np.ndarray, layout: BindingLayout) -> list[list[int]]:
    """The op indices each thread block runs from a record, as the interpreter reads its tb_start."""
    tb_start = record[: 4 * (layout.nthreadblocks + 1)].view(np.int32)
    return [list(range(tb_start[b], tb_start[b + 1])) for b in range(layout.nthreadblocks)]


def slots_of(record: np.ndarray, layout: BindingLayout) -> list[int]:
    return [int(v) for v in record[layout.tb_bytes : layout.tb_bytes + 8 * layout.nslots].view(np.uint64)]


# ---------------------------------------------------------------------------------------------- records


@settings(max_examples=60, deadline=None)
@given(blocks=st.integers(1, 200), nslots=st.integers(3, 40), nops=st.integers(1, 5000))
def test_a_disarmed_record_runs_only_the_tripwire_in_block_zero(blocks, nslots, nops):
    layout = BindingLayout(blocks, nslots)
    record = layout.disarmed(nops, marker=0xAB00, tripwire=0xCD00)
    assert walk(record, layout) == [[nops]] + [[] for _ in range(blocks - 1)]
    assert slots_of(record, layout)[:2] == [0xAB00, 0xCD00]


@settings(max_examples=60, deadline=None)
@given(blocks=st.integers(1, 200), nslots=st.integers(3, 40))
def test_records_keep_the_slot_table_and_the_next_record_16_byte_aligned(blocks, nslots):
    layout = BindingLayout(blocks, nslots)
    assert layout.tb_bytes % 16 == 0 and layout.stride % 16 == 0
    assert layout.tb_bytes >= 4 * (blocks + 1) and layout.stride - layout.tb_bytes >= 8 * nslots


def test_an_armed_record_runs_the_plans_ranges_on_the_execution_buffers():
    tables = build_tables(load_plan(PLANS / "allreduce-direct-ll-x4.json"), 1, 64 << 10)
    slots = (0x1000, 0x2000, 0x3000, 0x4000)
    layout = BindingLayout(tables.nthreadblocks, len(slots))
    record = layout.armed(tables.tb_start, slots)
    assert walk(record, layout) == [
        list(range(tables.tb_start[b], tables.tb_start[b + 1])) for b in range(tables.nthreadblocks)
    ]
    assert slots_of(record, layout) == list(slots)


@pytest.mark.parametrize("path", sorted(PLANS.glob("*.json")), ids=lambda p: p.stem)
def test_the_kernel_tells_a_disarmed_record_by_block_zeros_start(path):
    """ops.cuh (give_back_epoch_if_disarmed) hands back a launch's epochs where tb_start[0] is not 0: every armed
    table starts block 0 at op 0, and a disarmed record starts it at the tripwire, past every op."""
    plan = load_plan(path)
    tables = build_tables(plan, 0, plan.granule * 4)
    layout = BindingLayout(tables.nthreadblocks, 4)
    assert tables.tb_start[0] == 0 and walk(layout.armed(tables.tb_start, (1, 2, 3, 4)), layout)[0][:1] == [0]
    assert walk(layout.disarmed(len(with_tripwire(tables.ops)) - 1, 1, 2), layout)[0][0] > 0


def test_an_armed_record_of_another_shape_is_refused():
    with pytest.raises(ExecutorError, match="holds 2 thread blocks and 4 slots, not 3 and 4"):
        BindingLayout(2, 4).armed(np.arange(4, dtype=np.int32), (1, 2, 3, 4))


def test_the_tripwire_copies_16_plain_bytes_from_slot_0_to_slot_1():
    op = tripwire_op()
    assert (op["type"], op["nsrc"], op["ndst"], op["bytes"]) == (TRANSFER, 1, 1, TRIPWIRE_BYTES)
    assert tuple(op["src"][0]) == (0, 0, 0) and tuple(op["dst"][0]) == (0, 1, 0)  # offset, slot, no packet flags


@pytest.mark.parametrize(
    "name", ["allreduce-direct-ll-x8.json", "allreduce-twoshot-simple-x8.json", "allgather-direct-ll-x1.json"]
)
def test_the_tripwire_sits_after_every_thread_blocks_ops(name):
    tables = build_tables(load_plan(PLANS / name), 0, 64 << 10)
    ops = with_tripwire(tables.ops)
    assert ops.dtype == OP_DTYPE and len(ops) == len(tables.ops) + 1
    assert ops[:-1].tobytes() == tables.ops.tobytes() and ops[-1].tobytes() == tripwire_op().tobytes()
    assert tables.tb_start[-1] == len(tables.ops)  # so no block's range reaches it


@dataclass
class FakeChunk:
    """A device array as _Records sees one: an address, and writes into a slice."""

    base: int
    data_bytes: np.ndarray

    @property
    def data(self):
        return type("Pointer", (), {"ptr": self.base})

    def __getitem__(self, part: slice):
        view = self.data_bytes[part]
        return type("View", (), {"set": lambda _, values: view.__setitem__(slice(None), values)})()


def test_records_are_addressed_across_chunks_and_written_in_place():
    layout = BindingLayout(3, 4)
    records = _Records(
        layout,
        [FakeChunk(base, np.zeros(GRAPH_RECORDS * layout.stride, np.uint8)) for base in (0x10000000, 0x20000000)],
    )
    assert records.free == 2 * GRAPH_RECORDS
    records.used = GRAPH_RECORDS + 2
    assert records.free == GRAPH_RECORDS - 2
    assert records.address(1) == 0x10000000 + layout.stride
    assert records.address(GRAPH_RECORDS + 1) == 0x20000000 + layout.stride
    armed = layout.armed(np.array([0, 2, 5, 9], np.int32), (7, 8, 9, 10))
    records.write(GRAPH_RECORDS + 1, armed)
    second = records.chunks[1].data_bytes
    assert (second[layout.stride : 2 * layout.stride] == armed).all() and not second[: layout.stride].any()
    assert not records.chunks[0].data_bytes.any()


# ---------------------------------------------------------------------------------------------- agreement


def test_one_ranks_misaligned_buffer_sends_every_rank_to_the_fallback():
    # no peer maps the buffers of an LL plan, yet a rank that fell back alone would run another context than its
    # peers (the staging one): its launch counters would part from theirs and their packets would never arrive
    why = {1: "rank 1: a buffer is not aligned to the plan's 16-byte vectors"}
    verdicts = on_ranks(2, lambda rank, gather: binding_verdict(why.get(rank, ""), gather))
    assert verdicts == [why[1]] * 2


def test_one_ranks_unshareable_buffer_sends_every_rank_to_the_fallback():
    why = {2: "rank 2: a buffer cannot be shared by CUDA IPC (expandable segments or virtual memory)"}
    verdicts = on_ranks(4, lambda rank, gather: binding_verdict(why.get(rank, ""), gather))
    assert verdicts == [why[2]] * 4


def test_every_rank_binds_when_every_buffer_can_be_shared():
    assert on_ranks(3, lambda rank, gather: binding_verdict("", gather)) == ["", "", ""]


# ---------------------------------------------------------------------------------------------- exchange


def handle(rank: int, pointer: int) -> tuple[int, int]:
    """A fake exported buffer: who exported which address."""
    return (rank, pointer)


def opened(shared: tuple[int, int]) -> int:
    """A fake peer mapping: the exporter's address seen from here, shifted so it is not mistaken for it."""
    rank, pointer = shared
    return 0x7000_0000_0000 + (rank << 32) + pointer


def captured(rank: int, world: int, k: int, plan: str = "p", nbytes: int = 4096) -> CapturedExecution:
    """Execution k of a one-shot plan whose rank r reads every peer's input (slots 3.. in peer order)."""
    peers = [p for p in range(world) if p != rank]
    mine_in, mine_out = 0x1000 * (k + 1) + rank, 0x100000 * (k + 1) + rank
    slots = (mine_in, mine_out, 0x5C00 + rank, *([0] * len(peers)))
    return CapturedExecution(
        plan, nbytes, slots, tuple((3 + j, p, "i") for j, p in enumerate(peers)), (("i", mine_in),), record=k
    )


def exchange(world: int, executions_of) -> list:
    def body(rank, gather):
        mine = executions_of(rank)
        gathered = gather("graph-buffers", share_records(mine, lambda p: handle(rank, p)))
        return peer_slots(mine, gathered, rank, opened)

    return on_ranks(world, body)


def test_peers_inputs_fill_the_deferred_slots_in_capture_order():
    world = 3
    filled = exchange(world, lambda rank: [captured(rank, world, k) for k in range(5)])
    for rank, slots_by_k in enumerate(filled):
        peers = [p for p in range(world) if p != rank]
        for k, slots in enumerate(slots_by_k):
            mine = captured(rank, world, k)
            assert slots[:3] == mine.slots[:3]
            assert list(slots[3:]) == [opened(handle(p, captured(p, world, k).shared[0][1])) for p in peers]


def test_a_rank_with_fewer_captured_executions_is_named_on_every_rank():
    errors = exchange_errors(3, lambda rank: [captured(rank, 3, k) for k in range(4 if rank == 1 else 5)])
    assert (
        errors
        == [
            (
                "executor: ranks 0..2 captured [5, 4, 5] executions whose peers map their buffers; every "
                "rank must capture the same sequence"
            )
        ]
        * 3
    )


def test_another_plan_or_size_at_the_same_position_is_named():
    errors = exchange_errors(
        2, lambda rank: [captured(rank, 2, 0), captured(rank, 2, 1, nbytes=8192 if rank else 4096)]
    )
    assert errors[0] == (
        "executor: captured execution 1: rank 1 ran another plan or size (8192 B) than rank 0 "
        "(4096 B); every rank must capture the same sequence"
    )


def test_a_buffer_that_fails_to_export_after_capture_fails_every_rank_together():
    def body(rank, gather):
        def export(pointer):
            if rank == 1:
                raise RuntimeError("cudaErrorInvalidValue")
            return handle(rank, pointer)

        mine = [captured(rank, 2, 0)]
        try:
            peer_slots(mine, gather("graph-buffers", share_records(mine, export)), rank, opened)
        except ExecutorError as e:
            return str(e)
        return ""

    assert (
        on_ranks(2, body)
        == [
            (
                "executor: captured execution 0: rank 1 cannot export its buffers by CUDA IPC "
                "after the capture: cudaErrorInvalidValue"
            )
        ]
        * 2
    )


def test_executions_no_peer_maps_exchange_nothing():
    assert exchange(2, lambda rank: []) == [[], []]


def exchange_errors(world: int, executions_of) -> list[str]:
    def body(rank, gather):
        mine = executions_of(rank)
        try:
            peer_slots(mine, gather("graph-buffers", share_records(mine, lambda p: handle(rank, p))), rank, opened)
        except ExecutorError as e:
            return str(e)
        return ""

    return on_ranks(world, body)


def test_a_context_is_refused_where_a_peer_runs_another_plan_size_dtype_or_variant():
    mine = ("h", 65536, "bf16", False)
    assert context_refusal("p", 0, mine, [mine, mine]) == ""
    cases = {
        ("g", 65536, "bf16", False): "rank 1 runs another plan or size (65536 B) than rank 0 (65536 B)",
        ("h", 32768, "bf16", False): "rank 1 runs another plan or size (32768 B) than rank 0 (65536 B)",
        # the same bytes on another dtype: the call a rank with a cached context says next may be one (64 KB of
        # fp32 after 64 KB of bf16), and the peers would read its buffers as theirs
        ("h", 65536, "fp32", False): "rank 1 runs it on fp32 data and rank 0 on bf16",
        ("h", 65536, "bf16", True): "rank 1 passes residual and norm True and rank 0 False",
        ("h", 65536, "bf16", (4096, 1e-5)): "rank 1 passes residual and norm (4096, 1e-05) and rank 0 False",
    }
    for peer, words in cases.items():
        why = context_refusal("p", 0, mine, [mine, peer])
        assert words in why and why.startswith("plan p: ") and "\n" not in why, why
