"""The peers an inference engine runs instead of NCCL, timed beside weft: FlashInfer's all-reduce (TensorRT-LLM's
one-shot and two-shot kernels, ``flashinfer.comm.trtllm_allreduce_fusion`` with the all-reduce pattern), its fused
all-reduce + residual add + RMSNorm (the same call with ``kARResidualRMSNorm``), and vLLM's custom all-reduce as
FlashInfer ships it (``flashinfer.comm.vllm_ar``).

FlashInfer is the optional ``peers`` extra (``pip install 'weft[peers]'``: flashinfer-python from the package
index), imported here and nowhere else. Without it ``missing()`` says why, and the benches time the other peers.
Its kernels are built at first use (FlashInfer's JIT, nvcc) or loaded from its AOT folder (bench/NOTES.md, "Peers").

    fi = FlashInfer.create(group, max_bytes=16 << 20)
    fi.all_reduce(x, out, "oneshot")                      # out = the sum of x over ranks
    normed, new_residual = fi.fused_norm(y, residual, weight, 1e-5, "auto")
"""

from __future__ import annotations

import ctypes
import platform
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from executor.errors import ExecutorError

HIDDEN = 8192  # a plain all-reduce of n elements runs as rows of this many (Llama-70B's hidden size), or one row
VARIANTS = ("oneshot", "twoshot", "auto")  # FlashInfer's one-shot, two-shot, and its own heuristic's choice
VLLM_BLOCKS = 36  # vLLM's kMaxBlocks, the CTAs it launches
VLLM_MAX_BYTES = 16 << 20  # vLLM's custom all-reduce is timed up to this size (its default cap is 8 MB)
# FlashInfer 0.7.2.post1's one-shot kernel forms the buffer it clears as ``clear_offset * comm_size`` in int32
# (trtllm_allreduce_fusion.cuh, LamportComm): a workspace whose Lamport slot (ranks × its largest message) reaches
# 1 GiB overflows it, and every third one-shot call then clears memory 2 GiB before the slot, whoever owns it (it
# broke weft's 256 MB check at 4 ranks while FlashInfer's own results stayed right). Workspaces stay below it.
LAMPORT_SLOT_LIMIT = 1 << 30


class PeerUnavailable(ExecutorError):
    """A peer that cannot run here (not installed, or refused this shape)."""


def missing() -> str:
    """Why FlashInfer cannot be imported here, or '' where it can."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import flashinfer.comm  # noqa: F401
    except Exception as e:  # ImportError, or a dependency failing at import: either way the peer is absent
        return f"flashinfer: {type(e).__name__}: {e}".splitlines()[0]
    return ""


def version() -> str | None:
    try:
        import flashinfer

        return flashinfer.__version__
    except Exception:
        return None


def run_versions(torch: Any, flashinfer: bool = True) -> dict[str, Any]:
    """The versions a GPU results file records: torch, NCCL, CUDA and Python, and FlashInfer's (None where it is not
    installed, or with ``flashinfer`` False, where the run used no FlashInfer)."""
    return {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "flashinfer": version() if flashinfer else None,
    }


def max_tokens_for(max_bytes: int, world: int, hidden: int = HIDDEN) -> int:
    """The rows a workspace holds: ``max_bytes`` of bf16/fp16 rows, at least one more than ranks (two-shot needs
    them), below LAMPORT_SLOT_LIMIT (larger messages are refused: ``FlashInfer.refusal``)."""
    return min(max(max_bytes // (2 * hidden), world + 1), (LAMPORT_SLOT_LIMIT - 1) // (world * hidden * 2))


def rows(numel: int) -> tuple[int, int]:
    """(tokens, hidden) for a flat all-reduce of ``numel`` elements: rows of HIDDEN where they divide, else one."""
    return (numel // HIDDEN, HIDDEN) if numel >= HIDDEN and numel % HIDDEN == 0 else (1, numel)


def _quiet(fn, **kwargs):
    """FlashInfer marks the trtllm_* functions deprecated in favour of its unified API, which allocates through
    its own symmetric device memory; these take torch's (as the bench's symmetric-memory peer does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return fn(**kwargs)


