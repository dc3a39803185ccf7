"""Test-wide settings: `weft synth` without -o writes into a temporary folder, never the user data dir."""

import pytest


@pytest.fixture(autouse=True)
def _schedules_folder(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WEFT_SCHEDULES", str(tmp_path_factory.mktemp("schedules")))
