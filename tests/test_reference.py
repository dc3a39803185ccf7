"""The CPU reference executor: runs plans on real data and catches races, deadlocks, bad indexes, wrong sums."""

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from executor.reference.machine import PlanDeadlock, PlanRace, WrongResult, round_to
from executor.reference.prove import check_plan, expected_outputs, run_launches, run_reference
from schedules.collectives import Collective
from schedules.plan.io import load_plan, parse_plan
from schedules.plan.types import BufferRef, PlanError

FIXTURES = Path(__file__).parent / "fixtures" / "plans"
SIZES = [8, 24, 4096]  # 1 word per chunk, 3 words (ragged: 12-byte chunks), 512 words


def _edit(name: str, edit) -> dict:
    doc = json.loads((FIXTURES / name).read_text())
    edit(doc)
    return doc


def _ops(doc: dict, rank: int) -> list:
    return doc["gpus"][rank]["threadblocks"][0]["ops"]


@pytest.mark.parametrize("fixture", ["allpairs_allreduce_2.json", "allpairs_allreduce_2_ll.json"])
def test_hand_written_fixtures_compute_allreduce(fixture):
    record = check_plan(load_plan(FIXTURES / fixture), SIZES, ("fp32", "fp16", "bf16"), seed=3)
    assert record.ok and len(record.checks) == 9 and record.sizes == tuple(SIZES)


def test_outputs_are_the_elementwise_sum():
    plan = load_plan(FIXTURES / "allpairs_allreduce_2.json")
    a, b = np.arange(1, 7, dtype=np.float32), np.arange(10, 16, dtype=np.float32)
    out = run_reference(plan, [a, b], 24, "fp32")
    assert np.array_equal(out[0], a + b) and np.array_equal(out[1], a + b)


def test_missing_wait_is_a_race():
    def drop_first_wait(doc):
        del _ops(doc, 1)[2]
        del _ops(doc, 0)[1]  # and the matching signal, so that only the ordering is missing

    plan = parse_plan(_edit("allpairs_allreduce_2.json", drop_first_wait), "nowait.json")
    with pytest.raises(PlanRace, match=r"rank 1 threadblock 0 op 2 \(re\) reads chunk 0 of rank 1's scratch"):
        check_plan(plan, [8], ("fp32",))


def test_missing_final_wait_leaves_an_output_unordered():
    plan = parse_plan(_edit("allpairs_allreduce_2.json", lambda d: _ops(d, 0).pop()), "nofinal.json")
    with pytest.raises(PlanRace, match="output chunk 1 of rank 0 is written by rank 1 threadblock 0"):
        check_plan(plan, [8], ("fp32",))


def test_wait_without_signal_deadlocks_quickly_and_names_the_waiter():
    plan = parse_plan(_edit("allpairs_allreduce_2.json", lambda d: _ops(d, 1).pop(1)), "nosignal.json")
    started = time.process_time()  # the executor's own work: other processes on the cores do not count
    with pytest.raises(PlanDeadlock) as e:
        check_plan(plan, [8], ("fp32",))
    assert time.process_time() - started < 1.0
    # counting semaphores: the first wait consumes the second signal, so the last wait is the one left
    assert "rank 0 threadblock 0 op 6 (wait) waits on channel 0 from rank 1" in str(e.value)


def test_packets_that_never_come_deadlock():
    plan = parse_plan(_edit("allpairs_allreduce_2_ll.json", lambda d: _ops(d, 1).pop(0)), "nopkt.json")
    with pytest.raises(PlanDeadlock, match=r"rank 0 threadblock 0 op 1 \(repkt\) waits for packets"):
        check_plan(plan, [8], ("fp32",))


def test_index_out_of_range_is_reported():
    plan = load_plan(FIXTURES / "allpairs_allreduce_2.json")
    tb = plan.gpus[0].threadblocks[0]
    bad = replace(tb.ops[3], dst_buff=(BufferRef(2, 1, type="o"),))
    gpu = replace(plan.gpus[0], threadblocks=(replace(tb, ops=tb.ops[:3] + (bad,) + tb.ops[4:]),))
    with pytest.raises(PlanError, match=r"rank 0 threadblock 0 op 3 \(re\): chunks 2..2 of rank 0's 'o' buffer"):
        run_reference(replace(plan, gpus=(gpu,) + plan.gpus[1:]), [np.ones(2), np.ones(2)], 8, "fp32")


