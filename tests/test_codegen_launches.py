"""Launch safety: a compiled plan runs again on the same buffers before its peers finished, and stays correct.

The entry handshake (``codegen.sync.add_entry_handshake``) goes only on channels whose writes could overtake
the reader's previous launch (``codegen.launches.unsafe_channels``); the reference executor proves the result
over three launches back to back.
"""

import pytest

import codegen.sync
from codegen import compile_schedule
from codegen.buffers import place_buffers
from codegen.launches import unsafe_channels
from codegen.lower import lower
from codegen.merge import merge_ranges
from codegen.sync import _dependencies
from codegen.threadblocks import assign_threadblocks
from executor.reference.machine import PlanRace
from executor.reference.prove import check_plan
from schedules.collectives import Collective
from schedules.compact import expand
from synth import baselines
from topologies.catalog import build
from weft.pipeline import check_sizes

FC4 = build("fully_connected:n=4")


def _compile(method, name, protocol, handshake=True, monkeypatch=None, instances=1, topology=FC4):
    schedule = getattr(baselines, method)(topology, Collective(name, topology.nranks))
    if not handshake:  # the plan codegen made before the entry handshake existed
        monkeypatch.setattr(codegen.sync, "unsafe_channels", lambda *args: set())
    return compile_schedule(schedule, topology, instances=instances, protocol=protocol)


def _gated(method, name, packets):
    schedule = getattr(baselines, method)(FC4, Collective(name, 4))
    actions = lower(schedule, place_buffers(schedule.collective), packets)
    assign_threadblocks(actions)
    actions = merge_ranges(actions)
    needs = {}
    for rank in range(4):
        needs.update(_dependencies(sorted((a for a in actions if a.rank == rank), key=lambda a: a.order)))
    return unsafe_channels(actions, needs, double_scratch=packets)


def _count(plan, rank, name):
    return sum(op.name == name for tb in plan.gpus[rank].threadblocks for op in tb.ops)


def test_one_shot_simple_allreduce_without_handshake_races_across_launches(monkeypatch):
    plan = _compile("direct", "allreduce", "simple", handshake=False, monkeypatch=monkeypatch)
    assert check_plan(plan, check_sizes(plan)[:1], ("fp32",), back_to_back=1).ok  # one launch alone is fine
    with pytest.raises(
        PlanRace,
        match=r"plan .*: launch 1 rank \d threadblock \d+ op \d+ \(p\w+\) overwrites chunk "
        r"\d+ of rank \d's scratch buffer while rank \d threadblock \d+ in launch 0 "
        r"may still read it",
    ):
        check_plan(plan, check_sizes(plan)[:1], ("fp32",))


def test_one_shot_simple_allreduce_gates_every_channel_that_writes_a_peer():
    assert _gated("direct", "allreduce", packets=False) == {(p, r, 0) for p in range(4) for r in range(4) if p != r}


def test_one_shot_simple_allreduce_with_handshake_is_safe_back_to_back():
    plan = _compile("direct", "allreduce", "simple")
    record = check_plan(plan, check_sizes(plan), ("fp32", "bf16"))
    assert record.ok and record.back_to_back == 2 and "2 launches back to back" in record.checks[0]


def test_handshake_is_one_signal_and_one_wait_per_gated_channel_per_launch(monkeypatch):
    plan = _compile("direct", "allreduce", "simple", instances=2)
    bare = _compile("direct", "allreduce", "simple", handshake=False, monkeypatch=monkeypatch, instances=2)
    gated_channels = 3 * 2  # three peers, two instances
    for rank in range(4):
        signals = _count(plan, rank, "signal") + _count(plan, rank, "pws")
        bare_signals = _count(bare, rank, "signal") + _count(bare, rank, "pws")
        assert signals - bare_signals == gated_channels
        assert _count(plan, rank, "wait") - _count(bare, rank, "wait") == gated_channels


def test_handshake_signal_opens_a_threadblock_and_the_wait_sits_right_before_the_first_put():
    plan = _compile("direct", "allreduce", "simple")
    gpu = plan.gpus[0]
    opening = [tb.ops[0] for tb in gpu.threadblocks if tb.ops[0].name == "signal"]
    assert sorted(gpu.memory_peers[op.channel_ids[0]] for op in opening) == [1, 2, 3]
    for tb in gpu.threadblocks:
        puts = [i for i, op in enumerate(tb.ops) if op.name in ("put", "pws")]
        if puts:
            before = tb.ops[puts[0] - 1]
            assert before.name == "wait" and before.channel_ids == tb.ops[puts[0]].channel_ids


def test_two_shot_simple_allreduce_needs_no_handshake_and_is_proven_safe():
    assert _gated("twoshot", "allreduce", packets=False) == set()
    plan = _compile("twoshot", "allreduce", "simple")
    assert check_plan(plan, check_sizes(plan)[:1], ("fp32",)).ok


def test_ll_one_shot_allreduce_needs_no_handshake():
    assert _gated("direct", "allreduce", packets=True) == set()
    plan = _compile("direct", "allreduce", "ll")
    assert _count(plan, 0, "signal") == _count(plan, 0, "wait") == 0
    record = check_plan(plan, check_sizes(plan)[:1], ("fp32",))
    assert record.ok and record.back_to_back == 3  # the third launch reuses the first one's scratch half


def test_ll_broadcast_overtakes_its_readers_by_two_launches_without_handshake(monkeypatch):
    plan = _compile("direct", "broadcast", "ll", handshake=False, monkeypatch=monkeypatch)
    size = check_sizes(plan)[:1]
    assert check_plan(plan, size, ("fp32",), back_to_back=2).ok  # the two scratch halves cover one launch ahead
    with pytest.raises(PlanRace, match="launch 2 rank 0 .* scratch buffer while rank [123] threadblock 0 in launch 0"):
        check_plan(plan, size, ("fp32",), back_to_back=3)


def test_ll_broadcast_gates_the_roots_channels_only():
    assert _gated("direct", "broadcast", packets=True) == {(0, r, 0) for r in (1, 2, 3)}
    plan = _compile("direct", "broadcast", "ll")
    assert check_plan(plan, check_sizes(plan)[:1], ("fp32",)).ok


def test_ring_allgather_that_puts_into_peer_outputs_is_gated_and_safe():
    schedule = baselines.ring(FC4, Collective("allgather", 4))
    assert _gated("ring", "allgather", packets=False) == {
        (s.src, s.dst, 0) for st in expand(schedule).steps for s in st.sends
    }
    plan = _compile("ring", "allgather", "simple", instances=2)
    assert check_plan(plan, check_sizes(plan)[:1], ("fp32",)).ok
