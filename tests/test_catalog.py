"""The topology catalog: every entry builds real figures, specs parse strictly, switch removal keeps capacities."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from topologies import TopologyError, load_topology, parse_topology, resolve
from topologies.catalog import build, catalog_specs, dgx1, entries, hypercube, ring, torus2d

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "topologies" / "two_workstations.json"
ALL_SPECS = catalog_specs() + catalog_specs(nodes=2)

# SCCL's dgx1 (msccl/topologies/nvidia.py): NVLink lanes between GPU i and GPU j.
SCCL_DGX1 = [
    [0, 2, 1, 1, 2, 0, 0, 0],
    [2, 0, 1, 2, 0, 1, 0, 0],
    [1, 1, 0, 2, 0, 0, 2, 0],
    [1, 2, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 2, 1, 1],
    [0, 1, 0, 0, 2, 0, 1, 2],
    [0, 0, 2, 0, 1, 1, 0, 2],
    [0, 0, 0, 1, 1, 2, 2, 0],
]


# ---- every entry --------------------------------------------------------------------------------


def test_catalog_specs_cover_every_entry_once():
    assert catalog_specs() == [e.name for e in entries()]
    assert len(set(catalog_specs())) == len(entries())


def test_catalog_specs_with_nodes_lists_only_multi_node_entries():
    assert catalog_specs(nodes=2) == [f"{e.name}:nodes=2" for e in entries() if "nodes" in {p.name for p in e.params}]
    assert "hgx_h100:nodes=2" in catalog_specs(nodes=2)
    assert not any(s.startswith(("ring", "dgx1:")) for s in catalog_specs(nodes=2))


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_entry_round_trips_through_json_with_the_same_fingerprint(spec):
    topology = build(spec)
    again = parse_topology(topology.to_json(), f"{spec}.json")
    assert again == topology
    assert again.fingerprint == topology.fingerprint


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_entry_name_is_a_spec_that_builds_it_again(spec):
    topology = build(spec)
    assert resolve(topology.name).fingerprint == topology.fingerprint


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_ranks_are_host_major(spec):
    topology = build(spec)
    per_host = topology.nranks // topology.nhosts
    assert topology.hosts == tuple(r // per_host for r in topology.ranks)


@pytest.mark.parametrize("spec", catalog_specs(nodes=2))
def test_two_node_entries_join_hosts_through_an_ib_switch(spec):
    topology = build(spec)
    assert topology.nhosts == 2
    assert "ib" in topology.switches
    graph = topology.to_networkx()
    # every path from host 0 to host 1 crosses ib: without it, the hosts fall apart
    graph.remove_node("ib")
    assert not any(topology.hosts[b] == 1 for b in _reachable_ranks(graph, 0))


@pytest.mark.parametrize("spec", catalog_specs())
def test_single_node_entries_have_no_ib_switch(spec):
    assert "ib" not in build(spec).switches


def _reachable_ranks(graph, src):
    import networkx as nx

    return [v for v in nx.descendants(graph, src) if isinstance(v, int)]


def test_hgx_h100_at_128_nodes_builds_in_under_two_cpu_seconds():
    start = time.process_time()  # CPU time: a busy machine slows the wall clock, not the work
    topology = build("hgx_h100:nodes=128")
    _ = topology.fingerprint
    assert time.process_time() - start < 2.0
    assert topology.nranks == 1024
    assert topology.nhosts == 128


# ---- link figures -------------------------------------------------------------------------------


def test_dgx1_has_exactly_sccls_link_structure():
    topology = dgx1()
    lanes = [[topology.link(i, j).count if topology.has_link(i, j) else 0 for j in range(8)] for i in range(8)]
    assert lanes == SCCL_DGX1
    assert len(topology.links) == sum(1 for row in SCCL_DGX1 for x in row if x)
    assert {link.bandwidth for link in topology.links} == {25.0}


def test_dgx1_gives_every_v100_its_six_nvlinks():
    topology = dgx1()
    assert all(sum(link.count for link in topology.out_links[r]) == 6 for r in topology.ranks)


@pytest.mark.parametrize(
    "spec, per_gpu", [("dgx2", 150.0), ("dgx_a100", 300.0), ("hgx_h100", 450.0), ("hgx_h200", 450.0)]
)
def test_nvswitch_gives_each_gpu_its_nvlink_bandwidth_each_way(spec, per_gpu):
    topology = build(spec)
    for r in topology.ranks:
        assert topology.link(r, "n0.nvswitch").capacity == per_gpu
        assert topology.link("n0.nvswitch", r).capacity == per_gpu


@pytest.mark.parametrize(
    "spec, nic",
    [("dgx_a100:nodes=2", 25.0), ("hgx_h100:nodes=2", 50.0), ("hgx_h200:nodes=2", 50.0), ("mi300x:nodes=2", 50.0)],
)
def test_rail_nics_give_each_gpu_its_own_nic(spec, nic):
    topology = build(spec)
    assert all(
        topology.link(r, "ib").capacity == nic and topology.link("ib", r).capacity == nic for r in topology.ranks
    )


@pytest.mark.parametrize(
    "spec, nics, nic", [("ndv2:nodes=2", 1, 12.5), ("dgx2:nodes=2", 8, 12.5), ("mi250:nodes=2", 4, 25.0)]
)
def test_shared_nics_have_one_uplink_each(spec, nics, nic):
    topology = build(spec)
    uplinks = topology.in_links["ib"]
    assert len(uplinks) == 2 * nics
    assert {link.capacity for link in uplinks} == {nic}
    assert all(isinstance(link.src, str) and link.src.endswith(".tx") for link in uplinks)


def test_mi300x_is_fully_connected_by_seven_64_gbps_xgmi_links_per_gpu():
    topology = build("mi300x")
    for r in topology.ranks:
        assert len(topology.out_links[r]) == 7
        assert {link.capacity for link in topology.out_links[r]} == {64.0}


def test_mi250_packages_share_four_xgmi_lanes():
    topology = build("mi250")
    for a in (0, 2, 4, 6):
        assert topology.link(a, a + 1).capacity == 200.0
    assert topology.link(0, 6).capacity == 100.0
    assert topology.link(1, 3).capacity == 50.0
    assert not topology.has_link(0, 3)


@pytest.mark.parametrize("board", ["dgx_a100", "hgx_h100", "hgx_h200"])
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_gpus_sets_gpus_per_node_on_nvswitch_boards(board, gpus):
    topology = build(f"{board}:gpus={gpus}")
    assert topology.nranks == gpus
    assert bool(topology.links) == (gpus > 1)


def test_hgx_h200_two_gpu_box_across_two_nodes():
    topology = build("hgx_h200:nodes=2,gpus=2")
    assert topology.hosts == (0, 0, 1, 1)
    assert topology.name == "hgx_h200:nodes=2,gpus=2"


def test_nvlink_and_infiniband_latencies_sum_along_paths():
    topology = build("hgx_h100:nodes=2")
    assert topology.link(0, "n0.nvswitch").latency + topology.link("n0.nvswitch", 1).latency == pytest.approx(0.3)
    assert topology.link(0, "ib").latency + topology.link("ib", 8).latency == pytest.approx(2.6)


def test_shared_nic_paths_add_up_to_the_infiniband_latency():
    topology = build("ndv2:nodes=2")
    hops = [(0, "n0.nic0.tx"), ("n0.nic0.tx", "ib"), ("ib", "n1.nic0.rx"), ("n1.nic0.rx", 8)]
    assert sum(topology.link(*hop).latency for hop in hops) == pytest.approx(2.6)


# ---- abstract fabrics ---------------------------------------------------------------------------


def test_ring_links_each_rank_to_both_neighbours():
    topology = ring(5)
    assert sorted(link.key for link in topology.links) == sorted(
        [(r, (r + 1) % 5) for r in range(5)] + [(r, (r - 1) % 5) for r in range(5)]
    )


def test_two_rank_ring_bonds_its_two_cables():
    topology = ring(2)
    assert topology.link(0, 1).count == 2


def test_torus2d_gives_every_rank_four_lanes():
    for x, y in ((4, 4), (2, 3), (3, 5)):
        topology = torus2d(x, y)
        assert topology.nranks == x * y
        assert all(sum(link.count for link in topology.out_links[r]) == 4 for r in topology.ranks)


def test_hypercube_links_ranks_one_bit_apart():
    topology = hypercube(4)
    assert topology.nranks == 16
    assert all(bin(link.src ^ link.dst).count("1") == 1 for link in topology.links)
    assert len(topology.links) == 16 * 4


def test_hub_and_spoke_is_an_alias_of_switch():
    assert build("hub_and_spoke:n=4").fingerprint == build("switch:n=4").fingerprint
    assert build("switch:n=4").switches == ("switch",)


# ---- bad specs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("hgx_h100:nodes=0", "topology spec 'hgx_h100:nodes=0': nodes: must be >= 1"),
        ("hgx_h100:gpus=9", "gpus: must be <= 8"),
        ("nosuch", "unknown topology 'nosuch'"),
        ("ring:m=3", "m: unknown parameter (ring takes n)"),
        ("dgx1:nodes=2", "nodes: unknown parameter (dgx1 takes no parameters)"),
        ("ring:n=x", "n: must be an integer, got 'x'"),
        ("ring:n", "n: needs a value"),
        ("ring:n=4,n=5", "n: given twice"),
        ("ring:", "nothing after ':'"),
        ("", "empty"),
        ("torus2d:x=1000", "x: must be <= 128"),
    ],
)
def test_bad_spec_names_the_spec_and_field(spec, fragment):
    with pytest.raises(TopologyError) as info:
        build(spec)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_generators_check_their_arguments_too():
    with pytest.raises(TopologyError, match="n: must be >= 2"):
        ring(1)


# ---- switch removal keeps capacities ------------------------------------------------------------


def test_switch_free_form_links_every_pair_on_an_nvswitch_at_full_gpu_bandwidth():
    free = build("hgx_h100").without_switches()
    assert not free.switches
    assert {link.key for link in free.links} == {(a, b) for a in range(8) for b in range(8) if a != b}
    assert {link.capacity for link in free.links} == {450.0}
    assert all(link.latency == pytest.approx(0.3) for link in free.links)


def test_switch_free_form_shares_each_gpu_nvswitch_port_among_its_pairs():
    free = build("hgx_h100").without_switches()
    groups = {frozenset(g.links): g.bandwidth for g in free.sharing}
    for src in range(8):
        assert groups[frozenset((src, d) for d in range(8) if d != src)] == 450.0
    for dst in range(8):
        assert groups[frozenset((s, dst) for s in range(8) if s != dst)] == 450.0


def test_switch_free_form_caps_cross_host_pairs_at_the_nic():
    free = build("hgx_h100:nodes=2").without_switches()
    assert free.link(0, 8).capacity == 50.0
    assert free.link(0, 8).latency == pytest.approx(2.6)
    assert free.link(0, 1).capacity == 450.0
    groups = {frozenset(g.links): g.bandwidth for g in free.sharing}
    assert groups[frozenset((0, d) for d in range(8, 16))] == 50.0


def test_switch_free_form_shares_one_node_nic_among_all_its_gpus():
    free = build("ndv2:nodes=2").without_switches()
    out_of_host0 = frozenset((s, d) for s in range(8) for d in range(8, 16))
    groups = {frozenset(g.links): g.bandwidth for g in free.sharing}
    tightest = min(bw for links, bw in groups.items() if out_of_host0 <= links)
    assert tightest == 12.5


def test_switch_free_form_never_relays_through_a_nic_between_local_gpus():
    free = build("dgx2:nodes=2").without_switches()
    assert all(free.link(a, b).capacity == 150.0 for a in range(16) for b in range(16) if a != b)


def test_switch_free_form_keeps_dgx1_links_as_they_are():
    assert dgx1().without_switches() == dgx1()


def test_switch_free_form_keeps_a_sharing_group_over_switch_links():
    topology = load_topology(EXAMPLE)
    free = topology.without_switches()
    groups = {frozenset(g.links): g.bandwidth for g in free.sharing}
    # both GPUs of host 0 share one 12.5 GB/s NIC for everything they send to host 1
    assert groups[frozenset({(0, 2), (0, 3), (1, 2), (1, 3)})] == 12.5
    assert groups[frozenset({(2, 0), (2, 1), (3, 0), (3, 1)})] == 12.5
