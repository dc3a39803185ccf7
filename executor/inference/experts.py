"""An MoE layer's expert-parallel dispatch and combine for torch, from ``Communicator.expert_exchange``.

    ex = comm.expert_exchange(tokens=T, experts=E, capacity=C, hidden=H)     # collective, before any capture
    received = ex.dispatch(x, rows)          # (E / ranks, ranks * C, H): each local expert's rows from every rank
    done = experts(received)                 # the same shape: the experts' outputs, row for row
    y = ex.combine(done, rows, gates)        # (T, H): each token's kept rows weighted by its gates

``x`` is this rank's (T, H) tokens; ``rows`` (T, top_k) int64 holds each claim's dispatch row, expert * C + place,
or E * C where the claim was dropped (``examples/moe_routing.py``'s ``assign``); ``gates`` (T, top_k) fp32 its
weights. Both may be transposed views. The tensors dispatch and combine return belong to the exchange: the next
dispatch, or the next combine, overwrites them. Every rank calls dispatch and combine alternately, the same number
of times; calls may be captured in CUDA graphs (the kernels read the captured tensors; nothing to register).

Two implementations behind one API:
- ``FusedExperts``, on one host where the interpreter engine runs: one kernel for dispatch and one for combine
  (``executor.gpu.experts``), which read and write the layer's rows themselves, so the layer runs no dispatch
  buffer, no reordering copies and no separate weighted sum;
- ``PlainExperts`` elsewhere (across hosts, NCCL, a shape the kernels refuse): a dispatch buffer, the communicator's
  ``all_to_all_single`` (weft's plans, else NCCL), the reordering copies and torch's weighted sum, as GShard and
  Tutel run it. Both give the same output, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from executor.gpu.experts import Claims, ExpertExchange, ExpertLayout
from executor.inference.ops import DTYPES

AllToAll = Callable[[torch.Tensor, torch.Tensor], object]  # all_to_all_single(output, input), equal splits


class Experts(Protocol):
    layout: ExpertLayout
    path: str  # "fused" or "all_to_all"

    def dispatch(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor: ...

    def combine(self, done: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor) -> torch.Tensor: ...

    def check(self) -> None: ...


def layout_of(
    ranks: int, tokens: int, experts: int, capacity: int, hidden: int, dtype: torch.dtype, top_k: int
) -> ExpertLayout:
    """The layout of these arguments (ValueError naming a dtype the exchange does not take)."""
    if dtype not in DTYPES:
        raise ValueError(f"weft: expert_exchange: dtype {dtype} is not one of float32, float16, bfloat16")
    return ExpertLayout(ranks, experts, capacity, tokens, hidden, DTYPES[dtype], top_k)


def torch_dtype(layout: ExpertLayout) -> torch.dtype:
    return next(t for t, name in DTYPES.items() if name == layout.dtype)


def check_call(
    layout: ExpertLayout, what: str, x: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor | None, cuda: bool = True
) -> None:
    """One line naming the argument that does not fit ``layout`` (ValueError), else nothing; ``cuda``: ``x`` must be
    a contiguous CUDA tensor (the fused kernels read its rows in place)."""
    lay = layout
    held = (lay.local, lay.ranks * lay.capacity, lay.hidden)
    shape = (lay.tokens, lay.hidden) if what == "dispatch" else held
    name = "x" if what == "dispatch" else "done"
    if tuple(x.shape) != shape or DTYPES.get(x.dtype) != lay.dtype:
        raise ValueError(
            f"weft: expert_exchange.{what}: {name} is {tuple(x.shape)} {x.dtype}; this exchange takes {shape} "
            f"{lay.dtype}"
        )
    if cuda and not (x.is_contiguous() and x.is_cuda):
        raise ValueError(f"weft: expert_exchange.{what}: {name} must be a contiguous CUDA tensor")
    if cuda and any(t is not None and t.device != x.device for t in (rows, gates)):
        raise ValueError(f"weft: expert_exchange.{what}: rows and gates must be on {name}'s device, {x.device}")
    if tuple(rows.shape) != (lay.tokens, lay.top_k) or rows.dtype != torch.int64:
        raise ValueError(
            f"weft: expert_exchange.{what}: rows is {tuple(rows.shape)} {rows.dtype}; this exchange takes "
            f"({lay.tokens}, {lay.top_k}) torch.int64"
        )
    if gates is not None and (tuple(gates.shape) != (lay.tokens, lay.top_k) or gates.dtype != torch.float32):
        raise ValueError(
            f"weft: expert_exchange.{what}: gates is {tuple(gates.shape)} {gates.dtype}; this exchange takes "
            f"({lay.tokens}, {lay.top_k}) torch.float32"
        )


class FusedExperts:
    """dispatch and combine as one kernel each on this host's GPUs (``executor.gpu.experts``)."""

    path = "fused"

    def __init__(self, exchange: ExpertExchange, follow: Callable[[], None] = lambda: None):
        """``follow``: the communicator's stream order (``executor.inference.streams``), called before each launch."""
        self._ex, self._follow = exchange, follow
        self.layout = lay = exchange.layout
        device = torch.device("cuda", exchange.device)
        dtype = torch_dtype(lay)
        # the receive buffer as a tensor (a view of the exchange's own allocation, which it keeps alive)
        raw = torch.as_tensor(exchange.received, device=device)
        self.received = raw.view(dtype).view(lay.local, lay.ranks * lay.capacity, lay.hidden)
        self.output = torch.empty(lay.tokens, lay.hidden, dtype=dtype, device=device)

    def dispatch(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        check_call(self.layout, "dispatch", x, rows, None)
        self._follow()
        claims = Claims(rows.data_ptr(), (rows.stride(0), rows.stride(1)))
        self._ex.dispatch(x.data_ptr(), claims, torch.cuda.current_stream(x.device).cuda_stream)
        return self.received

    def combine(self, done: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        check_call(self.layout, "combine", done, rows, gates)
        self._follow()
        claims = Claims(
            rows.data_ptr(), (rows.stride(0), rows.stride(1)), gates.data_ptr(), (gates.stride(0), gates.stride(1))
        )
        self._ex.combine(
            done.data_ptr(), claims, self.output.data_ptr(), torch.cuda.current_stream(done.device).cuda_stream
        )
        return self.output

    def check(self) -> None:
        """Raise ExecutorTimeout if a wait of this exchange timed out (synchronizes the device)."""
        self._ex.check()

    def close(self) -> None:
        self._ex.close()


class PlainExperts:
    """dispatch and combine around an all-to-all: a dispatch buffer of E * C rows (and the trash row), the exchange,
    the reordering copies, and the gate-weighted sum in torch."""

    path = "all_to_all"

    def __init__(self, layout: ExpertLayout, all_to_all: AllToAll, device: torch.device):
        self.layout, self._all_to_all = layout, all_to_all
        dtype = torch_dtype(layout)
        rows = layout.trash
        self._send = torch.zeros(rows + 1, layout.hidden, dtype=dtype, device=device)  # + the trash row
        self._received = torch.zeros(rows, layout.hidden, dtype=dtype, device=device)
        self._returned = torch.zeros(rows + 1, layout.hidden, dtype=dtype, device=device)  # trash row: stays 0

    def dispatch(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        check_call(self.layout, "dispatch", x, rows, None, cuda=False)
        lay = self.layout
        self._send.zero_()
        self._send[rows.T.reshape(-1)] = x.repeat(lay.top_k, 1)  # the trash row may take several
        self._all_to_all(self._received, self._send[: lay.trash])
        return expert_major(self._received, lay)

    def combine(self, done: torch.Tensor, rows: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        check_call(self.layout, "combine", done, rows, gates, cuda=False)
        lay = self.layout
        self._all_to_all(self._returned[: lay.trash], token_major(done, lay))
        weights = gates.masked_fill(rows >= lay.trash, 0.0)
        return (self._returned[rows] * weights[..., None]).sum(1).to(done.dtype)

    def check(self) -> None:
        """Nothing to check: the all-to-all raises its own errors."""


def expert_major(received: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """The all-to-all's output (rank-major) as (local expert, source rank * capacity, hidden), a new tensor."""
    lay = layout
    return (
        received.view(lay.ranks, lay.local, lay.capacity, lay.hidden)
        .transpose(0, 1)
        .reshape(lay.local, lay.ranks * lay.capacity, lay.hidden)
        .contiguous()  # at one place an expert the reshape is a view
    )


def token_major(done: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """The inverse of ``expert_major``: rank-major rows, the second all-to-all's input (a new tensor)."""
    lay = layout
    return done.view(lay.local, lay.ranks, lay.capacity, lay.hidden).transpose(0, 1).reshape(lay.trash, lay.hidden)
