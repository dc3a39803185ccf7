"""The NVLink traffic model (schedules/traffic.py): bytes per GPU pair and port, and the time it predicts."""

from __future__ import annotations

import doctest
from dataclasses import replace

import pytest

from codegen import compile_schedule
from schedules import traffic
from schedules.plan.types import PlanError
from schedules.traffic import PortModel, link_bytes, port_bytes, predict_us
from topologies import resolve
from weft.synthesis import synthesize

MB = 1 << 20


def plan(nranks: int, method: str, collective: str = "allreduce", **options):
    topology = resolve(f"hgx_h200:gpus={nranks}")
    return compile_schedule(synthesize(topology, collective, method), topology, protocol="simple", **options)


def test_the_module_examples_hold():
    assert doctest.testmod(traffic).failed == 0


@pytest.mark.parametrize("multipeer", [False, True])
def test_a_two_shot_moves_two_pieces_over_every_pair_and_2_n_minus_1_over_n_through_every_port(multipeer):
    links = link_bytes(plan(4, "twoshot", multipeer=multipeer), 64 * MB)
    assert len(links) == 12 and set(links.values()) == {2 * 16 * MB}
    assert port_bytes(plan(4, "twoshot", multipeer=multipeer), 64 * MB) == [(96 * MB, 96 * MB)] * 4


def test_a_one_shot_moves_the_whole_message_to_every_peer():
    assert port_bytes(plan(4, "direct", double_scratch=True), 64 * MB)[0] == (192 * MB, 192 * MB)


def test_the_model_holds_the_measured_two_gpu_two_shot_within_its_error():
    assert predict_us(plan(2, "twoshot", instances=128), 64 * MB) == pytest.approx(201.6, rel=0.15)


def test_one_block_serving_every_peer_beats_per_peer_blocks_at_four_ranks():
    today = predict_us(plan(4, "twoshot", instances=32, threads=512), 64 * MB)
    assert predict_us(plan(4, "twoshot", instances=128, multipeer=True), 64 * MB) < 0.8 * today


def test_where_the_port_is_the_limit_pipelining_saves_only_phase_boundaries():
    flat = predict_us(plan(4, "twoshot", instances=64, multipeer=True), 64 * MB)
    piped = predict_us(plan(4, "twoshot", instances=64, pipeline=2, multipeer=True), 64 * MB)
    assert piped == pytest.approx(flat, rel=0.05)


def test_more_port_bandwidth_means_less_time():
    p = plan(4, "twoshot", instances=16, multipeer=True)
    assert predict_us(p, 16 * MB, PortModel(port_gbps=800.0)) < predict_us(p, 16 * MB)


def test_a_wait_that_no_signal_meets_is_reported():
    p = plan(2, "twoshot")
    gpu = p.gpus[0]
    tb = gpu.threadblocks[0]
    waits = [i for i, op in enumerate(tb.ops) if op.name == "wait"]
    broken = replace(
        p,
        gpus=(replace(gpu, threadblocks=(replace(tb, ops=tb.ops + (tb.ops[waits[0]],)),) + gpu.threadblocks[1:]),)
        + p.gpus[1:],
    )
    with pytest.raises(PlanError, match="waits forever"):
        predict_us(broken, MB)


def test_a_pipeline_counts_its_ops_whole_ranges():
    # MSCCL++'s pipelined all-to-all moves what its plain one does: half of each input over the one link each way
    from pathlib import Path

    from schedules.plan.io import load_plan

    corpus = Path(__file__).parent / "fixtures" / "mscclpp" / "plans"
    piped = load_plan(corpus / "single_node-alltoall-alltoall_pipeline-numgpus-2.json")
    plain = load_plan(corpus / "single_node-alltoall-alltoall-numgpus-2.json")
    assert link_bytes(piped, 1 << 20) == link_bytes(plain, 1 << 20) == {(0, 1): 1 << 19, (1, 0): 1 << 19}
    assert predict_us(piped, 1 << 20) > PortModel().launch_us


# the mid-size terms (issue 33): packets' wire bytes, a packet reader waiting for its writer, each op's issue


def packet_plan(nranks: int, method: str, protocol: str, **options):
    topology = resolve(f"hgx_h200:gpus={nranks}")
    return compile_schedule(synthesize(topology, "allreduce", method), topology, protocol=protocol, **options)


@pytest.mark.parametrize(
    ("protocol", "lines", "factor"), [("ll", False, 2.0), ("ll", True, 128 / 120), ("lamport", False, 1.0)]
)
def test_packets_cross_the_wire_at_their_protocols_factor(protocol, lines, factor):
    p = packet_plan(2, "direct", protocol)
    assert link_bytes(p, MB) == {(0, 1): MB, (1, 0): MB}
    assert traffic.wire_bytes(p, MB, lines=lines) == {
        (0, 1): pytest.approx(factor * MB),
        (1, 0): pytest.approx(factor * MB),
    }


def test_a_simple_plan_crosses_the_wire_with_its_data_bytes():
    p = plan(4, "twoshot", multipeer=True)
    assert traffic.wire_bytes(p, 64 * MB) == pytest.approx({k: float(v) for k, v in link_bytes(p, 64 * MB).items()})


def test_a_packet_reader_waits_for_its_writer_and_the_crossing():
    p = packet_plan(2, "direct", "lamport")
    model = PortModel(launch_us=0.0)
    assert predict_us(p, 1 << 10, replace(model, packet_us=7.0)) >= 7.0
    assert predict_us(p, 1 << 10, replace(model, packet_us=7.0)) == pytest.approx(predict_us(p, 1 << 10, model) + 7.0)


def test_an_ll_plan_moves_twice_the_bytes_of_its_lamport_twin():
    model = PortModel(port_gbps=1e6, launch_us=0.0, local_factor=1e6)  # the blocks' own rate is the limit
    ll = predict_us(packet_plan(2, "direct", "ll"), 16 * MB, model)
    assert ll == pytest.approx(2 * predict_us(packet_plan(2, "direct", "lamport"), 16 * MB, model), rel=0.01)
    assert predict_us(packet_plan(2, "direct", "ll"), 16 * MB, model, lines=True) == pytest.approx(
        ll * 64 / 120, rel=0.01
    )


def test_each_data_op_costs_its_issue_time_before_its_bytes():
    # the 2-rank two-shot's longest block runs put, signal, wait, res, signal, wait: two data ops in series
    p = plan(2, "twoshot")
    assert predict_us(p, MB, PortModel(op_us=5.0)) == pytest.approx(predict_us(p, MB) + 2 * 5.0, rel=0.02)


def test_the_packet_terms_leave_simple_plans_alone():
    p = plan(4, "twoshot", instances=32, multipeer=True)
    assert predict_us(p, 16 * MB, PortModel(packet_us=9.0, packet_rate=0.3)) == predict_us(p, 16 * MB)
