"""executor: runs Plans. ``reference`` (numpy, CPU) checks any plan; the GPU executor runs them on CUDA GPUs.

Names resolve lazily so that ``import executor`` never loads CuPy or torch until used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_reference": ("executor.reference.prove", "run_reference"),
    "check_plan": ("executor.reference.prove", "check_plan"),
    "Communicator": (
        "executor.inference.communicator",
        "Communicator",
    ),  # the plan executor plus torch.distributed's API
    "PlanExecutor": ("executor.gpu.engine", "PlanExecutor"),  # its core, for tools that run plans only
    "WeftBackend": ("executor.inference.backend", "WeftBackend"),
    "ExecutorTimeout": ("executor.errors", "ExecutorTimeout"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'executor' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), attr)
