"""The MILP's inter-/intra-host split, its symmetry across hosts and the pipelined hint, on small fabrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slowdown import idle_s

from schedules.bounds import lower_bound_us
from schedules.collectives import Collective
from schedules.cost import predict_us
from schedules.verify import require_valid
from synth.milp import MilpOptions, Sketch, SketchError, default_chunks, parse_sketch, solve
from synth.milp.flow import FlowSpec, shortest_path_sends
from synth.milp.hierarchy import rail_offsets
from synth.milp.links import allowed_links
from synth.milp.symmetry import auto_symmetry
from synth.trees import TreeOptions, allgather_forest
from topologies.catalog import build

GB = 1 << 30
RESULTS = Path(__file__).parent.parent / "bench" / "results" / "milp_allgather.json"


def milp(spec: str, sketch: Sketch | None = None, chunks: int = 2, size: int = GB, name: str = "allgather"):
    topology = build(spec)
    schedule = solve(
        topology,
        Collective(name, topology.nranks, chunks),
        MilpOptions(size=size, time_limit=10, workers=2, sketch=sketch),
    )
    require_valid(schedule, topology)
    return topology, schedule


def sends(schedule):
    return [(k, s) for k, step in enumerate(schedule.steps) for s in step.sends]


def local(topology, rank: int) -> int:
    return [r for r in topology.ranks if topology.hosts[r] == topology.hosts[rank]].index(rank)


@pytest.mark.parametrize("spec", ["hgx_h100:nodes=2,gpus=2", "dgx_a100:nodes=3,gpus=2"])
def test_rails_split_crosses_hosts_only_from_the_owner_along_its_rail(spec):
    # with a NIC per GPU the next GPU's rail is a second route
    topology, schedule = milp(spec)
    offsets = set(rail_offsets(topology.without_switches()))
    c = schedule.collective.chunks
    assert schedule.meta.options["hierarchy"] == "rails"
    for _, s in sends(schedule):
        owner = s.chunk // c
        if topology.hosts[s.src] != topology.hosts[s.dst]:
            assert s.src == owner and (local(topology, s.dst) - local(topology, owner)) % 2 in offsets
        else:  # inside an NVSwitch host, one hop from the rank that holds the chunk there
            assert s.src == owner or topology.hosts[owner] != topology.hosts[s.src]


@pytest.mark.parametrize(
    "spec,offsets",
    [
        ("hgx_h100:nodes=2", (0, 1)),
        ("dgx_a100:nodes=3", (0, 1)),
        ("dgx2:nodes=2", (0,)),
        ("ndv2:nodes=2", (0,)),
        ("dgx1", (0,)),
    ],
)
def test_only_gpus_with_a_nic_of_their_own_get_a_second_rail(spec, offsets):
    assert rail_offsets(build(spec).without_switches()) == offsets


def test_hgx_two_nodes_allgather_crosses_hosts_along_both_rails_past_the_one_rail_optimum():
    # one rail per GPU: the NVSwitch port takes 14 of 15 slices, 96.4% of the bound at best
    topology = build("hgx_h100:nodes=2")
    options = MilpOptions(size=GB, time_limit=idle_s(4.0), workers=2)  # the 97% needs 4 s of an idle machine
    schedule = solve(topology, Collective("allgather", 16, 4), options)
    require_valid(schedule, topology)
    cross = {
        (local(topology, s.dst) - local(topology, s.src)) % 8
        for _, s in sends(schedule)
        if topology.hosts[s.src] != topology.hosts[s.dst]
    }
    assert cross == {0, 1}
    assert lower_bound_us(topology, schedule.collective, GB) / predict_us(schedule, topology, GB) >= 0.97


def test_trees_split_crosses_hosts_only_by_the_trees_hops():
    spec = "hgx_h100:nodes=2,gpus=4"
    topology, schedule = milp(spec, Sketch(hierarchy="trees"))
    c = schedule.collective.chunks
    forest = allgather_forest(topology, TreeOptions(k=c))
    assert schedule.meta.options["hierarchy"] == "trees"
    for _, s in sends(schedule):
        if topology.hosts[s.src] != topology.hosts[s.dst]:
            owner, j = divmod(s.chunk, c)
            assert (s.src, s.dst) in forest.trees_of(owner)[j % c].hops


def test_no_split_is_the_whole_model():
    _, schedule = milp("hgx_h100:nodes=2,gpus=2", Sketch(hierarchy="none"))
    assert schedule.meta.options["hierarchy"] == "none"


def test_latency_bound_sizes_keep_the_whole_model():
    _, schedule = milp("hgx_h100:nodes=2,gpus=2", size=1 << 10, chunks=1)
    assert schedule.meta.options["hierarchy"] == "none"


def test_the_split_costs_nothing_where_a_host_is_one_switch():
    """On a 2 x 2 NVSwitch fabric both models reach the same optimum at 1 GB."""
    topology, split = milp("hgx_h100:nodes=2,gpus=2")
    _, whole = milp("hgx_h100:nodes=2,gpus=2", Sketch(hierarchy="none"))
    assert split.meta.options["status"] == whole.meta.options["status"] == "optimal"
    assert predict_us(split, topology, GB) == pytest.approx(predict_us(whole, topology, GB), rel=1e-6)


def test_symmetry_across_and_inside_hosts_is_found_without_a_sketch():
    topology, schedule = milp("hgx_h100:nodes=2,gpus=4")
    assert (schedule.meta.options["symmetry_offset"], schedule.meta.options["symmetry_local"]) == (4, 1)
    n, c = topology.nranks, schedule.collective.chunks
    across = [(r + 4) % n for r in range(n)]
    inside = [r - r % 4 + (r + 1) % 4 for r in range(n)]
    for perm in (across, inside):
        for step in schedule.steps:
            moved = {(perm[s.chunk // c] * c + s.chunk % c, perm[s.src], perm[s.dst]) for s in step.sends}
            assert moved == {(s.chunk, s.src, s.dst) for s in step.sends}


def test_dgx2_pairs_rotate_by_the_nic_they_share():
    topology = build("dgx2:nodes=2").without_switches()
    collective = Collective("allgather", 32, 4)
    links = allowed_links(topology, collective, Sketch(), collective.chunk_bytes(GB))
    symmetry = auto_symmetry(topology, collective, links)
    assert (symmetry.offset, symmetry.local) == (16, 2)


def test_a_sketch_offset_is_the_only_symmetry():
    _, schedule = milp("hgx_h100:nodes=2,gpus=4", Sketch(rank_offset=4), chunks=1)
    assert (schedule.meta.options["symmetry_offset"], schedule.meta.options["symmetry_local"]) == (4, None)


def test_no_symmetry_is_imposed_on_a_single_host():
    _, schedule = milp("ring:n=4", chunks=1)
    assert schedule.meta.options["symmetry_offset"] is None


@pytest.mark.parametrize("name", ["alltoall", "reducescatter", "allreduce"])
def test_other_collectives_verify_with_the_split(name):
    # the sketch asks for the split (without one, allreduce there takes the reduce-broadcast form, which has none)
    topology, schedule = milp("hgx_h100:nodes=2,gpus=2", Sketch(hierarchy="rails"), chunks=1, name=name)
    assert schedule.meta.options["hierarchy"] == "rails"
    assert predict_us(schedule, topology, GB) >= lower_bound_us(topology, schedule.collective, GB) * (1 - 1e-9)


def test_the_hint_pipelines_a_slices_chunks_a_step_apart():
    topology = build("line:n=3")
    collective = Collective("allgather", 3, 3)
    links = allowed_links(topology, collective, Sketch(), collective.chunk_bytes(GB))
    hint = shortest_path_sends(FlowSpec(topology, collective, 8, collective.chunk_bytes(GB), links))
    first = {c: min(k for cc, _, _, k in hint if cc == c) for c in range(collective.nchunks)}
    assert [first[c] for c in range(3)] == [1, 2, 3]  # rank 0's three chunks leave in steps 1, 2, 3


def test_hierarchy_field_round_trips_and_a_bad_one_names_the_field():
    sketch = Sketch(hierarchy="trees", source="s.json")
    assert parse_sketch(json.loads(json.dumps(sketch.to_json())), "s.json") == sketch
    with pytest.raises(SketchError, match="sketch s.json: hierarchy: must be one of rails, trees, none"):
        parse_sketch({"format": "weft.sketch/1", "hierarchy": "flat"}, "s.json")


def test_committed_dgx2_pair_milp_reaches_90_percent_within_its_limit():
    """The README's claim: milp on dgx2:nodes=2 allgather at 1 GB, verified, >= 90% of the bound in 120 s."""
    doc = json.loads(RESULTS.read_text())
    row = next(
        r
        for r in doc["rows"]
        if r["topology"] == "dgx2:nodes=2"
        and r["size"] == GB
        and r["method"] == "milp"
        and r.get("variant", "default") == "default"
    )
    assert doc["time_limit_s"] <= 120 and row["solve_s"] <= doc["time_limit_s"]
    assert 90.0 <= row["pct_of_bound"] <= 100.0 and row["verified"]


def test_every_committed_milp_solve_stayed_inside_its_time_limit():
    doc = json.loads(RESULTS.read_text())
    assert all(r["solve_s"] <= doc["time_limit_s"] for r in doc["rows"] if r["method"] == "milp")


def test_default_chunks_across_hosts_leave_room_to_pipeline():
    assert default_chunks(build("dgx2:nodes=2"), Collective("allgather", 32), GB) == 4
    assert default_chunks(build("ring:n=32"), Collective("allgather", 32), GB) == 2
