"""Lower bounds: closed forms, SCCL's dgx1 figure, exactness, and soundness against brute force."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from fabrics import shared_nic_fabric
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules.bounds import (
    allgather_cut_bound,
    bandwidth_bound_us,
    bandwidth_factor,
    bottleneck_cut,
    latency_bound_us,
    lower_bound_us,
    rank_ingress,
)
from schedules.collectives import Collective
from schedules.symmetry import rank_orbits
from topologies.catalog import build
from topologies.errors import UnreachableError
from topologies.topology import Link, Topology


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_fully_connected_allgather_bound_is_one_slice_per_link(n):
    topology = build(f"fully_connected:n={n}")
    assert allgather_cut_bound(topology) == Fraction(1, 25)


@pytest.mark.parametrize("n", [3, 4, 7, 16])
def test_ring_allgather_bound_is_n_minus_one_slices_over_two_links(n):
    assert allgather_cut_bound(build(f"ring:n={n}")) == Fraction(n - 1, 50)


def test_line_bound_is_set_by_an_end_rank():
    assert allgather_cut_bound(build("line:n=6")) == Fraction(5, 25)


def test_dgx1_allgather_bound_is_seven_sixths_rounds_per_chunk():
    topology = build("dgx1")
    assert allgather_cut_bound(topology) * Fraction(topology.unit_bandwidth) == Fraction(7, 6)


def test_hgx_two_nodes_bound_is_one_gpus_ingress():
    cut = bottleneck_cut(build("hgx_h100:nodes=2"))
    assert (cut.ranks, cut.capacity) == (15, 500)


def test_hgx_eight_nodes_bound_is_one_hosts_network():
    cut = bottleneck_cut(build("hgx_h100:nodes=8"))
    assert (cut.ranks, cut.capacity) == (56, 400)


def test_allgather_time_is_slice_times_bound():
    topology = build("ring:n=4")
    # 4 MB allgather: three 1 MB slices enter each rank over 50 GB/s (5e4 bytes/µs)
    assert bandwidth_bound_us(topology, Collective("allgather", 4), 4_000_000) == pytest.approx(3e6 / 50e3)


def test_allreduce_bound_is_twice_reducescatter():
    topology = build("dgx1")
    rs = bandwidth_factor(topology, Collective("reducescatter", 8))
    assert bandwidth_factor(topology, Collective("allreduce", 8)) == 2 * rs


def test_dgx2_two_nodes_allreduce_bound_counts_each_shared_nic_once():
    # 32 GPUs each take 150 GB/s from their NVSwitch; 16 NICs of 12.5 GB/s, each shared by two GPUs
    topology = build("dgx2:nodes=2")
    assert rank_ingress(topology) == 32 * 150 + 16 * Fraction(25, 2)
    bound = bandwidth_bound_us(topology, Collective("allreduce", 32), 1 << 30)
    assert bound == pytest.approx(62 * (1 << 30) / 5000e3)
    assert bound == pytest.approx(13_314, rel=0.01)


def test_rank_ingress_counts_the_sharing_groups_of_the_switch_free_form():
    # four GPUs take 100 GB/s of NVLink each; each host's NIC brings 12.5 GB/s for its two GPUs (16 GB/s PCIe)
    topology = shared_nic_fabric()
    flat = topology.without_switches()
    assert flat.sharing and not flat.switches
    assert rank_ingress(flat) == rank_ingress(topology) == 4 * 100 + 2 * Fraction(25, 2)


def test_broadcast_bound_is_the_roots_min_cut():
    topology = build("fully_connected:n=5")
    assert bandwidth_factor(topology, Collective("broadcast", 5, root=2)) == Fraction(1, 100)


def test_gather_bound_is_the_roots_ingress():
    topology = build("switch:n=6")
    assert bandwidth_factor(topology, Collective("gather", 6)) == Fraction(5, 6 * 25)


def test_alltoall_bound_counts_a_ranks_egress():
    topology = build("fully_connected:n=4")
    # each rank sends 3/4 of its buffer over 75 GB/s
    assert bandwidth_factor(topology, Collective("alltoall", 4)) == Fraction(3, 4 * 75)


def test_latency_bound_is_the_longest_cheapest_path():
    topology = build("line:n=5")
    assert latency_bound_us(topology, Collective("allgather", 5)) == pytest.approx(4 * 0.3)
    assert latency_bound_us(topology, Collective("broadcast", 5, root=2)) == pytest.approx(2 * 0.3)


def test_lower_bound_is_the_larger_of_the_two():
    topology = build("ring:n=8")
    c = Collective("allgather", 8)
    assert lower_bound_us(topology, c, 8) == pytest.approx(latency_bound_us(topology, c))
    assert lower_bound_us(topology, c, 1 << 30) == pytest.approx(bandwidth_bound_us(topology, c, 1 << 30))


def test_hgx_ranks_form_one_orbit():
    assert rank_orbits(build("hgx_h100:nodes=4")) == (tuple(range(32)),)


@pytest.mark.parametrize("spec", ["hgx_h100:nodes=2", "ndv2:nodes=2", "mi250:nodes=2", "torus2d:x=3,y=2"])
def test_one_flow_per_orbit_finds_the_same_bound_as_one_per_rank(spec):
    topology = build(spec)
    assert bottleneck_cut(topology).ratio == bottleneck_cut(topology, tuple(topology.ranks)).ratio


def test_a_one_way_fabric_names_the_unreachable_pair():
    with pytest.raises(UnreachableError, match="rank 1 cannot reach rank 0"):
        Topology("oneway", 2, (Link(0, 1, 25.0),))


def _brute_force(topology: Topology) -> Fraction:
    best = Fraction(0)
    vertices = list(topology.vertices)
    for size in range(1, len(vertices)):
        for chosen in itertools.combinations(vertices, size):
            inside = set(chosen)
            ranks = sum(1 for v in inside if isinstance(v, int))
            if not ranks or ranks == topology.nranks:
                continue
            leaving = sum(
                Fraction(link.capacity) for link in topology.links if link.src in inside and link.dst not in inside
            )
            best = max(best, Fraction(ranks) / leaving)
    return best


@st.composite
def small_fabrics(draw) -> Topology:
    n = draw(st.integers(2, 4))
    vertices: list = list(range(n)) + (["sw"] if draw(st.booleans()) else [])
    links = [
        Link(v, vertices[(i + 1) % len(vertices)], draw(st.sampled_from([10.0, 25.0, 50.0])))
        for i, v in enumerate(vertices)
    ]  # a cycle keeps it strongly connected
    taken = {link.key for link in links}
    for a, b in itertools.permutations(vertices, 2):
        if (a, b) not in taken and draw(st.booleans()):
            links.append(Link(a, b, draw(st.sampled_from([10.0, 25.0, 50.0]))))
    switches = ("sw",) if "sw" in vertices else ()
    return Topology("random", n, tuple(links), switches)


@settings(max_examples=40, deadline=None)
@given(small_fabrics())
def test_cut_bound_equals_brute_force_over_every_vertex_set(topology):
    assert allgather_cut_bound(topology) == _brute_force(topology)
