"""Baseline algorithms: each verifies where it exists and is refused with a reason where it does not."""

from __future__ import annotations

import functools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedules.collectives import NAMES, Collective
from schedules.cost import predict_us
from schedules.verify import require_valid, verify
from synth import baselines
from synth.baselines.tree import ruler_tree
from synth.errors import NotApplicable
from topologies.catalog import build, catalog_specs
from topologies.topology import Link, Topology
from weft.cli import main

SPECS = catalog_specs() + catalog_specs(nodes=2)


@functools.cache
def catalog(spec: str) -> Topology:
    return build(spec)


def fully_connected(n: int, bandwidth: float = 25.0) -> Topology:
    return Topology(f"fc{n}", n, tuple(Link(s, d, bandwidth, 1.0) for s in range(n) for d in range(n) if s != d))


def one_way_ring(n: int) -> Topology:
    return Topology(f"ring{n}", n, tuple(Link(r, (r + 1) % n, 25.0, 1.0) for r in range(n)))


def star(n: int) -> Topology:
    """n ranks on one switch: the switch-free form shares each rank's uplink and downlink."""
    links = tuple(Link(r, "sw", 25.0, 0.5) for r in range(n)) + tuple(Link("sw", r, 25.0, 0.5) for r in range(n))
    return Topology(f"star{n}", n, links, switches=("sw",))


def run(method: str, topology: Topology, name: str, chunks: int = 1, root: int = 0):
    return getattr(baselines, method)(topology, Collective(name, topology.nranks, chunks, root))


# ---- every baseline on every catalog topology --------------------------------------------------------


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("method", baselines.METHODS)
@pytest.mark.parametrize("spec", SPECS)
def test_catalog_sweep_verifies_or_says_why(spec, method, name, chunks):
    # chunks=2 also exercises several rings side by side, two trees' halves, and a root other than rank 0.
    topology = catalog(spec)
    try:
        schedule = run(method, topology, name, chunks, root=0 if chunks == 1 else topology.nranks - 1)
    except NotApplicable as refusal:
        assert str(refusal).startswith(f"{method}: ") and len(str(refusal)) > len(method) + 10
        return
    require_valid(schedule, topology)
    assert schedule.meta.solver == method and schedule.topology == topology.fingerprint


@pytest.mark.parametrize("spec", ["dgx1", "hgx_h100", "hgx_h100:nodes=2", "mi300x", "torus2d", "ndv2:nodes=2"])
def test_ring_allreduce_exists_on_the_systems_that_have_a_ring(spec):
    assert require_valid(run("ring", catalog(spec), "allreduce"), catalog(spec)).ok


@pytest.mark.parametrize("spec", ["dgx1", "hypercube", "hgx_h200:nodes=2", "dgx2"])
def test_rhd_allreduce_exists_where_partners_are_linked(spec):
    assert require_valid(run("rhd", catalog(spec), "allreduce"), catalog(spec)).ok


@pytest.mark.parametrize("spec", ["dgx1", "ndv2", "dgx_a100:nodes=2", "mi300x"])
def test_tree_allreduce_finds_a_placement(spec):
    assert require_valid(run("tree", catalog(spec), "allreduce"), catalog(spec)).ok


# ---- step counts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 6, 9])
def test_ring_allgather_takes_n_minus_1_steps(n):
    assert run("ring", one_way_ring(n), "allgather").nsteps == n - 1


@pytest.mark.parametrize("n", [2, 5, 8])
def test_ring_allreduce_takes_2_n_minus_1_steps(n):
    schedule = run("ring", one_way_ring(n), "allreduce", chunks=2)
    assert schedule.nsteps == 2 * (n - 1) and schedule.collective.nchunks == 2 * n


@pytest.mark.parametrize("name", NAMES)
def test_direct_is_one_step(name):
    assert run("direct", fully_connected(5), name, chunks=2, root=3).nsteps == 1


def test_twoshot_is_two_steps():
    assert run("twoshot", fully_connected(6), "allreduce").nsteps == 2


