"""Spanning-tree schedules: they verify, reach the cut bound in the α=0 limit, and say what they give up."""

from __future__ import annotations

import json
import math

import pytest

from schedules.bounds import bandwidth_bound_us
from schedules.collectives import Collective
from schedules.cost import predict_us
from schedules.verify import verify
from synth.errors import NotApplicable
from synth.trees import TreeOptions, forests_for, schedule, solve
from topologies.catalog import build, catalog_specs
from weft.cli import main

HUGE = 1e15  # bytes: latency terms vanish next to bandwidth terms, so the cost model is at its α = 0 limit
SPECS = sorted(set(catalog_specs() + catalog_specs(1) + catalog_specs(2)))
# The greedy packing through switches falls short where the optimum needs local data to loop out through
# a shared NIC (ForestColl routes some of a DGX-2's local traffic over InfiniBand); reported, not hidden.
SHORT_OF_OPTIMAL = {"dgx2:nodes=2": 90.0}


def _depth(forests) -> int:
    return max(max(t.depths().values()) for f in forests for t in f.trees)


def _pipelined(spec: str, name: str, waves: int, options: TreeOptions | None = None):
    topology = build(spec)
    collective = Collective(name, topology.nranks)
    forests = forests_for(topology, collective, options or TreeOptions())
    per_root = math.lcm(*(f.per_root for f in forests))
    sized = Collective(name, topology.nranks, per_root * waves)
    return topology, forests, schedule(topology, sized, forests)


@pytest.mark.parametrize("spec", SPECS)
def test_allgather_trees_verify_and_approach_the_bound(spec):
    waves = 2
    options = TreeOptions(max_trees=16 if spec in SHORT_OF_OPTIMAL else 128)  # keeps the slow one short
    topology, forests, s = _pipelined(spec, "allgather", waves, options)
    assert verify(s, topology).ok
    optimal = forests[0].pct_of_optimal
    assert optimal >= SHORT_OF_OPTIMAL.get(spec, 100.0)
    # with P chunks per tree and depth D the steps number P + D - 1, each no longer than one wave's share
    pct = 100 * bandwidth_bound_us(topology, s.collective, HUGE) / predict_us(s, topology, HUGE)
    assert pct >= optimal * waves / (waves + _depth(forests) - 1) - 1e-6
    assert pct <= 100 + 1e-6


def test_dgx1_allgather_reaches_the_bound_as_chunks_grow():
    pcts = []
    for waves in (1, 4, 16):
        topology, forests, s = _pipelined("dgx1", "allgather", waves)
        pcts.append(100 * bandwidth_bound_us(topology, s.collective, HUGE) / predict_us(s, topology, HUGE))
    assert pcts[0] < pcts[1] < pcts[2]
    assert pcts[2] >= 100 * 16 / (16 + _depth(forests) - 1)


@pytest.mark.parametrize("name", ["reducescatter", "allreduce", "broadcast", "reduce"])
@pytest.mark.parametrize("spec", ["dgx1", "hgx_h100:nodes=2", "ring:n=5"])
def test_other_collectives_verify(spec, name):
    topology, _, s = _pipelined(spec, name, 2)
    result = verify(s, topology)
    assert result.ok, result.errors[:3]


def test_reducescatter_reduces_up_reversed_trees():
    topology, _, s = _pipelined("ring:n=4", "reducescatter", 1)
    assert {send.op for step in s.steps for send in step.sends} == {"reduce"}


def test_broadcast_trees_reach_the_roots_min_cut():
    topology, forests, _ = _pipelined("dgx1", "broadcast", 1)
    assert forests[0].pct_of_optimal == 100.0
    assert float(forests[0].rate) == 150.0


def test_fewer_trees_report_their_share_of_the_optimum():
    topology = build("dgx1")
    s = solve(topology, Collective("allgather", 8, chunks=4), TreeOptions(k=2))
    assert verify(s, topology).ok
    assert "2 trees per root" in s.meta.notes and "93.3% of the optimal" in s.meta.notes


def test_gather_is_not_a_tree_collective():
    with pytest.raises(NotApplicable, match="gather"):
        solve(build("dgx1"), Collective("gather", 8))


def test_symmetric_packing_reaches_the_optimum_that_plain_greedy_misses():
    topology = build("hgx_h100:nodes=2")
    collective = Collective("allgather", 16)
    fast = forests_for(topology, collective, TreeOptions())[0]
    plain = forests_for(topology, collective, TreeOptions(symmetric=False))[0]
    assert fast.rate == fast.optimum
    assert plain.rate < fast.rate


def test_cli_synth_trees_writes_a_verified_schedule(tmp_path, capsys):
    out = tmp_path / "ag.json"
    assert (
        main(
            [
                "synth",
                "allgather",
                "-t",
                "hgx_h100:nodes=2",
                "--method",
                "trees",
                "--k",
                "1",
                "--size",
                "1GB",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    # the waves (chunks per tree) come from the size: many at 1 GB, where the pipeline's fill is what costs
    assert doc["meta"]["solver"] == "trees" and doc["collective"]["chunks"] >= 8
    assert doc["meta"]["pct_of_bound"] >= 90.0
    assert "verified" in capsys.readouterr().out


def test_waves_follow_the_size_and_the_compact_form_prices_the_expanded_schedule():
    from schedules.verify import require_valid
    from synth.trees import pipeline

    for spec, name in (
        ("hgx_h100:nodes=2", "allreduce"),
        ("dgx1", "reducescatter"),
        ("ring:n=5", "broadcast"),
        ("dgx2:nodes=2", "allgather"),
    ):
        topology = build(spec)
        wave = pipeline(topology, Collective(name, topology.nranks))
        small, large = wave.best_waves(1 << 20), wave.best_waves(1 << 30)
        assert small < large
        for waves in (1, 3, min(large, 6)):  # written out at a size the suite can afford
            explicit = wave.with_waves(waves).expand()
            require_valid(explicit, topology)
            assert wave.predict_us(1 << 30, waves) == pytest.approx(predict_us(explicit, topology, 1 << 30), rel=1e-9)


def test_hgx_128_nodes_reaches_90_percent_of_the_cut_bound_at_1gb_in_the_compact_form():
    """The scale claim of the README at a fraction of its size (the 1024-GPU run is bench/trees_scale.py)."""
    from synth.trees import pipeline

    topology = build("hgx_h100:nodes=16")
    wave = pipeline(topology, Collective("allgather", topology.nranks))
    waves = wave.best_waves(1 << 30)
    pct = 100 * bandwidth_bound_us(topology, wave.sized(waves), 1 << 30) / wave.predict_us(1 << 30, waves)
    assert pct >= 90.0


def test_cli_topo_bound_prints_the_exact_fraction(capsys):
    assert main(["topo", "bound", "dgx1", "allgather", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cut"]["rounds_per_chunk"] == "7/6"
    assert report["factor"] == "7/1200"


def test_cli_names_the_unreachable_pair(tmp_path, capsys):
    path = tmp_path / "oneway.json"
    path.write_text(
        json.dumps(
            {
                "format": "weft.topology/1",
                "name": "oneway",
                "nranks": 2,
                "links": [{"src": 0, "dst": 1, "bandwidth": 25.0, "latency": 1.0}],
            }
        )
    )
    assert main(["topo", "bound", str(path), "allgather"]) == 2
    assert "rank 1 cannot reach rank 0" in capsys.readouterr().err