@dataclass
class FlashInfer:
    """One rank's FlashInfer all-reduce workspace (IPC buffers and Lamport flags), sized for ``max_tokens`` rows
    of ``hidden`` bf16/fp16 elements. Calls run on the current stream and are CUDA-graph capturable."""

    rank: int
    world: int
    max_tokens: int
    hidden: int
    handles: Any
    workspace: Any
    metadata: dict
    pdl: bool = True  # launch with programmatic dependent launch (as vLLM does); False for an A/B

    @classmethod
    def create(cls, group: Any = None, max_bytes: int = 16 << 20, hidden: int = HIDDEN, pdl: bool = True) -> FlashInfer:
        """Collective over ``group`` (default: the default group). ``pdl``: its kernels launch with programmatic
        dependent launch."""
        why = missing()
        if why:
            raise PeerUnavailable(why)
        import torch.distributed as dist
        from flashinfer.comm import trtllm_ar

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        max_tokens = max_tokens_for(max_bytes, world, hidden)
        handles, workspace, metadata = _quiet(
            trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion,
            tp_rank=rank,
            tp_size=world,
            max_token_num=max_tokens,
            hidden_dim=hidden,
            use_fp32_lamport=False,
            group=group,
            create_metadata=True,
            use_symm_dev_mem=False,
        )
        return cls(rank, world, max_tokens, hidden, handles, workspace, metadata, pdl)

    def refusal(self, tokens: int, hidden: int, variant: str) -> str:
        """Why ``variant`` cannot run this shape, or ''. The two-shot kernel splits tokens over ranks (it needs
        more tokens than ranks); one-shot is capped by the Lamport buffer (MAX_COMM_SIZE)."""
        from flashinfer.comm import trtllm_ar

        if tokens * hidden > self.max_tokens * self.hidden:
            return f"{tokens}x{hidden} exceeds the workspace's {self.max_tokens}x{self.hidden}"
        if hidden % 8:
            return f"hidden {hidden} is not a multiple of 8 elements"
        if variant == "auto":
            import torch

            variant = (
                "oneshot" if trtllm_ar._should_use_oneshot(tokens, hidden, torch.bfloat16, self.world) else "twoshot"
            )
        if variant == "twoshot" and tokens <= self.world:
            return f"two-shot needs more tokens than ranks ({tokens} <= {self.world})"
        if variant == "oneshot" and tokens * hidden * 2 * self.world > trtllm_ar.MAX_COMM_SIZE:
            return "one-shot is capped by FlashInfer's MAX_COMM_SIZE"
        return ""

    def _call(self, x, variant: str, pattern: int, **buffers) -> None:
        from flashinfer.comm import trtllm_ar

        tokens, hidden = x.shape
        refused = self.refusal(tokens, hidden, variant)
        if refused:
            raise PeerUnavailable(f"flashinfer {variant}: {refused}")
        _quiet(
            trtllm_ar.trtllm_allreduce_fusion,
            allreduce_in=x,
            world_size=self.world,
            world_rank=self.rank,
            token_num=tokens,
            hidden_dim=hidden,
            workspace_ptrs=self.workspace,
            launch_with_pdl=self.pdl,
            trigger_completion_at_end=True,
            fp32_acc=True,
            pattern_code=pattern,
            use_oneshot={"oneshot": True, "twoshot": False, "auto": None}[variant],
            allreduce_out=buffers.get("allreduce_out"),
            residual_in=buffers.get("residual_in"),
            residual_out=buffers.get("residual_out"),
            norm_out=buffers.get("norm_out"),
            quant_out=None,
            scale_out=None,
            rms_gamma=buffers.get("rms_gamma"),
            rms_eps=buffers.get("rms_eps"),
            scale_factor=None,
            layout_code=None,
            metadata=self.metadata,
        )

    def all_reduce(self, x, out, variant: str = "auto"):
        """``out`` = the sum of ``x`` over ranks (flat tensors of one shape, run as ``rows(numel)``)."""
        from flashinfer.comm import AllReduceFusionPattern

        shape = rows(x.numel())
        self._call(x.view(shape), variant, AllReduceFusionPattern.kAllReduce, allreduce_out=out.view(shape))
        return out

    def fused_norm(self, y, residual, weight, eps: float, variant: str = "auto", normed=None, new_residual=None):
        """(rms_norm(residual + sum(y)) * weight, residual + sum(y)) in one launch; y and residual are
        [tokens, hidden]."""
        import torch
        from flashinfer.comm import AllReduceFusionPattern

        normed = torch.empty_like(y) if normed is None else normed
        new_residual = torch.empty_like(y) if new_residual is None else new_residual
        self._call(
            y,
            variant,
            AllReduceFusionPattern.kARResidualRMSNorm,
            residual_in=residual,
            residual_out=new_residual,
            norm_out=normed,
            rms_gamma=weight,
            rms_eps=eps,
        )
        return normed, new_residual

    def close(self) -> None:
        from flashinfer.comm import trtllm_ar

        _quiet(trtllm_ar.trtllm_destroy_ipc_workspace_for_all_reduce_fusion, workspace=self.handles)