def test_wrong_reduction_is_a_wrong_result():
    def add_input_twice(doc):
        _ops(doc, 0)[3]["src_buff"][1] = {"type": "i", "index": 0, "size": 1}

    plan = parse_plan(_edit("allpairs_allreduce_2.json", add_input_twice), "twice.json")
    with pytest.raises(WrongResult, match="rank 0 output chunk 0"):
        check_plan(plan, [8], ("fp32",))


def test_bf16_rounds_to_nearest_even_on_the_top_16_bits():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 257.0], dtype=np.float32)
    assert list(round_to(x, "bf16")) == [1.0, 1.0, 1.0 + 2**-6, 256.0]
    assert round_to(np.array([1 + 2**-11], dtype=np.float32), "fp16")[0] == 1.0


def test_numpy_definition_of_reducescatter():
    c = Collective("reducescatter", 2)
    want = expected_outputs(c, [np.array([1.0, 2.0]), np.array([10.0, 20.0])], 1, "fp32")
    assert want[0][0][0] == 11.0 and want[1][0][0] == 22.0


def test_unaccepted_size_is_refused():
    with pytest.raises(PlanError, match="not accepted"):
        run_reference(load_plan(FIXTURES / "allpairs_allreduce_2.json"), [np.ones(1), np.ones(1)], 6, "fp32")


def _one_rank_plan(ops_tb0, ops_tb1, semaphores=1):
    """A 1-rank allgather whose two thread blocks hand the chunk over through scratch."""

    def tb(i, ops):
        return {"id": i, "ops": ops, "channels": [], "remote_buffer_refs": []}

    return parse_plan(
        {
            "name": "handover",
            "collective": "allgather",
            "protocol": "Simple",
            "inplace": False,
            "gpus": [
                {
                    "id": 0,
                    "input_chunks": 1,
                    "output_chunks": 1,
                    "scratch_chunks": 1,
                    "semaphores": [{"init_value": 0}] * semaphores,
                    "threadblocks": [tb(0, ops_tb0), tb(1, ops_tb1)],
                }
            ],
        },
        "handover.json",
    )


COPY_IN = {
    "name": "copy",
    "src_buff": [{"type": "i", "index": 0, "size": 1}],
    "dst_buff": [{"type": "s", "index": 0, "size": 1}],
}
COPY_OUT = {
    "name": "copy",
    "src_buff": [{"type": "s", "index": 0, "size": 1}],
    "dst_buff": [{"type": "o", "index": 0, "size": 1}],
}


def test_semaphores_order_thread_blocks_of_one_gpu():
    plan = _one_rank_plan(
        [COPY_IN, {"name": "sem_release", "semaphore_ids": [0]}],
        [{"name": "sem_acquire", "semaphore_ids": [0]}, COPY_OUT],
    )
    assert check_plan(plan, [4, 12], DTYPES_ALL).ok


def test_barrier_orders_thread_blocks_of_one_gpu():
    barrier = {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2}
    plan = _one_rank_plan([COPY_IN, barrier], [barrier, COPY_OUT])
    assert check_plan(plan, [4], ("fp32",)).ok


def test_unordered_handover_between_thread_blocks_is_a_race():
    plan = _one_rank_plan([COPY_IN], [COPY_OUT])
    with pytest.raises(PlanRace, match="rank 0 threadblock 1 op 0 \\(copy\\) reads chunk 0 of rank 0's scratch"):
        check_plan(plan, [4], ("fp32",))


DTYPES_ALL = ("fp32", "fp16", "bf16")


def test_launches_back_to_back_each_compute_their_own_inputs():
    plan = load_plan(FIXTURES / "allpairs_allreduce_2_ll.json")
    inputs = [[np.full(2, 1.0 + k), np.full(2, 10.0 * (k + 1))] for k in range(3)]
    outputs = run_launches(plan, inputs, 8, "fp32")
    assert [list(out[0]) for out in outputs] == [[11.0, 11.0], [22.0, 22.0], [33.0, 33.0]]


