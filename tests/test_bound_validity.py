"""Bounds that are bounds: no schedule weft verifies is ever priced below a bound weft prints.

The all-reduce bound was once twice the reduce-scatter cut bound, which a pipelined reduce to the end of a
line beats (line:n=3: 18.75 GB/s "bound", about 23 GB/s reached). These tests build the schedules that
would beat an invalid bound: hand-built line pipelines, the baselines, trees, and milp-solved small fabrics
drawn by hypothesis.
"""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import pytest
from fabrics import shared_hub_fabric, shared_nic_fabric
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slowdown import idle_s

from schedules.bounds import allgather_cut_bound, bandwidth_factor, lower_bound_us
from schedules.collectives import NAMES, Collective
from schedules.cost import predict_us
from schedules.schedule import Schedule, Send, Step
from schedules.verify import require_valid
from synth import baselines, trees
from synth.errors import NotApplicable, SynthesisError
from synth.milp import MilpOptions, solve
from topologies import Link, Topology
from topologies.catalog import build
from weft.cli import main

GB = 1 << 30
SIZES = (1 << 10, 1 << 20, GB)


def line_allreduce(n: int, chunks: int) -> Schedule:
    """Reduce along the line towards rank n-1 and copy the sums back, both pipelined, one chunk per hop."""
    collective = Collective("allreduce", n, chunks)
    k = collective.nchunks
    steps = []
    for t in range(k + 2 * n - 3):
        sends = [Send(t - i, i, i + 1, "reduce") for i in range(n - 1) if 0 <= t - i < k]
        # rank j copies chunk c to j-1 at step c + n - 1 + (n - 1 - j)
        sends += [Send(t - (2 * n - 2 - j), j, j - 1) for j in range(1, n) if 0 <= t - (2 * n - 2 - j) < k]
        steps.append(Step(1, tuple(sends)))
    return Schedule(collective, build(f"line:n={n}").fingerprint, tuple(steps), name=f"line-pipeline-{n}")


@pytest.mark.parametrize("n,chunks", [(3, 4), (3, 16), (4, 8), (5, 8)])
def test_a_pipelined_line_allreduce_stays_at_or_above_the_bound(n, chunks):
    topology = build(f"line:n={n}")
    schedule = line_allreduce(n, chunks)
    require_valid(schedule, topology)
    for size in SIZES:
        assert predict_us(schedule, topology, size) >= lower_bound_us(topology, schedule.collective, size)


