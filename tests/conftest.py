"""Test-wide settings: `weft synth` without -o writes into a temporary folder, never the user data dir; a test
skips only because it needs a GPU (tests/skip_policy.py)."""

import pytest
from skip_policy import pytest_runtest_makereport  # noqa: F401  (the hook, registered by its name here)


@pytest.fixture(autouse=True)
def _schedules_folder(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WEFT_SCHEDULES", str(tmp_path_factory.mktemp("schedules")))
