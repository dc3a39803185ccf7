"""Issue 20 item 13: every stage asks the Collective type for a collective's facts."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from schedules.collectives import NAMES, Collective

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
