"""Signal/wait pairing: every arrival waits for its own send's signal, whatever order a schedule lists its sends in."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen import compile_schedule
from codegen.buffers import place_buffers
from codegen.ir import ARRIVE, SEND
from codegen.lower import lower
from codegen.sync import insert_sync
from codegen.threadblocks import assign_threadblocks
from executor.reference.prove import check_plan
from schedules.collectives import NAMES, Collective
from schedules.schedule import Schedule, Send, Step
from synth import baselines
from synth.errors import NotApplicable
from topologies.catalog import build
from weft.pipeline import check_sizes, compile_and_verify

COLLECTIVE = Collective("scatter", 4, chunks=2, root=3)


def _relay_scatter() -> Schedule:
    """Scatter from rank 3 through rank 0, which gets its own chunks 0 and 1 after rank 2's 4 and 5 and forwards
    chunk 2 (sent last) to rank 1 from a thread block of its own (the pair 3->0->2 carries more and shares one)."""
    steps = (
        Step(1, tuple(Send(c, 3, 0) for c in (4, 5, 0, 1, 2)) + (Send(3, 3, 1),)),
        Step(1, (Send(4, 0, 2), Send(5, 0, 2), Send(2, 0, 1))),
    )
    return Schedule(COLLECTIVE, "star", steps)


@pytest.mark.parametrize("instances", [1, 2])
def test_a_forwarded_chunk_sent_second_is_waited_for_before_forwarding(instances):
    plan = compile_schedule(_relay_scatter(), instances=instances, protocol="simple")
    assert check_plan(plan, check_sizes(plan), ("fp32",)).ok


def test_arrivals_on_a_channel_follow_the_order_of_its_sends():
    actions = lower(_relay_scatter(), place_buffers(COLLECTIVE), packets=False)
    sends = [a.seq for a in sorted(actions, key=lambda a: a.order) if a.kind == SEND and a.rank == 3 and a.peer == 0]
    arrivals = [a.sends[0] for a in sorted(actions, key=lambda a: a.order) if a.kind == ARRIVE and a.rank == 0]
    assert arrivals == sends


def test_arrivals_listed_in_reverse_wait_up_to_the_last_signal_first():
    actions = lower(_relay_scatter(), place_buffers(COLLECTIVE), packets=False)
    arrivals = sorted((a for a in actions if a.kind == ARRIVE and a.rank == 0), key=lambda a: a.order)
    reversed_seq = {id(a): b.seq for a, b in zip(arrivals, reversed(arrivals), strict=True)}
    swapped = [replace(a, seq=reversed_seq[id(a)]) if id(a) in reversed_seq else a for a in actions]
    assign_threadblocks(swapped)
    receiver = next(a.tb for a in swapped if a.kind == ARRIVE and a.rank == 0)
    ops = [(op.name, op.channels[0].peer if op.channels else None) for op in insert_sync(swapped)[0][receiver]]
    assert ops[0] == ("signal", 3)  # the entry handshake: rank 3 puts into rank 0's buffers
    assert ops[1:6] == [("wait", 3)] * 5 and ops.count(("wait", 3)) == 5  # all before anything reads, none extra


@pytest.mark.parametrize("spec,root", [("dgx1", 1), ("dgx1", 5), ("hypercube:d=3", 1), ("hypercube:d=3", 5)])
def test_rhd_scatter_from_any_root_compiles_to_a_proven_plan(spec, root):
    topology = build(spec)
    schedule = baselines.rhd(topology, Collective("scatter", topology.nranks, root=root))
    plan = compile_and_verify(schedule, topology, protocol="simple")
    assert plan.weft.verification["ok"] and len(plan.weft.verification["checks"]) == 9


def test_tree_allreduce_that_sends_a_chunk_back_and_on_compiles_to_a_proven_plan():
    topology = build("hgx_h100:nodes=2")
    schedule = baselines.tree(topology, Collective("allreduce", topology.nranks, chunks=2))
    plan = compile_schedule(schedule, topology, protocol="simple")
    assert check_plan(plan, check_sizes(plan)[:2], ("bf16",)).ok


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(NAMES),
    method=st.sampled_from(("ring", "twoshot", "rhd")),
    root=st.integers(0, 3),
    instances=st.integers(1, 2),
    inplace=st.booleans(),
    seed=st.randoms(use_true_random=False),
)
def test_any_order_of_a_steps_sends_compiles_to_a_proven_plan(name, method, root, instances, inplace, seed):
    topology = build("fully_connected:n=4")
    try:
        schedule = getattr(baselines, method)(topology, Collective(name, 4, chunks=2, root=root))
    except NotApplicable:
        return
    shuffled = tuple(replace(step, sends=tuple(seed.sample(step.sends, len(step.sends)))) for step in schedule.steps)
    plan = compile_schedule(replace(schedule, steps=shuffled), instances=instances, protocol="simple", inplace=inplace)
    assert check_plan(plan, check_sizes(plan)[1:2], ("fp32",)).ok
