"""The public facade: `import weft` is cheap, and its names reach every stage."""

from __future__ import annotations

import subprocess
import sys

import pytest

import weft


def test_import_weft_loads_no_solver_or_gpu_library():
    code = (
        "import sys, weft; weft.Topology; weft.Schedule; weft.catalog('dgx1'); "
        "print(sorted(m for m in ('z3', 'ortools', 'cupy', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_facade_synthesizes_verifies_and_compiles():
    topo = weft.catalog("ring:n=4")
    schedule = weft.synthesize(topo, "allreduce", method="ring")
    assert weft.verify(schedule, topo).ok
    plan = weft.compile(schedule, topo)
    assert plan.weft.verification["ok"] and plan.weft.verification["plan_hash"] == plan.content_hash
    assert weft.lower_bound_us(topo, schedule.collective, 1 << 20) <= weft.predict_us(schedule, topo, 1 << 20)


def test_unknown_facade_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = weft.no_such_thing
