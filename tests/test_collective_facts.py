"""Issue 20 item 13: every stage asks the Collective type for a collective's facts."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from schedules.collectives import NAMES, PLAN_ONLY, Chunking, Collective, Holding, facts_of, slice_chunks

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", NAMES)
def test_facts_agree_with_the_chunk_maps(name: str) -> None:
    n = 4
    c = Collective(name, n, chunks=2, root=1)
    ins = [len(c.input_map(r)) for r in range(n)]
    outs = [len(c.output_map(r)) for r in range(n)]
    assert c.input_fraction == Fraction(ins[0], c.size_chunks)
    assert c.output_fraction == Fraction(outs[0], c.size_chunks)
    assert max(c.input_fraction, c.output_fraction) == 1  # the message size is the larger buffer
    # the in-place rule: the smaller buffer is the rank's own slice of the larger one
    for r in range(n):
        off_in, off_out = c.inplace_offsets(r, ins[r], outs[r])
        big = c.output_map(r) if outs[r] >= ins[r] else c.input_map(r)
        if c.input_is_slice:
            assert big[off_in : off_in + ins[r]] == c.input_map(r) and off_out == 0
        elif c.output_is_slice:
            assert big[off_out : off_out + outs[r]] == c.output_map(r) and off_in == 0
        else:
            assert (off_in, off_out) == (0, 0)
    assert c.dual.dual == c and c.dual.nranks == n and c.dual.root == 1


def test_named_facts() -> None:
    assert Collective("allreduce", 8).bus_factor == pytest.approx(14 / 8)
    assert Collective("broadcast", 8).bus_factor == 1.0 and Collective("allgather", 8).bus_factor == 7 / 8
    assert Collective("reducescatter", 4).dual.name == "allgather"
    assert Collective("reduce", 4, root=2).dual == Collective("broadcast", 4, root=2)
    assert Collective("gather", 4).dual.name == "scatter"
    assert Collective("allgather", 4).input_fraction == Fraction(1, 4)
    assert Collective("reducescatter", 4).output_fraction == Fraction(1, 4)
    assert Collective("gather", 3).rooted and not Collective("alltoall", 3).rooted
    assert Collective("reduce", 3).combining and not Collective("scatter", 3).combining


def test_the_inplace_slice_rule_is_written_once() -> None:
    """codegen, the reference executor and the GPU executor ask Collective.inplace_offsets."""
    pattern = re.compile(r'in \("allgather", "gather"\)|in \("reducescatter", "scatter"\)|"gather": \("i"')
    for path in (
        "codegen/buffers.py",
        "executor/reference/machine.py",
        "executor/gpu/engine.py",
        "executor/gpu/bench.py",
        "weft/plots.py",
    ):
        text = (ROOT / path).read_text()
        assert not pattern.search(text), path
        assert "BUS_FACTOR" not in text and '"allreduce": lambda n' not in text, path


def test_one_public_communicator_one_wrong_result() -> None:
    import executor
    import executor.errors
    import executor.reference.machine

    assert "PlanCommunicator" not in executor.__all__ and "Communicator" in executor.__all__
    assert executor.reference.machine.WrongResult is executor.errors.WrongResult
    src = (ROOT / "executor/gpu/engine.py").read_text() + (ROOT / "executor/inference/communicator.py").read_text()
    assert src.count("class Communicator") == 1
    classes = [
        p
        for p in ROOT.glob("**/*.py")
        if "class FrontierPoint" in p.read_text()
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
        and "tests" not in p.parts
    ]
    assert len(classes) == 1, classes


def _having(fact: str) -> set[str]:
    return {name for name in NAMES + PLAN_ONLY if getattr(facts_of(name), fact)}


def test_each_fact_names_its_collectives() -> None:
    """Issue 34: the facts the stages branch on, each true of exactly these collectives."""
    assert _having("rooted") == {"broadcast", "reduce", "gather", "scatter"}
    assert _having("from_root") == {"broadcast", "scatter"} and _having("to_root") == {"reduce", "gather"}
    assert _having("combining") == {"reducescatter", "allreduce", "reduce"}
    assert _having("same_to_all") == {"allgather", "allreduce", "broadcast"}
    assert _having("spanning") == {"allgather", "reducescatter", "allreduce", "broadcast", "reduce"}
    assert _having("sums_everywhere") == {"allreduce"} and _having("shifts") == {"sendrecv"}
    assert _having("from_dual") == {"reducescatter", "reduce"}
    assert _having("phases") == {"allreduce"}
    assert {n for n in NAMES + PLAN_ONLY if facts_of(n).chunking is Chunking.SHARED} == {"broadcast", "reduce"}
    assert {n for n in NAMES + PLAN_ONLY if facts_of(n).chunking is Chunking.BLOCKS} == {"alltoall"}
    assert facts_of("reducescatter").msccl_coll == "reduce_scatter" and facts_of("allgather").msccl_coll == ""
    assert facts_of("allreduce").torch_op == "all_reduce" and facts_of("gather").torch_op is None


def test_the_dual_of_a_reversed_schedule_is_copy_only_where_it_combines() -> None:
    for name in NAMES:
        facts = facts_of(name)
        assert facts.dual is not None and facts_of(facts.dual).dual == name
        assert facts.from_dual == (facts.combining and not facts_of(facts.dual).combining)


def test_allreduce_runs_as_reducescatter_then_allgather() -> None:
    c = Collective("allreduce", 4, 3)
    assert c.phases == (Collective("reducescatter", 4, 3), Collective("allgather", 4, 3))
    assert all(p.nchunks == c.nchunks for p in c.phases)  # the halves number the chunks as allreduce does
    assert Collective("reduce", 4, 2, root=3).phases == (Collective("reduce", 4, 2, root=3),)


def test_the_conditions_are_the_holdings_of_the_facts() -> None:
    """Rank r's pre- and postconditions read off the facts' Holding, for every collective."""
    n, c = 4, 2
    for name in NAMES + PLAN_ONLY:
        coll = Collective(name, n, c, root=1)
        for r in range(n):
            for holding, held in ((coll.facts.starts, coll.precondition(r)), (coll.facts.ends, coll.postcondition(r))):
                if holding is Holding.SLICE:
                    assert held == set(range(r * c, r * c + c))
                elif holding is Holding.PREVIOUS:
                    assert held == set(range((r - 1) % n * c, (r - 1) % n * c + c))
                elif holding is Holding.ROOT:
                    assert held == (set(range(coll.nchunks)) if r == 1 else set())
                elif holding is Holding.ALL:
                    assert held == set(range(coll.nchunks))
                else:  # alltoall's blocks (s, d): its row as a source, its column as a destination
                    blocks = {k // c for k in held}
                    want = {r * n + d for d in range(n)} if holding is Holding.ROW else {s * n + r for s in range(n)}
                    assert blocks == want


@pytest.mark.parametrize("name", NAMES + PLAN_ONLY)
def test_a_plans_buffers_give_back_its_chunks_per_slice(name: str) -> None:
    for n, c in ((2, 1), (4, 3)):
        coll = Collective(name, n, c)
        assert slice_chunks(name, n, len(coll.input_map(0)), len(coll.output_map(0))) == c


def test_a_plan_says_its_collectives_facts() -> None:
    from codegen import compile_schedule
    from schedules.plan.io import load_plan
    from synth.baselines import direct
    from topologies.catalog import build

    fc4 = build("fully_connected:n=4")
    plan = compile_schedule(direct(fc4, Collective("reducescatter", 4)), fc4)
    assert plan.facts is facts_of("reducescatter") and plan.facts.output_is_slice
    unit = load_plan(ROOT / "tests/fixtures/mscclpp/plans/unit_tests-put_packet_test.json")
    assert not unit.checkable and unit.facts is None  # MSCCL++'s unit-test plans define no result