@pytest.mark.parametrize("n", [2, 4, 8, 16])
@pytest.mark.parametrize("name", ["allgather", "reducescatter", "broadcast", "reduce", "gather", "scatter", "alltoall"])
def test_rhd_takes_log2_n_steps(n, name):
    assert run("rhd", fully_connected(n), name).nsteps == int(math.log2(n))


def test_rhd_allreduce_takes_2_log2_n_steps():
    assert run("rhd", fully_connected(8), "allreduce").nsteps == 6


@pytest.mark.parametrize("chunks", [1, 4])
def test_tree_broadcast_pipelines_chunks_down_the_tree_depth(chunks):
    # The ruler tree on 8 positions: 0 -> 4 -> {2, 6} -> leaves, depth 3.
    assert run("tree", fully_connected(8), "broadcast", chunks=chunks).nsteps == chunks + 3 - 1


def test_tree_allreduce_reduces_up_then_broadcasts_down():
    # 8 chunks, 4 per tree; root height 3: the last chunk is reduced by step 3+3 and back down by 3+3+3-1.
    schedule = run("tree", fully_connected(8), "allreduce")
    assert schedule.nsteps == 4 + 2 * 3 - 1


def test_multi_host_tree_allreduce_runs_a_tree_pair_per_gpu_through_every_nic():
    topology = catalog("hgx_h100:nodes=2")
    schedule = run("tree", topology, "allreduce")
    senders = {s.src for step in schedule.steps for s in step.sends if topology.hosts[s.src] != topology.hosts[s.dst]}
    assert schedule.meta.options["trees"] == 16 and senders == set(range(16))
    assert require_valid(schedule, topology).ok


def test_ruler_tree_leaves_are_the_odd_positions():
    parents = ruler_tree(16)
    inner = set(parents.values())
    assert inner == {p for p in range(16) if p % 2 == 0}
    assert max(_depth(parents, p) for p in range(16)) == 4


def _depth(parents: dict[int, int], position: int) -> int:
    return 0 if position not in parents else 1 + _depth(parents, parents[position])


# ---- capacity: rounds fit the busiest link and sharing group ---------------------------------------


def test_rounds_grow_with_the_chunks_a_link_carries():
    schedule = run("ring", one_way_ring(4), "allgather", chunks=3)
    assert [step.rounds for step in schedule.steps] == [3, 3, 3]


def test_bonded_links_need_fewer_rounds():
    # The ring edges 0->1->2->3->0 are 3-lane bonds; the other links are single lanes and set the unit.
    ring_edges = {(r, (r + 1) % 4) for r in range(4)}
    links = tuple(Link(s, d, 25.0, 1.0, 3 if (s, d) in ring_edges else 1) for s in range(4) for d in range(4) if s != d)
    topology = Topology("bonded", 4, links)
    schedule = run("ring", topology, "allgather", chunks=3)
    assert [step.rounds for step in schedule.steps] == [1, 1, 1]
    assert require_valid(schedule, topology).ok


def test_a_switch_uplink_bounds_the_rounds_of_a_direct_step():
    # Each rank's one uplink to the switch carries its slice to 5 others: 5 chunks, 5 rounds.
    schedule = run("direct", star(6), "allgather")
    assert schedule.steps[0].rounds == 5
    assert require_valid(schedule, star(6)).ok


def test_ring_sends_half_of_each_slice_each_way_when_links_go_both_ways():
    schedule = run("ring", catalog("ring"), "allgather", chunks=2)
    order = schedule.meta.options["order"]
    forward = {(order[i], order[(i + 1) % 8]) for i in range(8)}
    first = schedule.steps[0].sends
    assert schedule.meta.options["rings"] == [order, order[::-1]]
    assert all(step.rounds == 1 for step in schedule.steps)
    assert sum((s.src, s.dst) in forward for s in first) == sum((s.src, s.dst) not in forward for s in first) == 8


def test_bidirectional_ring_allgather_reaches_the_cut_bound_for_large_messages():
    # ring(8): 25 GB/s each way. Cut bound for allgather: (N-1)/N · M over the 2 × 25 GB/s into one rank.
    topology, nbytes, n = catalog("ring"), 1 << 30, 8
    predicted = predict_us(run("ring", topology, "allgather", chunks=2), topology, nbytes)
    bound = (n - 1) / n * nbytes / (2 * 25.0 * 1e3)
    assert bound <= predicted < 1.001 * bound


