"""The fused all-reduce + residual add + RMSNorm of ``executor.Communicator``: the call's checks and plan ranking.

    normed, h = comm.all_reduce(y, residual=h, rms_weight=w, eps=1e-5)   # one launch
    comm.all_reduce_(y, residual=h, rms_weight=w, eps=1e-5)              # y <- normed, h <- h + sum(y)

``h + all_reduce(y)`` then ``rms_norm(that) * w`` (a decoder layer's all-reduce and the next norm) in one launch of
a plan whose thread blocks own whole rows (``executor.reference.norm``, ``codegen.rows``): the norm reads the rows where
the sum just left them instead of reading the hidden state back in a kernel of its own. The rows are the last
dimension (``w`` has that many elements, of the tensor's dtype).

Which plan: among the registry's all-reduce plans for this size, those that pass the norm's proof on the reference
executor (``executor.reference.norm.fused_refusal``) and whose rows fit this size and hidden size (``rows_refusal``); of
those the fastest measured (compiled kernels' times counting where the engine compiles), then the one with the most
row-owning thread blocks. The call runs its plan the way the registry measured that plan fastest at this size
(``executor.reference.norm.norm_mode``: LL128 lines, its compiled kernel); a row-owning plan, never benched alone,
the way its base plan ran.

Norm fusion is an engine's capability (``Engine.fuses_norm``, ``norm_refusal``): the interpreter has it, the port
engine has not. Where no plan's rows fit (or a size is first seen inside a capture, or a tensor is not contiguous, or
the engine has no epilogue) the call runs unfused: the all-reduce with its residual (weft's or NCCL's), then
torch's ``rms_norm``; logged once per reason (except for an engine without the epilogue). A weight of the wrong
shape or dtype is refused (ValueError, one line). Eager calls stage the input, residual and weight in buffers of
their own, so each size has one context; inside ``capture()`` calls bind the captured tensors (zero-copy), as the
plain all-reduce does.
"""

from __future__ import annotations

import math

import torch

from executor.reference.norm import RowNorm

UNFUSED = "unfused (the all-reduce with its residual, then torch's rms_norm)"


def check_norm_call(tensor: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float) -> RowNorm:
    """The call's row shape; a ValueError (one line) for arguments no path could run."""
    if residual is None:
        raise ValueError("weft: all_reduce with rms_weight needs residual= (the norm is of residual + the sum)")
    if residual.shape != tensor.shape or residual.dtype != tensor.dtype or residual.device != tensor.device:
        raise ValueError(
            f"weft: all_reduce's residual must be {tensor.dtype} of shape {tuple(tensor.shape)} on "
            f"{tensor.device}, got {residual.dtype} of shape {tuple(residual.shape)} on "
            f"{residual.device}"
        )
    hidden = tensor.shape[-1] if tensor.dim() else 0
    if weight.dim() != 1 or weight.numel() != hidden or weight.dtype != tensor.dtype or weight.device != tensor.device:
        raise ValueError(
            f"weft: all_reduce's rms_weight must be {tensor.dtype} of shape ({hidden},) (the last "
            f"dimension) on {tensor.device}, got {weight.dtype} of shape {tuple(weight.shape)} on "
            f"{weight.device}"
        )
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"weft: all_reduce's eps must be a finite number >= 0, got {eps!r}")
    return RowNorm(int(hidden), float(eps))
