"""The weft.topology/1 format: round trips, a fingerprint that ignores order and names, strict parsing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies import FORMAT, Link, Topology, TopologyError, load_topology, parse_topology, save_topology
from topologies.catalog import build

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "topologies" / "two_workstations.json"


def example_doc() -> dict:
    return json.loads(EXAMPLE.read_text())


# ---- the example file ---------------------------------------------------------------------------


def test_example_file_loads_with_its_switch_sharing_groups_and_hosts():
    topology = load_topology(EXAMPLE)
    assert topology.nranks == 4
    assert topology.switches == ("eth",)
    assert topology.hosts == (0, 0, 1, 1)
    assert len(topology.sharing) == 4
    assert topology.link(0, 1).capacity == pytest.approx(56.25)


def test_example_file_is_what_its_topology_writes():
    topology = load_topology(EXAMPLE)
    assert topology.to_json() == example_doc()


def test_save_then_load_keeps_topology_and_fingerprint(tmp_path):
    topology = build("mi250:nodes=2")
    save_topology(topology, tmp_path / "mi250.json")
    again = load_topology(tmp_path / "mi250.json")
    assert again == topology
    assert again.fingerprint == topology.fingerprint
    assert again.description == topology.description


# ---- the fingerprint ----------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False))
def test_fingerprint_is_stable_under_reordering_links_switches_and_groups(rnd: random.Random):
    doc = example_doc()
    for key in ("links", "sharing"):
        rnd.shuffle(doc[key])
    for group in doc["sharing"]:
        rnd.shuffle(group["links"])
    assert parse_topology(doc, "shuffled.json").fingerprint == load_topology(EXAMPLE).fingerprint


def test_fingerprint_is_stable_under_reordering_switch_declarations():
    doc = build("hgx_h100:nodes=2").to_json()
    doc["switches"] = list(reversed(doc["switches"]))
    assert parse_topology(doc, "x.json").fingerprint == build("hgx_h100:nodes=2").fingerprint


def test_fingerprint_ignores_name_and_description():
    doc = example_doc()
    doc["name"], doc["description"] = "renamed", "another description"
    assert parse_topology(doc, "x.json").fingerprint == load_topology(EXAMPLE).fingerprint


def test_fingerprint_reads_integer_and_float_figures_alike():
    doc = example_doc()
    doc["links"][4]["bandwidth"] = 12.50
    doc["links"][0]["latency"] = 0.3000000000001
    assert parse_topology(doc, "x.json").fingerprint == load_topology(EXAMPLE).fingerprint


@pytest.mark.parametrize("field, value", [("bandwidth", 13.0), ("latency", 3.0), ("count", 2)])
def test_fingerprint_changes_with_any_link_figure(field, value):
    doc = example_doc()
    doc["links"][5][field] = value
    assert parse_topology(doc, "x.json").fingerprint != load_topology(EXAMPLE).fingerprint


def test_fingerprint_changes_with_hosts():
    doc = example_doc()
    doc["hosts"] = [0, 1, 0, 1]
    assert parse_topology(doc, "x.json").fingerprint != load_topology(EXAMPLE).fingerprint


@st.composite
def small_topologies(draw) -> Topology:
    """A connected topology: a ring over the ranks plus random extra links with random figures."""
    n = draw(st.integers(2, 6))
    pairs = {(r, (r + 1) % n) for r in range(n)} | {((r + 1) % n, r) for r in range(n)}
    extra = draw(st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=8))
    pairs |= {(a, b) for a, b in extra if a != b}
    figure = st.floats(0.5, 900, allow_nan=False, allow_infinity=False)
    links = tuple(Link(a, b, draw(figure), draw(st.floats(0, 10)), draw(st.integers(1, 18))) for a, b in sorted(pairs))
    return Topology("random", n, links)


@settings(max_examples=40, deadline=None)
@given(small_topologies())
def test_any_valid_topology_round_trips_through_json_text(topology: Topology):
    text = json.dumps(topology.to_json())
    again = parse_topology(json.loads(text), "random.json")
    assert again == topology
    assert again.fingerprint == topology.fingerprint


# ---- strict parsing -----------------------------------------------------------------------------


def _error(doc: object) -> str:
    with pytest.raises(TopologyError) as info:
        parse_topology(doc, "bad.json")
    message = str(info.value)
    assert message.startswith("topology bad.json: ")
    assert "\n" not in message
    return message


def test_unknown_top_level_field_is_named():
    doc = example_doc()
    doc["linkz"] = []
    assert "'linkz': unknown field" in _error(doc)


def test_unknown_link_field_is_named():
    doc = example_doc()
    doc["links"][2]["lanes"] = 4
    assert "links[2]: unknown field 'lanes'" in _error(doc)


def test_unknown_sharing_field_is_named():
    doc = example_doc()
    doc["sharing"][1]["capacity"] = 4
    assert "sharing[1]: unknown field 'capacity'" in _error(doc)


def test_wrong_format_is_named():
    doc = example_doc()
    doc["format"] = "weft.topology/2"
    assert f"format: must be '{FORMAT}'" in _error(doc)


def test_sharing_group_over_a_missing_link_is_named():
    doc = example_doc()
    doc["sharing"][0]["links"].append([0, 3])
    assert "sharing[0].links[2]: no link 0->3" in _error(doc)


def test_sharing_group_with_a_nonsense_vertex_is_named():
    doc = example_doc()
    doc["sharing"][0]["links"].append([[0], 1])
    assert "sharing[0].links[2]: not a rank or switch" in _error(doc)


def test_huge_rank_count_is_refused_without_allocating():
    doc = example_doc()
    doc["nranks"] = 10**12
    assert "nranks: at most" in _error(doc)


def test_number_beyond_float_range_is_refused():
    doc = example_doc()
    doc["links"][0]["bandwidth"] = 10**400
    assert "links[0].bandwidth: must be a number" in _error(doc)


def test_bonded_lane_count_is_bounded():
    doc = example_doc()
    doc["links"][0]["count"] = 10**400
    assert "links[0] (0->1).count" in _error(doc)


def test_long_values_are_cut_short_in_messages():
    doc = example_doc()
    doc["name"] = ["x" * 500]
    assert len(_error(doc)) < 160


def test_error_detail_survives_a_name_holding_a_colon():
    doc = example_doc()
    doc["name"] = "lab: rack 2"
    doc["links"][1]["bandwidth"] = -1
    assert (
        _error(doc)
        == "topology bad.json: links[1] (1->0).bandwidth: must be a number of GB/s from 1e-06 to 1e+09, got -1"
    )
