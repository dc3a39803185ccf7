"""The shape inference engines call for a custom all-reduce (vLLM's, SGLang's): an engine plugin wraps it as is.

    backend = WeftBackend.from_process_group(group)
    with backend.capture(sizes):                     # around the engine's graph captures; replay after it
        ...
    y = backend.all_reduce(x) if backend.should_use(x) else engine_nccl_all_reduce(x)
    backend.close()
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch

from executor.inference import Communicator


class WeftBackend:
    """weft's all-reduce behind should_use / all_reduce / capture / close."""

    def __init__(self, comm: Communicator):
        self.comm = comm

    @classmethod
    def from_process_group(cls, group: Any = None, **options: Any) -> "WeftBackend":
        """``options`` go to Communicator (registry, topology, deterministic, staging_bytes)."""
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

    @contextmanager
    def capture(self, sizes: Sequence[int] = (), dtype: torch.dtype = torch.bfloat16,
                residual: bool = False) -> Iterator["WeftBackend"]:
        """Prepare these all-reduce sizes (bytes), also with a residual where ``residual``; graphs the engine
        captures inside the block all-reduce the captured tensors themselves, registered on every rank when the
        block closes (collective)."""
        with self.comm.capture(sizes, dtype, residual):
            yield self

    def close(self) -> None:
        self.comm.close()
