"""Plans run any size in their range (issue 20 item 1): sizes that are not multiples of a plan's granule run
padded, part by part, and give the collective's result at the caller's size."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen import compile_schedule
from executor.reference.machine import round_to
from executor.reference.padded import run_any_size
from schedules.collectives import NAMES
from schedules.plan.types import PlanError
from topologies import resolve
from weft.cli import main
from weft.synthesis import synthesize

TOPOLOGY = resolve("hgx_h200:gpus=4")
N = TOPOLOGY.nranks
ROOT = 2


def _plan(name: str, inplace: bool = False):
    # two instances: two chunks per part, so a part's granule is 8 B and fp32 parts of 3 elements are off the granule
    return compile_schedule(synthesize(TOPOLOGY, name, "direct", root=ROOT), TOPOLOGY, instances=2, inplace=inplace)


def _expected(name: str, inputs: list[np.ndarray], dtype: str) -> Sequence[np.ndarray | None]:
    """numpy's definition of each collective at the caller's size, written out per collective (None: a rank of a
    rooted collective that ends with nothing defined)."""
    total = round_to(np.sum(inputs, axis=0), dtype) if name in ("allreduce", "reducescatter", "reduce") else None
    split = lambda x: np.split(x, N)  # noqa: E731
    if name == "allgather":
        return [np.concatenate(inputs)] * N
    if name == "gather":
        return [np.concatenate(inputs) if r == ROOT else None for r in range(N)]
    if name == "allreduce":
        return [total] * N
    if name == "reduce":
        return [total if r == ROOT else None for r in range(N)]
    if name == "reducescatter":
        return split(total)
    if name == "broadcast":
        return [inputs[ROOT]] * N
    if name == "scatter":
        return split(inputs[ROOT])
    assert name == "alltoall"
    return [np.concatenate([split(inputs[s])[r] for s in range(N)]) for r in range(N)]


def _inputs(name: str, nbytes: int, dtype: str, rng) -> list[np.ndarray]:
    esize = 4 if dtype == "fp32" else 2
    elems = nbytes // esize // (N if name in ("allgather", "gather") else 1)
    return [rng.integers(-8, 9, elems).astype(np.float32) for _ in range(N)]


@pytest.mark.parametrize("name", NAMES)
def test_every_collective_runs_sizes_off_the_granule_on_the_reference_executor(name):
    plan = _plan(name)
    rng = np.random.default_rng(1)
    parts = plan.message_parts
    off_granule = [n for n in (parts * 12, parts * 20, parts * 6 * 7) if not plan.accepts(n)]
    assert plan.granule > 4 and off_granule  # the sizes below really need padding
    for nbytes in off_granule:
        for dtype in ("fp32", "bf16"):
            if nbytes // parts % (4 if dtype == "fp32" else 2):
                continue
            inputs = _inputs(name, nbytes, dtype, rng)
            outputs = run_any_size(plan, inputs, nbytes, dtype)
            for r, (got, want) in enumerate(zip(outputs, _expected(name, inputs, dtype), strict=True)):
                if want is not None:
                    assert got.shape == want.shape and np.array_equal(got, want), (name, nbytes, dtype, r)


@pytest.mark.parametrize("name", ["allgather", "reducescatter", "allreduce"])
def test_inplace_plans_run_sizes_off_the_granule(name):
    plan = _plan(name, inplace=True)
    nbytes = plan.message_parts * 12
    assert not plan.accepts(nbytes) and plan.runs(nbytes)
    inputs = _inputs(name, nbytes, "fp32", np.random.default_rng(2))
    for got, want in zip(run_any_size(plan, inputs, nbytes, "fp32"), _expected(name, inputs, "fp32"), strict=True):
        assert np.array_equal(got, want)


def test_a_size_that_is_not_whole_parts_is_refused_naming_the_plan():
    plan = _plan("allgather")
    assert not plan.runs(N * 12 + 2)
    with pytest.raises(
        PlanError, match=f"plan {plan.name}: size 50 B is not a whole number of the collective's {N} equal parts"
    ):
        run_any_size(plan, [np.zeros(12)] * N, N * 12 + 2, "fp16")


def test_parts_that_are_not_whole_elements_are_refused():
    plan = _plan("allreduce")
    with pytest.raises(PlanError, match="parts of 6 B are not whole fp32 elements"):
        run_any_size(plan, [np.zeros(1)] * N, 6, "fp32")


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=1 << 22))
def test_padding_is_the_size_rounded_up_to_the_granule(nbytes):
    plan = _plan("allgather")
    in_range = plan.min_message_size <= nbytes <= plan.max_message_size
    assert plan.runs(nbytes) == (in_range and nbytes % plan.message_parts == 0)
    if plan.runs(nbytes):
        padding = plan.padding(nbytes)
        assert padding.padded_bytes % plan.granule == 0 and 0 <= padding.padded_bytes - nbytes < plan.granule
        assert plan.accepts(padding.padded_bytes) and padding.direct == plan.accepts(nbytes)
        assert padding.padded_part_bytes >= padding.part_bytes


@pytest.fixture
def registry(tmp_path, monkeypatch):
    path = tmp_path / "registry"
    monkeypatch.setenv("WEFT_REGISTRY", str(path))
    return path


def test_readme_smt_plan_is_selected_at_real_sizes(registry, capsys):
    assert (
        main(
            [
                "synth",
                "allgather",
                "-t",
                "dgx1",
                "--method",
                "smt",
                "--steps",
                "3",
                "--rounds",
                "7",
                "--chunks",
                "6",
                "--commit",
            ]
        )
        == 0
    )
    capsys.readouterr()
    for size in ("1KB", "1MB", "4MB", "1GB"):
        assert main(["registry", "select", "-t", "dgx1", "allgather", "--size", size, "--json"]) == 0, size
        chosen = json.loads(capsys.readouterr().out)
        assert chosen["entry"] and chosen["basis"] == "predicted", size
    assert main(["registry", "list", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["granule_bytes"], row["message_parts"]) == (192, 8)
    assert row["accepts"] == "0B..∞, 8 parts, granule 192B"
    assert main(["registry", "show", row["id"]]) == 0
    assert (
        "runs any size in 0B..∞ that is a whole number of 8 equal parts (one per rank): multiples of 192B "
        "directly, others padded"
    ) in capsys.readouterr().out
    assert main(["registry", "select", "-t", "dgx1", "allgather", "--size", "1001"]) == 1
    assert "is not a whole number of the collective's 8 equal parts" in capsys.readouterr().out
