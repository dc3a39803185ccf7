"""The GPU job's cases (tests/gpu/scenarios.py), counted on the CPU: no committed test plan is left without a case.

The worker runs every plan at each size it accepts; a plan that accepted none of the sizes would drop out of the GPU
job silently, so each plan must get a case, in every dtype its chunks allow, for every rank count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import scenarios  # noqa: E402


@pytest.mark.parametrize("nranks", [2, 4, 8])
def test_every_test_plan_gets_cases(nranks):
    cases = scenarios.correctness_cases(nranks)
    covered = {Path(c.plan).name for c in cases}
    files = {p.name for p in scenarios.plan_files(nranks)}
    assert len(files) >= 27 and covered == files, sorted(files - covered)
    # the sizes off the granule (3MB+48: padding or whole parts) and the large sizes run somewhere
    assert {c.size for c in cases} == set(scenarios.SIZES)
    for name in scenarios.GRAPH_PLANS:
        assert name in covered


def test_residual_and_line_cases_exist():
    assert len(scenarios.residual_cases(2)) >= 10
    assert any(lined for _, _, lined in scenarios.residual_cases(2))
    assert len(scenarios.line_cases(2)) >= 10


def test_torch_jobs_time_each_scenario_and_record_a_failure_as_its_result(tmp_path, monkeypatch):
    """tests/gpu/torch_job.run_scenarios: every scenario runs though one raises, and rank 0 appends each one's
    seconds to WEFT_TEST_TIMINGS (bench/gpu_gate.sh's scenario_seconds file), with the phases a scenario timed."""
    import json

    import torch_job

    timings = tmp_path / "seconds.jsonl"
    monkeypatch.setenv("WEFT_TEST_TIMINGS", str(timings))
    monkeypatch.setenv("WORLD_SIZE", "2")

    def fails() -> dict:
        raise ValueError("no such plan")

    phased = {"ok": 1, "phases_s": {"communicator": 1.5}}
    torch_job.run_scenarios(0, tmp_path, {"first": lambda: phased, "second": fails, "third": lambda: {}})
    results = json.loads((tmp_path / "rank0.json").read_text())
    assert results["first"] == phased and results["third"] == {}
    assert results["second"]["error"] == "ValueError: no such plan"
    rows = [json.loads(line) for line in timings.read_text().splitlines()]
    assert [r["scenario"] for r in rows] == ["first", "second", "third"]
    assert all(r["seconds"] >= 0 and r["world"] == "2" for r in rows)
    assert rows[0]["phases_s"] == {"communicator": 1.5} and "phases_s" not in rows[2]  # a scenario's own phases
    torch_job.run_scenarios(1, tmp_path, {"first": lambda: {}})  # other ranks time nothing
    assert len(timings.read_text().splitlines()) == 3
