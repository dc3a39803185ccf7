"""The suite's skip policy: on a machine without GPUs a test may skip only because it needs one.

A parameter combination that cannot exist is not generated (the tests build their cases from what exists), so a
skip in the summary always means "run this on a GPU machine". Any other skip of a test that is not a GPU test
(marked ``gpu`` or under tests/gpu/) fails, naming its reason. Linux-only checks (they read /proc) say
"needs Linux"; weft's GPU path is Linux-only too.
"""

from __future__ import annotations

import pytest

ALLOWED = ("needs a GPU", "needs Linux")


def reason_of(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def is_gpu_test(item: pytest.Item) -> bool:
    return item.get_closest_marker("gpu") is not None or "gpu" in item.path.parent.parts[-1:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or is_gpu_test(item):
        return
    reason = reason_of(report)
    if not reason.startswith(ALLOWED):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} skipped: {reason!r}. On a CPU machine a test skips only because it "
            f"needs a GPU: generate only cases that exist, and mark GPU tests with pytest.mark.gpu"
        )
