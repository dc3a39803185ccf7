"""Bootstrap through a torch.distributed Store: exchange small values between ranks, and barriers.

Values travel as plain JSON (``encode`` / ``decode``), never as pickles: anyone who can reach the Store's port
could otherwise run code on every rank. What the executor exchanges is small and of a few known shapes: None,
booleans, numbers, strings, lists, tuples, dicts with string keys, bytes (IPC handles) and SharedBuffer.
"""

from __future__ import annotations

import base64
import json
import os
from datetime import timedelta
from typing import Any

from executor.errors import ExecutorError, ExecutorTimeout
from executor.gpu.ipc import SharedBuffer

MAX_VALUE_BYTES = 16 << 20  # a rank's share for one exchange; far above any real one (a few KB)
MAX_DEPTH = 32


def encode(value: Any) -> bytes:
    """``value`` as JSON bytes; a type outside the executor's few is an ExecutorError (a bug, never data)."""
    return json.dumps(_plain(value, 0), separators=(",", ":"), allow_nan=False).encode()


def _plain(value: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ExecutorError(f"executor: a bootstrap value nests deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"f": repr(value)}  # JSON has no inf or nan
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode()}
    if isinstance(value, SharedBuffer):
        return {"ipc": base64.b64encode(value.handle).decode(), "offset": value.offset}
    if isinstance(value, tuple):
        return {"t": [_plain(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"d": {k: _plain(v, depth + 1) for k, v in value.items()}}
    raise ExecutorError(f"executor: cannot send a {type(value).__name__} between ranks (plain data only)")


def decode(data: bytes | str, source: str = "a peer") -> Any:
    """The value ``encode`` made; anything else (a pickle, malformed JSON, an unknown shape) is an ExecutorError."""
    if len(data) > MAX_VALUE_BYTES:
        raise ExecutorError(f"executor: bootstrap value from {source}: more than {MAX_VALUE_BYTES >> 20} MiB")
    try:
        return _value(json.loads(data), 0)
    except (ValueError, TypeError, KeyError, RecursionError, OverflowError, AttributeError) as e:
        raise ExecutorError(
            f"executor: bootstrap value from {source}: not weft's plain data "
            f"({(str(e).splitlines() or [type(e).__name__])[0][:80]})"
        ) from None


def _value(doc: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
    if doc is None or isinstance(doc, (bool, int, str)):
        return doc
    if isinstance(doc, list):
        return [_value(v, depth + 1) for v in doc]
    if not isinstance(doc, dict):
        raise ValueError(f"unexpected {type(doc).__name__}")
    tag = ",".join(sorted(doc))
    if tag == "f":
        return float(doc["f"])
    if tag == "b":
        return base64.b64decode(doc["b"], validate=True)
    if tag == "ipc,offset" and isinstance(doc["offset"], int) and not isinstance(doc["offset"], bool):
        return SharedBuffer(base64.b64decode(doc["ipc"], validate=True), doc["offset"])
    if tag == "t" and isinstance(doc["t"], list):
        return tuple(_value(v, depth + 1) for v in doc["t"])
    if tag == "d" and isinstance(doc["d"], dict):
        return {k: _value(v, depth + 1) for k, v in doc["d"].items()}
    raise ValueError(f"unknown shape {{{tag[:40]}}}")


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
    store.set(f"{key}/{rank}", encode(value))
    keys = [f"{key}/{r}" for r in range(world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception as e:  # the store raises its own types (DistStoreError, RuntimeError) on timeout
        raise ExecutorTimeout(
            f"executor: rank {rank}: peers did not reach {key!r} within {timeout_s:g} s "
            f"(a rank died or runs something else): {str(e).splitlines()[0]}",
            rank,
        ) from None
    return [decode(store.get(k), f"rank {r} at {key!r}") for r, k in enumerate(keys)]


def all_gather_plain(value: Any, group: Any = None) -> list[Any]:
    """Every rank's ``value`` over a torch.distributed group, in rank order (collective), as ``encode``'s JSON bytes
    in two all_gathers (lengths, then the padded bytes). torch's all_gather_object would unpickle what peers send.
    """
    import torch
    import torch.distributed as dist

    data = encode(value)
    world = dist.get_world_size(group)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if "nccl" in str(dist.get_backend(group)).lower()
        else torch.device("cpu")
    )
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    sizes = [int(n.item()) for n in lengths]
    if not all(0 < n <= MAX_VALUE_BYTES for n in sizes):
        raise ExecutorError(f"executor: a rank's exchanged value is empty or over {MAX_VALUE_BYTES >> 20} MiB: {sizes}")
    mine = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return [
        decode(t[:n].cpu().numpy().tobytes(), f"rank {r}") for r, (t, n) in enumerate(zip(every, sizes, strict=True))
    ]


def barrier(store, key: str, rank: int, world_size: int, timeout_s: float) -> None:
    all_gather(store, key, rank, world_size, None, timeout_s)
