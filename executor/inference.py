"""weft collectives for PyTorch inference jobs: the two-line change from NCCL, CUDA-graph safe.

    comm = Communicator.from_process_group()         # after dist.init_process_group("nccl")
    y = comm.all_reduce(x)                           # out of place; all_reduce_(x) in place

Each call takes the registry's plan for its collective, size and dtype on this machine's topology; without one
(or without working P2P) it runs torch.distributed (NCCL), saying so once per size class in the
``weft.inference`` log.

Buffers: the executor creates a context per (plan, size, buffers) collectively, with allocations, an exchange
of IPC handles through the store and a device synchronize, none of which may happen during CUDA-graph capture.
So every call runs on two staging buffers this communicator allocated once with cudaMalloc (always shareable
by IPC, whatever the caller's allocator: expandable segments never reach the executor): the input is copied
in, the plan runs staging to staging, the result is copied out. A size's context is made on its first eager
call; a graph captures only copies and the plan's kernel. A size first seen inside a capture goes to NCCL for
that graph (logged), or is prepared beforehand with ``capture(sizes=...)``. A producer that writes straight
into ``staging_input(...)`` saves the copy in.

Reusing the staging buffers call after call is safe because calls are ordered on the caller's stream (one
stream per communicator, as engines run their collectives) and only plans that a rank can run again before its
peers finished the previous execution are chosen (``torch_plans.safe_back_to_back``: LL, double scratch).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from executor import gpu_bootstrap, gpu_ipc
from executor import torch_ops
from executor.communicator import Communicator as PlanCommunicator
from executor.torch_plans import PlanChoice
from executor.torch_topology import machine_topology, p2p_works
from schedules.registry import Registry, RegistryError

log = logging.getLogger("weft.inference")
DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
STAGING_BYTES = 8 << 20


class Communicator(PlanCommunicator):
    """A plan executor with torch.distributed's collective API, falling back to NCCL where weft has no plan."""

    def __init__(self, rank: int, world_size: int, store: Any = None, device: int | None = None,
                 timeout_s: float = 30.0, *, group: Any = None, registry: str | None = None,
                 topology: str | None = None, deterministic: bool = False, staging_bytes: int = STAGING_BYTES):
        """``registry``: default $WEFT_REGISTRY. ``topology``: a catalog spec or file, default $WEFT_TOPOLOGY, then
        NVML, then torch's view of the GPUs. ``deterministic``: only plans with a fixed reduction order.
        ``staging_bytes``: the largest message (nccl-tests terms) that weft runs; larger ones go to NCCL."""
        self.rank, self.world_size, self.group, self.timeout_s = rank, world_size, group, timeout_s
        self.deterministic, self.staging_bytes = deterministic, staging_bytes
        store = store if store is not None else gpu_bootstrap.store_from_env(rank, world_size)
        self._agreements = f"weft/inference/{store.add(f'weft/inference/{rank}', 1)}"
        self._logged: set[tuple] = set()
        self._ready: set[tuple[str, int, str]] = set()
        self._staged_views: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._started = False
        self.handle = torch_ops.register(self)
        why = ""
        try:
            super().__init__(rank, world_size, store, device, timeout_s)
            self._started = True
        except Exception as e:  # no CuPy, no driver, IPC refused: each means NCCL for this job, not a crash
            why = f"rank {rank}: the GPU executor did not start: {e}"
        self.store = store  # also where the executor did not start: the ranks still have to agree on that
        why = self._agree("started", why)
        if not why:
            why = self._agree("p2p", p2p_works(self) or self._allocate_staging())
        self.choice: PlanChoice | None = None
        self.topology = None
        if not why:
            why = self._agree_on_plans(self._read_plans(registry, topology))
        self.enabled = not why
        if why:
            log.warning("weft: using NCCL for every collective: %s", why)
        elif not self.choice.entries:
            log.warning("weft: the registry %s holds no plan for %s with %d ranks; using NCCL",
                        self.choice.registry.location, self.topology.name, world_size)

    @classmethod
    def from_process_group(cls, group: Any = None, timeout_s: float = 30.0, **options: Any) -> "Communicator":
        """A communicator over ``group`` (default: the default group), bootstrapped through its store."""
        store = gpu_bootstrap.process_group_store(group)
        return cls(dist.get_rank(group), dist.get_world_size(group), store, torch.cuda.current_device(), timeout_s,
                   group=group, **options)

    # ------------------------------------------------------------------ torch.distributed's API

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, as a new tensor."""
        return torch.ops.weft.all_reduce(tensor, self.handle)

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, written into ``tensor``."""
        torch.ops.weft.all_reduce_inplace(tensor, self.handle)
        return tensor

    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        torch.ops.weft.all_gather_into_tensor(output, tensor, self.handle)

    def reduce_scatter_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        torch.ops.weft.reduce_scatter_tensor(output, tensor, self.handle)

    def plan_for(self, collective: str, nbytes: int, dtype: torch.dtype):
        """The plan weft runs for this call, or None where NCCL does (size, dtype, no plan, or weft disabled)."""
        if not self.enabled or dtype not in DTYPES or nbytes > self.staging_bytes:
            return None
        return self.choice.plan(collective, nbytes, DTYPES[dtype])

    def is_prepared(self, plan, nbytes: int, dtype: torch.dtype) -> bool:
        """Whether ``plan``'s context for this size exists, so that a graph capture can run it."""
        return (plan.content_hash, nbytes, DTYPES[dtype]) in self._ready

    def staging_input(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The registered input buffer as ``numel`` elements: a tensor written here is not copied again."""
        return self._staging_in[:numel * torch.empty((), dtype=dtype).element_size()].view(dtype)

    @contextmanager
    def capture(self, sizes: Sequence[int] = (), dtype: torch.dtype = torch.bfloat16) -> Iterator["Communicator"]:
        """Prepare all-reduce contexts for these message sizes (bytes), then capture graphs inside the block."""
        for nbytes in sizes:
            self.prepare("allreduce", nbytes, dtype)
        yield self

    def prepare(self, collective: str, nbytes: int, dtype: torch.dtype = torch.bfloat16) -> bool:
        """Create the context for one collective and size now (collective, eager); whether weft will run it."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: prepare() must run before graph capture, not inside it")
        plan = self.plan_for(collective, nbytes, dtype)
        if plan is None:
            return False
        elements = nbytes // torch.empty((), dtype=dtype).element_size()
        inner = elements // self.world_size
        x = torch.zeros(elements if collective != "allgather" else inner, dtype=dtype, device=self._staging_in.device)
        out = torch.empty(elements if collective != "reducescatter" else inner, dtype=dtype, device=x.device)
        {"allreduce": lambda: self.all_reduce_(x), "allgather": lambda: self.all_gather_into_tensor(out, x),
         "reducescatter": lambda: self.reduce_scatter_tensor(out, x)}[collective]()
        return True

    def close(self) -> None:
        if self._started:
            super().close()
            self._started = False
        self.enabled = False

    # ------------------------------------------------------------------ the ops' bodies (eager or captured)

    def all_reduce_eager(self, tensor: torch.Tensor) -> torch.Tensor:
        staged = self._run("allreduce", tensor, tensor.numel())
        if staged is not None:
            return staged.view(tensor.shape).clone()
        out = tensor.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def all_reduce_eager_(self, tensor: torch.Tensor) -> None:
        staged = self._run("allreduce", tensor, tensor.numel())
        if staged is not None:
            tensor.copy_(staged.view(tensor.shape))
        else:
            dist.all_reduce(tensor, group=self.group)

    def all_gather_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        staged = self._run("allgather", tensor, output.numel())
        if staged is not None:
            output.copy_(staged.view(output.shape))
        else:
            dist.all_gather_into_tensor(output, tensor, group=self.group)

    def reduce_scatter_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        staged = self._run("reducescatter", tensor, output.numel())
        if staged is not None:
            output.copy_(staged.view(output.shape))
        else:
            dist.reduce_scatter_tensor(output, tensor, group=self.group)

    # ------------------------------------------------------------------ internals

    def _run(self, collective: str, tensor: torch.Tensor, out_numel: int) -> torch.Tensor | None:
        """Run ``collective`` through the staging buffers; the staged output, or None if NCCL must run it."""
        size = tensor.element_size()
        nbytes = max(tensor.numel(), out_numel) * size
        plan = self.plan_for(collective, nbytes, tensor.dtype)
        if plan is None:
            self._fallback(collective, nbytes, tensor.dtype, "no plan" if self.enabled else "weft disabled")
            return None
        if torch.cuda.is_current_stream_capturing() and not self.is_prepared(plan, nbytes, tensor.dtype):
            self._fallback(collective, nbytes, tensor.dtype, "first seen inside graph capture; warm up or "
                                                             "use capture(sizes=...) before capturing")
            return None
        source, staged = self._views(tensor.numel(), out_numel, tensor.dtype)
        if tensor.data_ptr() != source.data_ptr() or not tensor.is_contiguous():
            source.view(tensor.shape).copy_(tensor)
        self.execute(plan, source, staged)
        self._ready.add((plan.content_hash, nbytes, DTYPES[tensor.dtype]))
        return staged

    def _views(self, numel: int, out_numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The staging buffers as (input, output) tensors of these sizes; cached, since a decode loop repeats them."""
        key = (numel, out_numel, dtype)
        views = self._staged_views.get(key)
        if views is None:
            size = torch.empty((), dtype=dtype).element_size()
            views = (self._staging_in[:numel * size].view(dtype), self._staging_out[:out_numel * size].view(dtype))
            self._staged_views[key] = views
        return views

    def _fallback(self, collective: str, nbytes: int, dtype: torch.dtype, why: str) -> None:
        size_class = (collective, nbytes.bit_length(), dtype, why)
        if size_class not in self._logged:
            self._logged.add(size_class)
            low, high = 1 << max(nbytes.bit_length() - 1, 0), (1 << nbytes.bit_length()) - 1
            log.warning("weft: %s of %d..%d B in %s runs on NCCL: %s", collective, low, high, str(dtype)[6:], why)

    def _allocate_staging(self) -> str:
        """Allocate the staging buffers with cudaMalloc (through CuPy) and check they export; why not, or ''."""
        import cupy

        try:
            with cupy.cuda.Device(self.device):
                self._staging_memory = [cupy.cuda.Memory(self.staging_bytes) for _ in range(2)]
                arrays = [cupy.ndarray((self.staging_bytes,), cupy.uint8, cupy.cuda.MemoryPointer(m, 0))
                          for m in self._staging_memory]
            self._staging_in, self._staging_out = (torch.from_dlpack(a) for a in arrays)
            for t in (self._staging_in, self._staging_out):
                gpu_ipc.export(t.data_ptr())
        except Exception as e:  # an allocation that cannot be shared means NCCL, never a crash
            return f"rank {self.rank}: staging buffers cannot be shared by IPC: {e}"
        return ""

    def _read_plans(self, registry: str | None, topology: str | None) -> str:
        """Find this machine's topology and its registry entries; why weft cannot run, or ''."""
        self.topology = machine_topology(self.world_size, topology)
        if self.topology is None:
            return "this machine's topology is unknown (set WEFT_TOPOLOGY to a catalog spec or file)"
        try:
            self.choice = PlanChoice(Registry(registry), self.topology.fingerprint, self.world_size, self.deterministic)
        except (RegistryError, ImportError) as e:  # no registry location (platformdirs missing) is NCCL too
            return f"the plan registry cannot be read: {e}"
        return ""

    def _agree_on_plans(self, why: str) -> str:
        """Every rank must see the same topology and registry entries, or the ranks would pick different plans."""
        mine = why or (self.topology.fingerprint, sorted(e.id for e in self.choice.entries))
        seen = gpu_bootstrap.all_gather(self.store, f"{self._agreements}/plans", self.rank, self.world_size, mine,
                                        max(self.timeout_s, 60.0))
        reasons = [v for v in seen if isinstance(v, str)]
        if reasons:
            return reasons[0]
        if any(v != seen[0] for v in seen):
            return "ranks see different topologies or registry entries (is $WEFT_REGISTRY the same everywhere?)"
        return ""

    def _agree(self, what: str, why: str) -> str:
        """Every rank's verdict on ``what``; the first rank's reason if any rank said no, else ''."""
        verdicts = gpu_bootstrap.all_gather(self.store, f"{self._agreements}/{what}", self.rank, self.world_size, why,
                                            max(self.timeout_s, 60.0))
        return next((v for v in verdicts if v), "")
