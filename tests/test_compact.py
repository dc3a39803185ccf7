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
    "ring": ("ring:n=5", "hgx_h100:nodes=2", "hgx_h200:gpus=4"),  # cycles in rank order
    "direct": ("fully_connected:n=4", "hgx_h100:nodes=2"),
    "twoshot": ("fully_connected:n=4", "hgx_h100:nodes=2"),
    "rhd": ("hypercube:d=3", "hgx_h100:nodes=2"),
}
NAMES = {
    "ring": SYMMETRIC,
    "direct": ("allgather", "reducescatter", "alltoall"),
    "twoshot": ("allreduce",),
    "rhd": SYMMETRIC,
}
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
            sends = step.sends[:j] + step.sends[j + 1 :]
            broken = replace(schedule, steps=schedule.steps[:i] + (Step(step.rounds, sends),) + schedule.steps[i + 1 :])
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


# ---- waves: a pipelined tree allgather, one wave listed and shifted ----------------------------------------


def _pipelined(spec: str, waves: int):
    from synth.trees import pipeline

    topology = build(spec)
    pipe = pipeline(topology, Collective("allgather", topology.nranks)).with_waves(waves)
    return topology, pipe


@pytest.mark.parametrize("spec,waves", [("hgx_h100:nodes=2", 5), ("dgx1", 3)])
def test_a_compact_pipeline_is_the_expanded_one_and_prices_as_the_pipeline_predicts(spec, waves):
    topology, pipe = _pipelined(spec, waves)
    compact, explicit = pipe.compact(), pipe.expand()
    assert compact.symmetries[0].shift == 1 and compact.nsteps == explicit.nsteps
    assert compact.total_rounds == explicit.total_rounds and compact.nsends == explicit.nsends
    written = expand(compact)
    assert [sorted(map(repr, a.sends)) for a in written.steps] == [sorted(map(repr, b.sends)) for b in explicit.steps]
    assert verify(compact, topology).ok
    assert loads(compact, topology).predict_many_us(SIZES) == pytest.approx(
        [pipe.predict_us(size) for size in SIZES], rel=1e-12
    )
    assert parse_schedule(json.loads(dumps_schedule(compact)), "trees.json") == compact


def test_a_shifting_symmetry_that_moves_ranks_is_refused():
    topology, pipe = _pipelined("hgx_h100:nodes=2", 3)
    compact = pipe.compact()
    g = compact.symmetries[0]
    cycle = (1, 2, 0) + tuple(range(3, 16))  # order 3, as the wave shift's
    moved = replace(compact, symmetries=(Symmetry(cycle, g.chunks, g.order, 1),))
    assert "must leave every rank in place" in _refused(moved, topology)


def test_step_rounds_that_do_not_count_the_waves_are_refused():
    topology, pipe = _pipelined("hgx_h100:nodes=2", 3)
    compact = pipe.compact()
    assert "step_rounds: " in _refused(replace(compact, step_rounds=compact.step_rounds[:-1]), topology)


def test_a_wave_whose_images_meet_the_listed_chunks_is_refused():
    """A shift of order 3 over chunks that only swap in pairs would land wave 2 on wave 0's chunks."""
    topology, pipe = _pipelined("hgx_h100:nodes=2", 2)
    compact = pipe.compact()
    g = compact.symmetries[0]
    again = replace(
        compact,
        symmetries=(Symmetry(g.ranks, g.chunks, 4, 1),),
        step_rounds=compact.step_rounds + compact.step_rounds[-2:],
    )
    assert "meets them again" in _refused(again, topology)


def test_a_wave_missing_one_send_is_refused():
    topology, pipe = _pipelined("hgx_h100:nodes=2", 3)
    compact = pipe.compact()
    first = compact.steps[0]
    broken = replace(compact, steps=(Step(first.rounds, first.sends[1:]),) + compact.steps[1:])
    assert "postcondition" in _refused(broken, topology)
    assert not verify(expand(broken), topology).ok


def test_weft_synth_trees_writes_the_compact_file_whose_percentage_it_prints(tmp_path, capsys):
    from schedules.bounds import lower_bound_us
    from schedules.schedule import load_schedule
    from weft.cli import main

    out = tmp_path / "trees.json"
    assert (
        main(["synth", "allgather", "-t", "hgx_h100:nodes=2", "--method", "trees", "--size", "1GB", "-o", str(out)])
        == 0
    )
    printed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("trees-allgather"))
    written = load_schedule(out)
    topology = build("hgx_h100:nodes=2")
    pct = 100 * lower_bound_us(topology, written.collective, 1 << 30) / loads(written, topology).predict_us(1 << 30)
    assert json.loads(out.read_text())["format"] == COMPACT_FORMAT and written.symmetries[0].shift == 1
    assert f"{pct:.1f}" == printed.split()[-1] and pct == pytest.approx(written.meta.pct_of_bound)


@pytest.mark.parametrize("spec,chunks", [("hgx_h100:nodes=2", 4), ("dgx1", 6)])
def test_a_large_tree_allreduce_is_its_first_wave_shifted_and_equals_the_written_out_tree(spec, chunks, monkeypatch):
    """At scale (past COMPACT_FROM sends) the double binary tree is written as every tree's first chunk and the
    shift to the next: the same sends, steps, rounds and price as the tree written out."""
    import importlib

    tree = importlib.import_module("synth.baselines.tree")
    topology = build(spec)
    collective = Collective("allreduce", topology.nranks, chunks)
    explicit = baselines.tree(topology, collective)
    monkeypatch.setattr(tree, "COMPACT_FROM", 0)
    compact = baselines.tree(topology, collective)
    assert compact.symmetries[0].shift == 1 and not explicit.symmetries
    assert (compact.nsteps, compact.total_rounds, compact.nsends) == (
        explicit.nsteps,
        explicit.total_rounds,
        explicit.nsends,
    )
    assert sorted(map(repr, (s for st in expand(compact).steps for s in st.sends))) == sorted(
        map(repr, (s for st in explicit.steps for s in st.sends))
    )
    assert verify(compact, topology).ok
    assert loads(compact, topology).predict_many_us(SIZES) == pytest.approx(
        loads(explicit, topology).predict_many_us(SIZES), rel=1e-12
    )


def test_weft_verify_reads_a_compact_file(tmp_path, capsys):
    from weft.cli import main

    _, schedule = _compact("hgx_h100:nodes=2", "rhd", "allreduce")
    path = tmp_path / "rhd.json"
    path.write_text(dumps_schedule(schedule))
    assert main(["verify", str(path), "-t", "hgx_h100:nodes=2"]) == 0
    assert f"({schedule.content_hash}): ok" in capsys.readouterr().out
    broken = replace(schedule, symmetries=schedule.symmetries[1:])  # one bit flip fewer: a slice never arrives
    path.write_text(dumps_schedule(broken))
    assert main(["verify", str(path), "-t", "hgx_h100:nodes=2"]) == 1
