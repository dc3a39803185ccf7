"""The interpreter engine: one InterpreterEngine per process and GPU runs Plans on torch or CuPy buffers through the
interpreter kernel over CUDA IPC (one host). It is the one-host engine of ``executor.Communicator``
(``executor.inference.engine``), and tools that run given plans use it directly.

    comm = InterpreterEngine(rank, world_size)     # TCPStore from MASTER_ADDR/MASTER_PORT
    out = comm.execute(plan, x)                    # on the caller's current stream
    comm.synchronize()                             # raises ExecutorTimeout if a wait ran past its bound

A launch is asynchronous. A GPU-side timeout fills a host-mapped error record; the next ``execute`` or
``synchronize`` raises ExecutorTimeout on this rank, after resetting every rank's semaphores and scratch
together, so the next execution works. Contexts (device tables, scratch, peer buffer mappings) are cached by
(plan, size, buffer addresses); creating one is collective, so every rank must execute the same plans in the same
order, on buffers whose addresses recur alike: a rank that finds a context for an address its peers see as new
skips their exchange, and the job stops with a timeout naming the exchange. Fresh tensors from the caching
allocator recur alike in SPMD code; allocations that depend on a rank's data (``x[mask]``) can break that, so
inference jobs use ``executor.Communicator``, whose eager calls go through fixed staging buffers.

CUDA graphs without copies: inside ``capture()``, ``execute_captured`` runs a plan on buffers that have no
context of their own, against the context an eager ``execute`` made for the same plan, size and dtype, through a
binding record written before the capture (``tables.BindingLayout``). Leaving ``capture()`` registers the
buffers (collective): peers' buffers are exchanged in capture order and every record is armed.

    comm.execute(plan, x0)                         # eager: the context for this plan and size
    with comm.capture():
        with torch.cuda.graph(graph):
            comm.execute_captured(plan, x, out)    # '' when it ran on x and out directly
    graph.replay()
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from executor.errors import ExecutorError, ExecutorTimeout, PeerLost
from executor.gpu import bootstrap, ipc, liveness
from executor.gpu import build as gpu_build
from executor.gpu import launch as gpu_launch
from executor.gpu import trace as gpu_trace
from executor.gpu.lamport import fill_scratch
from executor.gpu.tables import (
    DTYPE_BYTES,
    ERROR_KINDS,
    MAX_BARRIERS,
    MAX_CHANNELS,
    TRIPWIRE_BYTES,
    BindingLayout,
    CapturedExecution,
    DeviceTables,
    PeerMapping,
    build_tables,
    check_launch,
    check_world,
    kernel_args,
    lines_possible,
    peer_mapping,
    peer_slots,
    share_records,
    vector_bytes,
    with_kernel_args,
    with_tripwire,
)
from executor.hosts import host_identity, ipc_across_hosts
from executor.reference.norm import RowNorm, fused_refusal, residual_refusal, rows_refusal
from executor.reference.padded import buffer_parts
from schedules.padding import Padding
from schedules.plan.io import load_plan, parse_plan
from schedules.plan.types import Plan, PlanError

ERROR_WORDS = 8
ERROR_MESSAGES = {kind.code: kind.message for kind in ERROR_KINDS}  # contract.cuh's ErrorKind
HOST_ALLOC_PORTABLE_MAPPED = 1 | 2
GRAPH_RECORDS = 1024  # binding records a context has free when capture() opens (or it is made inside)
IPC_CAPABLE = 10  # CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
MEMCPY_DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice
BIND_VERDICT = "graph-bind"  # the exchange in which the ranks decide whether a captured call binds its tensors


@dataclass(frozen=True)
class _Buffer:
    """A caller's array as the executor sees it."""

    pointer: int
    nbytes: int
    dtype: str | None
    device: int
    framework: str  # "torch" or "cupy"


def overlapping(plan: Plan, buf: _Buffer, out: _Buffer | None) -> bool:
    """Whether an out-of-place plan's call has its output over its input (torch's in-place all-gather passes a view
    of the output as the input). Such a call runs the interpreter, whose block's threads meet after every op: a
    compiled kernel's meet only where its ops may touch the same bytes, and it takes the two buffers as apart
    (``executor.gpu.compiled.source.barriers``). The kernels are wire-compatible, so a rank may run either."""
    if plan.inplace or out is None:
        return False
    return out.pointer < buf.pointer + buf.nbytes and buf.pointer < out.pointer + out.nbytes


def _describe(x: Any, name: str) -> _Buffer:
    if hasattr(x, "data_ptr") and hasattr(x, "element_size"):  # torch.Tensor
        if not x.is_cuda:
            raise ExecutorError(f"executor: {name} is a CPU tensor; pass a CUDA tensor")
        if not x.is_contiguous():
            raise ExecutorError(f"executor: {name} must be contiguous")
        dtype = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}.get(str(x.dtype))
        return _Buffer(x.data_ptr(), x.numel() * x.element_size(), dtype, x.get_device(), "torch")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise ExecutorError(f"executor: {name} must be a torch CUDA tensor or a CuPy array, got {type(x).__name__}")
    if cai.get("strides") is not None and not x.flags.c_contiguous:
        raise ExecutorError(f"executor: {name} must be contiguous")
    dtype = {"<f4": "fp32", "<f2": "fp16"}.get(cai["typestr"])
    nbytes = int(np.prod(cai["shape"])) * np.dtype(cai["typestr"]).itemsize
    return _Buffer(cai["data"][0], nbytes, dtype, x.device.id, "cupy")


@dataclass(frozen=True)
class NormCall:
    """One execution's RMSNorm epilogue: the rows' shape and eps, the weight (one row) and where the normalized
    rows go (input-sized)."""

    rows: RowNorm
    weight: Any
    normed: Any


def _variant(res: _Buffer | None, norm: NormCall | None) -> bool | tuple[int, float]:
    """What a context adds after its sums: nothing (False), the residual (True), or the residual and the norm
    epilogue ((row elements, eps)); contexts and templates are kept per variant."""
    return (norm.rows.row_elems, norm.rows.eps) if norm is not None else res is not None


@dataclass
class _Context:
    """One (plan, size, buffers) on this rank: device tables, scratch, peer mappings, kernel arguments."""

    tables: DeviceTables
    arrays: list  # device allocations kept alive (tables, scratch, state)
    scratch: Any
    state: Any  # the plan's semaphores ([2k] releases, [2k+1] acquires), then each thread block's epoch
    semaphore_init: np.ndarray
    args: tuple  # kernel arguments (tables.KERNEL_PARAMS)
    vector_bytes: int
    output: Any
    plan_hash: str
    nbytes: int
    slots: tuple[int, ...]  # the buffer slots: input, output, scratch, the plan's remote buffers, the residual
    peers: PeerMapping  # the inputs and outputs ranks map across (then bindings are collective)
    records: _Records | None = None
    launch: gpu_launch.Launch | None = None  # the launch with ``args``, prepared on first use
    compiled: Any = None  # the plan compiled to a kernel of its own for these tables (executor.gpu.compiled)
    compiled_why: str = ""  # why not, once it was refused
    compiled_launch: gpu_launch.Launch | None = None  # the compiled kernel's launch with ``args``
    trace: Any = None  # per-block phase sums of the timed build (Communicator(trace=True))
    traced_before: int = 0  # launches before the trace sums were last zeroed (reset_kernel_times)


