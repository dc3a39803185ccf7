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
