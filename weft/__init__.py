"""weft: synthesize GPU collective schedules, prove them, compile them into plans, and run them.

The public facade. Names resolve lazily, so ``import weft`` never loads z3, OR-Tools or CuPy until used::

    import weft
    topo = weft.catalog("dgx1")
    schedule = weft.synthesize(topo, "allreduce", method="ring")
    plan = weft.compile(schedule, topo)
    weft.commit(plan, topo)                    # proves the plan again, then commits it
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "WeftError": ("weftcore.errors", "WeftError"),
    "CheckFailed": ("weftcore.errors", "CheckFailed"),
    "Topology": ("topologies", "Topology"),
    "Link": ("topologies", "Link"),
    "load_topology": ("topologies", "load_topology"),
    "resolve": ("topologies", "resolve"),
    "catalog": ("topologies.catalog", "build"),
    "Collective": ("schedules.collectives", "Collective"),
    "Schedule": ("schedules.schedule", "Schedule"),
    "load_schedule": ("schedules.schedule", "load_schedule"),
    "verify": ("schedules.verify", "verify"),
    "predict_us": ("schedules.cost", "predict_us"),
    "lower_bound_us": ("schedules.bounds", "lower_bound_us"),
    "Plan": ("schedules.plan.types", "Plan"),
    "load_plan": ("schedules.plan.io", "load_plan"),
    "Registry": ("registry.store", "Registry"),
    "commit": ("weft.publish", "commit"),
    "select": ("weft.lookup", "select"),
    "parse_bytes": ("weft.units", "parse_bytes"),
    "synthesize": ("weft.synthesis", "synthesize"),
    "compile": ("weft.pipeline", "compile_and_verify"),
    "TuneOptions": ("weft.tuning", "TuneOptions"),
    "compile_variants": ("weft.tuning", "compile_variants"),
    "Communicator": ("executor", "Communicator"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'weft' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
