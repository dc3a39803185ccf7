"""The compile sweep: every baseline x collective on larger and multi-host catalog topologies compiles, in place
and out of place, with one and two instances, into a plan that the reference executor proves."""

from functools import cache

import pytest

from codegen import compile_schedule
from executor.reference.prove import check_plan
from schedules.collectives import NAMES, Collective
from synth import baselines
from synth.errors import NotApplicable
from topologies.catalog import build
from weft.pipeline import check_sizes

SMALL = ("hypercube:d=3", "torus2d:x=2,y=3")
LARGE = ("dgx2", "ndv2:nodes=2", "hgx_h100:nodes=2")
DTYPES = ("fp32", "fp16", "bf16")
PLACEMENTS = ((False, 1), (True, 1), (False, 2), (True, 2))  # (inplace, instances)


@cache
def _schedule(spec: str, method: str, name: str):
    topology = build(spec)
    try:
        return topology, getattr(baselines, method)(topology, Collective(name, topology.nranks))
    except NotApplicable:
        return topology, None


def _cases():
    """Only the baselines that exist on each fabric (test_baselines checks the refusals)."""
    for spec in SMALL + LARGE:
        for method in baselines.METHODS:
            for name in NAMES:
                if _schedule(spec, method, name)[1] is None:
                    continue
                for k, (inplace, instances) in enumerate(PLACEMENTS):
                    where = "in-place" if inplace else "out-of-place"
                    yield pytest.param(
                        spec, method, name, inplace, instances, k, id=f"{spec}-{method}-{name}-{where}-x{instances}"
                    )


@pytest.mark.parametrize("spec,method,name,inplace,instances,k", list(_cases()))
def test_baseline_plan_passes_the_reference_executor(spec, method, name, inplace, instances, k):
    topology, schedule = _schedule(spec, method, name)
    plan = compile_schedule(schedule, topology, instances=instances, inplace=inplace)
    sizes = check_sizes(plan)
    assert len(sizes) == 3 and plan.chunk_bytes(sizes[1]) % 16  # the middle size is ragged
    # every dtype at its own size: all three on the small topologies, one pair per placement on the large ones
    runs = list(zip(sizes, DTYPES, strict=True))
    if spec in LARGE:
        runs = [runs[k % 3]]
    for size, dtype in runs:
        assert check_plan(plan, [size], [dtype]).ok
