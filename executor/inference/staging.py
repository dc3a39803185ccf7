"""The Communicator's staging buffers: where an eager call runs an engine whose contexts are collective.

An interpreter context is made per (plan, size, buffers) with an exchange of IPC handles, so eager calls run on two
fixed buffers allocated once with cudaMalloc (always shareable by IPC, whatever the caller's allocator): the input
copied in, the plan run staging to staging, the result copied out. The residual, the norm's weight and its normed
rows have buffers of their own, read by this rank only (no IPC).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from executor.gpu import ipc


@dataclass
class Staging:
    """Two IPC-shareable buffers of ``nbytes`` (input, output) on ``device``, and this rank's own side buffers."""

    nbytes: int
    device: int
    memory: list[Any] = field(init=False, default_factory=list)  # the cudaMalloc allocations (CuPy), kept alive
    input: torch.Tensor = field(init=False)
    output: torch.Tensor = field(init=False)
    residual: torch.Tensor = field(init=False)
    norm: torch.Tensor | None = field(init=False, default=None)  # the normed rows, then the weight; on first use
    _views: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = field(init=False, default_factory=dict)

    def allocate(self) -> str:
        """Allocate with cudaMalloc (through CuPy) and check the buffers export; why not, or ''."""
        import cupy

        try:
            with cupy.cuda.Device(self.device):
                self.memory = [cupy.cuda.Memory(self.nbytes) for _ in range(2)]
                arrays = [cupy.ndarray((self.nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(m, 0)) for m in self.memory]
            self.input, self.output = (torch.from_dlpack(a) for a in arrays)
            # read by this rank only, so it needs no IPC: the residual an eager call adds in the launch
            self.residual = torch.empty(self.nbytes, dtype=torch.uint8, device=self.input.device)
            for t in (self.input, self.output):
                ipc.export(t.data_ptr())
        except Exception as e:  # an allocation that cannot be shared means NCCL, never a crash
            return f"staging buffers cannot be shared by IPC: {e}"
        return ""

    def views(self, numel: int, out_numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers as (input, output) tensors of these sizes; cached, since a decode loop repeats them."""
        key = (numel, out_numel, dtype)
        views = self._views.get(key)
        if views is None:
            size = torch.empty((), dtype=dtype).element_size()
            views = (self.input[: numel * size].view(dtype), self.output[: out_numel * size].view(dtype))
            self._views[key] = views
        return views

    def norm_buffers(self, nbytes: int, weight_bytes: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed rows, weight) views of the norm's own buffer, allocated on first use."""
        if self.norm is None:  # read by this rank only: no IPC needed
            self.norm = torch.empty(2 * self.nbytes, dtype=torch.uint8, device=self.input.device)
        return self.norm[:nbytes].view(dtype), self.norm[self.nbytes : self.nbytes + weight_bytes].view(dtype)