@dataclass
class _Records:
    """A context's binding records on the device, written disarmed when allocated; ``used`` of them are taken."""

    layout: BindingLayout
    chunks: list = field(default_factory=list)  # device uint8 arrays of GRAPH_RECORDS records each
    used: int = 0

    @property
    def free(self) -> int:
        return len(self.chunks) * GRAPH_RECORDS - self.used

    def address(self, index: int) -> int:
        return self.chunks[index // GRAPH_RECORDS].data.ptr + index % GRAPH_RECORDS * self.layout.stride

    def write(self, index: int, record: np.ndarray) -> None:
        at = index % GRAPH_RECORDS * self.layout.stride
        self.chunks[index // GRAPH_RECORDS][at : at + len(record)].set(record)


def ipc_capable(pointer: int) -> bool:
    """Whether CUDA IPC can share the allocation holding ``pointer`` (not expandable segments); safe in a capture."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    value = ctypes.c_int(0)
    fn = lib.cuPointerGetAttribute
    fn.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64)
    return fn(ctypes.byref(value), IPC_CAPABLE, ctypes.c_uint64(pointer)) == 0 and value.value == 1


def binding_verdict(why: str, all_gather: Callable[[str, Any], list]) -> str:
    """'' where every rank binds its buffers, else the first refusal of any rank (collective). Every rank decides
    together even where no peer maps the buffers: a rank that refused alone would run the call on another path
    (the communicator's staging context, not the template's) and its launch counters would part from its peers',
    so their packets never arrive."""
    verdicts = all_gather(BIND_VERDICT, why)
    return next((v for v in verdicts if v), "")


def context_refusal(name: str, rank: int, mine: tuple, peers: list[tuple]) -> str:
    """Why the ranks' calls cannot share one context, or ''. Each rank says (plan hash, bytes, dtype, variant) of the
    call it creates a context for (``_variant``: residual, norm); every rank must run the same plan at the same size
    and dtype, adding the same. A rank that found a cached context (its buffer at an address it had seen) says
    nothing, and its peers then read the next call it says: refused here where that call differs.

    >>> context_refusal("p", 0, ("h", 8, "bf16", False), [("h", 8, "bf16", False), ("h", 8, "fp16", False)])
    'plan p: rank 1 runs it on fp16 data and rank 0 on bf16; every rank must execute the same plan on the same dtype'
    """
    plan_hash, nbytes, dtype, variant = mine
    for r, (h, n, d, v) in enumerate(peers):
        if (h, n) != (plan_hash, nbytes):
            return (
                f"plan {name}: rank {r} runs another plan or size ({n} B) than rank {rank} ({nbytes} B); every "
                "rank must execute the same plan"
            )
        if d != dtype:
            return (
                f"plan {name}: rank {r} runs it on {d} data and rank {rank} on {dtype}; every rank must execute "
                "the same plan on the same dtype"
            )
        if v != variant:
            return (
                f"plan {name}: rank {r} passes residual and norm {v} and rank {rank} {variant}; every rank must "
                "pass the same"
            )
    return ""


class InterpreterEngine:
    """Runs Plans on this process's GPU together with ``world_size - 1`` peer processes: the engine of
    ``executor.Communicator`` on one host, which adds torch.distributed's API and the registry's plans."""

    stages = True  # contexts are collective, per buffer: the Communicator's eager calls go through its staging
    fuses_norm = True  # the RMSNorm epilogue (executor.reference.norm) runs in the all-reduce's launch
    direct_path = "zero_copy"  # a call on the caller's tensors: captured inside capture()

    def __init__(
        self,
        rank: int,
        world_size: int,
        store: Any = None,
        device: int | None = None,
        timeout_s: float = 30.0,
        programmatic: bool = True,
        trace: bool = False,
        ll128: bool = False,
        compiled: bool = False,
        late_trigger: bool = False,
        cluster: int = 1,
        gemm_tail: bool = False,
    ):
        """``programmatic``: launch with programmatic dependent launch (gpu_launch), so that back-to-back
        collectives overlap one kernel's start with the previous one's end; ``late_trigger``: compiled kernels let
        the next programmatic launch start only at their end (by default at their start). ``cluster``: launch each
        kernel in thread-block clusters of this many blocks (Hopper and newer; 1, the default: none) where they
        divide its grid and the GPU holds them all at once; the kernels do not use their clusters. ``gemm_tail``
        (Hopper and newer): after each kernel, launch an empty one in one cluster of 8 blocks. A memory-bound
        clustered cuBLAS GEMM after weft's call (tp_decode's gate-up projection, 470 MB of weights at TP=2) ran
        113-120 µs on one GPU of two, and 107-108 µs on both after such an empty clustered launch; weft's own
        kernel launched in clusters, with PDL or without, did not do it (bench/gemm_after.py; bench/NOTES.md,
        the twenty-first session). It costs one launch a call.
        ``trace``: run the timed build of the interpreter (gpu_trace; slower, for diagnosis) and keep per-block
        phase times, read by ``kernel_times``.
        ``ll128``: by default, move LL plans' packets as LL128 lines (120 data bytes per 128-byte line instead of 8
        per 16) where the size allows (tables.lines_possible) and every rank's buffers are 8-byte aligned; a
        call's ``lines`` overrides it. Lines rely on NVLink delivering a warp's 128-byte store whole, as NCCL's LL128
        does, so use them on NVLink machines only. ``compiled``: by default, run each context's plan as a kernel of
        its own (``executor.gpu.compiled``: its ops compile-time constants, built through NVRTC and cached) where
        the generator takes it, the interpreter elsewhere; a call's ``compiled`` overrides it."""
        if cluster < 1:
            raise ExecutorError(f"executor: cluster {cluster}: a cluster holds one block or more")
        import cupy

        if not 0 <= rank < world_size:
            raise ExecutorError(f"executor: rank {rank} is not in 0..{world_size - 1}")
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._cluster = cluster
        self._tail: gpu_launch.Launch | None = None  # made at the first launch, on this engine's device
        self._resident_clusters: dict[tuple[str, int], int] = {}  # (entry, threads) -> clusters the GPU holds
        self.launch_clusters: dict[int, int] = {}  # blocks a cluster -> launches prepared with it (1: no cluster)
        self.store = store if store is not None else bootstrap.store_from_env(rank, world_size)
        self.device = cupy.cuda.runtime.getDevice() if device is None else device
        self._cupy = cupy
        # a per-rank count of communicators on this store names this one's keys the same on every rank
        self._prefix = f"weft/{self.store.add(f'weft/communicators/{rank}', 1)}"
        self._keys = 0
        self._contexts: dict[tuple, _Context] = {}
        self._plans: dict[int, tuple[Plan, str]] = {}
        self._streams: dict[int, Any] = {}
        self._kernels: dict[str, Any] = {}  # interpreter entries by name
        # plan hash -> why a context of it runs the interpreter where its compiled kernel was asked for (the latest)
        self.compiled_refused: dict[str, str] = {}
        self._resident: dict[tuple[str, int], int] = {}  # (entry, threads) -> blocks the GPU holds at once
        self._peers = ipc.PeerMappings()
        # (plan, size, dtype, lines, with a residual) -> the first context made for them
        self._templates: dict[tuple[str, int, str, bool, bool | tuple[int, float]], _Context] = {}
        # (plan, message size, dtype, with a residual) -> padded (input, output, residual) buffers for sizes that
        # are not multiples of the plan's granule
        self._padded: dict[tuple[str, int, str, bool], tuple] = {}
        self._captured: list[CapturedExecution] = []
        self._residual_refusals: dict[str, str] = {}  # plan hash -> why it cannot add a residual, or ''
        self._norm_refusals: dict[str, str] = {}  # plan hash -> why it cannot run the norm epilogue, or ''
        self._rows_refusals: dict[tuple, str] = {}  # (plan hash, bytes, dtype, rows) -> why its rows do not fit
        self._graph_mode = False
        # the disarmed records' source (device) and target (host-mapped)
        self._marker: Any = None
        self._tripwire: ctypes.Array[ctypes.c_uint64] | None = None
        with cupy.cuda.Device(self.device):
            cc = cupy.cuda.Device(self.device).compute_capability
            self._launcher = gpu_launch.Launcher(programmatic and int(cc) >= 90)  # PDL needs Hopper or newer
            self._module = gpu_build.load_module(cc, trace)
            self._trace, self._ll128, self._compiled = trace, ll128, compiled
            self._late_trigger = late_trigger
            self._cc = cc
            self._gemm_tail = gemm_tail and int(cc) >= 90  # clusters need Hopper or newer
            # inbound counters are written by peers, so they get their own shared allocation
            self._inbound = cupy.zeros(MAX_CHANNELS, cupy.uint64)
            self._expected = cupy.zeros(MAX_CHANNELS, cupy.uint64)
            self._barriers = cupy.zeros(MAX_BARRIERS, cupy.uint64)
            self._error_host = cupy.cuda.runtime.hostAlloc(4 * ERROR_WORDS, HOST_ALLOC_PORTABLE_MAPPED)
            self._error_device = self._error_host  # mapped pinned memory has one address under UVA
            self._error = np.ctypeslib.as_array((ctypes.c_int32 * ERROR_WORDS).from_address(self._error_host))
            self._error[:] = 0
            cupy.cuda.runtime.deviceSynchronize()
        shared = self._all_gather("inbound", ipc.export(self._inbound.data.ptr))
        self._peer_inbound = [
            self._inbound.data.ptr if r == rank else self._peers.open(s) for r, s in enumerate(shared)
        ]
        self.hosts = tuple(self._all_gather("host", host_identity()))  # a memory channel never crosses them

    @classmethod
    def from_process_group(
        cls,
        group: Any = None,
        timeout_s: float = 30.0,
        programmatic: bool = True,
        ll128: bool = False,
        compiled: bool = False,
        cluster: int = 1,
        gemm_tail: bool = False,
    ) -> InterpreterEngine:
        """A communicator over torch.distributed's default group, bootstrapped through its store."""
        import torch.distributed as dist

        store = bootstrap.process_group_store(group)
        return cls(
            dist.get_rank(group),
            dist.get_world_size(group),
            store,
            timeout_s=timeout_s,
            programmatic=programmatic,
            ll128=ll128,
            compiled=compiled,
            cluster=cluster,
            gemm_tail=gemm_tail,
        )

    # ------------------------------------------------------------------ running plans

    def execute(
        self,
        plan: Plan | dict | str | Path,
        input: Any,
        output: Any = None,
        stream: Any = None,
        dtype: str | None = None,
        lines: bool | None = None,
        residual: Any = None,
        norm: NormCall | None = None,
        compiled: bool | None = None,
    ) -> Any:
        """Run ``plan`` on ``input`` (and ``output``, allocated when None) on ``stream``; returns the output.

        ``stream``: a torch or CuPy stream or a raw handle; default the current stream of input's framework.
        ``dtype``: needed only for CuPy bf16 (held as uint16).
        ``lines``: move an LL plan's packets as LL128 lines where it can (default: the communicator's ``ll128``).
        ``compiled``: run the plan compiled to a kernel of its own where the generator takes it (default: the
        engine's ``compiled``); the context is the same, so calls may alternate (``compiled_refused`` says why not).
        ``residual``: an all-reduce's output is the sum plus this buffer (input-sized), in the same launch: the
        reductions that write outputs add it after their sums (executor.reference.norm.residual_refusal), each
        with its own rank's residual, so pass the same values on every rank, as a transformer's residual stream
        holds. Every rank passes one, or none does.
        ``norm``: with a residual, also the RMSNorm epilogue (``executor.reference.norm``): ``norm.normed`` receives
        each output row normalized and times ``norm.weight``, in the same launch (the plan's rows must fit:
        ``norm_refusal``).
        For in-place plans pass the larger buffer as ``input``; the smaller lives inside it at the rank's slice.
        An output allocated here belongs to the context: later calls on the same input reuse it.
        A message that is not a multiple of the plan's granule runs padded (``schedules.padding``): each part is
        copied to its padded place in buffers this executor keeps per plan and size, the plan runs there, and each
        output part is copied back, all on ``stream`` (an output allocated for it is fresh each call). Calls of one
        plan and size share those buffers, so issue them on one stream, as calls on one buffer must be.
        """
        plan, plan_hash, buf, out, dtype = self._arguments(plan, input, output, dtype)
        padding = self._padding(plan, buf, dtype)
        if padding is not None and norm is not None:
            raise ExecutorError(
                f"plan {plan.name}: {buf.nbytes} B runs padded, and the norm epilogue needs whole rows "
                "in place (executor.reference.norm.rows_refusal)"
            )
        if padding is not None:
            return self._execute_padded(
                plan, padding, input, buf, output, out, stream, dtype, lines, residual, compiled
            )
        lines = self._ll128 if lines is None else lines
        res = self._residual(plan, buf, residual, dtype)
        normed = self._norm_buffers(plan, buf, res, norm, dtype)
        key = (
            plan_hash,
            buf.pointer,
            buf.nbytes,
            out.pointer if out else 0,
            dtype,
            lines,
            res.pointer if res else 0,
            _variant(res, norm),
            tuple(b.pointer for b in normed),
        )
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._create_context(plan, plan_hash, input, buf, output, out, dtype, lines, res, norm, normed)
            self._contexts[key] = ctx
            template = (plan_hash, ctx.nbytes, dtype, lines, _variant(res, norm))
            if self._templates.setdefault(template, ctx) is ctx and self._graph_mode:
                self._add_records(ctx)  # made inside capture() by an eager call (a warm-up), so outside a graph
        use = self._compiled if compiled is None else compiled
        if use:
            self._compile(ctx, dtype, plan)  # collective: every rank asks, whatever its buffers
        self._launch(ctx, dtype, buf.framework, stream, compiled=use and not overlapping(plan, buf, out))
        return ctx.output

    @contextmanager
    def capture(self) -> Iterator[InterpreterEngine]:
        """A block for CUDA graph captures with zero-copy executions; leaving it registers their buffers.

        Enter it before the captures and leave it before the first replay: a graph replayed earlier runs
        nothing of its captured executions, and the next ``execute``, ``synchronize`` or registration raises.
        Leaving is collective. Leaving on an exception registers nothing (the records stay disarmed).
        """
        if self._graph_mode:
            raise ExecutorError("executor: capture() is already open; graphs captured in one block register together")
        self._graph_mode = True
        try:
            for ctx in list(self._templates.values()):
                self._add_records(ctx)
            yield self
        except BaseException:
            self._graph_mode = False
            self._captured.clear()
            raise
        self._graph_mode = False
        self.register_graph_buffers()

    def execute_captured(
        self,
        plan: Plan | dict | str | Path,
        input: Any,
        output: Any = None,
        stream: Any = None,
        dtype: str | None = None,
        lines: bool | None = None,
        residual: Any = None,
        norm: NormCall | None = None,
        compiled: bool | None = None,
    ) -> str:
        """Inside ``capture()``, while a graph captures: run ``plan`` on ``input`` and ``output`` with no copy.

        The execution shares the context an eager ``execute`` made for this plan, size, dtype and ``lines`` (its
        scratch, counters and peer mappings; with ``residual``, one made with a residual) and takes a binding record
        of its own, armed at registration. Returns
        '' when it launched, else why it did not (nothing launched): no such context, a buffer not aligned to the
        context's vectors, no free record, or, for plans whose peers map this rank's input or output, a buffer
        that CUDA IPC cannot share on some rank. Every rank decides together (collective: one exchange through the
        store per captured call), so that no rank runs the call on a path its peers do not. ``compiled``: the graph
        launches the context's compiled kernel where an eager call built it (none is built inside a capture), else the
        interpreter.
        """
        if not self._graph_mode:
            raise ExecutorError("executor: execute_captured runs inside comm.capture() only")
        plan, plan_hash, buf, out, dtype = self._arguments(plan, input, output, dtype, capturing=True)
        if self._padding(plan, buf, dtype) is not None:
            return (
                f"plan {plan.name}: {buf.nbytes} B of input is not a multiple of the plan's granule "
                f"({plan.granule} B per message): it runs padded, through copies, not on the captured buffers"
            )
        lines = self._ll128 if lines is None else lines
        res = self._residual(plan, buf, residual, dtype)
        normed = self._norm_buffers(plan, buf, res, norm, dtype)
        ctx = self._templates.get((plan_hash, self._message_bytes(plan, buf), dtype, lines, _variant(res, norm)))
        in_ptr = out_ptr = 0
        if ctx is None:
            why = (
                f"no context for plan {plan.name} at {buf.nbytes} B of input{' with a residual' if res else ''}: "
                "execute it once before capturing"
            )
        else:
            self._check_output(plan, ctx.tables, out, dtype)
            in_ptr, out_ptr = self._pointers(plan, ctx.tables, buf, out)
            why = self._bind_refusal(ctx, in_ptr, out_ptr, res.pointer if res else None, *(b.pointer for b in normed))
        why = binding_verdict(f"rank {self.rank}: {why}" if why else "", self._all_gather)
        if why:
            return why
        assert ctx is not None and ctx.records is not None  # every rank bound; templates made in capture() got records
        mine = {"i": in_ptr, "o": out_ptr}
        deferred = {slot for slot, _, _ in ctx.peers.deferred}
        slots = (in_ptr, out_ptr, *(0 if k in deferred else p for k, p in enumerate(ctx.slots) if k >= 2))
        own = [b.pointer for b in ([res] if res is not None else []) + normed]  # the residual, weight, normed
        if own:
            slots = (*slots[: -len(own)], *own)
        captured = CapturedExecution(
            ctx.plan_hash,
            ctx.nbytes,
            slots,
            ctx.peers.deferred,
            tuple((t, mine[t]) for t in ctx.peers.exported),
            ctx.records.used,
            ctx,
        )
        ctx.records.used += 1
        self._captured.append(captured)
        address = ctx.records.address(captured.record)
        args = with_kernel_args(ctx.args, tb_start=address, buffers=address + ctx.records.layout.tb_bytes)
        use = self._compiled if compiled is None else compiled
        self._launch(ctx, dtype, buf.framework, stream, args, compiled=use and not overlapping(plan, buf, out))
        return ""

    def register_graph_buffers(self) -> None:
        """Arm every execution captured since the last registration (collective: every rank, after its captures
        and before the first replay). Peers' buffers are exchanged in capture order, as allocation handle and
        offset; every rank must have captured the same executions."""
        cupy = self._cupy
        captured, self._captured = self._captured, []
        shared = [c for c in captured if c.context.peers.collective]
        with cupy.cuda.Device(self.device):
            cupy.cuda.runtime.deviceSynchronize()  # no replay of a disarmed record is still running
            gathered = self._all_gather("graph-buffers", share_records(shared, ipc.export))
            filled = dict(zip(map(id, shared), peer_slots(shared, gathered, self.rank, self._peers.open), strict=True))
            for c in captured:
                records = c.context.records
                records.write(c.record, records.layout.armed(c.context.tables.tb_start, filled.get(id(c), c.slots)))
            cupy.cuda.runtime.deviceSynchronize()
        self._check_tripwire()

    def kernel_times(
        self, plan: Plan | dict | str | Path, nbytes: int, dtype: str, lines: bool | None = None, residual: bool = False
    ) -> list[gpu_trace.BlockTimes]:
        """Per-block mean phase times (µs per launch) of ``plan`` at ``nbytes`` (its context's message size) and
        ``dtype`` (with a residual where ``residual``), over every launch since ``reset_kernel_times`` (or the
        first); needs ``trace=True``."""
        if not self._trace:
            raise ExecutorError("executor: kernel_times needs a Communicator made with trace=True")
        plan, plan_hash = self._plan(plan)
        ctx = self._templates.get((plan_hash, nbytes, dtype, self._ll128 if lines is None else lines, residual))
        if ctx is None:
            raise ExecutorError(f"executor: plan {plan.name} has not run at {nbytes} B {dtype} here")
        self.synchronize()
        t = ctx.tables
        launches = self._launches(ctx) - ctx.traced_before
        ops = [int(t.tb_start[b + 1] - t.tb_start[b]) for b in range(t.nthreadblocks)]
        return gpu_trace.summarize(ctx.trace.get(), t.nthreadblocks, ops, launches)

    def reset_kernel_times(self) -> None:
        """Zero every context's trace sums, so that ``kernel_times`` covers only the launches after this one
        (warm-ups and captures left out); needs ``trace=True``."""
        if not self._trace:
            raise ExecutorError("executor: reset_kernel_times needs a Communicator made with trace=True")
        self.synchronize()
        for ctx in self._contexts.values():
            ctx.trace.fill(0)
            ctx.traced_before = self._launches(ctx)

    @staticmethod
    def _launches(ctx: _Context) -> int:
        """Launches of ``ctx`` so far: its first thread block's epoch."""
        return int(ctx.state[-ctx.tables.nthreadblocks :].get()[0])

    def synchronize(self, stream: Any = None) -> None:
        """Wait for this rank's launches; raise ExecutorTimeout if a wait on the GPU ran past its bound."""
        if stream is None:
            self._cupy.cuda.runtime.deviceSynchronize()
        else:
            self._stream(stream, "cupy").synchronize()
        if self._error[0]:
            self._raise_device_error()
        self._check_tripwire()

    def close(self) -> None:
        self._contexts.clear()
        self._templates.clear()
        self._captured.clear()
        self._peers.close()
        if self._error_host:
            self._cupy.cuda.runtime.freeHost(self._error_host)
            self._error_host = 0
        if self._tripwire is not None:
            self._cupy.cuda.runtime.freeHost(ctypes.addressof(self._tripwire))
            self._tripwire = self._marker = None

    # ------------------------------------------------------------------ internals

    def _plan(self, plan: Plan | dict | str | Path) -> tuple[Plan, str]:
        if isinstance(plan, (str, Path)):
            plan = load_plan(plan)
        elif isinstance(plan, dict):
            plan = parse_plan(plan, "plan")
        cached = self._plans.get(id(plan))
        if cached is None or cached[0] is not plan:
            cached = (plan, plan.content_hash)
            self._plans[id(plan)] = cached
        return cached

    def exchange(self, what: str, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (collective: every rank calls it, in the same order). Values are
        plain data (bootstrap.encode: JSON through the store, never a pickle, which would run code sent by
        anyone who can reach the store); ``what`` names the exchange in errors."""
        return self._all_gather(what, value)

    def _all_gather(self, what: str, value: Any) -> list[Any]:
        self._keys += 1
        if self._keys == 1:  # the first exchange: each rank says who it is, so that a peer that dies can be named
            self._roster = liveness.Roster.join(self.store, self._prefix, self.rank, self.world_size)
        # a peer that exits is found within a fraction of a second; the bound is for live peers that are slow
        return self._roster.all_gather(f"{self._prefix}/{self._keys}/{what}", value, max(self.timeout_s, 60.0))

    def _message_bytes(self, plan: Plan, buf: _Buffer) -> int:
        check_world(plan, self.world_size)  # before this rank's entry is looked up: a smaller plan has none
        gpu = plan.gpus[self.rank]
        if plan.inplace:
            return buf.nbytes
        if gpu.input_chunks == 0 or buf.nbytes % gpu.input_chunks:
            raise ExecutorError(
                f"plan {plan.name}: input of {buf.nbytes} B does not split into the plan's "
                f"{gpu.input_chunks} input chunks"
            )
        return buf.nbytes // gpu.input_chunks * plan.size_chunks

    def _padding(self, plan: Plan, buf: _Buffer, dtype: str) -> Padding | None:
        """How this input's message runs padded, or None where it runs directly (or fails there, as it should)."""
        check_world(plan, self.world_size)
        if plan.inplace:
            nbytes = buf.nbytes
        else:
            parts = buffer_parts(plan, plan.gpus[self.rank].input_chunks)
            if parts == 0 or buf.nbytes % parts:
                return None
            nbytes = buf.nbytes // parts * plan.message_parts
        if nbytes % plan.granule == 0:
            return None
        try:
            padding = plan.padding(nbytes)
        except PlanError as e:
            raise ExecutorError(str(e)) from None
        if dtype in DTYPE_BYTES and padding.part_bytes % DTYPE_BYTES[dtype]:
            raise ExecutorError(
                f"plan {plan.name}: size {nbytes} B: its parts of {padding.part_bytes} B are not whole {dtype} elements"
            )
        return padding

    def _execute_padded(
        self,
        plan: Plan,
        padding: Padding,
        input: Any,
        buf: _Buffer,
        output: Any,
        out: _Buffer | None,
        stream: Any,
        dtype: str,
        lines: bool | None,
        residual: Any,
        compiled: bool | None = None,
    ) -> Any:
        """``execute`` at a size that is not a multiple of the plan's granule: parts copied to their padded places,
        the plan run there, output parts copied back, all on the caller's stream."""
        res = self._residual(plan, buf, residual, dtype)
        gpu = plan.gpus[self.rank]
        in_parts = plan.message_parts if plan.inplace else buffer_parts(plan, gpu.input_chunks)
        out_parts = in_parts if plan.inplace else buffer_parts(plan, gpu.output_chunks)
        m, stride = padding.part_bytes, padding.padded_part_bytes
        if not plan.inplace:
            if output is None:
                output = self._allocate_output(input, buf, out_parts * m)
                out = _describe(output, "output")
            assert out is not None  # described by execute, or just now
            if out.nbytes != out_parts * m or out.dtype not in (None, dtype) or out.device != self.device:
                raise ExecutorError(
                    f"plan {plan.name}: output must be {dtype} of {out_parts * m} B on GPU "
                    f"{self.device} for this input, not {out.nbytes} B"
                )
        key = (plan.content_hash, padding.nbytes, dtype, res is not None)
        staged = self._padded.get(key)
        if staged is None:
            with self._cupy.cuda.Device(self.device):
                staged = tuple(
                    self._cupy.zeros(max(n, 16), self._cupy.uint8) if n else None
                    for n in (
                        in_parts * stride,
                        0 if plan.inplace else out_parts * stride,
                        in_parts * stride if res else 0,
                    )
                )
                self._cupy.cuda.runtime.deviceSynchronize()
            self._padded[key] = staged
        padded_in, padded_out, padded_res = staged
        handle = self._stream_handle(stream, buf.framework)
        self._copy_parts(padded_in.data.ptr, stride, buf.pointer, m, m, in_parts, handle)
        if res is not None:
            self._copy_parts(padded_res.data.ptr, stride, res.pointer, m, m, in_parts, handle)
        self.execute(
            plan,
            padded_in[: in_parts * stride],
            None if plan.inplace else padded_out[: out_parts * stride],
            stream=handle,
            dtype=dtype,
            lines=lines,
            residual=None if res is None else padded_res[: in_parts * stride],
            compiled=compiled,
        )
        result = (padded_in if plan.inplace else padded_out).data.ptr
        target = buf if plan.inplace else out
        assert target is not None  # out of place: checked above
        self._copy_parts(target.pointer, m, result, stride, m, out_parts, handle)
        return input if plan.inplace else output

    def _copy_parts(
        self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, parts: int, stream: int
    ) -> None:
        """Copy ``parts`` rows of ``width`` bytes between pitched device buffers on ``stream`` (one 2-D copy)."""
        if parts and width:
            self._cupy.cuda.runtime.memcpy2DAsync(
                dst, dst_pitch, src, src_pitch, width, parts, MEMCPY_DEVICE_TO_DEVICE, stream
            )

    def _pointers(self, plan: Plan, tables: DeviceTables, buf: _Buffer, out: _Buffer | None) -> tuple[int, int]:
        """(input, output) addresses; in-place plans keep the smaller buffer inside the larger one."""
        if not plan.inplace:
            assert out is not None  # execute described or allocated it
            return buf.pointer, out.pointer
        offset_i, offset_o = plan.inplace_offsets(self.rank, tables.input_bytes, tables.output_bytes)
        return buf.pointer + offset_i, buf.pointer + offset_o

    def _allocate_output(self, input: Any, buf: _Buffer, nbytes: int) -> Any:
        if buf.framework == "torch":
            import torch

            return torch.empty(nbytes // input.element_size(), dtype=input.dtype, device=input.device)
        return self._cupy.empty(nbytes // input.dtype.itemsize, dtype=input.dtype)

    def _arguments(
        self, plan: Plan | dict | str | Path, input: Any, output: Any, dtype: str | None, capturing: bool = False
    ) -> tuple[Plan, str, _Buffer, _Buffer | None, str]:
        """Check for a pending error, and read one execution's arguments: (plan, hash, input, output, dtype).
        ``capturing``: a stream captures, where the recovery (which synchronizes the device) cannot run."""
        if self._error[0]:
            self._raise_device_error(recover=not capturing)
        self._check_tripwire()
        plan, plan_hash = self._plan(plan)
        buf = _describe(input, "input")
        dtype = dtype or buf.dtype
        if dtype is None:
            raise ExecutorError("executor: input dtype is not fp32, fp16 or bf16 (pass dtype= for CuPy bf16)")
        if buf.device != self.device:
            raise ExecutorError(
                f"executor: input is on GPU {buf.device} but rank {self.rank} runs on GPU {self.device}"
            )
        return plan, plan_hash, buf, _describe(output, "output") if output is not None else None, dtype

    def plan_refusal(self, plan: Plan) -> str:
        """Why this engine cannot run ``plan`` here (a memory channel between hosts), or ''."""
        return ipc_across_hosts(plan, self.hosts)

    def residual_refusal(self, plan: Plan | dict | str | Path) -> str:
        """Why ``plan`` cannot add a residual in its launch, or '' (executor.reference.norm.residual_refusal, once
        per plan)."""
        plan, plan_hash = self._plan(plan)
        why = self._residual_refusals.get(plan_hash)
        if why is None:
            why = self._residual_refusals[plan_hash] = residual_refusal(plan)
        return why

    def _residual(self, plan: Plan, buf: _Buffer, residual: Any, dtype: str) -> _Buffer | None:
        """The residual buffer of an execution, checked against its plan and input; None without one."""
        if residual is None:
            return None
        res = _describe(residual, "residual")
        why = self.residual_refusal(plan)
        if why:
            raise ExecutorError(f"executor: {why}")
        if res.nbytes != buf.nbytes or res.dtype not in (None, dtype) or res.device != self.device:
            raise ExecutorError(
                f"plan {plan.name}: the residual must be {dtype} of {buf.nbytes} B (the input's size) "
                f"on GPU {self.device}, not {res.dtype} of {res.nbytes} B on GPU {res.device}"
            )
        return res

    def norm_refusal(self, plan: Plan | dict | str | Path) -> str:
        """Why ``plan`` cannot run the RMSNorm epilogue at any size, or '' (executor.reference.norm.fused_refusal,
        once per plan)."""
        plan, plan_hash = self._plan(plan)
        why = self._norm_refusals.get(plan_hash)
        if why is None:
            why = self._norm_refusals[plan_hash] = fused_refusal(plan)
        return why

    def _norm_buffers(
        self, plan: Plan, buf: _Buffer, res: _Buffer | None, norm: NormCall | None, dtype: str
    ) -> list[_Buffer]:
        """[weight, normed] of an execution with the norm epilogue, checked against its plan and input; []
        without one."""
        if norm is None:
            return []
        if res is None:
            raise ExecutorError(f"plan {plan.name}: the norm epilogue needs a residual")
        nbytes = self._message_bytes(plan, buf)
        key = (plan.content_hash, nbytes, dtype, norm.rows)  # once per shape: an eager call must not walk the plan
        if key not in self._rows_refusals:
            self._rows_refusals[key] = rows_refusal(plan, nbytes, dtype, norm.rows)
        why = self.norm_refusal(plan) or self._rows_refusals[key]
        if why:
            raise ExecutorError(f"executor: {why}")
        weight, normed = _describe(norm.weight, "norm weight"), _describe(norm.normed, "normed output")
        row = norm.rows.row_bytes(dtype)
        for b, name, nbytes in ((weight, "norm weight", row), (normed, "normed output", buf.nbytes)):
            if b.nbytes != nbytes or b.dtype not in (None, dtype) or b.device != self.device:
                raise ExecutorError(
                    f"plan {plan.name}: the {name} must be {dtype} of {nbytes} B on GPU {self.device}, "
                    f"not {b.dtype} of {b.nbytes} B on GPU {b.device}"
                )
        return [weight, normed]

    def _check_output(self, plan: Plan, tables: DeviceTables, out: _Buffer | None, dtype: str) -> None:
        if plan.inplace:
            if out is not None:
                raise ExecutorError(f"plan {plan.name} is in-place: pass one buffer as input and no output")
            return
        if out is None:
            raise ExecutorError(f"plan {plan.name}: pass an output buffer (none can be allocated in a capture)")
        if out.nbytes != tables.output_bytes:
            raise ExecutorError(
                f"plan {plan.name}: output holds {out.nbytes} B, the plan writes {tables.output_bytes} B for this input"
            )
        if out.dtype not in (None, dtype) or out.device != self.device:
            raise ExecutorError(f"plan {plan.name}: output must be {dtype} on GPU {self.device}")

    def _create_context(
        self,
        plan: Plan,
        plan_hash: str,
        input: Any,
        buf: _Buffer,
        output: Any,
        out: _Buffer | None,
        dtype: str,
        lines: bool,
        res: _Buffer | None,
        norm: NormCall | None = None,
        normed: Sequence[_Buffer] = (),
    ) -> _Context:
        cupy = self._cupy
        nbytes = self._message_bytes(plan, buf)
        check_launch(plan, self.world_size, nbytes, dtype)
        if ipc_across_hosts(plan, self.hosts):
            raise ExecutorError(ipc_across_hosts(plan, self.hosts))
        fused = res is not None
        rows = norm.rows if norm is not None else None
        tables = build_tables(plan, self.rank, nbytes, residual=fused, norm=rows, dtype=dtype)
        if not plan.inplace and output is None:
            output = self._allocate_output(input, buf, tables.output_bytes)
            out = _describe(output, "output")
        self._check_output(plan, tables, out, dtype)
        if plan.inplace:
            output = input
        in_ptr, out_ptr = self._pointers(plan, tables, buf, out)
        # LL128 lines only where every rank asks for them and can (same size and 8-byte aligned buffers)
        lined = (
            build_tables(plan, self.rank, nbytes, lines=True, residual=fused, norm=rows, dtype=dtype)
            if (lines and lines_possible(plan, nbytes) and in_ptr % 8 == 0 and out_ptr % 8 == 0)
            else None
        )
        with cupy.cuda.Device(self.device):
            scratch = cupy.zeros(max(tables.scratch_alloc, lined.scratch_alloc if lined else 0, 16), cupy.uint8)
            fill_scratch(cupy, scratch, tables)  # a Lamport plan's copies start as its sentinel
            nsem = max(len(tables.semaphore_init), 1)
            init = np.zeros(2 * nsem + tables.nthreadblocks, np.uint64)
            init[0 : 2 * len(tables.semaphore_init) : 2] = tables.semaphore_init
            state = cupy.asarray(init)
            trace = cupy.zeros(tables.nthreadblocks * gpu_trace.TRACE_SLOTS if self._trace else 1, cupy.uint64)
            mine = {"i": in_ptr, "o": out_ptr, "s": scratch.data.ptr}
            shares = {t: ipc.export(p) for t, p in mine.items()}
            call = (plan_hash, nbytes, dtype, _variant(res, norm))
            peers = self._all_gather("context", (*call, shares, lined is not None))
            if lined is not None and all(p[5] for p in peers):
                tables = lined
            why = context_refusal(plan.name, self.rank, call, [p[:4] for p in peers])
            if why:
                raise ExecutorError(why)
            remote = [self._peers.open(peers[r][4][t]) for r, t in tables.remote_buffers]
            slots = [
                in_ptr,
                out_ptr,
                scratch.data.ptr,
                *remote,
                *([res.pointer] if fused and res is not None else []),
                *(b.pointer for b in normed),
            ]
            outbound = [
                self._peer_inbound[p] + 8 * c for p, c in zip(tables.channel_peers, tables.paired_channel, strict=True)
            ]
            ops = cupy.asarray(with_tripwire(tables.ops).view(np.uint8))
            tb_start = cupy.asarray(tables.tb_start)
            slot_table = cupy.asarray(np.asarray(slots, np.uint64))
            outbound_table = cupy.asarray(np.asarray(outbound or [0], np.uint64))
            cupy.cuda.runtime.deviceSynchronize()
        width = vector_bytes(tables.vector_bytes, *slots)
        return _Context(
            tables=tables,
            arrays=[ops, tb_start, slot_table, outbound_table],
            scratch=scratch,
            state=state,
            semaphore_init=init,
            vector_bytes=width,
            output=output,
            plan_hash=plan_hash,
            nbytes=nbytes,
            slots=tuple(slots),
            peers=peer_mapping(plan, self.rank),
            trace=trace,
            args=kernel_args(
                ops=ops,
                tb_start=tb_start,
                buffers=slot_table,
                outbound=outbound_table,
                inbound=self._inbound,
                expected=self._expected,
                barriers=self._barriers,
                semaphores=state,
                epochs=state[2 * nsem :],
                error=self._error_device,
                timeout_ns=int(self.timeout_s * 1e9),
                rank=self.rank,
                scratch_half=tables.scratch_stride,
                nslots=len(slots),
                uniform_ops=tables.uniform_ops,
                **({"trace": trace} if self._trace else {}),
            ),
        )

    def _bind_refusal(
        self, ctx: _Context, in_ptr: int, out_ptr: int, res_ptr: int | None = None, *norm_ptrs: int
    ) -> str:
        """Why this rank cannot run a captured execution on these buffers through a record of ``ctx``, or ''."""
        misaligned = [p for p in (in_ptr, out_ptr, res_ptr or 0, *norm_ptrs) if p % ctx.vector_bytes]
        if misaligned:
            return f"a buffer is not aligned to the plan's {ctx.vector_bytes}-byte vectors"
        if ctx.records is None or ctx.records.free == 0:
            return f"all {GRAPH_RECORDS} free binding records of this plan and size are taken in this capture()"
        shared = [p for t, p in (("i", in_ptr), ("o", out_ptr)) if t in ctx.peers.exported]
        if not all(ipc_capable(p) for p in shared):
            return "a buffer cannot be shared by CUDA IPC (expandable segments or virtual memory)"
        return ""

    def _add_records(self, ctx: _Context) -> None:
        """Top ``ctx`` up to GRAPH_RECORDS free binding records, written disarmed (outside any capture)."""
        cupy = self._cupy
        if ctx.records is None:
            ctx.records = _Records(BindingLayout(ctx.tables.nthreadblocks, len(ctx.slots)))
        if ctx.records.free >= GRAPH_RECORDS:
            return
        with cupy.cuda.Device(self.device):
            if self._tripwire is None:
                self._marker = cupy.full(TRIPWIRE_BYTES, 0x5E, cupy.uint8)
                host = cupy.cuda.runtime.hostAlloc(TRIPWIRE_BYTES, HOST_ALLOC_PORTABLE_MAPPED)
                self._tripwire = (ctypes.c_uint64 * (TRIPWIRE_BYTES // 8)).from_address(host)
                ctypes.memset(host, 0, TRIPWIRE_BYTES)
            layout = ctx.records.layout
            # mapped pinned memory has one address under UVA, as the error record's
            disarmed = layout.disarmed(len(ctx.tables.ops), self._marker.data.ptr, ctypes.addressof(self._tripwire))
            chunk = cupy.asarray(np.tile(disarmed, GRAPH_RECORDS))
            cupy.cuda.runtime.deviceSynchronize()
        ctx.records.chunks.append(chunk)

    def _check_tripwire(self) -> None:
        if self._tripwire is not None and any(self._tripwire):
            ctypes.memset(ctypes.addressof(self._tripwire), 0, TRIPWIRE_BYTES)
            raise ExecutorError(
                "executor: a CUDA graph replayed executions captured inside comm.capture() before "
                "their buffers were registered, so they did nothing; leave capture() (or call "
                "register_graph_buffers()) before replaying"
            )

    def _stream(self, stream: Any, framework: str):
        handle = self._stream_handle(stream, framework)
        s = self._streams.get(handle)
        if s is None:
            s = self._cupy.cuda.ExternalStream(handle, self.device)
            self._streams[handle] = s
        return s

    def _stream_handle(self, stream: Any, framework: str) -> int:
        """The raw CUDA stream a launch goes to (the framework's current stream by default)."""
        if stream is None:
            if framework == "torch":
                import torch

                return torch._C._cuda_getCurrentRawStream(self.device)
            return self._cupy.cuda.get_current_stream().ptr
        return stream.cuda_stream if hasattr(stream, "cuda_stream") else getattr(stream, "ptr", stream)

    def _call_label(self, plan: Plan, nbytes: int, dtype: str) -> str:
        """How a compiled kernel's call is named (its source's first line, refusals, ``precompile``'s keys)."""
        return f"plan {plan.name}: rank {self.rank}: {nbytes} B {dtype}"

    def precompile(
        self, calls: Sequence[tuple[Plan, int, str]], threads: int | None = None, lines: bool | None = None
    ) -> dict[str, str]:
        """Builds the compiled kernels of ``calls`` (plan, message bytes, dtype: what ``execute(..., compiled=True)``
        launches for an aligned buffer, without a residual) into the kernel cache, ``threads`` NVRTC builds side by
        side, so that the first compiled call of each finds its kernel built instead of building it while its peers
        wait. ``lines`` (default: the engine's ``ll128``): an LL plan's kernel with its packets as LL128 lines too,
        where the size allows (what a call with lines launches; the kernel without them stays the fallback of a
        buffer that is not 8-byte aligned). This rank's kernels only (no peer takes part). Returns {call: why} for
        the calls that will run the interpreter: the generator or NVRTC refused them, or the plan does not run that
        call here; a refused lines kernel is named with " (LL128 lines)" after its call."""
        from executor.gpu.compiled import build, source_for
        from executor.gpu.compiled.source import CompiledSource

        sources: list[CompiledSource] = []
        refused: dict[str, str] = {}
        labels: dict[str, list[str]] = {}  # entry: the calls that launch it
        lines = self._ll128 if lines is None else lines
        for plan, nbytes, dtype in calls:
            label = self._call_label(plan, nbytes, dtype)
            try:
                check_launch(plan, self.world_size, nbytes, dtype)
            except (ExecutorError, PlanError) as e:
                refused[label] = str(e)
                continue
            kinds = [(label, False)]
            if lines and lines_possible(plan, nbytes):
                kinds.append((f"{label} (LL128 lines)", True))
            for name, lined in kinds:
                try:
                    tables = build_tables(plan, self.rank, nbytes, lines=lined, dtype=dtype)
                    generated = source_for(tables, dtype, tables.vector_bytes, label, self._trace, self._late_trigger)
                except (ExecutorError, PlanError) as e:
                    refused[name] = str(e)
                    break  # the plain kernel refused: its lines form is not tried
                sources.append(generated)
                labels.setdefault(generated.entry, []).append(name)
        for entry, why in build.prebuild(sources, f"sm_{self._cc}", threads, self._trace).items():
            refused.update({label: why for label in labels[entry]})
        return refused

    def _compile(self, ctx: _Context, dtype: str, plan: Plan) -> None:
        """Give ``ctx`` its compiled kernel (built once, cached on disk), or the reason it runs the interpreter.

        Collective, once per context: every rank builds its kernel before any launches one (a build takes seconds,
        longer than a peer should spin for it), and a refusal on any rank sends every rank to the interpreter."""
        if ctx.compiled is not None or ctx.compiled_why:
            return
        from executor.gpu.compiled import kernel_for

        label = self._call_label(plan, ctx.nbytes, dtype)
        why = ""
        try:
            with self._cupy.cuda.Device(self.device):
                ctx.compiled = kernel_for(
                    ctx.tables, dtype, ctx.vector_bytes, label, self._cc, self._trace, self._late_trigger
                )
        except ExecutorError as e:
            why = str(e)
        except ImportError as e:  # a CuPy without NVRTC's binding
            why = f"executor: {label}: not compiled: NVRTC is not available ({e})"
        except Exception as e:  # the driver refusing the module (CuPy's own errors): the peers must still hear
            why = f"executor: {label}: not compiled: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ctx.compiled_why = next((w for w in self._all_gather("compiled", why) if w), "")
        if ctx.compiled_why:
            ctx.compiled = None
            self.compiled_refused[ctx.plan_hash] = ctx.compiled_why
        else:
            self.compiled_refused.pop(ctx.plan_hash, None)

    def _prepare(self, ctx: _Context, dtype: str, args: tuple, compiled: bool = False) -> gpu_launch.Launch:
        t = ctx.tables
        if compiled:
            name, kernel = f"compiled:{getattr(ctx.compiled, 'name', id(ctx))}", ctx.compiled
        else:
            name = gpu_build.kernel_name(dtype, ctx.vector_bytes, t.threads, lamport=t.lamport_buffers > 0)
            kernel = self._kernels.get(name)
            if kernel is None:
                kernel = self._kernels[name] = self._module.get_function(name)
        fits = self._resident.get((name, t.threads))
        if fits is None:
            fits = self._resident[(name, t.threads)] = gpu_build.resident_blocks(kernel, t.threads, self.device)
        if t.nthreadblocks > fits:
            raise ExecutorError(
                f"executor: plan needs {t.nthreadblocks} thread blocks of {t.threads} threads at "
                f"once but GPU {self.device} holds {fits}; compile it with fewer --instances "
                "or --threads"
            )
        function = getattr(kernel, "kernel", kernel).ptr  # a RawKernel wraps the driver function
        cluster = self._cluster_of(name, function, t.nthreadblocks, t.threads)
        self.launch_clusters[cluster] = self.launch_clusters.get(cluster, 0) + 1
        return self._launcher.prepare(function, t.nthreadblocks, t.threads, gpu_launch.Arguments.pack(args), cluster)

    def _cluster_of(self, name: str, function: int, blocks: int, threads: int) -> int:
        """The cluster this launch takes (``cluster`` in __init__): 1 before Hopper, where it does not divide the
        grid, or where the GPU cannot hold the grid's clusters all at once (the blocks wait on each other)."""
        cluster = self._cluster
        if cluster == 1 or int(self._cc) < 90 or blocks % cluster:
            return 1
        fits = self._resident_clusters.get((name, threads))
        if fits is None:
            fits = self._launcher.resident_clusters(function, threads, cluster)
            self._resident_clusters[(name, threads)] = fits
        return cluster if fits * cluster >= blocks else 1

    def _launch(
        self,
        ctx: _Context,
        dtype: str,
        framework: str,
        stream: Any,
        args: tuple | None = None,
        compiled: bool = False,
    ) -> None:
        """Launch ``ctx``'s plan (with its own arguments, prepared once, or a captured execution's ``args``); with
        ``compiled``, its compiled kernel where it has one, else the interpreter."""
        if ctx.tables.nthreadblocks == 0:
            return
        compiled = compiled and ctx.compiled is not None
        if args is None and compiled:
            launch = ctx.compiled_launch = ctx.compiled_launch or self._prepare(ctx, dtype, ctx.args, True)
        elif args is None:
            launch = ctx.launch = ctx.launch or self._prepare(ctx, dtype, ctx.args)
        else:
            launch = self._prepare(ctx, dtype, args, compiled)
        handle = self._stream_handle(stream, framework)
        launch(handle)
        if self._gemm_tail:
            self._tail = self._tail or gpu_launch.cluster_tail(self._cupy)
            self._tail(handle)

    def _raise_device_error(self, recover: bool = True) -> None:
        """Raise what the device's error record says. With ``recover``, every rank first recovers together; without
        (inside a capture, where the device cannot synchronize), the record stays for the next call outside one."""
        words = [int(w) for w in self._error]
        kind, rank, tb, op, channel, barrier = words[1:7]
        peer = None
        where = f"rank {rank}: threadblock {tb}: op {op}"
        detail = ERROR_MESSAGES.get(kind, f"error {kind}")
        if kind == 1 and channel >= 0:
            peer = self._channel_peer(channel)
            detail += f" {channel}" + (
                f" (peer rank {peer})" if peer is not None else " (its peer differs between this communicator's plans)"
            )
        elif kind == 1:
            detail = f"sem_acquire on semaphore {-2 - channel}"
        elif kind == 2:  # the peer's packets of this launch: a peer ran this plan another number of times
            detail += (
                " (or the ranks launched this plan unequally often: a graph replayed on some ranks only, or two "
                "launches of it on one rank that no stream orders)"
            )
        elif kind == 3:
            detail += f" (barrier {barrier})"
        elif kind == 5:
            detail += f" (a row in {barrier} slices, summed by thread blocks of this GPU)"
        self._roster.raise_if_lost(f"threadblock {tb}, op {op}: {detail}", tb, op, peer)  # a dead peer cannot recover
        message = f"executor: {where}: timed out after {self.timeout_s:g} s: {detail}"
        if not recover:
            raise ExecutorTimeout(
                f"{message} (found while a graph captured: the ranks recover at the next call outside the capture)",
                rank,
                tb,
                op,
                peer,
            )
        try:
            self._recover()
        except PeerLost:
            raise  # a peer died during the recovery: that is the news, as it is
        except ExecutorTimeout as e:  # the peers did not time out with us: say what timed out here, then that
            raise ExecutorTimeout(f"{message}; the peers did not join the recovery: {e}", rank, tb, op, peer) from e
        raise ExecutorTimeout(message, rank, tb, op, peer)

    def _channel_peer(self, channel: int) -> int | None:
        """The peer of channel ``channel``: one rank where every context's plan agrees, else None (the error record
        does not say which context's kernel stopped, and plans number their channels differently)."""
        peers = {
            ctx.tables.channel_peers[channel]
            for ctx in self._contexts.values()
            if channel < len(ctx.tables.channel_peers)
        }
        return peers.pop() if len(peers) == 1 else None

    def _recover(self) -> None:
        """Bring every rank back to zeroed semaphores, barriers, scratch and launch counters, together."""
        cupy = self._cupy
        cupy.cuda.runtime.deviceSynchronize()
        self._all_gather("recover-stopped", None)
        with cupy.cuda.Device(self.device):
            for arr in (self._inbound, self._expected, self._barriers):
                arr.fill(0)
            for ctx in self._contexts.values():
                fill_scratch(cupy, ctx.scratch, ctx.tables)
                ctx.state.set(ctx.semaphore_init)
            cupy.cuda.runtime.deviceSynchronize()
        self._error[:] = 0
        self._all_gather("recover-reset", None)
