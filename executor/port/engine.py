"""The port engine: runs plans whose hops between hosts are port channels, through torch.distributed's
point-to-point sends and receives (NCCL on GPUs: its InfiniBand, RoCE or socket transport, whichever NCCL picks;
gloo on CPUs).

It is MSCCL++'s host proxy for port channels, driven by the static plan that every rank knows: each rank's
``Program`` (``executor.port.program``) holds its sums and its groups of sends and receives, in the one global
order that makes both sides of every hop meet. Everything runs on the caller's stream, so a CUDA graph captures
it whole. No network code lives here: the engine's transports are NCCL's own, and on a real cluster NCCL moves
the same calls over InfiniBand with no change here. Set ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`` to force NCCL
onto its network path between the GPUs of one machine (as the two-host proof does).

    engine = PortEngine.from_process_group()     # after init_process_group; WEFT_HOST may declare hosts
    out = engine.execute(plan, x)                # on the current stream
    engine.synchronize()                         # bounded: PeerLost names a peer that stopped answering

Lanes overlap sums with transfers. Every op maps element j of a chunk to element j of another, so the columns of
the chunks split into lanes that each run the whole program on their own: each lane has its own process group
(its own NCCL communicator, hence its own connections and proxy) and, on a GPU, its own stream. While one lane
sums, the others move data, and the lanes' connections carry a hop's bytes side by side. A chunk splits into at
most ``lanes`` lanes (``$WEFT_PORT_LANES``, or ``default_lanes``) of at least ``piece_bytes`` each; small chunks
run as one, and with the default lane count so does a call of less than ``MIN_LANE_BYTES`` (the larger buffer;
lanes asked for by ``lanes=`` or ``$WEFT_PORT_LANES`` apply at every size). A lane splits a slot of several
chunks into one operation per chunk, so its groups are closed (``compile_programs(closed=True)``: each group meets
one group per peer, of the same span). The lanes' NCCL kernels spin side by side waiting for their peers, so they
need hardware queues of their own: with CUDA's default of 8 (``CUDA_DEVICE_MAX_CONNECTIONS``), one lane's kernel
can wait behind another's, a false dependency. Lanes are therefore on by default only on the NCCL backend with
``CUDA_DEVICE_MAX_CONNECTIONS`` set to at least 4 a lane (bench/port_x4.sh sets 32: ``LANES`` for every collective,
``ALLTOALL_LANES`` for all-to-all, ``call_limit``); elsewhere one lane, unless ``$WEFT_PORT_LANES`` or ``lanes=``
asks. Measured on 4 GPUs as 2 hosts x 2, closed groups, every plan at 1
and 4 lanes from 1 to 256 MB, on sockets and with NVLink inside hosts (0 wrong). On 4xH200 (bench/results/
gpu_{allgather,allreduce}_bf16_graph_4xh200_2hosts{,_nvlink}.json, 7 samples a plan; port_lanes_1mb_4xh200/, 9)
the best plan at 4 lanes beat the best at one at every size over sockets (1.36-3.18x; 1.32-1.88x at 1-2 MB in
port_lanes_1mb_4xh200) and for all-reduce with NVLink inside (1.12-2.27x); all-gather with NVLink inside was the
exception at 1-2 MB (4 lanes 0.83-0.90x in one call, 1.00-1.03x in the other; 1.00-2.42x from 4 MB), and still
beat NCCL there (1.38-1.39x). Hence the 1 MB floor; below it lanes are not measured. On 4xH100 (3 samples) 4 lanes
won from 4 MB up (1.05-3.75x) and lost at 1 MB in 3 of 4 cases (0.81-0.97x). Eight lanes against four, on 4xH100
(bench/results/twodh_4xh100_s11/ab_lanes{4,8}_nvlink.json, a job each): all-to-all's 2DH plan faster at every size
from 1 to 64 MB with NVLink inside hosts (1.06-1.82x), the flat direct plan at every size but 2 MB (0.99-1.95x);
all-gather and all-reduce mixed (bench/results/port_lanes8_4xh100/, one job a fabric: the best plan 0.67-1.46x), so
they keep four.

Every wait is bounded: ``synchronize`` polls the stream's progress for ``timeout_s`` and a gloo wait carries the
same bound, so a peer whose process or host died is reported as ``PeerLost`` (naming the rank and its host)
instead of a hang.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.errors import ExecutorError, PeerLost
from executor.gpu import liveness
from executor.gpu.bootstrap import all_gather_plain
from executor.gpu.protocols import PORT_PROTOCOLS, protocol_refusal
from executor.hosts import host_identity, ipc_across_hosts, transport_refusal
from executor.port.program import (
    INPLACE,
    Compute,
    Exchange,
    Program,
    Slot,
    call_lanes,
    compile_programs,
    lane_bounds,
    split_peer,
)
from schedules.collectives import facts_of
from schedules.plan.io import load_plan, parse_plan
from schedules.plan.types import Plan

DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
POLL_S = 0.0005
LANES = 4  # a call's lanes by default (where default_lanes allows them), unless $WEFT_PORT_LANES says otherwise
ALLTOALL_LANES = 8  # an all-to-all's: measured faster than 4 from 1 to 64 MB (bench/NOTES.md, eleventh session)
MIN_LANE_BYTES = 1 << 20  # a call whose larger buffer is smaller runs as one lane (lanes measured from 1 MB up)
PIECE_BYTES = 64 << 10  # the least of a chunk that a lane carries
ALIGN_BYTES = 16  # lanes split chunks on 16-byte boundaries
LANE_CTAS = 8  # thread blocks of one lane's NCCL kernels
Bounds = tuple[int, int] | None  # a lane's columns of every chunk; None: the whole chunks, as one lane


def default_lanes(backend: str, env: Mapping[str, str]) -> int:
    """The lanes the engine makes when neither ``lanes=`` nor ``$WEFT_PORT_LANES`` says: on the NCCL backend, the
    most a call takes by default (``ALLTOALL_LANES``) where ``CUDA_DEVICE_MAX_CONNECTIONS`` gives each lane's streams
    hardware queues of their own (at least 4 a lane), else ``LANES`` where it gives them those, else one (with
    CUDA's default of 8 queues, a lane's kernel can wait behind another lane's that spins for a peer).

    >>> [default_lanes("nccl", {"CUDA_DEVICE_MAX_CONNECTIONS": q}) for q in ("32", "16", "8")]
    [8, 4, 1]
    """
    try:
        queues = int(env.get("CUDA_DEVICE_MAX_CONNECTIONS", "8"))
    except ValueError:
        return 1
    fits = [n for n in (ALLTOALL_LANES, LANES) if backend == "nccl" and queues >= 4 * n]
    return fits[0] if fits else 1


def call_limit(personalized: bool, lanes: int, asked: bool) -> int:
    """The most lanes one call takes on an engine of ``lanes`` lanes: all of them where the user asked for them
    (``lanes=`` or ``$WEFT_PORT_LANES``) and for a personalized exchange (all-to-all: ``Facts.personalized``), else
    at most ``LANES`` (more measured slower for all-reduce and all-gather at some sizes: bench/NOTES.md, eleventh
    session).

    >>> call_limit(True, 8, False), call_limit(False, 8, False), call_limit(False, 8, True)
    (8, 4, 8)
    """
    return lanes if asked or personalized else min(lanes, LANES)


def lane_floor(lanes: int | None, env: Mapping[str, str]) -> int:
    """The least call (its larger buffer, bytes) that splits into lanes: ``MIN_LANE_BYTES`` for the default lane
    count, 0 where ``lanes=`` or ``$WEFT_PORT_LANES`` asked for lanes (they apply at every size, as
    bench/port_x4.py measures them).

    >>> lane_floor(None, {}), lane_floor(4, {}), lane_floor(None, {"WEFT_PORT_LANES": "2"})
    (1048576, 0, 0)
    """
    return 0 if asked(lanes, env) else MIN_LANE_BYTES


def asked(lanes: int | None, env: Mapping[str, str]) -> bool:
    """Whether the user chose the lanes (``lanes=`` or ``$WEFT_PORT_LANES``): every call then takes them, at every
    size and for every collective."""
    return lanes is not None or "WEFT_PORT_LANES" in env


@dataclass
class _Context:
    """One plan at one size and dtype on this rank: its program and its own scratch and staging buffers."""

    program: Program
    scratch: dict[str, Any]  # "s" and "t", as (chunks, elements) views
    chunk_elems: int
    lanes: tuple[tuple[int, int], ...]  # each lane's columns [lo, hi) of every chunk
    outputs: dict[int, Any] = field(default_factory=dict)  # input pointer -> the output allocated for it
    pending: list = field(default_factory=list)  # (event, exchange) of the last eager execution


class PortEngine:
    """Runs port-channel plans on this rank with ``world_size - 1`` peers of a torch.distributed group: the engine
    of ``executor.Communicator`` across hosts (``executor.inference.engine``)."""

    stages = False  # contexts are local: calls run on the caller's tensors, inside a graph capture or not
    fuses_norm = False  # no row-owning port plan exists: the fused norm runs unfused
    direct_path = "port"

    def __init__(
        self, group: Any = None, timeout_s: float = 30.0, lanes: int | None = None, piece_bytes: int = PIECE_BYTES
    ):
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ExecutorError(
                "port engine: torch.distributed has no process group (launch with torchrun and call init_process_group)"
            )
        self._torch, self._dist = torch, dist
        self.group, self.timeout_s = group, timeout_s
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.backend = str(dist.get_backend(group)).lower()
        self.device = torch.cuda.current_device() if self.backend == "nccl" else None
        me = [host_identity(), liveness.identity_of(self.rank).to_json().decode()]
        every = all_gather_plain(me, group)  # plain data, never a pickle
        try:
            self.hosts = tuple(str(h) for h, _ in every)
            self._identities = [liveness.RankIdentity.from_json(i) for _, i in every]
        except (TypeError, ValueError) as e:
            raise ExecutorError(f"port engine: rank {self.rank}: a peer's identity is malformed: {e}") from None
        self._contexts: dict[tuple, _Context] = {}
        self._programs: dict[tuple[str, bool], tuple[Program, ...]] = {}  # (plan hash, closed groups)
        self._last: _Context | None = None
        self.lanes_refused: dict[str, str] = {}  # plan hash -> why its calls ran as one lane
        self.lanes, self.piece_bytes = self._lane_count(lanes, self.backend), piece_bytes
        self._asked = asked(lanes, os.environ)
        self.min_lane_bytes = lane_floor(lanes, os.environ)
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.world_size))
        # every rank creates the lanes' groups here, in the same order (a collective call)
        self._groups = [group] + [self._lane_group(ranks) for _ in range(self.lanes - 1)]
        self._streams = (
            [torch.cuda.Stream(self.device) for _ in range(self.lanes)]
            if self.device is not None and self.lanes > 1
            else []
        )

    @classmethod
    def from_process_group(
        cls, group: Any = None, timeout_s: float = 30.0, lanes: int | None = None, **_: Any
    ) -> PortEngine:
        return cls(group, timeout_s, lanes)

    def _lane_group(self, ranks: list[int]) -> Any:
        """A lane's process group. On NCCL its kernels take at most LANE_CTAS thread blocks: the lanes' kernels
        spin side by side waiting for their peers, and together they must fit on the GPU at once."""
        dist, options = self._dist, None
        if self.backend == "nccl":
            try:
                options = dist.ProcessGroupNCCL.Options()
                options.config.max_ctas = LANE_CTAS
            except (AttributeError, TypeError):  # a torch without NCCL's config: NCCL's defaults
                options = None
        return dist.new_group(ranks, backend=self.backend, pg_options=options)

    @staticmethod
    def _lane_count(lanes: int | None, backend: str) -> int:
        if lanes is None:
            text = os.environ.get("WEFT_PORT_LANES")
            if text is None:
                return default_lanes(backend, os.environ)
            try:
                lanes = int(text)
            except ValueError:
                raise ExecutorError(f"port engine: $WEFT_PORT_LANES={text!r} is not a whole number") from None
        if not 1 <= lanes <= 64:
            raise ExecutorError(f"port engine: {lanes} lanes: between 1 and 64")
        return lanes

    def precompile(
        self, calls: Sequence[tuple[Plan, int, str]], threads: int | None = None, lines: bool | None = None
    ) -> dict[str, str]:
        """Nothing to build: the port engine runs its plans as NCCL operations and sums, no compiled kernel."""
        return {
            f"plan {plan.name}: rank {self.rank}: {nbytes} B {dtype}": "port engine: runs no compiled kernels"
            for plan, nbytes, dtype in calls
        }

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
        norm: Any = None,
        compiled: bool | None = None,
    ) -> Any:
        """Run ``plan`` on ``input`` (and ``output``, allocated when None) on the current stream; the output.
        An in-place plan runs on one buffer: pass the larger of its input and output as ``input`` and no
        ``output`` (the smaller lives inside it at the rank's slice); the result is that buffer. The engine runs
        programs of NCCL calls and compiles no kernels: ``compiled=True`` is refused."""
        plan = (
            load_plan(plan)
            if isinstance(plan, (str, Path))
            else parse_plan(plan, "plan")
            if isinstance(plan, dict)
            else plan
        )
        if lines or compiled or residual is not None or norm is not None:
            raise ExecutorError(
                f"plan {plan.name}: the port engine moves plain data (no LL128 lines, no compiled kernel, no residual,"
                " no norm)"
            )
        if protocol_refusal(plan, PORT_PROTOCOLS, "the port engine"):
            raise ExecutorError(protocol_refusal(plan, PORT_PROTOCOLS, "the port engine"))
        ctx = self._context(plan, input, dtype)
        if plan.inplace:
            if output is not None:
                raise ExecutorError(f"plan {plan.name} is in-place: pass one buffer as input and no output")
            if not input.is_contiguous():  # a reshape would copy it, and the result land in the copy
                raise ExecutorError(f"plan {plan.name} is in-place: its buffer must be contiguous")
            output = input
            buffers = {INPLACE: input.reshape(-1).view(-1, ctx.chunk_elems), **ctx.scratch}
        else:
            output = self._output(plan, ctx, input, output)
            buffers = {
                "i": input.reshape(-1).view(-1, ctx.chunk_elems),
                "o": output.reshape(-1).view(-1, ctx.chunk_elems),
                **ctx.scratch,
            }
        capturing = self.device is not None and self._torch.cuda.is_current_stream_capturing()
        ctx.pending = []
        record = self.device is not None and not capturing
        if len(ctx.lanes) == 1:
            for step in ctx.program.steps:
                self._step(buffers, ctx, step, None, self.group, record)
        else:
            self._run_lanes(buffers, ctx, record)
        self._last = ctx
        return output

    def _run_lanes(self, buffers: dict[str, Any], ctx: _Context, record: bool) -> None:
        """Every lane's program, each on its own group and stream, forked from and joined to the caller's stream.
        Steps are issued step by step across the lanes: each rank's calls then follow one global order (each step
        of the one-lane order as consecutive copies), so no lane waits on a peer that waits on it."""
        streams = self._streams[: len(ctx.lanes)]
        main = self._torch.cuda.current_stream() if streams else None
        if main is not None:
            for s in streams:
                s.wait_stream(main)
        for step in ctx.program.steps:
            for lane, bounds in enumerate(ctx.lanes):
                with self._torch.cuda.stream(streams[lane]) if streams else contextlib.nullcontext():
                    self._step(buffers, ctx, step, bounds, self._groups[lane], record)
        if main is not None:
            for s in streams:
                main.wait_stream(s)

    def synchronize(self, stream: Any = None) -> None:
        """Wait, at most ``timeout_s``, for the last execution; PeerLost names a peer that did not answer."""
        if self.device is None:
            return
        ctx = self._last
        deadline = time.monotonic() + self.timeout_s
        for event, exchange in ctx.pending if ctx else []:
            while not event.query():
                if time.monotonic() > deadline:
                    raise self._lost(exchange, f"waited {self.timeout_s:.0f} s for its data")
                time.sleep(POLL_S)
        self._torch.cuda.current_stream().synchronize()

    def plan_refusal(self, plan: Plan) -> str:
        """Why this engine cannot run ``plan`` as the Communicator calls it, or '': a memory channel between hosts
        (CUDA IPC cannot reach another host), an in-place plan (its calls pass an input and an output), or one
        that ``compile_programs`` refuses (its ops, no pipelines)."""
        why = ipc_across_hosts(plan, self.hosts)
        if why or plan.inplace:
            return why or f"plan {plan.name} is in place; the Communicator's calls pass an input and an output"
        try:
            self._programs_for(plan, closed=False)  # kept for the plan's calls
        except ExecutorError as e:
            return str(e)
        return ""

    def residual_refusal(self, plan: Plan) -> str:
        return f"plan {plan.name}: the port engine adds no residual in its launch"

    def norm_refusal(self, plan: Plan) -> str:
        return f"plan {plan.name}: the port engine runs no norm epilogue"

    @contextlib.contextmanager
    def capture(self) -> Iterator[PortEngine]:
        """Nothing to prepare or register: every call runs on the caller's stream, so a graph captures it whole."""
        yield self

    def execute_captured(self, plan: Plan, input: Any, output: Any = None, **options: Any) -> str:
        self.execute(plan, input, output, **options)
        return ""

    def register_graph_buffers(self) -> None:
        """Nothing to register (``capture``)."""

    def exchange(self, what: str, value: Any) -> list[Any]:
        """Every rank's ``value`` in rank order (collective), as plain data, never a pickle
        (``gpu.bootstrap.all_gather_plain``): the interpreter's communicator's call, so the CLI uses either engine.
        ``what`` names the exchange (the interpreter's errors use it; NCCL's own wait is bounded by its timeout)."""
        return all_gather_plain(value, self.group)

    def close(self) -> None:
        self._contexts.clear()
        self._last = None

    # ------------------------------------------------------------------ internals

    def _context(self, plan: Plan, input: Any, dtype: str | None) -> _Context:
        torch = self._torch
        name = DTYPES.get(str(input.dtype).replace("torch.", ""))
        if name is None or (dtype is not None and dtype != name):
            raise ExecutorError(
                f"plan {plan.name}: dtype {dtype or input.dtype} is not supported here (fp32, fp16, "
                "bf16, matching the input)"
            )
        key = (plan.content_hash, input.numel(), name, str(input.device))
        ctx = self._contexts.get(key)
        if ctx is not None:
            return ctx
        self._check(plan, input, name)
        gpu = plan.gpus[self.rank]
        elems = input.numel() // self._input_chunks(plan)
        size = input.element_size()
        limit = call_limit(facts_of(plan.collective).personalized, self.lanes, self._asked)
        count = call_lanes(elems * size * plan.size_chunks, elems * size, limit, self.piece_bytes, self.min_lane_bytes)
        lanes = lane_bounds(elems, count, max(ALIGN_BYTES // size, 1))
        programs = self._programs_for(plan, closed=len(lanes) > 1)
        if plan.content_hash in self.lanes_refused:
            lanes = lane_bounds(elems, 1)
        program = programs[self.rank]
        scratch = {
            k: torch.empty(n * elems, dtype=input.dtype, device=input.device).view(-1, elems)
            for k, n in (("s", gpu.scratch_chunks), ("t", program.staging_chunks))
            if n
        }
        ctx = self._contexts[key] = _Context(program, scratch, elems, lanes)
        return ctx

    def _output(self, plan: Plan, ctx: _Context, input: Any, output: Any) -> Any:
        n = plan.gpus[self.rank].output_chunks * ctx.chunk_elems
        if output is None:
            output = ctx.outputs.get(input.data_ptr())
            if output is None:
                output = ctx.outputs[input.data_ptr()] = self._torch.empty(n, dtype=input.dtype, device=input.device)
        elif output.numel() != n or output.dtype != input.dtype or not output.is_contiguous():
            raise ExecutorError(
                f"plan {plan.name}: output has {output.numel()} {output.dtype} elements, expected "
                f"{n} {input.dtype} (contiguous)"
            )
        return output

    def _check(self, plan: Plan, input: Any, dtype: str) -> None:
        gpu = plan.gpus[min(self.rank, plan.nranks - 1)]
        why = ipc_across_hosts(plan, self.hosts) if plan.nranks == self.world_size else ""
        why = why or transport_refusal(
            plan.nranks, self.rank, self.hosts, gpu.port_peers, self.backend, input.device.type
        )
        if why:
            raise ExecutorError(why if why.startswith("plan ") else f"plan {plan.name}: {why}")
        if plan.nranks != self.world_size:
            raise ExecutorError(f"plan {plan.name}: {plan.nranks} ranks, the process group has {self.world_size}")
        if dtype not in plan.weft.dtypes:
            raise ExecutorError(
                f"plan {plan.name}: dtype {dtype} is not among the plan's ({', '.join(plan.weft.dtypes)})"
            )
        chunks = self._input_chunks(plan)
        nbytes = input.numel() * input.element_size() * plan.size_chunks // max(chunks, 1)
        if input.numel() % max(chunks, 1) or not plan.accepts(nbytes):
            raise ExecutorError(
                f"plan {plan.name}: an input of {input.numel()} elements is not a size the plan accepts "
                f"({chunks} {'buffer' if plan.inplace else 'input'} chunks of whole 4-byte words)"
            )

    def _programs_for(self, plan: Plan, closed: bool) -> tuple[Program, ...]:
        """Every rank's programs for ``plan``, compiled once; ``closed`` for lanes (a lane splits slots into many
        operations: groups of one round each). Closed programs that meet a peer in two groups of a round, which
        lanes could deadlock on, are refused once, in ``lanes_refused``: the plan's calls then run as one lane
        (every rank decides alike, from the plan)."""
        key = (plan.content_hash, closed)
        if key not in self._programs:
            programs = compile_programs(plan, closed)
            why = split_peer(programs) if closed else ""
            if why:
                self.lanes_refused[plan.content_hash] = f"plan {plan.name}: one lane: {why}"
                programs = self._programs_for(plan, closed=False)
            self._programs[key] = programs
        return self._programs[key]

    def _input_chunks(self, plan: Plan) -> int:
        """Chunks of the buffer passed as input: an in-place plan's one buffer is the larger of the two."""
        gpu = plan.gpus[self.rank]
        return max(gpu.input_chunks, gpu.output_chunks) if plan.inplace else gpu.input_chunks

    @staticmethod
    def _view(buffers: dict[str, Any], slot: Slot, bounds: Bounds):
        """The slot's chunks (a lane's columns of them: a strided view, which sums read and write)."""
        rows = buffers[slot.buffer][slot.index : slot.index + slot.size]
        return rows.reshape(-1) if bounds is None else rows[:, bounds[0] : bounds[1]]

    @staticmethod
    def _pieces(buffers: dict[str, Any], slot: Slot, bounds: Bounds) -> list:
        """The slot as contiguous tensors for sends and receives: whole, or a lane's columns chunk by chunk (both
        sides of a hop cut the same slot size the same way, so the pieces meet in order)."""
        rows = buffers[slot.buffer][slot.index : slot.index + slot.size]
        return [rows.reshape(-1)] if bounds is None else [row[bounds[0] : bounds[1]] for row in rows]

    def _step(self, buffers: dict[str, Any], ctx: _Context, step, bounds: Bounds, group: Any, record: bool) -> None:
        if isinstance(step, Compute):
            self._compute(buffers, step, bounds)
        else:
            self._exchange(buffers, ctx, step, bounds, group, record)

    def _compute(self, buffers: dict[str, Any], step: Compute, bounds: Bounds) -> None:
        srcs = [self._view(buffers, s, bounds) for s in step.srcs]
        total = srcs[0]
        for s in srcs[1:]:
            total = total + s  # in the element type: fp16/bf16 round after every add, as the plan says
        for d in step.dsts:
            view = self._view(buffers, d, bounds)
            if view.data_ptr() != total.data_ptr():
                view.copy_(total)

    def _exchange(
        self, buffers: dict[str, Any], ctx: _Context, step: Exchange, bounds: Bounds, group: Any, record: bool
    ) -> None:
        dist = self._dist
        ops = [
            dist.P2POp(dist.isend if t.send else dist.irecv, piece, t.peer, group)
            for t in step.transfers
            for piece in self._pieces(buffers, t.slot, bounds)
        ]
        try:
            works = dist.batch_isend_irecv(ops)
            for w in works or ():
                if self.device is None:
                    if not w.wait(datetime.timedelta(seconds=self.timeout_s)):
                        raise TimeoutError(f"no answer in {self.timeout_s:.0f} s")
                else:
                    w.wait()  # NCCL: the current stream waits for the group; the host does not
        except (RuntimeError, TimeoutError, ConnectionError) as e:
            if self.device is not None and "NCCL" not in str(e):
                raise
            raise self._lost(step, str(e).splitlines()[0][:200]) from None
        if record:
            event = self._torch.cuda.Event()
            event.record()
            ctx.pending.append((event, step))

    def _lost(self, step: Exchange, why: str) -> PeerLost:
        peers = sorted({t.peer for t in step.transfers})
        here = self._identities[self.rank]
        states = {p: liveness.probe(self._identities[p], here) for p in peers}
        gone = [p for p in peers if states[p] != "alive"] or peers
        p = gone[0]
        state = {"exited": "its process exited", "remote": "it runs on another host and did not answer"}.get(
            states[p], "it did not answer"
        )
        return PeerLost(
            f"rank {self.rank}: peer rank {p} on host {self.hosts[p]} lost during a port-channel exchange "
            f"({step}): {state}; {why}",
            rank=self.rank,
            peer=p,
            lost=tuple(gone),
        )
