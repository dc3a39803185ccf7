"""executor: runs Plans, one subpackage per runtime, each layer importing only those below it:

    reference/   the CPU reference executor (numpy): runs and proves any plan (machine, padded, norm)
    gpu/         the interpreter engine: device tables, the CUDA kernel (cuda/, its contract.cuh generated from the
                 tables by gpu/contract.py), build, IPC, bootstrap, liveness, the bench and its peers
    port/        the port engine: port-channel plans across hosts, as per-rank programs over torch.distributed
    inference/   the one ``Communicator`` (torch.distributed's API over an engine, the registry's plans, NCCL
                 where none fits), its torch ops, plan choice, staging and the engine plugin ``WeftBackend``
    errors.py, hosts.py: what every layer shares

Names resolve lazily so that ``import executor`` never loads CuPy or torch until used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_reference": ("executor.reference.prove", "run_reference"),
    "check_plan": ("executor.reference.prove", "check_plan"),
    "Communicator": ("executor.inference.communicator", "Communicator"),  # the one communicator, over an engine
    "InterpreterEngine": ("executor.gpu.engine", "InterpreterEngine"),  # its engine on one host; tools run plans
    "PortEngine": ("executor.port.engine", "PortEngine"),  # its engine across hosts
    "RowNorm": ("executor.reference.norm", "RowNorm"),  # the fused norm's rows (hidden size, eps)
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
