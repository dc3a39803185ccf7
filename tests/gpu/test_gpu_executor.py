"""The GPU executor against NCCL on real GPUs: every plan, size and dtype; graphs; timeouts; refusals."""

from __future__ import annotations

import pytest
import scenarios
from conftest import nproc

pytestmark = pytest.mark.gpu

CASES = scenarios.correctness_cases(nproc())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan_matches_nccl(gpu_results, case):
    for rank, results in enumerate(gpu_results):
        r = results["cases"][case.id]
        assert r["ok"], f"rank {rank}: {r}"


LINE_CASES = scenarios.line_cases(nproc())


@pytest.mark.parametrize("case", LINE_CASES, ids=[c.id for c in LINE_CASES])
def test_plan_with_ll128_lines_matches_nccl(gpu_results, case):
    for rank, results in enumerate(gpu_results):
        r = results["lines"][case.id]
        assert r["ok"], f"rank {rank}: {r}"


RESIDUAL_CASES = [run_id for run_id, _, _ in scenarios.residual_cases(nproc())]


@pytest.mark.parametrize("case", RESIDUAL_CASES)
def test_plan_adding_a_residual_equals_the_plans_sum_then_the_add(gpu_results, case):
    for rank, results in enumerate(gpu_results):
        r = results["residual"][case]
        assert r["ok"], f"rank {rank}: {r}"


@pytest.mark.parametrize("name", scenarios.LINE_GRAPH_PLANS)
def test_graph_with_ll128_lines_replays_100_times(gpu_results, name):
    for rank, results in enumerate(gpu_results):
        r = results["lines_graph"][name]
        assert r.get("wrong") == 0 and r["replays"] == 100, f"rank {rank}: {r}"


@pytest.mark.parametrize("name", scenarios.GRAPH_PLANS)
def test_graph_of_ten_executions_replays_100_times(gpu_results, name):
    for rank, results in enumerate(gpu_results):
        r = results["graph"][name]
        assert r.get("wrong") == 0 and r["replays"] == 100, f"rank {rank}: {r}"


def test_wait_never_signalled_times_out_on_every_rank(gpu_results):
    for rank, results in enumerate(gpu_results):
        t = results["timeout"]
        assert t.get("raised"), f"rank {rank}: {t}"
        assert t["raised"]["rank"] == rank and t["raised"]["threadblock"] == 0 and t["raised"]["op"] == 0
        assert t["elapsed_s"] < t["timeout_s"] + 10


def test_next_execution_after_timeout_is_correct(gpu_results):
    assert all(r["timeout"].get("next_ok") for r in gpu_results)


def test_plan_for_another_world_size_is_refused(gpu_results):
    written = 4 if len(gpu_results) == 2 else 2
    for results in gpu_results:
        assert f"written for {written} ranks, but the communicator has {len(gpu_results)}" in (
            results["refusals"]["world_size"] or ""
        )


def test_size_outside_the_plans_range_is_refused(gpu_results):
    for results in gpu_results:
        assert "is not accepted" in results["refusals"]["size"]


def test_an_out_of_place_plan_whose_output_is_its_input_runs_right_even_when_asked_compiled(gpu_results):
    for rank, results in enumerate(gpu_results):
        assert results["overlap"].get("ok"), f"rank {rank}: {results['overlap']}"


def test_dtype_the_plan_lacks_is_refused(gpu_results):
    for results in gpu_results:
        assert "bf16 is not among the plan's dtypes" in results["refusals"]["dtype"]