class _Raw:
    """A device allocation as bytes, for torch.as_tensor (CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


@dataclass
class VllmCustomAllReduce:
    """vLLM's custom all-reduce (one-stage, or two-stage on more than two GPUs at larger sizes) as
    ``flashinfer.comm.vllm_ar`` ships it. The input lives in the IPC-registered buffer (``input(numel, dtype)``):
    no copy into the buffer per call. Graphs are captured inside ``capture()``, which registers the captured
    inputs on every rank as vLLM does after its captures (a replay before that reads unset peer pointers)."""

    rank: int
    max_bytes: int
    handle: int
    meta: list
    buffers: list
    rank_data: Any
    group: Any

    @classmethod
    def create(cls, group: Any = None, max_bytes: int = VLLM_MAX_BYTES) -> VllmCustomAllReduce:
        why = missing()
        if why:
            raise PeerUnavailable(why)
        import torch
        import torch.distributed as dist
        from flashinfer.comm import cuda_ipc, vllm_ar

        rank = dist.get_rank(group)
        meta = cuda_ipc.create_shared_buffer(vllm_ar.meta_size() + max_bytes, group)
        buffers = cuda_ipc.create_shared_buffer(max_bytes, group)
        cuda_ipc.cudart.cudaMemset(ctypes.c_void_p(meta[rank]), 0, vllm_ar.meta_size() + max_bytes)  # the flags
        torch.cuda.synchronize()
        dist.barrier(group)
        rank_data = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        handle = vllm_ar.init_custom_ar(meta, rank_data, rank, True)  # every pair on NVLink (NV18 here)
        vllm_ar.register_buffer(handle, buffers)
        return cls(rank, max_bytes, handle, meta, buffers, rank_data, group)

    def input(self, numel: int, dtype) -> Any:
        """The registered buffer's first ``numel`` elements, as a tensor to write the input into."""
        import torch

        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.max_bytes:
            raise PeerUnavailable(f"vllm: {nbytes} bytes exceed its registered buffer ({self.max_bytes})")
        return torch.as_tensor(_Raw(self.buffers[self.rank], nbytes), device="cuda").view(dtype)

    def all_reduce(self, x, out):
        """``out`` = the sum over ranks of ``x``, which must be ``input()``'s tensor."""
        from flashinfer.comm import vllm_ar

        vllm_ar.all_reduce(self.handle, x, out, 0, 0, VLLM_BLOCKS)
        return out

    @contextmanager
    def capture(self) -> Iterator[None]:
        yield
        self.register_graph_buffers()

    def register_graph_buffers(self) -> None:
        """The inputs captured since the last call, registered with every rank's (collective; plain data)."""
        from flashinfer.comm import vllm_ar

        from executor.gpu.bootstrap import all_gather_plain

        handles, offsets = vllm_ar.get_graph_buffer_ipc_meta(self.handle)
        every = all_gather_plain([list(handles), list(offsets)], self.group)
        vllm_ar.register_graph_buffers(self.handle, [e[0] for e in every], [e[1] for e in every])

    def close(self) -> None:
        import torch
        from flashinfer.comm import cuda_ipc, vllm_ar

        torch.cuda.synchronize()
        vllm_ar.dispose(self.handle)
        cuda_ipc.free_shared_buffer(self.buffers, self.group)
        cuda_ipc.free_shared_buffer(self.meta, self.group)
