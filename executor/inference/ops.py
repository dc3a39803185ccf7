"""weft's collectives as torch.library custom ops, with fake implementations, so torch.compile traces through them.

An op cannot take a Python object, so each op names its communicator by a small integer handle. The handle
table is the one piece of module state: torch calls the ops from compiled graphs, where nothing else could
carry the communicator. It holds weak references, so a closed and dropped communicator does not linger.

    torch.ops.weft.all_reduce(x, comm.handle)          # out of place
    torch.ops.weft.all_reduce(x, comm.handle, h)       # out of place, plus the residual h
    torch.ops.weft.all_reduce_inplace(x, comm.handle)  # in place
    n, h2 = torch.ops.weft.all_reduce_rms_norm(x, comm.handle, h, w, eps)  # rms_norm(h + sum) * w, h + sum
    torch.ops.weft.all_reduce_rms_norm_inplace(x, h, comm.handle, w, eps)  # x <- the norm, h <- h + sum
    torch.ops.weft.all_gather_into_tensor(out, x, comm.handle)
    torch.ops.weft.reduce_scatter_tensor(out, x, comm.handle)
    torch.ops.weft.all_to_all_single(out, x, comm.handle)    # block j of x to rank j; block i of out from rank i
"""

import itertools
import weakref
from typing import Any

import torch

# No ``from __future__ import annotations`` here: torch.library reads the ops' schemas from real annotations.
DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}  # torch's dtypes by weft's names
_COMMUNICATORS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def register(comm: Any) -> int:
    """A handle under which the ops find ``comm``."""
    handle = next(_HANDLES)
    _COMMUNICATORS[handle] = comm
    return handle


def _comm(handle: int) -> Any:
    comm = _COMMUNICATORS.get(handle)
    if comm is None:
        raise RuntimeError(f"weft: communicator {handle} was closed or garbage-collected")
    return comm


@torch.library.custom_op("weft::all_reduce", mutates_args=())
def all_reduce(tensor: torch.Tensor, handle: int, residual: torch.Tensor | None = None) -> torch.Tensor:
    return _comm(handle).all_reduce_eager(tensor, residual)


@all_reduce.register_fake
def _(tensor: torch.Tensor, handle: int, residual: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(tensor)


@torch.library.custom_op("weft::all_reduce_inplace", mutates_args=("tensor",))
def all_reduce_inplace(tensor: torch.Tensor, handle: int) -> None:
    _comm(handle).all_reduce_eager_(tensor)


@all_reduce_inplace.register_fake
def _(tensor: torch.Tensor, handle: int) -> None:
    return None


@torch.library.custom_op("weft::all_gather_into_tensor", mutates_args=("output",))
def all_gather_into_tensor(output: torch.Tensor, tensor: torch.Tensor, handle: int) -> None:
    _comm(handle).all_gather_eager(output, tensor)


@all_gather_into_tensor.register_fake
def _(output: torch.Tensor, tensor: torch.Tensor, handle: int) -> None:
    return None


@torch.library.custom_op("weft::reduce_scatter_tensor", mutates_args=("output",))
def reduce_scatter_tensor(output: torch.Tensor, tensor: torch.Tensor, handle: int) -> None:
    _comm(handle).reduce_scatter_eager(output, tensor)


@reduce_scatter_tensor.register_fake
def _(output: torch.Tensor, tensor: torch.Tensor, handle: int) -> None:
    return None


@torch.library.custom_op("weft::all_to_all_single", mutates_args=("output",))
def all_to_all_single(output: torch.Tensor, tensor: torch.Tensor, handle: int) -> None:
    _comm(handle).all_to_all_eager(output, tensor)


@all_to_all_single.register_fake
def _(output: torch.Tensor, tensor: torch.Tensor, handle: int) -> None:
    return None


@torch.library.custom_op("weft::all_reduce_rms_norm", mutates_args=())
def all_reduce_rms_norm(
    tensor: torch.Tensor, handle: int, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _comm(handle).all_reduce_norm_eager(tensor, residual, weight, eps)


@all_reduce_rms_norm.register_fake
def _(
    tensor: torch.Tensor, handle: int, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(tensor), torch.empty_like(tensor)


@torch.library.custom_op("weft::all_reduce_rms_norm_inplace", mutates_args=("tensor", "residual"))
def all_reduce_rms_norm_inplace(
    tensor: torch.Tensor, residual: torch.Tensor, handle: int, weight: torch.Tensor, eps: float
) -> None:
    _comm(handle).all_reduce_norm_eager_(tensor, residual, weight, eps)


@all_reduce_rms_norm_inplace.register_fake
def _(tensor: torch.Tensor, residual: torch.Tensor, handle: int, weight: torch.Tensor, eps: float) -> None:
    return None