def test_ll_packets_in_a_single_scratch_buffer_are_overwritten_by_the_next_launch():
    from codegen import compile_schedule
    from synth.baselines import direct
    from topologies.catalog import build

    # one-shot: a rank hears nothing back after its peer's packets, so it may run a launch ahead of the reader
    double = compile_schedule(direct(build("fully_connected:n=2"), Collective("allreduce", 2)), protocol="ll")
    single = replace(double, use_double_scratch_buffer=False)
    assert check_plan(double, [8], ("fp32",), back_to_back=3).ok
    assert check_plan(single, [8], ("fp32",), back_to_back=1).ok
    with pytest.raises(
        PlanRace,
        match=r"launch 1 rank \d threadblock \d op 0 \(ppkt\) overwrites chunk 0 of rank \d's "
        r"scratch buffer while rank \d threadblock \d in launch 0 may still read it",
    ):
        check_plan(single, [8], ("fp32",), back_to_back=2)


def test_writing_a_peers_output_before_it_started_its_next_launch_is_a_race():
    def put_result_without_waiting(doc):  # rank 1 writes rank 0's output first thing, waiting for nothing
        _ops(doc, 1).insert(
            0,
            {
                "name": "put",
                "src_buff": [{"type": "i", "index": 0, "size": 1}],
                "dst_buff": [{"buffer_id": 1, "index": 0, "size": 1}],
                "channel_type": "memory",
                "channel_ids": [0],
            },
        )

    plan = parse_plan(_edit("allpairs_allreduce_2.json", put_result_without_waiting), "early.json")
    with pytest.raises(PlanRace, match="rank 1 threadblock 0 op 0 \\(put\\) overwrites chunk 0 of rank 0's output"):
        check_plan(plan, [8], ("fp32",), back_to_back=2)


def test_packets_overwritten_before_their_reader_got_to_them_are_a_race():
    """A 2-rank LL broadcast whose root hears nothing back: its third launch reuses the first launch's scratch
    half while rank 1, busy with a long thread block first, has not read those packets yet."""
    nop = {"name": "nop"}
    root = {
        "id": 0,
        "ops": [
            {
                "name": "ppkt",
                "src_buff": [{"type": "i", "index": 0, "size": 1}],
                "dst_buff": [{"buffer_id": 0, "index": 0, "size": 1}],
                "channel_type": "memory",
                "channel_ids": [0],
            }
        ],
        "channels": [{"channel_type": "memory", "channel_ids": [0]}],
        "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}],
    }
    reader = {
        "id": 0,
        "ops": [nop] * 8
        + [
            {
                "name": "upkt",
                "src_buff": [{"type": "s", "index": 0, "size": 1}],
                "dst_buff": [{"type": "o", "index": 0, "size": 1}],
            }
        ],
    }
    copy = {
        "id": 1,
        "ops": [
            {
                "name": "copy",
                "src_buff": [{"type": "i", "index": 0, "size": 1}],
                "dst_buff": [{"type": "o", "index": 0, "size": 1}],
            }
        ],
    }

    def gpu(r, tbs, **extra):
        return {
            "id": r,
            "input_chunks": 1,
            "output_chunks": 1,
            "scratch_chunks": 1,
            "channels": [{"channel_type": "memory", "connected_to": [1 - r]}],
            "threadblocks": tbs,
            **extra,
        }

    plan = parse_plan(
        {
            "name": "bcast",
            "collective": "broadcast",
            "protocol": "LL",
            "inplace": False,
            "use_double_scratch_buffer": True,
            "gpus": [gpu(0, [root, copy], remote_buffers=[{"rank": 1, "type": "s"}]), gpu(1, [reader])],
        },
        "bcast.json",
    )
    assert check_plan(plan, [4], ("fp32",), back_to_back=2).ok
    with pytest.raises(
        PlanRace,
        match=r"launch 2 rank 0 threadblock 0 op 0 \(ppkt\) overwrites the packets of "
        r"launch 0 in chunk 0 of rank 1's scratch buffer before anything read them",
    ):
        check_plan(plan, [4], ("fp32",), back_to_back=3)
