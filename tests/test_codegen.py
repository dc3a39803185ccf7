"""Codegen: every baseline schedule compiles into a plan that the reference executor proves; each pass does its job."""

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen import CodegenError, compile_schedule
from codegen.buffers import place_buffers
from codegen.protocol import LL_MAX_BYTES
from executor.reference.prove import check_plan
from schedules.collectives import NAMES, Collective
from schedules.plan.io import parse_plan
from synth import baselines
from synth.errors import NotApplicable
from topologies.catalog import build
from weft.pipeline import check_sizes

TOPOLOGIES = ("ring:n=4", "fully_connected:n=4", "dgx1", "hgx_h100", "mi300x")
DTYPES = ("fp32", "fp16", "bf16")


@cache
def _topology(spec):
    return build(spec)


@cache
def _schedule(spec, method, name, chunks=1):
    topology = _topology(spec)
    return topology, getattr(baselines, method)(topology, Collective(name, topology.nranks, chunks))


def _exists(spec, method, name) -> bool:
    try:
        _schedule(spec, method, name)
    except NotApplicable:
        return False
    return True


def _cases():
    """Only the baselines that exist: twoshot is allreduce's alone, rhd needs a power-of-two rank count, and so on
    (test_baselines checks each refusal); building them all takes well under a second."""
    for spec in TOPOLOGIES:
        for method in baselines.METHODS:
            for name in NAMES:
                if _exists(spec, method, name):
                    yield pytest.param(spec, method, name, id=f"{spec}-{method}-{name}")


@pytest.mark.parametrize("spec,method,name", list(_cases()))
def test_baseline_plan_passes_the_reference_executor(spec, method, name):
    topology, schedule = _schedule(spec, method, name)
    plan = compile_schedule(schedule, topology)
    sizes = check_sizes(plan)
    assert len(sizes) == 3 and any(plan.chunk_bytes(n) % 16 for n in sizes)  # one ragged size
    record = check_plan(plan, sizes, DTYPES)
    assert record.ok and len(record.checks) == 9


@pytest.mark.parametrize("protocol", ["simple", "ll"])
@pytest.mark.parametrize("instances", [1, 3])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_every_protocol_instance_count_and_placement_is_correct(name, inplace, instances, protocol):
    topology, schedule = _schedule("fully_connected:n=4", "ring", name)
    plan = compile_schedule(schedule, topology, instances=instances, protocol=protocol, inplace=inplace)
    assert check_plan(plan, check_sizes(plan), ("fp32",)).ok


def test_placement_in_place_aliases_allgather_input_into_output():
    placement = place_buffers(Collective("allgather", 4), inplace=True)
    assert placement.input_loc(2, 2) == placement.output_loc(2, 2)
    assert placement.output_loc(2, 2).type == "o" and placement.output_loc(2, 2).index == 2
    assert place_buffers(Collective("allgather", 4)).input_loc(2, 2).type == "i"


def test_ring_allreduce_runs_one_fused_threadblock_per_rank():
    topology, schedule = _schedule("ring:n=4", "ring", "allreduce")
    plan = compile_schedule(schedule, topology, protocol="simple")
    names = [op.name for op in plan.gpus[0].threadblocks[0].ops]
    assert len(plan.gpus[0].threadblocks) == 1
    assert names.count("res") == 3 and "pws" not in names and "re" not in names  # pws: see codegen.fuse


def test_one_shot_allreduce_is_one_packet_put_per_peer_and_one_reduction():
    topology, schedule = _schedule("fully_connected:n=4", "direct", "allreduce")
    plan = compile_schedule(schedule, topology)
    assert plan.protocol == "LL" and plan.max_message_size == LL_MAX_BYTES
    ops = sorted(op.name for tb in plan.gpus[0].threadblocks for op in tb.ops)
    assert ops == ["ppkt", "ppkt", "ppkt", "repkt"]
    reduce = next(op for tb in plan.gpus[0].threadblocks for op in tb.ops if op.name == "repkt")
    assert len(reduce.src_buff) == 4 and reduce.dst_buff[0].size == 4  # all chunks, all peers, one op


