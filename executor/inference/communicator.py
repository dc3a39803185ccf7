"""weft collectives for PyTorch inference jobs: the two-line change from NCCL, CUDA-graph safe.

    comm = Communicator.from_process_group()         # after dist.init_process_group("nccl")
    y = comm.all_reduce(x)                           # out of place; all_reduce_(x) in place
    comm.all_to_all_single(out, x)                   # equal splits, as torch.distributed's (MoE dispatch/combine)
    h = comm.all_reduce(y, residual=h)               # h + the sum of y, in the all-reduce's own launch
    n, h = comm.all_reduce(y, residual=h, rms_weight=w, eps=1e-5)  # and rms_norm(h) * w too (executor.inference.norm)

One facade over one engine (``executor.inference.engine``): on one host the interpreter engine
(``executor.gpu.engine``, CUDA IPC), across hosts the port engine (``executor.port.engine``), chosen by
``from_process_group`` from the ranks' host identities (``executor.hosts``). The facade owns plan choice, the NCCL
fallback, staging, ``capture()``, path accounting and the torch ops. Each call takes the registry's plan for its
collective, size and dtype on this machine's topology that the engine can run; without one (or without working P2P)
it runs torch.distributed (NCCL), saying so once per size class in the ``weft.inference`` log. ``paths`` counts the
calls each path took (a captured call counts once): the engine's direct path (``zero_copy`` for the interpreter,
``port`` across hosts), ``staging`` and ``nccl``.

Staging (the interpreter): the executor creates a context per (plan, size, buffers) collectively, with allocations,
an exchange of IPC handles through the store and a device synchronize, none of which may happen during CUDA-graph
capture. So a size's context is made on its first eager call, on two staging buffers allocated once
(``executor.inference.staging``). An eager call copies its input in, runs the plan staging to staging and copies
the result out; a producer that writes straight into ``staging_input(...)`` saves the copy in. A size first seen
inside a capture goes to NCCL for that graph (logged), or is prepared beforehand with ``capture(sizes=...)``. The
port engine's contexts are local, so its calls run on the caller's tensors, captured or not, sizes seen or not.

CUDA graphs, zero-copy: graphs captured inside ``with comm.capture():`` run the plan on the captured tensors
themselves (``InterpreterEngine.execute_captured``), through the size's context, and leaving the block registers
them on every rank before any replay (vLLM's graph buffer registration). The chosen plans write peers only in
their scratch, so no peer maps a captured tensor and tensors from expandable segments bind too; a plan whose
peers map the tensors would exchange their IPC handles at registration, and any tensor that cannot be shared
(or is not aligned to the plan's vectors) on any rank keeps the staging path for that call on every rank, decided
together while capturing (a rank that staged alone would run another context than its peers and hang them).
Graphs captured outside ``capture()`` use the staging path.

Any size a plan runs is weft's: a size that is not a multiple of the plan's granule (``Plan.padding``) runs padded,
through the staging path (``InterpreterEngine.execute`` stages each part at its padded place), also inside
``capture()``.

A residual (a transformer layer's ``x + all_reduce(y)``) is added inside the all-reduce's launch where the engine
and plan allow it (``executor.reference.norm.residual_refusal``): the reductions that write outputs add it after
their sums, so the result is rounded as the sum followed by the add, and the layer saves the add kernel. It must
hold the same values on every rank, as the residual stream does. Elsewhere (NCCL, the port engine, or a plan that
cannot) the sum is computed first and the residual added after it.

Reusing the staging buffers and contexts call after call is safe because eager calls run on the GPU in the order
they are made, whatever streams they are made on (``executor.inference.streams``: a call on another stream than
the one before waits for it, as NCCL orders a communicator's operations), and only plans that a rank can run again
before its peers finished the previous execution are chosen (``plans.safe_back_to_back``: LL, double scratch,
peers written only in their scratch). Replay graphs on the stream of the eager calls around them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.errors import ExecutorError
from executor.gpu import bootstrap
from executor.gpu.engine import BIND_VERDICT, InterpreterEngine, NormCall
from executor.gpu.experts import ExpertExchange
from executor.hosts import host_identity
from executor.inference import ops
from executor.inference.engine import Engine
from executor.inference.experts import Experts, FusedExperts, PlainExperts, layout_of
from executor.inference.norm import UNFUSED, check_norm_call
from executor.inference.plans import PlanChoice, disagreement, split_refusal
from executor.inference.staging import Staging
from executor.inference.streams import torch_order
from executor.inference.topology import machine_topology, p2p_works
from executor.port.engine import PortEngine
from executor.reference.norm import (
    RowNorm,
    best_fused_plan,
    fused_tiers,
    fused_time,
    norm_mode,
    ranked_norm_plans,
    rows_refusal,
)
from registry.index import Mode
from registry.store import Registry, RegistryError
from schedules.collectives import Collective
from schedules.plan.types import Plan
from topologies import Topology

log = logging.getLogger("weft.inference")
STAGING_BYTES = 8 << 20
NOT_CONTIGUOUS = "a tensor (input, residual or weight) is not contiguous"
DTYPES = ops.DTYPES

Agree = Callable[[str, object], list]  # every rank's value for one named agreement, in rank order (collective)


def _kernel(mode: Mode) -> dict[str, bool]:
    """An engine call's ``compiled`` option for ``mode``: given only when the plan runs compiled (an engine without
    compiled kernels is never asked)."""
    return {"compiled": True} if mode.compiled else {}


class Communicator:
    """torch.distributed's collective API over one engine and the registry's plans, falling back to NCCL."""

    def __init__(
        self,
        engine: Engine | None,
        agree: Agree,
        why: str = "",
        *,
        rank: int,
        world_size: int,
        group: Any = None,
        registry: str | None = None,
        topology: str | None = None,
        deterministic: bool = False,
        staging_bytes: int = STAGING_BYTES,
        ll128: bool = True,
        **_: Any,
    ):
        """Use ``from_process_group``. ``engine``: None where it did not start (``why`` says why; NCCL throughout).
        ``registry``: default $WEFT_REGISTRY. ``topology``: a catalog spec or file, default $WEFT_TOPOLOGY, then
        NVML, then torch's view of the GPUs. ``deterministic``: only plans with a fixed reduction order.
        ``staging_bytes``: the largest message (nccl-tests terms) that a staging engine runs; larger ones go to
        NCCL. ``ll128``: LL plans may move LL128 lines, at the sizes where this topology's registry entries
        measured lines faster than packets (``weft bench --ll128`` on that fabric, so only where lines ran there:
        NVLink). False: LL16 packets only."""
        self.engine, self.rank, self.world_size, self.group = engine, rank, world_size, group
        self._agree, self._exchanges = agree, 0
        self.deterministic, self.staging_bytes = deterministic, staging_bytes
        self.staging: Staging | None = None
        self.choice: PlanChoice | None = None
        self.topology: Topology | None = None
        self._logged: set[tuple] = set()
        # (plan, size, dtype, with a residual, or the norm's RowNorm) prepared (staging engines)
        self._ready: set[tuple[str, int, str, bool | RowNorm]] = set()
        self._norm_choices: dict[tuple[int, torch.dtype, RowNorm], tuple[Plan | None, str]] = {}
        self._norm_modes: dict[tuple[int, torch.dtype, RowNorm], Mode] = {}  # how each choice runs (default Mode())
        self._capturing = False  # inside capture(), where a staging engine's calls bind the captured tensors
        # eager calls in one order across the caller's streams (executor.inference.streams)
        self.streams = torch_order(getattr(engine, "device", None))
        # calls by path (a captured call counts once): the engine's direct path, staging where it stages, NCCL
        staging = engine is None or engine.stages
        self.paths = {
            engine.direct_path if engine else "zero_copy": 0,
            **({"staging": 0} if staging else {}),
            "nccl": 0,
        }
        self.handle = ops.register(self)
        if not why and isinstance(engine, InterpreterEngine):  # the staging engine: its P2P is CUDA IPC
            self.staging = Staging(staging_bytes, engine.device)
            why = p2p_works(engine)
            if not why:
                staged = self.staging.allocate()
                why = staged and f"rank {rank}: {staged}"
            why = _first(agree("p2p", why))
        # why the engine's own kernels cannot run (the expert exchange needs the interpreter engine, not plans)
        self._engine_refusal = why or ("" if isinstance(engine, InterpreterEngine) else "no engine on one host")
        if not why:
            why = self._read_plans(registry, topology, ll128)
            why = disagreement(agree("plans", why or self._plans_seen()))
        self.enabled = not why
        if why:
            across = " across hosts" if engine is not None and len(set(engine.hosts)) > 1 else ""
            log.warning("weft: using NCCL for every collective%s: %s", across, why)
        elif self.choice is not None and self.choice.norm_warning:
            log.warning("weft: %s", self.choice.norm_warning)  # the fused call then ranks plans by all-reduce times
        if not why and self.choice is not None and self.topology is not None and not self.choice.entries:
            log.warning(
                "weft: the registry %s holds no plan for %s with %d ranks; using NCCL",
                self.choice.registry.location,
                self.topology.name,
                world_size,
            )

    @classmethod
    def from_process_group(cls, group: Any = None, timeout_s: float = 30.0, **options: Any) -> Communicator:
        """A communicator over ``group`` (default: the default group), bootstrapped through its store: the
        interpreter engine where the group's ranks share a host, the port engine (no CUDA IPC between hosts)
        where they sit on several (``executor.hosts``). ``options``: see ``__init__``; ``trace`` (one host): the
        interpreter's timed build, read by ``comm.engine.kernel_times``; ``compiled`` (one host): each plan runs
        compiled to a kernel of its own where the generator takes it (``executor.gpu.compiled``), else interpreted;
        ``programmatic`` (one host, default True): launch with programmatic dependent launch (Hopper and newer);
        ``late_trigger`` (one host): compiled kernels let the next programmatic launch start at their end, not their
        start; ``cluster`` (one host, default 1: none): blocks a thread-block cluster in each launch;
        ``gemm_tail`` (one host): an empty clustered launch after each call, for the clustered GEMM after it (the
        interpreter engine's ``cluster`` and ``gemm_tail``)."""
        if options.get("cluster", 1) < 1:  # a wrong option is the caller's error, not a reason to fall back to NCCL
            raise ValueError(f"weft: Communicator: cluster {options['cluster']}: a cluster holds 1 block or more")
        hosts = bootstrap.all_gather_plain(host_identity(), group)  # plain data, never a pickle
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        if len(set(hosts)) > 1:

            def agree_across_hosts(what: str, value: object) -> list:
                return bootstrap.all_gather_plain(value, group)  # plain data, never a pickle

            engine = PortEngine(group, timeout_s)
            return cls(engine, agree_across_hosts, rank=rank, world_size=world_size, group=group, **options)
        store = bootstrap.process_group_store(group)
        agreements = f"weft/inference/{store.add(f'weft/inference/{rank}', 1)}"

        def agree(what: str, value: object) -> list:
            key = f"{agreements}/{what}"
            return bootstrap.all_gather(store, key, rank, world_size, value, max(timeout_s, 60.0))

        interpreter: InterpreterEngine | None = None
        why = ""
        try:  # every rank says whether its engine started, and one that did not means NCCL on every rank
            interpreter = InterpreterEngine(
                rank,
                world_size,
                store,
                torch.cuda.current_device(),
                timeout_s,
                ll128=options.get("ll128", True),
                trace=options.pop("trace", False),
                compiled=options.pop("compiled", False),
                programmatic=options.pop("programmatic", True),
                late_trigger=options.pop("late_trigger", False),
                cluster=options.pop("cluster", 1),
                gemm_tail=options.pop("gemm_tail", False),
            )
        except Exception as e:  # no CuPy, no driver, IPC refused: each means NCCL for this job, not a crash
            why = f"rank {rank}: the GPU executor did not start: {e}"
        why = _first(agree("started", why))
        return cls(interpreter, agree, why, rank=rank, world_size=world_size, group=group, **options)

    @property
    def stages(self) -> bool:
        """Whether eager calls run through the staging buffers (the interpreter engine)."""
        return self.engine is not None and self.engine.stages

    # ------------------------------------------------------------------ torch.distributed's API, through the ops

    def all_reduce(
        self,
        tensor: torch.Tensor,
        residual: torch.Tensor | None = None,
        rms_weight: torch.Tensor | None = None,
        eps: float = 1e-6,
    ):
        """The sum over ranks, as a new tensor; plus ``residual`` (same shape and dtype, the same values on every
        rank), added in the all-reduce's launch where the plan can. With ``rms_weight`` (the last dimension's
        size, the tensor's dtype): ``(rms_norm(residual + sum) * rms_weight, residual + sum)``, both from one launch
        where a plan's rows fit (executor.inference.norm)."""
        if rms_weight is not None:
            if residual is None:
                raise ValueError("weft: all_reduce with rms_weight needs residual= (the norm is of residual + sum)")
            return torch.ops.weft.all_reduce_rms_norm(tensor, self.handle, residual, rms_weight, float(eps))
        return torch.ops.weft.all_reduce(tensor, self.handle, residual)

    def all_reduce_(
        self,
        tensor: torch.Tensor,
        residual: torch.Tensor | None = None,
        rms_weight: torch.Tensor | None = None,
        eps: float = 1e-6,
    ) -> torch.Tensor:
        """The sum over ranks, written into ``tensor``. With ``residual`` and ``rms_weight``: ``residual`` becomes
        residual + sum and ``tensor`` its rms_norm times ``rms_weight``."""
        if rms_weight is not None:
            if residual is None:
                raise ValueError("weft: all_reduce_ with rms_weight needs residual= (it becomes residual + sum)")
            torch.ops.weft.all_reduce_rms_norm_inplace(tensor, residual, self.handle, rms_weight, float(eps))
            return tensor
        if residual is not None:
            raise ValueError("weft: all_reduce_ takes residual= only with rms_weight= (use all_reduce(x, residual=))")
        torch.ops.weft.all_reduce_inplace(tensor, self.handle)
        return tensor

    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        torch.ops.weft.all_gather_into_tensor(output, tensor, self.handle)

    def reduce_scatter_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        torch.ops.weft.reduce_scatter_tensor(output, tensor, self.handle)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """torch.distributed's equal-split all_to_all_single: block j of ``input`` (its first dimension cut into
        world_size equal blocks) goes to rank j, and block i of ``output`` comes from rank i."""
        why = split_refusal(
            tuple(output.shape),
            tuple(input.shape),
            output.dtype == input.dtype,
            output.device == input.device,
            self.world_size,
        )
        if why:
            raise ValueError(f"weft: all_to_all_single: {why}")
        torch.ops.weft.all_to_all_single(output, input, self.handle)

    def expert_exchange(
        self,
        tokens: int,
        experts: int,
        capacity: int,
        hidden: int,
        dtype: torch.dtype = torch.bfloat16,
        top_k: int = 2,
        timeout_s: float | None = None,
    ) -> Experts:
        """An MoE layer's expert-parallel dispatch and combine for ``tokens`` tokens a rank of ``hidden`` elements,
        ``experts`` experts (rank-major over the ranks), ``capacity`` places per expert and rank, and ``top_k`` claims
        a token (executor.inference.experts says the calls). Collective, outside graph capture. One kernel each way
        on one host where the engine runs (``path`` "fused"); elsewhere the same calls around ``all_to_all_single``
        (``path`` "all_to_all", said once in the log), with the same output. ``timeout_s``: how long a fused call
        waits for a peer's rows before giving up (``check()`` then raises); default the engine's."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: make the expert exchange before capturing a graph, not inside the capture")
        layout = layout_of(self.world_size, tokens, experts, capacity, hidden, dtype, top_k)
        why = layout.refusal()
        if why:
            raise ValueError(f"weft: expert_exchange: {why}")
        why = self._engine_refusal
        if not why:
            assert isinstance(self.engine, InterpreterEngine)  # no refusal: the one-host engine runs
            try:
                engine = self.engine
                wait_s = engine.timeout_s if timeout_s is None else timeout_s
                exchange = ExpertExchange(layout, self.rank, engine.device, engine.exchange, wait_s)
                return FusedExperts(exchange, self.streams.follow)
            except ExecutorError as e:  # every rank raised the same (the exchange agrees first)
                why = str(e)
        self._fallback("expert exchange", layout.trash * layout.row_bytes, dtype, why, "around all_to_all_single")
        gpu = getattr(self.engine, "device", None)  # None: the port engine on gloo (CPU tensors)
        if gpu is None and self.engine is None and torch.cuda.is_available():
            gpu = torch.cuda.current_device()
        return PlainExperts(layout, self.all_to_all_single, torch.device("cpu" if gpu is None else f"cuda:{gpu}"))

    # ------------------------------------------------------------------ plans, preparation, capture

    def plan_for(self, collective: str, nbytes: int, dtype: torch.dtype) -> Plan | None:
        """The plan weft runs for this call, or None where NCCL does (size, dtype, no plan, or weft disabled)."""
        if not self.enabled or self.choice is None or dtype not in DTYPES or self._too_large(nbytes):
            return None
        return self.choice.plan(collective, nbytes, DTYPES[dtype])

    def lines_for(self, collective: str, nbytes: int, dtype: torch.dtype) -> bool:
        """Whether ``plan_for``'s plan moves LL128 lines (``ll128`` set, and measured faster so at this size)."""
        return self.mode_for(collective, nbytes, dtype).lines

    def mode_for(self, collective: str, nbytes: int, dtype: torch.dtype) -> Mode:
        """How ``plan_for``'s plan runs: with LL128 lines, as its own compiled kernel (each where the registry
        measured it faster so at this size, and this engine can), or ``Mode()``."""
        if self.plan_for(collective, nbytes, dtype) is None or self.choice is None:
            return Mode()
        return self.choice.mode(collective, nbytes, DTYPES[dtype])

    def is_prepared(self, plan: Plan, nbytes: int, dtype: torch.dtype, residual: bool = False) -> bool:
        """Whether ``plan`` can run this size (with a residual, where ``residual`` and the plan adds one in its
        launch) inside a graph capture: its context exists, or the engine needs none made beforehand."""
        if self.engine is not None and not self.engine.stages:
            return True
        return (plan.content_hash, nbytes, DTYPES[dtype], residual and self.fuses(plan)) in self._ready

    def fuses(self, plan: Plan) -> bool:
        """Whether ``plan`` adds a residual in its own launch on this engine."""
        return self.engine is not None and not self.engine.residual_refusal(plan)

    def staging_input(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The registered input buffer as ``numel`` elements: a tensor written here is not copied again."""
        assert self.staging is not None, "staging_input: this communicator's engine runs on the caller's tensors"
        return self.staging.input[: numel * torch.empty((), dtype=dtype).element_size()].view(dtype)

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
        all-to-all contexts of ``alltoall_sizes`` (bytes each rank sends, its whole input). Leaving the block
        registers the captured tensors on every rank (collective): replay the graphs after it, or call
        ``register_graph_buffers()`` before replaying inside it. A graph replayed before its tensors are
        registered runs none of its weft calls, and the next weft call, or leaving the block, raises. An engine
        that does not stage (the port engine) needs nothing prepared or registered.
        """
        if self.engine is not None and not self.engine.stages:  # graphs captured anywhere run weft's calls
            yield self
            return
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: enter comm.capture() before capturing a graph, not inside the capture")
        if self.engine is None:  # NCCL throughout: nothing to register
            yield self
            return
        with self.engine.capture(), self._capture_block():
            for nbytes in sizes:
                self.prepare("allreduce", nbytes, dtype)
                if residual:
                    self.prepare("allreduce", nbytes, dtype, residual=True)
                if rms_norm is not None:
                    self.prepare_norm(nbytes, rms_norm, dtype)
            for nbytes in alltoall_sizes:
                self.prepare("alltoall", nbytes, dtype)
            yield self

    @contextmanager
    def _capture_block(self) -> Iterator[None]:
        self._capturing = True
        try:
            yield
        finally:
            self._capturing = False

    def register_graph_buffers(self) -> None:
        """Register the tensors of the calls captured so far inside ``capture()`` (collective), before replaying."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: register_graph_buffers() runs after a graph capture ends, not inside it")
        if self.engine is not None:
            self.engine.register_graph_buffers()

    def prepare(
        self, collective: str, nbytes: int, dtype: torch.dtype = torch.bfloat16, residual: bool = False
    ) -> bool:
        """Create the context for one collective and size now (collective, eager), for an all-reduce with a
        residual where ``residual``; whether weft will run it."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: prepare() must run before graph capture, not inside it")
        plan = self.plan_for(collective, nbytes, dtype)
        if plan is None or self.staging is None:
            return plan is not None
        elements = nbytes // torch.empty((), dtype=dtype).element_size()
        spec = Collective(collective, self.world_size)
        x = torch.zeros(int(elements * spec.input_fraction), dtype=dtype, device=self.staging.input.device)
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

    def precompile(
        self, calls: Iterable[tuple[str, int]], dtype: torch.dtype = torch.bfloat16, threads: int | None = None
    ) -> dict[str, str]:
        """Build now the compiled kernels of the plans this communicator runs for ``calls`` (collective, message
        bytes: the larger buffer's), NVRTC builds side by side (``threads``, default one a CPU), so that a server's
        first calls find them built (a build takes about a second each). For a communicator made with
        ``compiled=True``, or one whose registry measured sizes faster compiled (``mode_for``; the chosen plan's
        kernel is built either way); this rank's kernels only, no peer takes part. Returns {call: why} for the calls
        that will not launch a compiled kernel (NCCL runs them, or the generator refuses the plan)."""
        refused: dict[str, str] = {}
        wanted = []
        for collective, nbytes in calls:
            plan = self.plan_for(collective, nbytes, dtype)
            if plan is None:
                refused[f"{collective} {nbytes} B"] = f"NCCL runs it: {self._no_plan_reason(collective, nbytes, dtype)}"
            else:
                wanted.append((plan, nbytes, DTYPES[dtype]))
        if self.engine is None:
            return {**refused, **{f"plan {p.name}: {n} B": "no engine started" for p, n, _ in wanted}}
        return {**refused, **self.engine.precompile(wanted, threads)}

    def synchronize(self) -> None:
        if self.engine is not None:
            self.engine.synchronize()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.enabled = False

    # ------------------------------------------------------------------ the fused norm's plan

    def norm_plan_for(self, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> Plan | None:
        """The plan that runs the fused norm for this size, dtype and row shape, or None (``norm_reason`` says why)."""
        key = (nbytes, dtype, rows)
        if key not in self._norm_choices:
            self._norm_choices[key] = self._choose_norm_plan(nbytes, dtype, rows)
            plan = self._norm_choices[key][0]
            self._norm_modes[key] = Mode() if plan is None else self._measured_norm_mode(plan, nbytes, rows)
        return self._norm_choices[key][0]

    def norm_mode_for(self, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> Mode:
        """How the fused call of this size, dtype and row shape runs its plan (LL128 lines, its compiled kernel):
        as the registry measured that plan fastest at this size (``executor.reference.norm.norm_mode``), or as
        pinned; ``Mode()`` where no plan runs it."""
        self.norm_plan_for(nbytes, dtype, rows)
        return self._norm_modes.get((nbytes, dtype, rows), Mode())

    def norm_reason(self, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> str:
        self.norm_plan_for(nbytes, dtype, rows)
        return self._norm_choices[(nbytes, dtype, rows)][1]

    def is_norm_prepared(self, plan: Plan, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> bool:
        """Whether ``plan``'s fused-norm context for this size and row shape exists, so that a capture can run it."""
        return (plan.content_hash, nbytes, DTYPES[dtype], rows) in self._ready

    def pin_norm_plan(
        self, nbytes: int, dtype: torch.dtype, rows: RowNorm, plan: Plan | None, mode: Mode | None = None
    ) -> None:
        """Run the fused norm of this size, dtype and row shape on ``plan`` from now on (a bench comparing plans,
        a test of one plan's shape), or on the plan ``norm_plan_for`` picks again where ``plan`` is None. The plan
        must still pass the proof and fit the rows (ValueError, one line, otherwise). ``mode``: how it runs (LL128
        lines, its compiled kernel); default, as the registry measured that plan fastest at this size."""
        if plan is None:
            self._norm_choices.pop((nbytes, dtype, rows), None)
            self._norm_modes.pop((nbytes, dtype, rows), None)
            return
        if dtype not in DTYPES:
            raise ValueError(f"weft: the fused norm runs {', '.join(map(str, DTYPES))}, not {dtype}")
        if not self.enabled or self.engine is None:
            raise ValueError(f"weft: cannot pin {plan.name} for the fused norm: weft is disabled on this communicator")
        if self._too_large(nbytes):
            raise ValueError(
                f"weft: cannot pin {plan.name} for the fused norm: {nbytes} B exceeds staging_bytes "
                f"{self.staging_bytes} B"
            )
        why = self.engine.norm_refusal(plan) or rows_refusal(plan, nbytes, DTYPES[dtype], rows)
        if why:
            raise ValueError(f"weft: cannot pin {plan.name} for the fused norm: {why}")
        self._norm_choices[(nbytes, dtype, rows)] = (plan, "")
        measured = self._measured_norm_mode(plan, nbytes, rows)
        self._norm_modes[(nbytes, dtype, rows)] = measured if mode is None else mode

    def prepare_norm(self, nbytes: int, rows: RowNorm, dtype: torch.dtype = torch.bfloat16) -> bool:
        """Create the fused norm's context for one size now (collective, eager); whether weft will run it."""
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("weft: prepare() must run before graph capture, not inside it")
        elements = nbytes // torch.empty((), dtype=dtype).element_size()
        if self.norm_plan_for(nbytes, dtype, rows) is None or elements % rows.row_elems or self.staging is None:
            return False
        x = torch.zeros(elements // rows.row_elems, rows.row_elems, dtype=dtype, device=self.staging.input.device)
        self.all_reduce_norm_eager(
            x, torch.zeros_like(x), torch.ones(rows.row_elems, dtype=dtype, device=x.device), rows.eps
        )
        return True

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
        else:
            result = self._run(plan, tensor, out, fused)
            if result is not out:
                out.copy_(result.view(tensor.shape))
        if residual is not None and fused is None:
            out.add_(residual)
        return out

    def all_reduce_eager_(self, tensor: torch.Tensor) -> None:
        plan = self._weft_plan("allreduce", tensor, tensor.numel())
        if plan is None:
            dist.all_reduce(tensor, group=self.group)
            return
        # the plans are out of place, so an in-place call runs into a buffer (the caller's tensors' own where the
        # engine runs on them, else the staging output) and copies the sum back
        direct = not self.stages or self._in_graph()
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format) if direct else None
        tensor.copy_(self._run(plan, tensor, out, numel=tensor.numel()).view(tensor.shape))

    def all_gather_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        self._collective("allgather", output, tensor, dist.all_gather_into_tensor)

    def reduce_scatter_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        self._collective("reducescatter", output, tensor, dist.reduce_scatter_tensor)

    def all_to_all_eager(self, output: torch.Tensor, tensor: torch.Tensor) -> None:
        self._collective("alltoall", output, tensor, dist.all_to_all_single)

    def all_reduce_norm_eager(
        self, tensor: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = check_norm_call(tensor, residual, weight, eps)
        assert residual is not None  # check_norm_call refuses a call without one
        nbytes = tensor.numel() * tensor.element_size()
        plan, why = self._fused_norm_plan(tensor, residual, weight, rows)
        if plan is None:
            if self.engine is None or self.engine.fuses_norm:  # an engine without the epilogue is not news
                self._fallback("allreduce+rms_norm", nbytes, tensor.dtype, why, UNFUSED)
            new_residual = self.all_reduce_eager(tensor, residual)
            return F.rms_norm(new_residual, (rows.row_elems,), weight, rows.eps), new_residual
        new_residual = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        normed = torch.empty_like(new_residual)
        norm = NormCall(rows, weight, normed)
        if not self._zero_copy(plan, tensor, new_residual, residual, norm, "allreduce+rms_norm"):
            staged, staged_normed = self._stage_norm(plan, tensor, residual, norm)
            new_residual.copy_(staged.view(tensor.shape))
            normed.copy_(staged_normed.view(tensor.shape))
        return normed, new_residual

    def all_reduce_norm_eager_(
        self, tensor: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> None:
        """The in-place op's body: the out-of-place one (``all_reduce_norm_eager``), then two copies."""
        normed, new_residual = self.all_reduce_norm_eager(tensor, residual, weight, eps)
        residual.copy_(new_residual)
        tensor.copy_(normed)

    # ------------------------------------------------------------------ internals: one call's path

    def _collective(self, collective: str, output: torch.Tensor, tensor: torch.Tensor, nccl: Callable) -> None:
        """An all-gather, reduce-scatter or all-to-all: the plan on the engine, else NCCL's ``nccl``."""
        plan = self._weft_plan(collective, tensor, output.numel())
        if plan is None:
            nccl(output, tensor, group=self.group)
            return
        result = self._run(plan, tensor, output)
        if result is not output:
            output.copy_(result.view(output.shape))

    def _weft_plan(self, collective: str, tensor: torch.Tensor, out_numel: int, residual: bool = False) -> Plan | None:
        """The plan weft runs this call with, or None (logged, counted) where NCCL must run it."""
        nbytes = max(tensor.numel(), out_numel) * tensor.element_size()
        plan = self.plan_for(collective, nbytes, tensor.dtype)
        if plan is None:
            self._fallback(collective, nbytes, tensor.dtype, self._no_plan_reason(collective, nbytes, tensor.dtype))
        elif torch.cuda.is_current_stream_capturing() and self.stages:
            why = self._unprepared(self.is_prepared(plan, nbytes, tensor.dtype, residual), "sizes")
            if why:
                self._fallback(collective, nbytes, tensor.dtype, why)
                plan = None
        if plan is None:
            self.paths["nccl"] += 1
        return plan

    def _run(
        self,
        plan: Plan,
        tensor: torch.Tensor,
        output: torch.Tensor | None,
        residual: torch.Tensor | None = None,
        numel: int | None = None,
    ) -> torch.Tensor:
        """Run ``plan`` on the engine: into ``output`` where the engine runs on the caller's tensors (the port
        engine always, the interpreter inside ``capture()``), else through the staging buffers; the tensor that
        holds the result (``output``, or the staging output of ``numel`` elements, default ``output``'s)."""
        assert self.engine is not None  # a plan came, so the engine runs
        if output is not None and not self.engine.stages:
            self.streams.follow()
            target = (
                output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
            )
            mode = self._mode(plan.collective, tensor, output.numel())
            self.engine.execute(plan, tensor.contiguous().view(-1), target.view(-1), lines=mode.lines, **_kernel(mode))
            self.paths[self.engine.direct_path] += 1
            if target is not output:
                output.copy_(target)
            return output
        if output is not None and self._zero_copy(plan, tensor, output, residual):
            return output
        return self._stage(plan, tensor, output.numel() if output is not None else numel or 0, residual)

    def exchange(self, what: str, value: Any) -> list[Any]:
        """Every rank's ``value`` (plain data), in rank order, through the agreement the ranks started on
        (collective: every rank calls it, in the same order; NCCL-only communicators too). ``what`` names it in
        errors; each call is an exchange of its own, so one name may repeat."""
        self._exchanges += 1
        return self._agree(f"exchange/{self._exchanges}/{what}", value)

    def _unprepared(self, prepared: bool, option: str, why: str = "") -> str:
        """Inside a capture on a staging engine: why a call cannot run its plan on some rank (``why`` here, or its
        context not prepared), or '' where every rank can (collective)."""
        if not why and not prepared:
            why = f"first seen inside graph capture; warm up or use capture({option}=...) before capturing"
        return self._together("graph-prepared", why)

    def _together(self, what: str, why: str) -> str:
        """Every rank's say on one captured call (collective: a staging engine's decisions inside a capture depend
        on each rank's own state and tensors): the first refusal, or '' where every rank said ''. A rank that
        decided alone would take another path than its peers (NCCL, or another context) and hang them."""
        assert self.engine is not None  # only a staging engine's captured calls ask
        return _first(self.engine.exchange(what, f"rank {self.rank}: {why}" if why else ""))

    def _in_graph(self) -> bool:
        """Whether a graph is capturing inside ``capture()``, where calls bind the captured tensors."""
        return self._capturing and torch.cuda.is_current_stream_capturing()

    def _zero_copy(
        self,
        plan: Plan,
        tensor: torch.Tensor,
        output: torch.Tensor,
        residual: torch.Tensor | None = None,
        norm: NormCall | None = None,
        what: str = "",
    ) -> bool:
        """Inside ``capture()``, capture ``plan`` on ``tensor`` and ``output`` (and ``residual``, and the norm's
        tensors) themselves; whether it did."""
        if not self._in_graph():
            return False
        assert self.engine is not None  # _in_graph holds an engine
        nbytes = max(tensor.numel(), output.numel()) * tensor.element_size()
        buffers = (tensor, output, *([] if residual is None else [residual]))
        if norm is None and not all(t.is_contiguous() for t in buffers):  # joins the peers' verdict on the call
            why = self._together(BIND_VERDICT, "the tensor is not contiguous")
        else:
            if norm is None:
                mode = self._mode(plan.collective, tensor, output.numel())
            else:
                mode = self.norm_mode_for(nbytes, tensor.dtype, norm.rows)
            why = self.engine.execute_captured(
                plan, tensor, output, lines=mode.lines, residual=residual, norm=norm, **_kernel(mode)
            )
        if why:
            self._fallback(
                what or plan.collective, nbytes, tensor.dtype, why, "through the staging buffer in this graph"
            )
            return False
        self.paths["zero_copy"] += 1
        return True

    def _stage(
        self, plan: Plan, tensor: torch.Tensor, out_numel: int, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run ``plan`` through the staging buffers (and the staging residual); the staged output."""
        assert self.engine is not None and self.staging is not None  # a staging engine ran the plan
        self.streams.follow()
        nbytes = max(tensor.numel(), out_numel) * tensor.element_size()
        source, staged = self.staging.views(tensor.numel(), out_numel, tensor.dtype)
        if tensor.data_ptr() != source.data_ptr() or not tensor.is_contiguous():
            source.view(tensor.shape).copy_(tensor)
        added = None
        if residual is not None:
            added = self.staging.residual[:nbytes].view(tensor.dtype)
            added.view(residual.shape).copy_(residual)
        mode = self._mode(plan.collective, tensor, out_numel)
        self.engine.execute(plan, source, staged, lines=mode.lines, residual=added, **_kernel(mode))
        self._ready.add((plan.content_hash, nbytes, DTYPES[tensor.dtype], residual is not None))
        self.paths["staging"] += 1
        return staged

    def _stage_norm(
        self, plan: Plan, tensor: torch.Tensor, residual: torch.Tensor, norm: NormCall
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the fused launch through staging buffers (input, residual, weight, normed); (output, normed)."""
        assert self.engine is not None and self.staging is not None  # a staging engine ran the plan
        self.streams.follow()
        nbytes = tensor.numel() * tensor.element_size()
        weight = norm.weight
        source, staged = self.staging.views(tensor.numel(), tensor.numel(), tensor.dtype)
        source.view(tensor.shape).copy_(tensor)
        added = self.staging.residual[:nbytes].view(tensor.dtype)
        added.view(residual.shape).copy_(residual)
        normed, staged_weight = self.staging.norm_buffers(nbytes, weight.numel() * weight.element_size(), weight.dtype)
        staged_weight.copy_(weight)
        mode = self.norm_mode_for(nbytes, tensor.dtype, norm.rows)
        self.engine.execute(
            plan,
            source,
            staged,
            lines=mode.lines,
            residual=added,
            norm=NormCall(norm.rows, staged_weight, normed),
            **_kernel(mode),
        )
        self._ready.add((plan.content_hash, nbytes, DTYPES[tensor.dtype], norm.rows))
        self.paths["staging"] += 1
        return staged, normed

    def _fused_norm_plan(
        self, tensor: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, rows: RowNorm
    ) -> tuple[Plan | None, str]:
        """(plan, '') for a fused launch, or (None, why the call runs unfused)."""
        nbytes = tensor.numel() * tensor.element_size()
        scattered = "" if all(t.is_contiguous() for t in (tensor, residual, weight)) else NOT_CONTIGUOUS
        plan = self.norm_plan_for(nbytes, tensor.dtype, rows)
        if plan is None:
            return None, self.norm_reason(nbytes, tensor.dtype, rows)
        if torch.cuda.is_current_stream_capturing() and self.stages:  # fused or not: every rank's say
            scattered = self._unprepared(self.is_norm_prepared(plan, nbytes, tensor.dtype, rows), "rms_norm", scattered)
        return (None, scattered) if scattered else (plan, "")

    def _choose_norm_plan(self, nbytes: int, dtype: torch.dtype, rows: RowNorm) -> tuple[Plan | None, str]:
        choice, engine = self.choice, self.engine
        if engine is not None and not engine.fuses_norm:
            return None, f"the {type(engine).__name__} runs no norm epilogue"
        if not self.enabled or choice is None or engine is None or dtype not in DTYPES or self._too_large(nbytes):
            return None, "weft disabled" if not self.enabled or choice is None else "no plan (dtype or size)"
        tiers = self._norm_tiers(nbytes, DTYPES[dtype], rows)  # the plans timed for the call first
        return best_fused_plan(tiers, nbytes, DTYPES[dtype], rows, engine.norm_refusal)

    def _norm_tiers(self, nbytes: int, dtype: str, rows: RowNorm) -> tuple[list, list]:
        """(plan, estimated µs, mode) of the registry's all-reduce entries serving this size and dtype, for the
        fused call: those with its own measured times here (norm.json), then the others by the all-reduce's
        (``executor.reference.norm.fused_tiers``; ``choice`` set)."""
        choice = self.choice
        assert choice is not None
        serving = [
            e
            for e in choice.entries
            if e.serves(choice.topology, "allreduce", self.world_size, nbytes) and (not e.dtypes or dtype in e.dtypes)
        ]
        fused = choice.norm_us.get(rows.row_elems, {})
        return fused_tiers(serving, fused, nbytes, choice.ll128, choice.compiled)

    def norm_plans(self, nbytes: int, dtype: torch.dtype, rows: RowNorm, count: int) -> list[tuple[Plan, Mode]]:
        """Up to ``count`` plans the fused call of this size, dtype and row shape can run, each with the way the
        registry measured it fastest, in the order selection weighs them (the first is ``norm_plan_for``'s where
        nothing is pinned): a bench timing the runners-up beside the choice pins each (``pin_norm_plan``)."""
        choice, engine = self.choice, self.engine
        if not self.enabled or choice is None or engine is None or not engine.fuses_norm or dtype not in DTYPES:
            return []
        plans: list[tuple[Plan, Mode]] = []
        for tier in self._norm_tiers(nbytes, DTYPES[dtype], rows):  # the plans timed for the call first
            modes = {p.content_hash: m for p, _, m in tier}
            for plan, _ in ranked_norm_plans([(p, t) for p, t, _ in tier], nbytes, DTYPES[dtype], rows):
                if len(plans) == count:
                    return plans
                if not engine.norm_refusal(plan):  # a proof: run only for the plans kept, in order
                    plans.append((plan, modes[plan.content_hash]))
        return plans

    def _measured_norm_mode(self, plan: Plan, nbytes: int, rows: RowNorm) -> Mode:
        """How the fused call runs ``plan`` at this size: the mode it was measured fastest in for the fused call
        (norm.json) where its times cover the size, else for the all-reduce (``norm_mode``)."""
        choice = self.choice
        if choice is None:
            return Mode()
        fused = fused_time(plan, choice.norm_us.get(rows.row_elems, {}), nbytes, choice.ll128, choice.compiled)
        return fused[1] if fused else norm_mode(choice.entries, plan, nbytes, choice.ll128, choice.compiled)

    def _mode(self, collective: str, tensor: torch.Tensor, out_numel: int) -> Mode:
        """How the registry's plan for ``collective`` at this call's size runs (LL128 lines, its compiled kernel)."""
        nbytes = max(tensor.numel(), out_numel) * tensor.element_size()
        return Mode() if self.choice is None else self.choice.mode(collective, nbytes, DTYPES[tensor.dtype])

    def _too_large(self, nbytes: int) -> bool:
        """Past the staging buffers, where a staging engine's calls go to NCCL."""
        return self.stages and nbytes > self.staging_bytes

    def _no_plan_reason(self, collective: str, nbytes: int, dtype: torch.dtype) -> str:
        if not self.enabled:
            return "weft disabled"
        if self.choice is None or dtype not in DTYPES or self._too_large(nbytes):
            return "no plan"
        return self.choice.reason(collective, nbytes, DTYPES[dtype]) or "no plan"

    def _fallback(self, collective: str, nbytes: int, dtype: torch.dtype, why: str, path: str = "on NCCL") -> None:
        size_class = (collective, nbytes.bit_length(), dtype, why)
        if size_class not in self._logged:
            self._logged.add(size_class)
            low, high = 1 << max(nbytes.bit_length() - 1, 0), (1 << nbytes.bit_length()) - 1
            log.warning("weft: %s of %d..%d B in %s runs %s: %s", collective, low, high, str(dtype)[6:], path, why)

    # ------------------------------------------------------------------ internals: start-up

    def _read_plans(self, registry: str | None, topology: str | None, ll128: bool) -> str:
        """Find the topology and the registry entries the engine can run; why weft cannot run, or ''."""
        assert self.engine is not None  # the engine started, or the ranks agreed on NCCL before this
        several = len(set(self.engine.hosts)) > 1
        try:
            self.topology = found = machine_topology(self.world_size, topology)
        except Exception as e:  # across hosts a bad WEFT_TOPOLOGY means NCCL, said once; on one host it raises
            if not several:
                raise
            return f"the topology cannot be read: {e}"
        if found is None:
            return (
                "the hosts' topology is unknown (set WEFT_TOPOLOGY to a topology file that places ranks on hosts)"
                if several
                else "this machine's topology is unknown (set WEFT_TOPOLOGY to a catalog spec or file)"
            )
        if several and len(set(found.hosts)) < 2:
            return f"topology {found.name} places every rank on one host, but the ranks run on several"
        try:
            lines = ll128 and self.stages  # only the interpreter moves LL128 lines
            self.choice = PlanChoice(
                Registry(registry),
                found.fingerprints,
                self.world_size,
                self.deterministic,
                lines,
                compiled=self.stages,  # and only it compiles plans to kernels: their measured times count where it runs
            )
        except (RegistryError, ImportError) as e:  # no registry location (platformdirs missing) is NCCL too
            return f"the plan registry cannot be read: {e}"
        # only plans the engine runs as this communicator calls it, so that no call fails that NCCL would have run
        # (across hosts: memory channels only inside a host, and what the port engine compiles)
        self.choice.entries = [e for e in self.choice.entries if not self.engine.plan_refusal(e.plan)]
        return ""

    def _plans_seen(self) -> object:
        """What every rank must see alike, or the ranks would pick different plans or lines for one call: the
        topology, and the entries with their recorded times and the options (``PlanChoice.basis``)."""
        assert self.topology is not None and self.choice is not None  # _read_plans set both where it said ''
        return [self.topology.fingerprint, self.choice.basis()]


def _first(verdicts: list) -> str:
    """The first rank's reason where any rank said no, else ''."""
    return next((v for v in verdicts if v), "")
