"""Test-wide settings: `weft synth` without -o and proofs write into temporary folders, never the user dirs; a test
skips only because it needs a GPU (tests/skip_policy.py)."""

import pytest
from _cache import prove_once  # noqa: F401  (the run's proof cache: a fixture for every test module)
from skip_policy import pytest_runtest_makereport  # noqa: F401  (the hook, registered by its name here)


@pytest.fixture(autouse=True)
def _schedules_folder(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WEFT_SCHEDULES", str(tmp_path_factory.mktemp("schedules")))
    # the plans this machine proved (registry select proves a plan the first time it serves it): one folder for
    # the session, never the user cache dir
    monkeypatch.setenv("WEFT_PROOFS", str(tmp_path_factory.getbasetemp() / "proofs"))
