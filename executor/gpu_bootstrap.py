"""Bootstrap through a torch.distributed Store: exchange small values between ranks, and barriers."""

from __future__ import annotations

import os
import pickle
from datetime import timedelta
from typing import Any

from executor.errors import ExecutorError, ExecutorTimeout


def store_from_env(rank: int, world_size: int, timeout_s: float = 120.0):
    """A TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 hosts it)."""
    import torch.distributed as dist

    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        raise ExecutorError("executor: set MASTER_ADDR and MASTER_PORT, or pass a store or process group") from None
    return dist.TCPStore(host, port, world_size, rank == 0, timedelta(seconds=timeout_s))


def process_group_store(group=None):
    """The store behind torch.distributed's default process group (the group must be initialized)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ExecutorError("executor: torch.distributed is not initialized (call init_process_group first)")
    return dist.distributed_c10d._get_default_store()


def all_gather(store, key: str, rank: int, world_size: int, value: Any, timeout_s: float) -> list[Any]:
    """Every rank's ``value`` for ``key``, in rank order; a rank that never arrives is a timeout."""
    store.set(f"{key}/{rank}", pickle.dumps(value))
    keys = [f"{key}/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception as e:  # the store raises its own types (DistStoreError, RuntimeError) on timeout
        raise ExecutorTimeout(f"executor: rank {rank}: peers did not reach {key!r} within {timeout_s:g} s "
                              f"(a rank died or runs something else): {str(e).splitlines()[0]}", rank) from None
    return [pickle.loads(store.get(k)) for k in keys]


def barrier(store, key: str, rank: int, world_size: int, timeout_s: float) -> None:
    all_gather(store, key, rank, world_size, None, timeout_s)
