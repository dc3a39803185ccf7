"""Tutel's 2DH all-to-all (``--method 2dh``): proven by verify and the reference executor, priced beside the flat
direct schedule and the lower bound, and refused where the fabric has no host structure for it."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from executor.port.program import Exchange, compile_programs, run_programs
from executor.reference.machine import chunk_elems, smallest_size
from executor.reference.prove import _compare, expected_outputs, random_inputs
from schedules.bounds import lower_bound_us
from schedules.collectives import Collective
from schedules.compact import expand
from schedules.cost import predict_us
from schedules.verify import require_valid
from synth.baselines import direct, twodh
from synth.baselines.twodh import host_grid
from synth.errors import NotApplicable
from synth.pareto import candidates
from topologies.catalog import build
from topologies.topology import Link, Topology
from weft.cli import main
from weft.pipeline import compile_and_verify

TWO_BY_TWO, TWO_HGX = "hgx_h100:nodes=2,gpus=2", "hgx_h100:nodes=2"


@pytest.mark.parametrize("spec", [TWO_BY_TWO, TWO_HGX])
def test_2dh_verifies_in_two_steps(spec):
    topology = build(spec)
    schedule = twodh(topology, Collective("alltoall", topology.nranks))
    require_valid(schedule, topology)
    assert schedule.nsteps == 2


@pytest.mark.parametrize("spec", [TWO_BY_TWO, TWO_HGX])
def test_across_hosts_each_gpu_sends_one_message_per_remote_host(spec):
    topology = build(spec)
    grid = host_grid(topology)
    gpus = len(grid[0])
    schedule = twodh(topology, Collective("alltoall", topology.nranks, chunks=2))
    crossing = Counter(
        (s.src, s.dst)
        for step in expand(schedule).steps
        for s in step.sends
        if topology.hosts[s.src] != topology.hosts[s.dst]
    )
    local_index = {r: j for ranks in grid for j, r in enumerate(ranks)}
    assert all(local_index[src] == local_index[dst] for src, dst in crossing)  # only GPU j to GPU j
    assert set(crossing.values()) == {gpus * 2}  # the G blocks of 2 chunks bound for that GPU, in one message
    flat = Counter(
        (s.src, s.dst)
        for s in expand(direct(topology, Collective("alltoall", topology.nranks))).steps[0].sends
        if topology.hosts[s.src] != topology.hosts[s.dst]
    )
    assert len(flat) == gpus * len(crossing)  # the flat schedule talks to every remote GPU


@pytest.mark.parametrize("spec, chunks", [(TWO_BY_TWO, 2), (TWO_HGX, 1)])
def test_2dh_plan_is_proven_on_the_reference_executor(spec, chunks):
    topology = build(spec)
    schedule = twodh(topology, Collective("alltoall", topology.nranks, chunks=chunks))
    plan = compile_and_verify(schedule, topology)
    assert plan.weft.verification["ok"]
    assert any(ch.channel_type == "port" for g in plan.gpus for ch in g.channels)  # hops between hosts: ports


@pytest.mark.parametrize("spec", [TWO_BY_TWO, "hgx_h100:nodes=3,gpus=2"])
def test_on_the_port_engines_lanes_2dh_gathers_in_one_group_then_crosses_in_one(spec):
    # every group is a launch, and one between hosts a network round trip (a port hop: about 40 µs, bench/NOTES.md):
    # each GPU's own blocks for the other hosts wait for the gather and cross with the blocks it forwards
    topology = build(spec)
    grid = host_grid(topology)
    plan = compile_and_verify(twodh(topology, Collective("alltoall", topology.nranks)), topology, protocol="simple")
    programs = compile_programs(plan, closed=True)  # the programs of the calls that split into lanes
    for program in programs:
        exchanges = [s for s in program.steps if isinstance(s, Exchange)]
        assert [{t.channel_type for t in s.transfers} for s in exchanges] == [{"memory"}, {"port"}]
        assert sum(t.send for t in exchanges[1].transfers) == (len(grid) - 1) * len(grid[0])
    elems = chunk_elems(plan, 2 * smallest_size(plan), "fp32")
    inputs = random_inputs(plan, elems, np.random.default_rng(11))
    outputs = run_programs(plan, programs, inputs, elems, "fp32")
    _compare(plan, expected_outputs(plan.collective_spec(), inputs, elems, "fp32"), outputs, elems, "fp32")


@pytest.mark.parametrize("spec", [TWO_BY_TWO, TWO_HGX])
def test_2dh_costs_at_least_the_bound_and_at_most_its_nvlink_step_above_direct(spec):
    topology = build(spec)
    collective = Collective("alltoall", topology.nranks)
    schedule, flat = twodh(topology, collective), direct(topology, collective)
    for nbytes in (1 << 10, 1 << 20, 1 << 30):
        hierarchical = predict_us(schedule, topology, nbytes)
        assert hierarchical >= lower_bound_us(topology, collective, nbytes) - 1e-9
        assert predict_us(flat, topology, nbytes) <= hierarchical <= 1.25 * predict_us(flat, topology, nbytes)


def test_the_cli_prints_2dh_beside_direct_and_the_bound(tmp_path, capsys):
    assert main(["synth", "alltoall", "-t", TWO_BY_TWO, "--method", "2dh", "-o", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    topology = build(TWO_BY_TWO)
    flat = predict_us(direct(topology, Collective("alltoall", 4)), topology, 1 << 30)
    assert "2dh-alltoall" in out and f"1GB: {flat:.2f} µs" in out
    assert f"1GB: {lower_bound_us(topology, Collective('alltoall', 4), 1 << 30):.2f} µs" in out
    assert "messages a GPU sends across hosts: 2dh 1, flat direct 2" in out


def test_the_cli_json_carries_the_comparison(tmp_path, capsys):
    assert (
        main(["synth", "alltoall", "-t", TWO_BY_TWO, "--method", "2dh", "--json", "-o", str(tmp_path / "s.json")]) == 0
    )
    [row] = json.loads(capsys.readouterr().out)
    assert set(row["compared_us"]) == {"direct", "bound"}
    assert row["compared_us"]["direct"]["1GB"] <= row["meta"]["predicted_us"]["1GB"]


@pytest.mark.parametrize(
    "spec, collective, why",
    [
        ("hgx_h100:gpus=4", "alltoall", "one host"),
        (TWO_BY_TWO, "allgather", "all-to-all algorithm"),
    ],
)
def test_2dh_is_refused_with_the_reason(spec, collective, why, capsys):
    topology = build(spec)
    with pytest.raises(NotApplicable, match=why):
        twodh(topology, Collective(collective, topology.nranks))
    assert main(["synth", collective, "-t", spec, "--method", "2dh"]) == 2
    assert why in capsys.readouterr().err


def test_2dh_needs_hosts_of_one_size():
    three = Topology(
        "uneven", 3, tuple(Link(s, d, 25.0) for s in range(3) for d in range(3) if s != d), hosts=(0, 0, 1)
    )
    with pytest.raises(NotApplicable, match=r"hosts of \[1, 2\] GPUs"):
        twodh(three, Collective("alltoall", 3))


def test_pareto_considers_2dh_on_several_hosts():
    topology = build(TWO_BY_TWO)
    assert "2dh" in {s.meta.solver for s in candidates(topology, Collective("alltoall", 4), chunk_options=(1,))}


def test_the_facade_synthesizes_2dh():
    from weft.synthesis import synthesize

    assert synthesize(build(TWO_BY_TWO), "alltoall", "2dh").meta.solver == "2dh"
