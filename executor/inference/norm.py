"""The fused all-reduce + residual add + RMSNorm of ``executor.Communicator`` (the norm's half of it).

    normed, h = comm.all_reduce(y, residual=h, rms_weight=w, eps=1e-5)   # one launch
    comm.all_reduce_(y, residual=h, rms_weight=w, eps=1e-5)              # y <- normed, h <- h + sum(y)

``h + all_reduce(y)`` then ``rms_norm(that) * w`` (a decoder layer's all-reduce and the next norm) in one launch of
a plan whose thread blocks own whole rows (``executor.reference.norm``, ``codegen.rows``): the norm reads the rows where
the sum just left them instead of reading the hidden state back in a kernel of its own. The rows are the last
dimension (``w`` has that many elements, of the tensor's dtype).

Which plan: among the registry's all-reduce plans for this size, those that pass the norm's proof on the reference
executor (``executor.reference.norm.fused_refusal``) and whose rows fit this size and hidden size (``rows_refusal``); of
those the one with the most row-owning thread blocks (parallel rows), then the fastest measured. Packets move as
LL128 lines where the registry's plan for a plain all-reduce of this size does.

Where no plan's rows fit (or a size is first seen inside a capture, or a tensor is not contiguous) the call runs
unfused: the all-reduce with its residual (weft's or NCCL's), then torch's ``rms_norm``; logged once per reason.
A weight of the wrong shape or dtype is refused (ValueError, one line). Eager calls stage the input, residual and
weight in buffers of their own, so each size has one context; inside ``capture()`` calls bind the captured tensors
(zero-copy), as the plain all-reduce does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from executor.gpu.engine import NormCall
from executor.inference.ops import DTYPES
from executor.reference.norm import RowNorm, best_norm_plan, row_base, rows_refusal

if TYPE_CHECKING:
    from executor.gpu.engine import PlanExecutor as _Executor  # the executor it is mixed in beside
    from executor.inference.plans import PlanChoice
else:
    _Executor = object

UNFUSED = "unfused (the all-reduce with its residual, then torch's rms_norm)"


def norm_candidates(entries: list, nbytes: int, ll128: bool) -> list[tuple]:
    """(plan, estimated µs) of registry entries serving a size: a row-owning plan (never benched alone) takes the
    time measured for the plan it was regrouped from, whose sends it keeps; any other its own estimate."""
    by_name = {e.plan.name: e for e in entries}
    return [
        (e.plan, (by_name.get(row_base(e.plan.name), e).estimate_us(nbytes, ll128)[1] or math.inf)) for e in entries
    ]


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


class NormCalls(_Executor):
    """The fused norm's methods, mixed into ``executor.inference.communicator.Communicator`` (which provides ``choice``,
    ``enabled``, the staging buffers, ``_fallback`` and the executor)."""

    if TYPE_CHECKING:  # what the host class provides; declared for the type checker only, so nothing is shadowed
        choice: PlanChoice | None  # set whenever ``enabled``
        enabled: bool
        staging_bytes: int
        world_size: int
        paths: dict[str, int]
        _ready: set[tuple[Any, ...]]
        _norm_choices: dict[tuple[int, torch.dtype, RowNorm], Any]
        _staging_in: torch.Tensor
        _staging_residual: torch.Tensor

        def _fallback(
            self, collective: str, nbytes: int, dtype: torch.dtype, why: str, path: str = "on NCCL"
        ) -> None: ...
        def _in_graph(self) -> bool: ...
        def _views(self, numel: int, out_numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]: ...
        def all_reduce_eager(self, tensor: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor: ...

    def norm_plan_for(self, nbytes: int, dtype: torch.dtype, rows: RowNorm):
        """The plan that runs the fused norm for this size, dtype and row shape, or None (``norm_reason`` says why)."""
        key = (nbytes, dtype, rows)
        cache = self.__dict__.setdefault("_norm_choices", {})
        if key not in cache:
            cache[key] = self._choose_norm_plan(nbytes, dtype, rows)
        return cache[key][0]

    def is_norm_prepared(self, plan, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> bool:
        """Whether ``plan``'s fused-norm context for this size and row shape exists, so that a capture can run it."""
        return (plan.content_hash, nbytes, DTYPES[dtype], rows) in self._ready

    def pin_norm_plan(self, nbytes: int, dtype: torch.dtype, rows: RowNorm, plan) -> None:
        """Run the fused norm of this size, dtype and row shape on ``plan`` from now on (a bench comparing plans,
        a test of one plan's shape), or on the plan ``norm_plan_for`` picks again where ``plan`` is None. The plan
        must still pass the proof and fit the rows (ValueError, one line, otherwise)."""
        cache = self.__dict__.setdefault("_norm_choices", {})
        if plan is None:
            cache.pop((nbytes, dtype, rows), None)
            return
        if dtype not in DTYPES:
            raise ValueError(f"weft: the fused norm runs {', '.join(map(str, DTYPES))}, not {dtype}")
        if not self.enabled:
            raise ValueError(f"weft: cannot pin {plan.name} for the fused norm: weft is disabled on this communicator")
        if nbytes > self.staging_bytes:
            raise ValueError(
                f"weft: cannot pin {plan.name} for the fused norm: {nbytes} B exceeds staging_bytes "
                f"{self.staging_bytes} B"
            )
        why = self.norm_refusal(plan) or rows_refusal(plan, nbytes, DTYPES[dtype], rows)
        if why:
            raise ValueError(f"weft: cannot pin {plan.name} for the fused norm: {why}")
        cache[(nbytes, dtype, rows)] = (plan, "")

    def norm_reason(self, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> str:
        self.norm_plan_for(nbytes, dtype, rows)
        return self._norm_choices[(nbytes, dtype, rows)][1]

    def all_reduce_norm_eager(
        self, tensor: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = check_norm_call(tensor, residual, weight, eps)
        nbytes = tensor.numel() * tensor.element_size()
        plan, why = self._fused_norm_plan(tensor, residual, weight, rows)
        if plan is None:
            self._fallback("allreduce+rms_norm", nbytes, tensor.dtype, why, UNFUSED)
            new_residual = self.all_reduce_eager(tensor, residual)
            return F.rms_norm(new_residual, (rows.row_elems,), weight, eps), new_residual
        new_residual = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        normed = torch.empty_like(new_residual)
        if not self._zero_copy_norm(plan, tensor, new_residual, residual, NormCall(rows, weight, normed)):
            staged, staged_normed = self._stage_norm(plan, tensor, residual, weight, rows)
            new_residual.copy_(staged.view(tensor.shape))
            normed.copy_(staged_normed.view(tensor.shape))
        return normed, new_residual

    def prepare_norm(self, nbytes: int, rows: RowNorm, dtype: torch.dtype = torch.bfloat16) -> bool:
        """Create the fused norm's context for one size now (collective, eager); whether weft will run it."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: prepare() must run before graph capture, not inside it")
        elements = nbytes // torch.empty((), dtype=dtype).element_size()
        if self.norm_plan_for(nbytes, dtype, rows) is None or elements % rows.row_elems:
            return False
        x = torch.zeros(elements // rows.row_elems, rows.row_elems, dtype=dtype, device=self._staging_in.device)
        self.all_reduce_norm_eager(
            x, torch.zeros_like(x), torch.ones(rows.row_elems, dtype=dtype, device=x.device), rows.eps
        )
        return True

    # ------------------------------------------------------------------ internals

    def _fused_norm_plan(self, tensor: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, rows: RowNorm):
        """(plan, '') for a fused launch, or (None, why the call runs unfused)."""
        nbytes = tensor.numel() * tensor.element_size()
        if not all(t.is_contiguous() for t in (tensor, residual, weight)):
            return None, "a tensor (input, residual or weight) is not contiguous"
        plan = self.norm_plan_for(nbytes, tensor.dtype, rows)
        if plan is None:
            return None, self.norm_reason(nbytes, tensor.dtype, rows)
        if torch.cuda.is_current_stream_capturing() and not self.is_norm_prepared(plan, nbytes, tensor.dtype, rows):
            return None, "first seen inside graph capture; warm up or use capture(rms_norm=...) before capturing"
        return plan, ""

    def _choose_norm_plan(self, nbytes: int, dtype: torch.dtype, rows: RowNorm):
        choice = self.choice
        if not self.enabled or choice is None or dtype not in DTYPES or nbytes > self.staging_bytes:
            return None, "weft disabled" if not self.enabled or choice is None else "no plan (dtype or size)"
        name = DTYPES[dtype]
        serving = [
            e
            for e in choice.entries
            if e.serves(choice.topology, "allreduce", self.world_size, nbytes) and (not e.dtypes or name in e.dtypes)
        ]
        return best_norm_plan(norm_candidates(serving, nbytes, choice.ll128), nbytes, name, rows, self.norm_refusal)

    def _zero_copy_norm(
        self, plan, tensor: torch.Tensor, output: torch.Tensor, residual: torch.Tensor, norm: NormCall
    ) -> bool:
        """Inside ``capture()``, capture the fused launch on the caller's tensors themselves; whether it did."""
        if not self._in_graph():
            return False
        nbytes = tensor.numel() * tensor.element_size()
        why = self.execute_captured(
            plan, tensor, output, lines=self._norm_lines(nbytes, tensor.dtype), residual=residual, norm=norm
        )
        if why:
            self._fallback("allreduce+rms_norm", nbytes, tensor.dtype, why, "through the staging buffer in this graph")
            return False
        self.paths["zero_copy"] += 1
        return True

    def _stage_norm(
        self, plan, tensor: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, rows: RowNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the fused launch through staging buffers (input, residual, weight, normed); (output, normed)."""
        nbytes = tensor.numel() * tensor.element_size()
        if getattr(self, "_staging_norm", None) is None:  # read by this rank only: no IPC needed
            self._staging_norm = torch.empty(2 * self.staging_bytes, dtype=torch.uint8, device=self._staging_in.device)
        source, staged = self._views(tensor.numel(), tensor.numel(), tensor.dtype)
        source.view(tensor.shape).copy_(tensor)
        added = self._staging_residual[:nbytes].view(tensor.dtype)
        added.view(residual.shape).copy_(residual)
        normed = self._staging_norm[:nbytes].view(tensor.dtype)
        staged_weight = self._staging_norm[
            self.staging_bytes : self.staging_bytes + weight.numel() * weight.element_size()
        ].view(weight.dtype)
        staged_weight.copy_(weight)
        self.execute(
            plan,
            source,
            staged,
            lines=self._norm_lines(nbytes, tensor.dtype),
            residual=added,
            norm=NormCall(rows, staged_weight, normed),
        )
        self._ready.add((plan.content_hash, nbytes, DTYPES[tensor.dtype], rows))
        self.paths["staging"] += 1
        return staged, normed

    def _norm_lines(self, nbytes: int, dtype: torch.dtype) -> bool:
        """LL128 lines where the registry's plan for a plain all-reduce of this size runs them."""
        return self.choice is not None and self.choice.lines("allreduce", nbytes, DTYPES[dtype])
