"""The compact schedule form (weft.schedule/2): a compact schedule and its expansion verify and price alike,
the file round-trips, and a compact schedule that is not what it claims is refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from schedules.collectives import Collective
from schedules.compact import TooLarge, expand
from schedules.cost import loads
from schedules.schedule import COMPACT_FORMAT, Step, Symmetry, dumps_schedule, parse_schedule
from schedules.verify import verify
from synth import baselines
from topologies.catalog import build

SYMMETRIC = ("allgather", "reducescatter", "allreduce")
FABRICS = {  # where each baseline exists: the ring on any cycle, direct on all pairs, rhd on partners
    "ring": ("ring:n=5", "hgx_h100:nodes=2", "dgx1"),
    "direct": ("fully_connected:n=4", "hgx_h100:nodes=2"),
    "twoshot": ("fully_connected:n=4", "hgx_h100:nodes=2"),
    "rhd": ("hypercube:d=3", "hgx_h100:nodes=2"),
}
NAMES = {"ring": SYMMETRIC, "direct": ("allgather", "reducescatter", "alltoall"), "twoshot": ("allreduce",),
         "rhd": SYMMETRIC}
CASES = [(spec, method, name) for method, specs in FABRICS.items() for spec in specs for name in NAMES[method]]
SIZES = (1 << 10, 3 << 20, 1 << 30)


def _compact(spec: str, method: str, name: str, chunks: int = 1):
    topology = build(spec)
    return topology, getattr(baselines, method)(topology, Collective(name, topology.nranks, chunks))


@pytest.mark.parametrize("spec,method,name", CASES)
def test_a_compact_baseline_and_its_expansion_verify_and_price_alike(spec, method, name):
    topology, schedule = _compact(spec, method, name)
    assert schedule.symmetries, "the baseline is written in the compact form"
    explicit = expand(schedule)
    assert not explicit.symmetries and explicit.nsends == schedule.nsends
    assert explicit.nsends > sum(len(step.sends) for step in schedule.steps)
    assert verify(schedule, topology).ok and verify(explicit, topology).ok
    compact_us = loads(schedule, topology).predict_many_us(SIZES)
    explicit_us = loads(explicit, topology).predict_many_us(SIZES)
    assert compact_us == pytest.approx(explicit_us, rel=1e-12)


def test_the_compact_file_round_trips_and_names_its_format():
    _, schedule = _compact("hgx_h100:nodes=2", "ring", "allreduce")
    doc = json.loads(dumps_schedule(schedule))
    assert doc["format"] == COMPACT_FORMAT and doc["nsends"] == schedule.nsends
    back = parse_schedule(doc, "ring.json")
    assert back == schedule and back.content_hash == schedule.content_hash


def test_an_explicit_schedule_is_still_written_and_read_as_weft_schedule_1():
    _, schedule = _compact("ring:n=5", "ring", "broadcast")
    doc = json.loads(dumps_schedule(schedule))
    assert doc["format"] == "weft.schedule/1" and parse_schedule(doc, "b.json") == schedule


def _refused(schedule, topology) -> str:
    result = verify(schedule, topology)
    assert not result.ok
    return result.errors[0]


def test_a_compact_schedule_missing_one_listed_send_is_refused_as_its_expansion_is():
    """Each listed send of a ring all-reduce dropped in turn: the orbit simulation fails exactly where the expanded
    schedule fails (dropping a listed send drops its every image)."""
    topology, schedule = _compact("ring:n=4", "ring", "allreduce")
    for i, step in enumerate(schedule.steps):
        for j in range(len(step.sends)):
            sends = step.sends[:j] + step.sends[j + 1:]
            broken = replace(schedule, steps=schedule.steps[:i] + (Step(step.rounds, sends),) + schedule.steps[i + 1:])
            assert not verify(broken, topology).ok
            assert not verify(expand(broken), topology).ok


def test_a_symmetry_that_does_not_return_to_the_identity_is_refused():
    topology, schedule = _compact("ring:n=4", "ring", "allgather")
    g = schedule.symmetries[0]
    short = replace(schedule, symmetries=(Symmetry(g.ranks, g.chunks, 2),))
    assert "is not the identity" in _refused(short, topology)


def test_a_symmetry_that_moves_ranks_but_not_their_slices_is_refused():
    """Rotating the ranks while leaving every chunk in place breaks the precondition's invariance: that
    would make the listed rank's sends stand for sends of chunks the other ranks do not hold."""
    topology, schedule = _compact("fully_connected:n=4", "direct", "allgather")
    g = schedule.symmetries[0]
    frozen = replace(schedule, symmetries=(Symmetry(g.ranks, tuple(range(len(g.chunks))), g.order),))
    assert "precondition is not invariant" in _refused(frozen, topology)


def test_generators_that_do_not_commute_are_refused():
    topology, schedule = _compact("fully_connected:n=4", "direct", "allgather")
    swap = Symmetry((1, 0, 2, 3), (1, 0, 2, 3), 2)
    assert "do not commute" in _refused(replace(schedule, symmetries=schedule.symmetries + (swap,)), topology)


def test_an_image_over_a_missing_link_is_refused():
    """A ring's listed sends (chunk 0 from rank 0 on to rank 3) all lie on a line of 4, but their rotations
    wrap around from rank 3 to rank 0, which a line lacks."""
    _, schedule = _compact("ring:n=4", "ring", "allgather")
    line = build("line:n=4")
    assert all(line.has_link(s.src, s.dst) for step in schedule.steps for s in step.sends)
    assert "no link 3->0" in _refused(replace(schedule, topology=line.fingerprint), line)


def test_writing_out_past_the_limit_is_refused_in_one_line(monkeypatch):
    import schedules.compact as compact

    _, schedule = _compact("hgx_h100:nodes=2", "ring", "allreduce")
    monkeypatch.setattr(compact, "MAX_WRITTEN_SENDS", schedule.nsends - 1)
    with pytest.raises(TooLarge, match="MAX_WRITTEN_SENDS"):
        expand(schedule)
