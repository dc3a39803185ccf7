"""The switch-free form built as arrays (topologies/switch_free.py): the links and sharing groups that verify,
cost and the baselines read."""

from __future__ import annotations

from topologies.catalog import build
from topologies.switch_free import switch_free_arrays
from topologies.topology import Link, Topology


def test_a_switch_whose_every_path_a_direct_link_shadows_adds_nothing():
    """Rank 2 reaches rank 0 through the switch too, but the direct link 2->0 stays the pair's only link."""
    links = (
        Link(0, 1, 10.0, 0.5),
        Link(1, 2, 10.0, 0.5),
        Link(2, "sw", 10.0, 0.5),
        Link("sw", 0, 10.0, 0.5),
        Link(2, 0, 10.0, 0.5),
    )
    form = Topology("shadowed", 3, links, ("sw",)).without_switches()
    assert [link.key for link in form.links] == [(0, 1), (1, 2), (2, 0)] and form.sharing == ()


def test_two_nvswitch_hosts_on_one_ib_switch():
    topology = build("hgx_h100:nodes=2")
    form = topology.without_switches()
    assert len(form.links) == 16 * 15
    inside, across = form.link(0, 1), form.link(0, 8)
    assert inside.capacity == 450.0 and across.capacity == 50.0 and across.latency > inside.latency
    # each GPU's NVLink port, each way, is shared by its 7 host peers; each NIC, each way, by the 8 on the other host
    sizes = sorted(len(g.links) for g in form.sharing)
    assert sizes == [7] * 32 + [8] * 32
    arrays = switch_free_arrays(topology)
    assert list(zip(arrays.src.tolist(), arrays.dst.tolist(), strict=True)) == [link.key for link in form.links]
