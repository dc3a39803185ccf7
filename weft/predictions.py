"""A plan's predicted times, as the registry stores them: the fabric's calibration where it was measured, else the
α-β model of its links.

Its own module so that proving a plan (``weft.pipeline``) and committing one (``weft.publish``) can both price it
without importing each other.
"""

from __future__ import annotations

from schedules.plan.types import Plan
from schedules.schedule import Schedule
from topologies import Topology
from weft.units import parse_bytes
from weftcore.errors import WeftError

# Sizes at which a plan's predicted time is stored: 1 KB to 1 GB in powers of 4.
PREDICTION_SIZES = tuple(1 << k for k in range(10, 31, 2))
ALPHA_BETA = "alpha-beta model of the links only (launch, hops and protocol not calibrated)"


def predictions(plan: Plan, schedule: Schedule | None, topology: Topology | None) -> tuple[dict[int, float], str]:
    """The plan's predicted times and what made them (``weft.publish.PREDICTION``), at ``PREDICTION_SIZES`` and every
    size its schedule was priced at (the sizes ``weft synth`` printed): the fabric's calibration where it was
    measured (``weft topo calibrate``), else the α-β model of its links, which knows nothing of launches or
    protocols (so a fabric never measured is said to be so next to each prediction). Without a schedule, the plan's
    own table (``weft compile`` made it the same way)."""
    from weft.calibrate import predictions as calibrated

    if schedule is None or topology is None:
        return (
            {
                parse_bytes(k, f"plan {plan.name}: weft.predicted_us"): float(v)
                for k, v in plan.weft.predicted_us.items()
            },
            plan.weft.prediction or ALPHA_BETA,
        )
    sizes = tuple(sorted(set(PREDICTION_SIZES) | set(_priced_sizes(schedule))))
    found = calibrated(plan, schedule, topology, sizes)
    if found is not None:
        return found
    from schedules.cost import loads

    return dict(zip(sizes, loads(schedule, topology).predict_many_us(sizes), strict=True)), ALPHA_BETA


def _priced_sizes(schedule: Schedule) -> list[int]:
    sizes = []
    for text in schedule.meta.predicted_us:
        try:
            sizes.append(parse_bytes(str(text)))
        except WeftError:
            continue  # a size this weft does not read is one price fewer, never a failed commit
    return sizes
