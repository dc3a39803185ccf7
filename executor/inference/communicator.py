"""weft collectives for PyTorch inference jobs: the two-line change from NCCL, CUDA-graph safe.

    comm = Communicator.from_process_group()         # after dist.init_process_group("nccl")
    y = comm.all_reduce(x)                           # out of place; all_reduce_(x) in place
    comm.all_to_all_single(out, x)                   # equal splits, as torch.distributed's (MoE dispatch/combine)
    h = comm.all_reduce(y, residual=h)               # h + the sum of y, in the all-reduce's own launch
    n, h = comm.all_reduce(y, residual=h, rms_weight=w, eps=1e-5)  # and rms_norm(h) * w too (executor.inference.norm)

Each call takes the registry's plan for its collective, size and dtype on this machine's topology; without one
(or without working P2P) it runs torch.distributed (NCCL), saying so once per size class in the
``weft.inference`` log.

Buffers: the executor creates a context per (plan, size, buffers) collectively, with allocations, an exchange
of IPC handles through the store and a device synchronize, none of which may happen during CUDA-graph capture.
So a size's context is made on its first eager call, on two staging buffers this communicator allocated once
with cudaMalloc (always shareable by IPC, whatever the caller's allocator). An eager call copies its input in,
runs the plan staging to staging and copies the result out; a producer that writes straight into
``staging_input(...)`` saves the copy in. A size first seen inside a capture goes to NCCL for that graph
(logged), or is prepared beforehand with ``capture(sizes=...)``.

CUDA graphs, zero-copy: graphs captured inside ``with comm.capture():`` run the plan on the captured tensors
themselves (``PlanExecutor.execute_captured``), through the size's context, and leaving the block registers
them on every rank before any replay (vLLM's graph buffer registration). The chosen plans write peers only in
their scratch, so no peer maps a captured tensor and tensors from expandable segments bind too; a plan whose
peers map the tensors would exchange their IPC handles at registration, and any tensor that cannot be shared
(or is not aligned to the plan's vectors) keeps the staging path for that call, decided while capturing.
Graphs captured outside ``capture()`` use the staging path. ``paths`` counts the calls each path took.

Any size a plan runs is weft's: a size that is not a multiple of the plan's granule (``Plan.padding``) runs padded,
through the staging path (``PlanExecutor.execute`` stages each part at its padded place), also inside ``capture()``.

A residual (a transformer layer's ``x + all_reduce(y)``) is added inside the all-reduce's launch where the plan
allows it (``executor.reference.norm.residual_refusal``): the reductions that write outputs add it after their
sums, so the result is rounded as the sum followed by the add, and the layer saves the add kernel. It must hold
the same values on every rank, as the residual stream does. Elsewhere (NCCL, or a plan that cannot) the sum is
computed first and the residual added after it.

Reusing the staging buffers and contexts call after call is safe because calls are ordered on the caller's
stream (one stream per communicator, as engines run their collectives) and only plans that a rank can run again
before its peers finished the previous execution are chosen (``torch_plans.safe_back_to_back``: LL, double
scratch, peers written only in their scratch).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from executor.gpu import bootstrap, ipc
from executor.gpu.engine import PlanExecutor
from executor.hosts import host_identity
from executor.inference import ops as torch_ops
from executor.inference.norm import NormCalls
from executor.inference.ops import DTYPES, CollectiveCalls
from executor.inference.plans import PlanChoice, disagreement
from executor.inference.topology import machine_topology, p2p_works
from executor.reference.norm import RowNorm
from registry.store import Registry, RegistryError
from schedules.collectives import Collective
from topologies import Topology

if TYPE_CHECKING:
    from executor.inference.port_communicator import PortCommunicator

log = logging.getLogger("weft.inference")
STAGING_BYTES = 8 << 20


class Communicator(CollectiveCalls, NormCalls, PlanExecutor):
    """A plan executor with torch.distributed's collective API, falling back to NCCL where weft has no plan."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        store: Any = None,
        device: int | None = None,
        timeout_s: float = 30.0,
        *,
        group: Any = None,
        registry: str | None = None,
        topology: str | None = None,
        deterministic: bool = False,
        staging_bytes: int = STAGING_BYTES,
        ll128: bool = True,
        trace: bool = False,
    ):
        """``registry``: default $WEFT_REGISTRY. ``topology``: a catalog spec or file, default $WEFT_TOPOLOGY, then
        NVML, then torch's view of the GPUs. ``deterministic``: only plans with a fixed reduction order.
        ``staging_bytes``: the largest message (nccl-tests terms) that weft runs; larger ones go to NCCL.
        ``ll128``: LL plans may move LL128 lines (executor.gpu.engine.PlanExecutor), at the sizes where this
        topology's registry entries measured lines faster than packets (``weft bench --ll128`` on that fabric, so
        only where lines ran there: NVLink). False: LL16 packets only. ``trace``: the timed kernel build, for
        diagnosis (``kernel_times``)."""
        self.rank, self.world_size, self.group, self.timeout_s = rank, world_size, group, timeout_s
        self.deterministic, self.staging_bytes = deterministic, staging_bytes
        store = store if store is not None else bootstrap.store_from_env(rank, world_size)
        self._agreements = f"weft/inference/{store.add(f'weft/inference/{rank}', 1)}"
        self._logged: set[tuple] = set()
        # (plan, size, dtype, with a residual, or the norm's RowNorm) prepared
        self._ready: set[tuple[str, int, str, bool | RowNorm]] = set()
        self._staged_views: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._started = False
        self.paths = {"zero_copy": 0, "staging": 0, "nccl": 0}  # calls by path; a captured call counts once
        self.handle = torch_ops.register(self)
        why = ""
        try:
            super().__init__(rank, world_size, store, device, timeout_s, ll128=ll128, trace=trace)
            self._started = True
        except Exception as e:  # no CuPy, no driver, IPC refused: each means NCCL for this job, not a crash
            why = f"rank {rank}: the GPU executor did not start: {e}"
        self.store = store  # also where the executor did not start: the ranks still have to agree on that
        why = self._agree("started", why)
        if not why:
            why = self._agree("p2p", p2p_works(self) or self._allocate_staging())
        self.choice: PlanChoice | None = None
        self.topology: Topology | None = None
        if not why:
            why = self._agree_on_plans(self._read_plans(registry, topology))
        self.enabled = not why
        if why:
            log.warning("weft: using NCCL for every collective: %s", why)
        elif self.choice is not None and self.topology is not None and not self.choice.entries:
            log.warning(
                "weft: the registry %s holds no plan for %s with %d ranks; using NCCL",
                self.choice.registry.location,
                self.topology.name,
                world_size,
            )

    @classmethod
    def from_process_group(  # type: ignore[override]  # across hosts it is not a PlanExecutor: issue 34's one facade
        cls, group: Any = None, timeout_s: float = 30.0, **options: Any
    ) -> Communicator | PortCommunicator:
        """A communicator over ``group`` (default: the default group), bootstrapped through its store.

        Where the group's ranks sit on several hosts (``executor.hosts``) it is a ``PortCommunicator``: the same API,
        with the registry's plans run through the port engine and no CUDA IPC between hosts."""
        hosts = bootstrap.all_gather_plain(host_identity(), group)  # plain data, never a pickle
        if len(set(hosts)) > 1:
            from executor.inference.port_communicator import PortCommunicator

            return PortCommunicator(group, timeout_s, **options)
        store = bootstrap.process_group_store(group)
        return cls(
            dist.get_rank(group),
            dist.get_world_size(group),
            store,
            torch.cuda.current_device(),
            timeout_s,
            group=group,
            **options,
        )

    # ---------------------------------- torch.distributed's API (the calls: torch_ops.CollectiveCalls)

    def plan_for(self, collective: str, nbytes: int, dtype: torch.dtype):
        """The plan weft runs for this call, or None where NCCL does (size, dtype, no plan, or weft disabled)."""
        if not self.enabled or self.choice is None or dtype not in DTYPES or nbytes > self.staging_bytes:
            return None
        return self.choice.plan(collective, nbytes, DTYPES[dtype])

    def lines_for(self, collective: str, nbytes: int, dtype: torch.dtype) -> bool:
        """Whether ``plan_for``'s plan moves LL128 lines (``ll128`` set, and measured faster so at this size)."""
        return (
            self.plan_for(collective, nbytes, dtype) is not None
            and self.choice is not None
            and self.choice.lines(collective, nbytes, DTYPES[dtype])
        )

    def is_prepared(self, plan, nbytes: int, dtype: torch.dtype, residual: bool = False) -> bool:
        """Whether ``plan``'s context for this size (with a residual, where ``residual`` and the plan adds one in
        its launch) exists, so that a graph capture can run it."""
        return (plan.content_hash, nbytes, DTYPES[dtype], residual and self.fuses(plan)) in self._ready

    def fuses(self, plan) -> bool:
        """Whether ``plan`` adds a residual in its own launch (executor.reference.norm.residual_refusal)."""
        return self._started and not self.residual_refusal(plan)

    def staging_input(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The registered input buffer as ``numel`` elements: a tensor written here is not copied again."""
        return self._staging_in[: numel * torch.empty((), dtype=dtype).element_size()].view(dtype)

    @contextmanager
    def capture(
        self,
        sizes: Sequence[int] = (),
        dtype: torch.dtype = torch.bfloat16,
        residual: bool = False,
        rms_norm: RowNorm | None = None,
        alltoall_sizes: Sequence[int] = (),
    ) -> Iterator[Communicator]:
        """Capture CUDA graphs inside this block with weft's collectives reading and writing the captured tensors.

        Prepares the all-reduce contexts of ``sizes`` (message bytes) first, also with a residual where
        ``residual``, the fused norm's contexts for rows ``rms_norm`` (hidden size and eps) where given, and the
        all-to-all contexts of ``alltoall_sizes`` (bytes each rank sends, its whole input).
        Leaving the block registers the
        captured tensors on every rank (collective): replay the graphs after it, or call
        ``register_graph_buffers()`` before replaying inside it. A graph replayed before its tensors are
        registered runs none of its weft calls, and the next weft call, or leaving the block, raises.
        """
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: enter comm.capture() before capturing a graph, not inside the capture")
        if not self._started:  # NCCL throughout: nothing to register
            yield self
            return
        with PlanExecutor.capture(self):
            for nbytes in sizes:
                self.prepare("allreduce", nbytes, dtype)
                if residual:
                    self.prepare("allreduce", nbytes, dtype, residual=True)
                if rms_norm is not None:
                    self.prepare_norm(nbytes, rms_norm, dtype)
            for nbytes in alltoall_sizes:
                self.prepare("alltoall", nbytes, dtype)
            yield self

    def register_graph_buffers(self) -> None:
        """Register the tensors of the calls captured so far inside ``capture()`` (collective), before replaying."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: register_graph_buffers() runs after a graph capture ends, not inside it")
        if self._started:
            super().register_graph_buffers()

    def prepare(
        self, collective: str, nbytes: int, dtype: torch.dtype = torch.bfloat16, residual: bool = False
    ) -> bool:
        """Create the context for one collective and size now (collective, eager), for an all-reduce with a
        residual where ``residual``; whether weft will run it."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: prepare() must run before graph capture, not inside it")
        plan = self.plan_for(collective, nbytes, dtype)
        if plan is None:
            return False
        elements = nbytes // torch.empty((), dtype=dtype).element_size()
        spec = Collective(collective, self.world_size)
        x = torch.zeros(int(elements * spec.input_fraction), dtype=dtype, device=self._staging_in.device)
        out = torch.empty(int(elements * spec.output_fraction), dtype=dtype, device=x.device)
        if residual:
            self.all_reduce(x, residual=torch.zeros_like(x))
            return True
        {  # by torch.distributed's name (Facts.torch_op), which these methods follow
            "all_reduce": lambda: self.all_reduce_(x),
            "all_gather_into_tensor": lambda: self.all_gather_into_tensor(out, x),
            "reduce_scatter_tensor": lambda: self.reduce_scatter_tensor(out, x),
            "all_to_all_single": lambda: self.all_to_all_single(out, x),
        }[spec.facts.torch_op or collective]()
        return True

    def close(self) -> None:
        if self._started:
            super().close()
            self._started = False
        self.enabled = False

    # ------------------------------------------------------------------ the ops' bodies (eager or captured)

    def all_reduce_eager(self, tensor: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if residual is not None and (
            residual.shape != tensor.shape or residual.dtype != tensor.dtype or residual.device != tensor.device
        ):
            raise ValueError(
                f"weft: all_reduce's residual must be {tensor.dtype} of shape {tuple(tensor.shape)} on "
                f"{tensor.device}, got {residual.dtype} of shape {tuple(residual.shape)} on "
                f"{residual.device}"
            )
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        plan = self._weft_plan("allreduce", tensor, tensor.numel(), residual is not None)
        fused = residual if plan is not None and residual is not None and self.fuses(plan) else None
        if plan is None:
            out.copy_(tensor)
            dist.all_reduce(out, group=self.group)
        elif not self._zero_copy(plan, tensor, out, fused):
            out.copy_(self._stage(plan, tensor, tensor.numel(), fused).view(tensor.shape))
        if residual is not None and fused is None:
            out.add_(residual)
        return out

    def all_reduce_eager_(self, tensor: torch.Tensor) -> None:
        plan = self._weft_plan("allreduce", tensor, tensor.numel())
        if plan is None:
            dist.all_reduce(tensor, group=self.group)
            return
        # the plans are out of place, so a captured in-place call reads the tensor and copies the sum back
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format) if self._in_graph() else None
        if out is None or not self._zero_copy(plan, tensor, out):
            out = self._stage(plan, tensor, tensor.numel()).view(tensor.shape)
        tensor.copy_(out)

    def all_gather_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        plan = self._weft_plan("allgather", tensor, output.numel())
        if plan is None:
            dist.all_gather_into_tensor(output, tensor, group=self.group)
        elif not self._zero_copy(plan, tensor, output):
            output.copy_(self._stage(plan, tensor, output.numel()).view(output.shape))

    def reduce_scatter_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        plan = self._weft_plan("reducescatter", tensor, output.numel())
        if plan is None:
            dist.reduce_scatter_tensor(output, tensor, group=self.group)
        elif not self._zero_copy(plan, tensor, output):
            output.copy_(self._stage(plan, tensor, output.numel()).view(output.shape))

    def all_to_all_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        plan = self._weft_plan("alltoall", tensor, output.numel())
        if plan is None:
            dist.all_to_all_single(output, tensor, group=self.group)
        elif not self._zero_copy(plan, tensor, output):
            output.copy_(self._stage(plan, tensor, output.numel()).view(output.shape))

    # ------------------------------------------------------------------ internals

    def _weft_plan(self, collective: str, tensor: torch.Tensor, out_numel: int, residual: bool = False):
        """The plan weft runs this call with, or None (logged, counted) where NCCL must run it."""
        nbytes = max(tensor.numel(), out_numel) * tensor.element_size()
        plan = self.plan_for(collective, nbytes, tensor.dtype)
        if plan is None:
            self._fallback(collective, nbytes, tensor.dtype, self._no_plan_reason(collective, nbytes, tensor.dtype))
        elif torch.cuda.is_current_stream_capturing() and not self.is_prepared(plan, nbytes, tensor.dtype, residual):
            self._fallback(
                collective,
                nbytes,
                tensor.dtype,
                "first seen inside graph capture; warm up or use capture(sizes=...) before capturing",
            )
            plan = None
        if plan is None:
            self.paths["nccl"] += 1
        return plan

    def _in_graph(self) -> bool:
        """Whether a graph is capturing inside ``capture()``, where calls bind the captured tensors."""
        return self._started and self._graph_mode and torch.cuda.is_current_stream_capturing()

    def _zero_copy(
        self, plan, tensor: torch.Tensor, output: torch.Tensor, residual: torch.Tensor | None = None
    ) -> bool:
        """Inside ``capture()``, capture ``plan`` on ``tensor`` and ``output`` (and ``residual``) themselves;
        whether it did."""
        if not self._in_graph():
            return False
        nbytes = max(tensor.numel(), output.numel()) * tensor.element_size()
        buffers = (tensor, output, *([] if residual is None else [residual]))
        why = "the tensor is not contiguous" if not all(t.is_contiguous() for t in buffers) else ""
        assert self.choice is not None  # a plan came from it
        lines = self.choice.lines(plan.collective, nbytes, DTYPES[tensor.dtype])
        why = why or self.execute_captured(plan, tensor, output, lines=lines, residual=residual)
        if why:
            self._fallback(plan.collective, nbytes, tensor.dtype, why, "through the staging buffer in this graph")
            return False
        self.paths["zero_copy"] += 1
        return True

    def _stage(self, plan, tensor: torch.Tensor, out_numel: int, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``plan`` through the staging buffers (and the staging residual); the staged output."""
        nbytes = max(tensor.numel(), out_numel) * tensor.element_size()
        source, staged = self._views(tensor.numel(), out_numel, tensor.dtype)
        if tensor.data_ptr() != source.data_ptr() or not tensor.is_contiguous():
            source.view(tensor.shape).copy_(tensor)
        added = None
        assert self.choice is not None  # a plan came from it
        if residual is not None:
            added = self._staging_residual[:nbytes].view(tensor.dtype)
            added.view(residual.shape).copy_(residual)
        self.execute(
            plan, source, staged, lines=self.choice.lines(plan.collective, nbytes, DTYPES[tensor.dtype]), residual=added
        )
        self._ready.add((plan.content_hash, nbytes, DTYPES[tensor.dtype], residual is not None))
        self.paths["staging"] += 1
        return staged

    def _views(self, numel: int, out_numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The staging buffers as (input, output) tensors of these sizes; cached, since a decode loop repeats them."""
        key = (numel, out_numel, dtype)
        views = self._staged_views.get(key)
        if views is None:
            size = torch.empty((), dtype=dtype).element_size()
            views = (self._staging_in[: numel * size].view(dtype), self._staging_out[: out_numel * size].view(dtype))
            self._staged_views[key] = views
        return views

    def _no_plan_reason(self, collective: str, nbytes: int, dtype: torch.dtype) -> str:
        if not self.enabled:
            return "weft disabled"
        if self.choice is None or dtype not in DTYPES or nbytes > self.staging_bytes:
            return "no plan"
        return self.choice.reason(collective, nbytes, DTYPES[dtype]) or "no plan"

    def _fallback(self, collective: str, nbytes: int, dtype: torch.dtype, why: str, path: str = "on NCCL") -> None:
        size_class = (collective, nbytes.bit_length(), dtype, why)
        if size_class not in self._logged:
            self._logged.add(size_class)
            low, high = 1 << max(nbytes.bit_length() - 1, 0), (1 << nbytes.bit_length()) - 1
            log.warning("weft: %s of %d..%d B in %s runs %s: %s", collective, low, high, str(dtype)[6:], path, why)

    def _allocate_staging(self) -> str:
        """Allocate the staging buffers with cudaMalloc (through CuPy) and check they export; why not, or ''."""
        import cupy

        try:
            with cupy.cuda.Device(self.device):
                self._staging_memory = [cupy.cuda.Memory(self.staging_bytes) for _ in range(2)]
                arrays = [
                    cupy.ndarray((self.staging_bytes,), cupy.uint8, cupy.cuda.MemoryPointer(m, 0))
                    for m in self._staging_memory
                ]
            self._staging_in, self._staging_out = (torch.from_dlpack(a) for a in arrays)
            # read by this rank only, so it needs no IPC: the residual an eager call adds in the launch
            self._staging_residual = torch.empty(self.staging_bytes, dtype=torch.uint8, device=self._staging_in.device)
            for t in (self._staging_in, self._staging_out):
                ipc.export(t.data_ptr())
        except Exception as e:  # an allocation that cannot be shared means NCCL, never a crash
            return f"rank {self.rank}: staging buffers cannot be shared by IPC: {e}"
        return ""

    def _read_plans(self, registry: str | None, topology: str | None) -> str:
        """Find this machine's topology and its registry entries; why weft cannot run, or ''."""
        self.topology = found = machine_topology(self.world_size, topology)
        if found is None:
            return "this machine's topology is unknown (set WEFT_TOPOLOGY to a catalog spec or file)"
        try:
            self.choice = PlanChoice(
                Registry(registry), found.fingerprints, self.world_size, self.deterministic, self._ll128
            )
        except (RegistryError, ImportError) as e:  # no registry location (platformdirs missing) is NCCL too
            return f"the plan registry cannot be read: {e}"
        return ""

    def _agree_on_plans(self, why: str) -> str:
        """Every rank must see the same topology and registry entries, or the ranks would pick different plans."""
        mine: object = why
        if not why:
            assert self.topology is not None and self.choice is not None  # _read_plans set both where ``why`` is ''
            mine = (self.topology.fingerprint, sorted(e.id for e in self.choice.entries))
        seen = bootstrap.all_gather(
            self.store, f"{self._agreements}/plans", self.rank, self.world_size, mine, max(self.timeout_s, 60.0)
        )
        return disagreement(seen)

    def _agree(self, what: str, why: str) -> str:
        """Every rank's verdict on ``what``; the first rank's reason if any rank said no, else ''."""
        verdicts = bootstrap.all_gather(
            self.store, f"{self._agreements}/{what}", self.rank, self.world_size, why, max(self.timeout_s, 60.0)
        )
        return next((v for v in verdicts if v), "")
