"""weftcore.gcpause: the cyclic collector paused while plans are parsed, and given back as it was."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from registry.store import Registry
from schedules.plan import io as plan_io
from schedules.plan.io import load_plan
from weftcore.gcpause import collector_paused

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "tests" / "fixtures" / "plans" / "allpairs_allreduce_2.json"


@pytest.fixture
def collector():
    """The collector enabled for the test and as it was after it."""
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_a_pause_gives_the_collector_back_as_it_was_even_nested_or_raising(collector):
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause found it paused and leaves it so
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()  # a caller who turned it off keeps it off
    with collector_paused():
        pass
    assert not gc.isenabled()


def _seen_paused(monkeypatch, module, name):
    """Wrap ``module.name`` to record whether the collector ran while it did."""
    seen = []
    inner = getattr(module, name)

    def wrapped(*args, **kwargs):
        seen.append(gc.isenabled())
        return inner(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return seen


def test_parsing_a_plan_and_loading_a_registry_run_paused_and_end_enabled(collector, monkeypatch):
    seen = _seen_paused(monkeypatch, plan_io, "_parse_plan")
    plan = load_plan(PLAN)
    assert plan.gpus and seen == [False] and gc.isenabled()
    read = _seen_paused(monkeypatch, Registry, "_parse")  # the entry files' JSON is decoded there too
    entries = Registry(str(ROOT / "bench" / "registry_h200x2")).entries()
    assert len(entries) > 10 and len(read) == len(entries) and not any(read) and gc.isenabled()