# ---- refusals --------------------------------------------------------------------------------------


def test_ring_refuses_a_line_for_lack_of_a_hamiltonian_cycle():
    with pytest.raises(NotApplicable, match="no Hamiltonian cycle"):
        run("ring", catalog("line"), "allgather")


def test_rhd_refuses_six_ranks():
    with pytest.raises(NotApplicable, match="power-of-two"):
        run("rhd", fully_connected(6), "allreduce")


def test_rhd_names_the_missing_partner_link():
    with pytest.raises(NotApplicable, match=r"no link 0->2 \(partners at distance 2\)"):
        run("rhd", catalog("ring"), "allgather")


def test_direct_names_the_missing_link():
    with pytest.raises(NotApplicable, match="no link 0->5"):
        run("direct", catalog("dgx1"), "allgather")


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "broadcast", "alltoall"])
def test_twoshot_is_allreduce_only(name):
    with pytest.raises(NotApplicable, match="allreduce only"):
        run("twoshot", fully_connected(4), name)


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "gather", "scatter", "alltoall"])
def test_tree_is_for_allreduce_broadcast_and_reduce(name):
    with pytest.raises(NotApplicable, match="allreduce, broadcast, reduce only"):
        run("tree", fully_connected(4), name)


def test_tree_refuses_a_ring_topology():
    with pytest.raises(NotApplicable, match="tree edge on a link"):
        run("tree", catalog("ring"), "allreduce")


def test_a_collective_for_another_rank_count_is_refused():
    with pytest.raises(NotApplicable, match="has 4 ranks"):
        baselines.ring(fully_connected(5), Collective("allgather", 4))


# ---- rings and names ---------------------------------------------------------------------------------


def test_dgx1_ring_is_a_cycle_over_its_links():
    order = baselines.hamiltonian_cycle(catalog("dgx1"))
    assert sorted(order) == list(range(8))
    assert all(catalog("dgx1").has_link(order[i], order[(i + 1) % 8]) for i in range(8))


def test_multi_node_ring_crosses_hosts_once_each_way():
    topology = catalog("hgx_h100:nodes=2")
    order = baselines.hamiltonian_cycle(topology)
    crossings = sum(topology.hosts[order[i]] != topology.hosts[order[(i + 1) % 16]] for i in range(16))
    assert crossings == 2


def test_multi_host_rings_cross_between_hosts_at_different_gpus():
    topology = catalog("hgx_h100:nodes=2")
    rings = run("ring", topology, "allreduce", chunks=16).meta.options["rings"]
    crossings = [
        (r[i], r[(i + 1) % 16])
        for r in rings
        for i in range(16)
        if topology.hosts[r[i]] != topology.hosts[r[(i + 1) % 16]]
    ]
    assert len(rings) == 16 and len(crossings) == 32 and len(set(crossings)) == 32
    assert len({src for src, _ in crossings}) == 16  # every GPU's NIC sends


def test_ndv2_ring_stays_on_nvlink_inside_each_host():
    topology = catalog("ndv2:nodes=2")
    order = baselines.hamiltonian_cycle(topology)
    inside = [
        (order[i], order[(i + 1) % 16])
        for i in range(16)
        if topology.hosts[order[i]] == topology.hosts[order[(i + 1) % 16]]
    ]
    assert len(inside) == 14 and all(topology.has_link(s, d) for s, d in inside)


def test_schedule_is_named_for_algorithm_collective_and_topology():
    schedule = run("ring", catalog("dgx1"), "allreduce")
    assert schedule.name == "ring-allreduce-dgx1"
    assert schedule.meta.options["order"] == baselines.hamiltonian_cycle(catalog("dgx1"))


def test_switched_topology_schedule_records_the_topology_fingerprint():
    topology = catalog("hgx_h100")
    assert (
        run("direct", topology, "allgather").topology == topology.fingerprint != topology.without_switches().fingerprint
    )