def test_cross_threadblock_dependencies_get_semaphores():
    topology, schedule = _schedule("fully_connected:n=4", "twoshot", "allreduce")
    plan = compile_schedule(schedule, topology, protocol="simple")
    gpu = plan.gpus[0]
    names = [op.name for tb in gpu.threadblocks for op in tb.ops]
    assert gpu.semaphores and names.count("sem_release") >= 1
    assert names.count("sem_release") == names.count("sem_acquire")
    assert names.count("wait") == sum(op.name in ("signal", "pws") for tb in gpu.threadblocks for op in tb.ops)


def test_instances_multiply_threadblocks_channels_and_chunks():
    topology, schedule = _schedule("ring:n=4", "ring", "allgather")
    one = compile_schedule(schedule, topology, protocol="simple")
    four = compile_schedule(schedule, topology, instances=4, protocol="simple")
    assert len(four.gpus[0].threadblocks) == 4 * len(one.gpus[0].threadblocks)
    assert len(four.gpus[0].memory_peers) == 4 * len(one.gpus[0].memory_peers)
    assert four.size_chunks == 4 * one.size_chunks and four.weft.instances == 4


def test_auto_protocol_keeps_long_schedules_simple_and_unbounded():
    topology, schedule = _schedule("ring:n=4", "ring", "allreduce")
    plan = compile_schedule(schedule, topology)
    assert plan.protocol == "Simple" and plan.max_message_size == (1 << 64) - 1 and plan.min_message_size == 0


def test_compiled_plan_round_trips_through_the_reader():
    topology, schedule = _schedule("dgx1", "ring", "reducescatter")
    plan = compile_schedule(schedule, topology, instances=2)
    import json

    from schedules.plan.io import dumps_plan

    assert parse_plan(json.loads(dumps_plan(plan)), "compiled.json") == plan
    assert plan.weft.schedule_hash == schedule.content_hash and plan.weft.topology == topology.fingerprint


def test_bad_options_are_refused():
    topology, schedule = _schedule("ring:n=4", "ring", "allreduce")
    with pytest.raises(CodegenError, match="--instances"):
        compile_schedule(schedule, topology, instances=0)
    with pytest.raises(CodegenError, match="--protocol"):
        compile_schedule(schedule, topology, protocol="ll128")


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    method=st.sampled_from(("ring", "direct")),
    chunks=st.integers(1, 3),
    instances=st.integers(1, 3),
    protocol=st.sampled_from(("simple", "ll")),
    inplace=st.booleans(),
)
def test_any_option_mix_compiles_to_a_correct_plan(name, method, chunks, instances, protocol, inplace):
    topology = _topology("fully_connected:n=3")
    try:
        schedule = getattr(baselines, method)(topology, Collective(name, 3, chunks))
    except NotApplicable:
        return
    plan = compile_schedule(schedule, topology, instances=instances, protocol=protocol, inplace=inplace)
    assert check_plan(plan, check_sizes(plan)[1:2], ("bf16",)).ok


def test_each_instance_moves_its_consecutive_chunks_in_one_op():
    topology, schedule = _schedule("fully_connected:n=4", "direct", "allreduce")
    one = compile_schedule(schedule, topology, protocol="ll")
    two = compile_schedule(schedule, topology, instances=2, protocol="ll")

    def ops(plan):
        return sorted(op.name for tb in plan.gpus[0].threadblocks for op in tb.ops)

    assert ops(two) == sorted(ops(one) * 2)  # one ppkt per peer and one repkt per instance, not one per chunk
    puts = [op for tb in two.gpus[0].threadblocks for op in tb.ops if op.name == "ppkt"]
    assert {op.src_buff[0].index for op in puts} == {0, 4} and {op.src_buff[0].size for op in puts} == {4}


def test_two_instances_of_allgather_keep_each_ranks_slice_in_place():
    topology, schedule = _schedule("ring:n=4", "ring", "allgather")
    plan = compile_schedule(schedule, topology, instances=2, inplace=True, protocol="simple")
    assert plan.gpus[0].input_chunks == 2 and plan.gpus[0].output_chunks == 8
    assert check_plan(plan, check_sizes(plan), ("fp32",)).ok
