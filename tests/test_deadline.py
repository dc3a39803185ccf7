"""The command's deadline (``weft.cli.deadline``): an alarm that Python swallowed still ends the phase."""

from __future__ import annotations

import time

import pytest

from weft.cli import deadline as deadline_module
from weft.cli.deadline import Deadline, TimeLimitReached


def test_an_alarm_swallowed_once_fires_again_until_the_phase_ends(monkeypatch):
    """CI once ran `weft topo bound torus2d:x=32,y=32 --time-limit 1` for 300 s: the one alarm raised while the
    garbage collector ran a finalizer, where Python reports and drops the exception. Swallowed here by hand."""
    monkeypatch.setattr(deadline_module, "GRACE_S", 0.0)
    swallowed = 0
    spinning = Deadline("weft test", 0.05, phase="spinning")
    with pytest.raises(TimeLimitReached, match="--time-limit 0.05 s reached while spinning"), spinning:
        ends = time.monotonic() + 30
        while time.monotonic() < ends:
            try:
                while time.monotonic() < ends:
                    pass
            except TimeLimitReached:
                swallowed += 1
                if swallowed > 1:
                    raise
    assert swallowed == 2


def test_no_alarm_outlives_the_phase(monkeypatch):
    """Once the context closes, the repeating alarm is off: nothing raises afterwards."""
    monkeypatch.setattr(deadline_module, "GRACE_S", 0.0)
    with Deadline("weft test", 0.05):
        pass
    time.sleep(0.7)  # past the first alarm and one repeat


def test_a_quiet_phase_says_what_it_is_doing(monkeypatch):
    """Issue 39.3: `weft synth allgather -t ring:n=5000 --method ring` ran past 30 s without a word. A phase quiet
    for QUIET_S now names itself on the progress callback (the CLI prints it on stderr), every QUIET_S."""
    monkeypatch.setattr(deadline_module, "QUIET_S", 0.01)
    lines: list[str] = []
    with Deadline("weft synth", 60.0, progress=lines.append) as deadline:
        deadline.phase = "synthesizing allgather on ring:n=5000 (ring)"
        ends = time.monotonic() + 30
        while len(lines) < 2 and time.monotonic() < ends:
            time.sleep(0.01)
    assert len(lines) >= 2 and lines[-1].startswith("weft synth: synthesizing allgather on ring:n=5000 (ring) (")