# ---- reductions and rooted collectives, checked by the verifier --------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(baselines.METHODS), st.sampled_from(NAMES), st.integers(2, 9), st.integers(1, 3), st.data())
def test_every_baseline_verifies_on_fully_connected_for_any_chunks_and_root(method, name, n, chunks, data):
    root = data.draw(st.integers(0, n - 1))
    topology = fully_connected(n)
    try:
        schedule = run(method, topology, name, chunks, root)
    except NotApplicable as refusal:
        assert _refused_on_fully_connected(method, name, n), str(refusal)
        return
    result = verify(schedule, topology)
    assert result.ok, result.errors[:3]


def _refused_on_fully_connected(method: str, name: str, n: int) -> bool:
    """The only refusals where every pair has a link: the algorithm does not exist for the collective or n."""
    return (
        (method == "twoshot" and name != "allreduce")
        or (method == "tree" and name not in ("allreduce", "broadcast", "reduce"))
        or (method == "rhd" and n & (n - 1) != 0)
    )


def test_one_shot_allreduce_counts_each_contribution_once():
    schedule = run("direct", fully_connected(4), "allreduce")
    doubled = schedule.steps[0].sends + schedule.steps[0].sends[:1]
    broken = type(schedule)(
        schedule.collective, schedule.topology, (type(schedule.steps[0])(schedule.steps[0].rounds + 1, doubled),)
    )
    assert verify(schedule, fully_connected(4)).ok
    assert any("double-counted" in e for e in verify(broken, fully_connected(4)).errors)


@st.composite
def strongly_connected(draw) -> Topology:
    """A random directed ring (so every rank reaches every rank) plus random extra links and bonds."""
    n = draw(st.integers(2, 7))
    order = draw(st.permutations(range(n)))
    pairs = {(order[i], order[(i + 1) % n]) for i in range(n)}
    pairs |= draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1])))
    links = tuple(
        Link(s, d, draw(st.sampled_from([12.5, 25.0, 50.0])), 1.0, draw(st.integers(1, 2))) for s, d in sorted(pairs)
    )
    return Topology("random", n, links)


@settings(max_examples=60, deadline=None)
@given(strongly_connected(), st.sampled_from(baselines.METHODS), st.sampled_from(NAMES))
def test_random_fabrics_verify_or_refuse(topology, method, name):
    try:
        schedule = run(method, topology, name, chunks=2, root=topology.nranks - 1)
    except NotApplicable as refusal:
        assert str(refusal).startswith(f"{method}: ")
        return
    assert verify(schedule, topology).ok


# ---- the command line ---------------------------------------------------------------------------------


def test_weft_synth_ring_allreduce_on_dgx1(capsys):
    assert main(["synth", "allreduce", "-t", "dgx1", "--method", "ring"]) == 0
    out = capsys.readouterr().out
    assert "ring-allreduce-dgx1" in out and "verified" in out


def test_weft_synth_refuses_tree_allgather_in_one_line(capsys):
    assert main(["synth", "allgather", "-t", "dgx1", "--method", "tree"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tree: exists for allreduce" in err


@pytest.mark.parametrize("output", ["taken/ring.json", "taken/out", "folder.json"])
def test_weft_synth_to_an_unwritable_output_is_one_line_naming_it(tmp_path, capsys, output):
    (tmp_path / "taken").write_text("a file, not a folder")
    (tmp_path / "folder.json").mkdir()
    out = tmp_path / output
    assert main(["synth", "allreduce", "-t", "ring:n=4", "--method", "ring", "--compile", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("weft: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert str(tmp_path) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.json", "taken"]


def test_weft_synth_refuses_a_chunk_count_too_large_to_hold_in_one_line(capsys):
    assert main(["synth", "allreduce", "-t", "hgx_h200:gpus=2", "--method", "ring", "--chunks", "100000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "200000000 chunks in all; at most 16777216" in err


@pytest.mark.parametrize("method", ["ring", "trees", "milp", "smt"])
@pytest.mark.parametrize("limit", ["0", "-1", "nan", "inf"])
def test_weft_synth_time_limit_must_be_positive_and_finite_for_every_method(capsys, method, limit):
    assert main(["synth", "allgather", "-t", "ring:n=4", "--method", method, "--time-limit", limit]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--time-limit must be positive seconds, got {float(limit)}" in err