def test_line3_bound_is_at_or_below_what_reduce_to_the_middle_reaches(capsys):
    """The issue's schedule: 4 chunks per rank, 13 steps, reduce into rank 1 and copy back."""
    topology = build("line:n=3")
    collective = Collective("allreduce", 3, 4)
    steps = []
    for t in range(13):
        sends = [Send(t, e, 1, "reduce") for e in (0, 2)] if t < 12 else []
        sends += [Send(t - 1, 1, e) for e in (0, 2)] if t >= 1 else []
        steps.append(Step(1, tuple(sends)))
    schedule = Schedule(collective, topology.fingerprint, tuple(steps))
    require_valid(schedule, topology)
    reached_us = predict_us(schedule, topology, GB)
    assert main(["topo", "bound", "line:n=3", "allreduce", "--size", "1GB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bound_us"] <= reached_us
    assert report["algbw_max"] >= GB / (reached_us * 1e3)
    assert report["algbw_max"] == pytest.approx(25.0, rel=1e-3)  # M over one 25 GB/s link, not 18.75


def test_allreduce_bound_equals_twice_reducescatter_on_uniform_fabrics():
    for spec in ("switch:n=8", "fully_connected:n=6", "ring:n=8", "dgx1", "hgx_h100:nodes=4"):
        topology = build(spec)
        n = topology.nranks
        twice_rs = 2 * allgather_cut_bound(topology.reversed()) / n
        assert bandwidth_factor(topology, Collective("allreduce", n)) == twice_rs, spec


def _baseline_schedules(topology: Topology, name: str):
    collective = Collective(name, topology.nranks)
    for method in baselines.METHODS:
        try:
            yield getattr(baselines, method)(topology, collective)
        except NotApplicable:
            continue


def _assert_above_bounds(schedule: Schedule, topology: Topology) -> None:
    require_valid(schedule, topology)
    for size in SIZES:
        bound = lower_bound_us(topology, schedule.collective, size)
        assert predict_us(schedule, topology, size) >= bound * (1 - 1e-9), (schedule.name, size)


@pytest.mark.parametrize(
    "spec",
    ["line:n=3", "line:n=5", "ring:n=5", "switch:n=4", "dgx1", "ndv2:nodes=2", "torus2d:x=3,y=2", "hgx_h100:nodes=2"],
)
@pytest.mark.parametrize("name", NAMES)
def test_no_baseline_or_tree_schedule_beats_a_bound(spec, name):
    topology = build(spec)
    for schedule in _baseline_schedules(topology, name):
        _assert_above_bounds(schedule, topology)
    try:
        schedule = trees.solve(topology, Collective(name, topology.nranks, 2))
    except (NotApplicable, SynthesisError):
        return
    _assert_above_bounds(schedule, topology)


@pytest.mark.parametrize("fabric", [shared_hub_fabric, shared_nic_fabric])
@pytest.mark.parametrize("switch_free", [False, True], ids=["switches", "sharing-groups"])
def test_no_schedule_beats_a_bound_on_a_fabric_with_shared_capacity(fabric, switch_free):
    topology = fabric().without_switches() if switch_free else fabric()
    for name in NAMES:
        for schedule in _baseline_schedules(topology, name):
            _assert_above_bounds(schedule, topology)
    # the all-reduce bound counts the shared capacity, and the milp's reduce-broadcast form prices it exactly
    collective = Collective("allreduce", topology.nranks, 2)
    _assert_above_bounds(solve(topology, collective, MilpOptions(size=GB, time_limit=idle_s(2.0), workers=2)), topology)


def test_the_shared_hub_sets_the_allreduce_bound():
    topology = shared_hub_fabric()
    assert bandwidth_factor(topology, Collective("allreduce", 3)) == Fraction(2 * 2, 50)


def test_ring_allreduce_on_dgx2_two_nodes_stays_above_the_shared_nic_bound():
    topology = build("dgx2:nodes=2")
    _assert_above_bounds(baselines.ring(topology, Collective("allreduce", 32, 2)), topology)


@st.composite
def small_fabrics(draw) -> Topology:
    """Strongly connected fabrics of 3 or 4 ranks with mixed link speeds, sometimes through a switch."""
    n = draw(st.integers(3, 4))
    vertices: list = list(range(n)) + (["sw"] if draw(st.booleans()) else [])
    speeds = st.sampled_from([10.0, 25.0, 50.0])
    links = [Link(v, vertices[(i + 1) % len(vertices)], draw(speeds), 0.5) for i, v in enumerate(vertices)]
    taken = {link.key for link in links}
    for a, b in itertools.permutations(vertices, 2):
        if (a, b) not in taken and draw(st.booleans()):
            links.append(Link(a, b, draw(speeds), 0.5))
    return Topology("random", n, tuple(links), ("sw",) if "sw" in vertices else ())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_fabrics(), st.sampled_from(["allreduce", "allgather", "reducescatter"]))
def test_no_milp_schedule_on_a_random_fabric_beats_a_bound(topology, name):
    """MILP optimizes the very cost it is priced at, so it is the schedule most likely to find a bad bound."""
    for schedule in _baseline_schedules(topology, name):
        _assert_above_bounds(schedule, topology)
    collective = Collective(name, topology.nranks, 2 if name != "allreduce" else 1)
    try:
        schedule = solve(topology, collective, MilpOptions(size=GB, time_limit=3.0, workers=2))
    except SynthesisError:
        return  # no incumbent within the limit: nothing to check
    _assert_above_bounds(schedule, topology)


@pytest.mark.parametrize("spec", ["line:n=3", "ring:n=4", "switch:n=3"])
@pytest.mark.parametrize("name", ["allgather", "allreduce"])
def test_no_smt_frontier_point_beats_a_bound(spec, name):
    from synth import smt

    topology = build(spec)
    frontier = smt.pareto(topology, Collective(name, topology.nranks), smt.SmtOptions(time_limit=20, workers=1))
    assert frontier.points
    for point in frontier.points:
        _assert_above_bounds(point.schedule, topology)
