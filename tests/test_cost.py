"""The α-β cost model: closed forms on hand-built fabrics, nccl-tests bandwidth factors, monotonicity."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from fabrics import mixed_fabric, random_steps
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules.collectives import NAMES, Collective
from schedules.cost import CostError, algbw, bus_factor, busbw, loads, predict_us, step_times_us
from schedules.schedule import Schedule, Send, Step
from topologies.topology import Link, Topology


def ring_topology(n: int, bandwidth: float = 25.0, latency: float = 1.0) -> Topology:
    return Topology(f"ring{n}", n, tuple(Link(r, (r + 1) % n, bandwidth, latency) for r in range(n)))


def ring_allgather(topo: Topology) -> Schedule:
    n = topo.nranks
    steps = tuple(Step(1, tuple(Send((r - k) % n, r, (r + 1) % n) for r in range(n))) for k in range(n - 1))
    return Schedule(Collective("allgather", n), topo.fingerprint, steps, "ring-allgather")


def star(n: int, bandwidth: float = 25.0, latency: float = 0.5) -> Topology:
    links = tuple(Link(r, "sw", bandwidth, latency) for r in range(n)) + tuple(
        Link("sw", r, bandwidth, latency) for r in range(n)
    )
    return Topology(f"star{n}", n, links, switches=("sw",))


sizes = st.floats(0, 1e10, allow_nan=False, allow_infinity=False)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 12), st.floats(0, 20), st.floats(0.5, 900), sizes)
def test_ring_allgather_closed_form(n, alpha, bandwidth, nbytes):
    topo = ring_topology(n, bandwidth, alpha)
    expected = (n - 1) * (alpha + (nbytes / n) / (bandwidth * 1e3))
    assert predict_us(ring_allgather(topo), topo, nbytes) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_each_ring_step_costs_alpha_plus_one_chunk_over_beta():
    topo = ring_topology(4, bandwidth=50.0, latency=2.0)
    assert step_times_us(ring_allgather(topo), topo, 4_000_000) == [2.0 + 1_000_000 / 50e3] * 3


def test_cost_follows_actual_load_not_rounds():
    topo = ring_topology(2, bandwidth=10.0, latency=1.0)
    schedule = Schedule(Collective("allgather", 2), topo.fingerprint, (Step(4, (Send(0, 0, 1), Send(1, 1, 0))),))
    assert predict_us(schedule, topo, 20_000) == pytest.approx(1.0 + 10_000 / 10e3)


def test_two_chunks_on_one_link_cost_twice_the_transfer():
    topo = ring_topology(2, bandwidth=10.0, latency=1.0)
    schedule = Schedule(
        Collective("allgather", 2, chunks=2),
        topo.fingerprint,
        (Step(2, (Send(0, 0, 1), Send(1, 0, 1))), Step(2, (Send(2, 1, 0), Send(3, 1, 0)))),
    )
    assert step_times_us(schedule, topo, 40_000) == [pytest.approx(1.0 + 2 * 10_000 / 10e3)] * 2


def test_bonded_lanes_add_capacity():
    topo = Topology("bonded", 2, (Link(0, 1, 25.0, 1.0, count=2), Link(1, 0, 25.0, 1.0)))
    schedule = Schedule(Collective("broadcast", 2), topo.fingerprint, (Step(1, (Send(0, 0, 1),)),))
    assert predict_us(schedule, topo, 1_000_000) == pytest.approx(1.0 + 1_000_000 / 50e3)


def test_a_shared_uplink_limits_a_step_through_a_switch():
    topo = star(4, bandwidth=25.0, latency=0.5)
    schedule = Schedule(
        Collective("broadcast", 4), topo.fingerprint, (Step(3, tuple(Send(0, 0, d) for d in (1, 2, 3))),)
    )
    # rank 0's uplink carries all three chunks, and the step still pays the 1 µs switch path
    assert predict_us(schedule, topo, 1_000) == pytest.approx(1.0 + 3 * 1_000 / 25e3)
    assert predict_us(schedule, topo, 1e9) == pytest.approx(1.0 + 3 * 1e9 / 25e3)


def test_a_switch_fabric_does_not_reach_its_bound_at_64kb():
    from schedules.bounds import lower_bound_us
    from synth.baselines import direct
    from topologies import resolve

    topo = resolve("switch:n=8")  # direct puts 7 chunks through each rank's switch port in one step
    schedule = direct(topo, Collective("allgather", 8))
    pct = 100 * lower_bound_us(topo, schedule.collective, 65536) / predict_us(schedule, topo, 65536)
    assert pct < 90.0


def test_a_step_without_sends_costs_nothing():
    topo = ring_topology(3)
    schedule = Schedule(
        Collective("broadcast", 3),
        topo.fingerprint,
        (Step(1, (Send(0, 0, 1),)), Step(1, ()), Step(1, (Send(0, 1, 2),))),
    )
    assert step_times_us(schedule, topo, 1e6)[1] == 0.0


def test_predict_many_matches_single_predictions():
    topo = ring_topology(5, bandwidth=40.0, latency=3.0)
    schedule = ring_allgather(topo)
    many = [1, 1 << 10, 1 << 20, 1 << 30]
    assert loads(schedule, topo).predict_many_us(many) == [predict_us(schedule, topo, n) for n in many]


def test_predict_is_the_sum_of_step_times():
    topo = star(4)
    schedule = Schedule(
        Collective("broadcast", 4),
        topo.fingerprint,
        (Step(1, (Send(0, 0, 1),)), Step(2, (Send(0, 0, 2), Send(0, 1, 3)))),
    )
    assert predict_us(schedule, topo, 123_456) == pytest.approx(sum(step_times_us(schedule, topo, 123_456)))


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 8), st.floats(0, 20), st.floats(0.5, 900), sizes, sizes)
def test_time_is_monotone_in_size(n, alpha, bandwidth, a, b):
    topo = star(n, bandwidth, alpha)
    schedule = Schedule(
        Collective("broadcast", n), topo.fingerprint, (Step(n - 1, tuple(Send(0, 0, d) for d in range(1, n))),)
    )
    small, large = sorted((a, b))
    assert predict_us(schedule, topo, small) <= predict_us(schedule, topo, large)


def test_send_over_a_missing_link_is_refused():
    topo = ring_topology(4)
    schedule = Schedule(Collective("broadcast", 4), topo.fingerprint, (Step(1, (Send(0, 0, 2),)),))
    with pytest.raises(CostError, match=r"steps\[0\]: no link 0->2 in topology ring4") as caught:
        predict_us(schedule, topo, 1e6)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("nbytes", [-1, math.nan, math.inf])
def test_a_meaningless_size_is_refused(nbytes):
    topo = ring_topology(2)
    with pytest.raises(CostError, match="size: must be a non-negative number of bytes"):
        predict_us(ring_allgather(topo), topo, nbytes)


FACTORS = {
    "allreduce": 2 * 7 / 8,
    "allgather": 7 / 8,
    "reducescatter": 7 / 8,
    "alltoall": 7 / 8,
    "broadcast": 1.0,
    "reduce": 1.0,
    "gather": 7 / 8,
    "scatter": 7 / 8,
}


@pytest.mark.parametrize("name", NAMES)
def test_busbw_uses_the_nccl_tests_factor(name):
    collective = Collective(name, 8)
    assert bus_factor(collective) == FACTORS[name]
    assert busbw(collective, 1 << 30, 1000.0) == pytest.approx((1 << 30) / 1e6 * FACTORS[name])


def test_algbw_is_bytes_over_time_in_gbps():
    assert algbw(Collective("allgather", 4), 4_000_000, 100.0) == pytest.approx(40.0)


def test_algbw_of_an_instant_schedule_is_infinite():
    assert algbw(Collective("allgather", 1), 1024, 0.0) == math.inf


def test_ring_allgather_busbw_reaches_link_speed_for_large_messages():
    topo = ring_topology(8, bandwidth=100.0, latency=1.0)
    t = predict_us(ring_allgather(topo), topo, 1 << 34)
    assert busbw(Collective("allgather", 8), 1 << 34, t) == pytest.approx(100.0, rel=1e-3)


def direct_step_times(topo: Topology, steps, chunk_bytes: float) -> list[float]:
    fabric = topo.without_switches()
    times = []
    for step in steps:
        per_link = Counter((s.src, s.dst) for s in step.sends)
        link_times = [
            fabric.link(*key).latency + n * chunk_bytes / (fabric.link(*key).capacity * 1e3)
            for key, n in per_link.items()
        ]
        group_times = [
            max(fabric.link(*key).latency for key in g.links if key in per_link)
            + sum(per_link[key] for key in g.links) * chunk_bytes / (g.bandwidth * 1e3)
            for g in fabric.sharing
            if any(key in per_link for key in g.links)
        ]
        times.append(max(link_times + group_times, default=0.0))
    return times


@settings(max_examples=80, deadline=None)
@given(random_steps(), sizes)
def test_step_times_match_a_direct_evaluation(steps, nbytes):
    topo = mixed_fabric()
    schedule = Schedule(Collective("broadcast", 5), topo.fingerprint, steps)
    expected = direct_step_times(topo, steps, nbytes)
    assert step_times_us(schedule, topo, nbytes) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert predict_us(schedule, topo, nbytes) == pytest.approx(sum(expected), rel=1e-12, abs=1e-12)
