"""A fabric's fingerprint ignores what its switches are called (the README's promise), and only that: a fabric with
its switches renamed is the catalog's fabric for verify and select; a fabric wired differently is not."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies.catalog import build
from topologies.topology import Link, Topology
from weft.cli import main

CATALOG = "hgx_h100:nodes=2,gpus=4"


def renamed(topology: Topology, names: dict[str, str]) -> dict:
    """The topology's file with every switch renamed (and the topology too)."""
    doc = topology.to_json()
    move = lambda v: names.get(v, v) if isinstance(v, str) else v  # noqa: E731
    doc["name"] = "my-cluster"
    doc["switches"] = [names[s] for s in doc["switches"]]
    for link in doc["links"]:
        link["src"], link["dst"] = move(link["src"]), move(link["dst"])
    return doc


NAMES = {"n0.nvswitch": "tray-B", "n1.nvswitch": "tray-A", "ib": "spine"}


@pytest.fixture
def mine(tmp_path):
    path = tmp_path / "my-cluster.json"
    path.write_text(json.dumps(renamed(build(CATALOG), NAMES)))
    return path


def test_renaming_every_switch_keeps_the_fingerprint(mine):
    from topologies import resolve

    assert set(build(CATALOG).switches) == set(NAMES)
    assert resolve(str(mine)).fingerprint == build(CATALOG).fingerprint


def test_moving_a_gpu_to_the_other_tray_changes_the_fingerprint():
    doc = build(CATALOG).to_json()
    for link in doc["links"]:  # GPU 0's NVLinks go to host 1's tray: another fabric, with the same switch names
        if 0 in (link["src"], link["dst"]) and "n0.nvswitch" in (link["src"], link["dst"]):
            link["src"], link["dst"] = [
                ("n1.nvswitch" if v == "n0.nvswitch" else v) for v in (link["src"], link["dst"])
            ]
    from topologies.io import parse_topology

    assert parse_topology(doc, "moved").fingerprint != build(CATALOG).fingerprint


def _cycle(order: str, pairs: bool) -> Topology:
    """Four switches refinement cannot tell apart, linked as one 4-cycle or as two 2-cycles."""
    a, b, c, d = list(order)
    cycle = [(a, b), (b, a), (c, d), (d, c)] if pairs else [(a, b), (b, c), (c, d), (d, a)]
    links = [link for s in "ABCD" for link in (Link(0, s, 10.0), Link(s, 1, 10.0))] + [Link(1, 0, 10.0)]
    return Topology("cycles", 2, tuple(links + [Link(x, y, 5.0) for x, y in cycle]), tuple("ABCD"))


def test_switches_that_only_their_order_tells_apart_are_still_named_by_structure():
    one = {_cycle("".join(p), pairs=False).fingerprint for p in itertools.permutations("ABCD")}
    two = {_cycle("".join(p), pairs=True).fingerprint for p in itertools.permutations("ABCD")}
    assert len(one) == 1 and len(two) == 1 and one != two


def test_fabrics_without_switches_keep_their_fingerprint_and_switched_ones_answer_to_their_old_one():
    assert build("dgx1").fingerprints == ("topo-da02cde4d62e23b4",)  # as recorded before this change
    assert build("hgx_h200:gpus=2").fingerprints[1] == "topo-57fe5eed9a547d8b"  # bench/registry_h200x2's key


def test_verify_accepts_a_schedule_for_the_renamed_fabric_against_the_catalog_name(mine, tmp_path, capsys):
    out = tmp_path / "ring.json"
    assert main(["synth", "allgather", "-t", str(mine), "--method", "ring", "-o", str(out)]) == 0
    assert main(["verify", str(out), "-t", CATALOG]) == 0
    capsys.readouterr()


def test_select_on_the_renamed_fabric_serves_the_catalog_fabrics_plans(mine, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WEFT_REGISTRY", str(tmp_path / "registry"))
    assert main(["synth", "allgather", "-t", CATALOG, "--method", "ring", "--commit"]) == 0
    capsys.readouterr()
    assert main(["registry", "select", "-t", str(mine), "allgather", "--size", "1MB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entry"] is not None


def test_the_committed_registry_still_serves_its_fabric(capsys):
    from pathlib import Path

    from registry.store import Registry

    registry = Registry(str(Path(__file__).parents[1] / "bench" / "registry_h200x2"))
    assert registry.select(build("hgx_h200:gpus=2").fingerprints, "allreduce", 1 << 20).entry is not None


SWITCHED = ("hgx_h100:nodes=2,gpus=4", "ndv2:nodes=2", "dgx2:nodes=2", "mi250:nodes=2", "hgx_h200:nodes=3,gpus=2")


@settings(max_examples=25, deadline=None)
@given(spec=st.sampled_from(SWITCHED), seed=st.integers(0, 2**32 - 1))
def test_any_renaming_of_a_catalog_fabrics_switches_keeps_its_fingerprint(spec, seed):
    import random

    from topologies.io import parse_topology

    fabric = build(spec)
    names = list(fabric.switches)
    random.Random(seed).shuffle(names)  # each switch takes another's name, or a fresh one
    doc = renamed(
        fabric, {old: f"{new}-{i % 2}" for i, (old, new) in enumerate(zip(fabric.switches, names, strict=True))}
    )
    assert parse_topology(doc, spec).fingerprint == fabric.fingerprint
