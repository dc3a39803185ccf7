"""The shape inference engines call for a custom all-reduce (vLLM's, SGLang's): an engine plugin wraps it as is.

backend = WeftBackend.from_process_group(group)
with backend.capture(sizes):                     # around the engine's graph captures; replay after it
    ...
y = backend.all_reduce(x) if backend.should_use(x) else engine_nccl_all_reduce(x)
h, x = backend.fused_add_rms_norm(y, x, norm_weight, eps)   # all-reduce + residual add + RMSNorm, one launch
backend.close()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from executor.inference.communicator import Communicator
from executor.reference.norm import RowNorm


class WeftBackend:
    """weft's all-reduce behind should_use / all_reduce / capture / close."""

    def __init__(self, comm: Communicator):
        self.comm = comm

    @classmethod
    def from_process_group(cls, group: Any = None, **options: Any) -> WeftBackend:
        """``options`` go to Communicator (registry, topology, deterministic, staging_bytes); across hosts its engine
        is the port engine, whose fused norm runs unfused."""
        return cls(Communicator.from_process_group(group, **options))

    def should_use(self, tensor: torch.Tensor, residual: bool = False) -> bool:
        """Whether weft has a plan for this all-reduce (size, dtype, topology; with a residual where ``residual``)
        and can run it here and now."""
        comm = self.comm
        nbytes = tensor.numel() * tensor.element_size()
        plan = comm.plan_for("allreduce", nbytes, tensor.dtype)
        if plan is None or not tensor.is_cuda:
            return False
        # inside a capture only sizes prepared before it run on weft (their contexts already exist)
        return not torch.cuda.is_current_stream_capturing() or comm.is_prepared(plan, nbytes, tensor.dtype, residual)

    def all_reduce(self, tensor: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The sum over ranks as a new tensor, plus ``residual`` if given (NCCL where should_use is False)."""
        return self.comm.all_reduce(tensor, residual=residual)

    def should_fuse_norm(self, tensor: torch.Tensor, rms_weight: torch.Tensor, eps: float = 1e-6) -> bool:
        """Whether ``fused_add_rms_norm`` runs as one weft launch here and now (a plan whose rows fit this size
        and hidden size; inside a capture, one prepared before it). Where not, it still runs, unfused."""
        comm = self.comm
        rows = RowNorm(tensor.shape[-1], float(eps))
        nbytes = tensor.numel() * tensor.element_size()
        plan = comm.norm_plan_for(nbytes, tensor.dtype, rows) if tensor.is_cuda and tensor.dim() else None
        if plan is None or rms_weight.dtype != tensor.dtype:
            return False
        return not torch.cuda.is_current_stream_capturing() or comm.is_norm_prepared(plan, nbytes, tensor.dtype, rows)

    def fused_add_rms_norm(
        self, tensor: torch.Tensor, residual: torch.Tensor, rms_weight: torch.Tensor, eps: float = 1e-6
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decoder layer's all-reduce, residual add and the next RMSNorm: ``(rms_norm(residual + sum) *
        rms_weight, residual + sum)``, in place of the engine's all-reduce, add and norm (one launch where
        should_fuse_norm, else the all-reduce with its residual, then torch's rms_norm)."""
        return self.comm.all_reduce(tensor, residual=residual, rms_weight=rms_weight, eps=eps)

    @contextmanager
    def capture(
        self,
        sizes: Sequence[int] = (),
        dtype: torch.dtype = torch.bfloat16,
        residual: bool = False,
        rms_norm: tuple[int, float] | None = None,
    ) -> Iterator[WeftBackend]:
        """Prepare these all-reduce sizes (bytes), also with a residual where ``residual`` and fused with the
        RMSNorm of rows ``rms_norm`` = (hidden size, eps) where given; graphs the engine
        captures inside the block all-reduce the captured tensors themselves, registered on every rank when the
        block closes (collective)."""
        with self.comm.capture(sizes, dtype, residual, RowNorm(*rms_norm) if rms_norm is not None else None):
            yield self

    def close(self) -> None:
        self.comm.close()
