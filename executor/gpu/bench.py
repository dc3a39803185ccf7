"""Timing weft against its peers on the same buffers, alternating, with CUDA events: NCCL, PyTorch symmetric memory
and, for the all-reduce where the ``peers`` extra is installed, FlashInfer's one-shot, two-shot and own-choice
all-reduce and vLLM's custom all-reduce (executor.gpu.peers).

Runs on every rank (one process per GPU, torch.distributed initialized); returns rows in DESIGN.md's bench
format. Each implementation is timed as CUDA-graph replays (``graph``) or eager calls of ``calls`` back-to-back
launches; a sample is one replay's time / ``calls``; the row holds the median of ``samples`` samples. Every peer's
output is checked against NCCL's by the bound of ``within_rounding`` (``peers_wrong``), as weft's is (``wrong``).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from executor.errors import ExecutorError
from executor.gpu.tables import lines_possible
from registry.index import Mode
from schedules.collectives import Chunking, Collective, facts_of
from schedules.plan.types import Plan

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


TURNS_ORDER = "implementations take turns, each round in the next order of a Williams design (executor.gpu.bench.turns)"


def turns(names: list[str], iteration: int) -> list[str]:
    """The order in which implementations take turns in one round of timing, from a Williams design: over every
    ``len(names)`` rounds (twice that for an odd count) each takes every place equally often and follows every
    other equally often, so that neither its place nor the replay before it (what that left in the L2, the clocks)
    favours one. Every rank computes the same order (the timed replays are collective).

    >>> [turns(["a", "b", "c"], i) for i in range(6)]
    [['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['c', 'b', 'a'], ['a', 'c', 'b'], ['b', 'a', 'c']]
    """
    n = len(names)
    if n < 2:
        return list(names)
    r = iteration % (2 * n if n % 2 else n)  # an odd count needs each row reversed too: rows n .. 2n-1
    base = [0] + [(k + 1) // 2 if k % 2 else n - k // 2 for k in range(1, n)]  # 0, 1, n-1, 2, n-2, ...
    row = [names[(b + r) % n] for b in base]
    return row[::-1] if r >= n else row


@dataclass(frozen=True)
class BenchConfig:
    collective: str
    sizes: tuple[int, ...]
    dtype: str
    graph: bool = True
    calls: int = 20
    samples: int = 30
    warmup: int = 3
    ll128: bool = False  # time LL plans a second time with LL128 lines (tables.lines_possible), named NAME+ll128
    compiled: bool = False  # time every plan (and format) a second time compiled to a kernel of its own: NAME+compiled
    symm: bool = True  # time PyTorch symmetric memory too (all-reduce, reduce-scatter, all-gather; one host: CUDA IPC)
    peers: tuple[str, ...] = ("flashinfer", "vllm")  # where installed (all-reduce, one host, as symm)
    # (size, plan hashes): the only plans timed at that size (weft bench --top: registry.store.contenders_at); a size
    # not named times every plan that runs it
    contenders: tuple[tuple[int, frozenset[str]], ...] = ()
    # all-to-all: "symm" adds torch symmetric memory's all_to_all_vdev (NVSHMEM), opt-in (alltoall_peers)


def _buffers(collective: str, nbytes: int, world: int, dtype, device):
    import torch

    esize = torch.tensor([], dtype=dtype).element_size()
    facts = Collective(collective, world)
    n_in = int(nbytes * facts.input_fraction) // esize
    x = torch.randn(n_in, device=device, dtype=torch.float32).to(dtype)
    n_out = int(nbytes * facts.output_fraction) // esize
    out = x.clone() if _one_tensor(facts) else torch.empty(n_out, device=device, dtype=dtype)
    return x, out


def _one_tensor(collective: Collective) -> bool:
    """Whether torch's call works in place on one tensor: every rank ends with the whole message, in a buffer the
    size of its input (all_reduce, broadcast)."""
    return collective.facts.same_to_all and collective.input_fraction == collective.output_fraction


def _world_group() -> ProcessGroup:
    """The default process group, whose name symmetric memory's rendezvous takes (the bench runs after init)."""
    import torch.distributed as dist

    world = dist.group.WORLD
    if world is None:
        raise ExecutorError("bench: torch.distributed has no default process group")
    return world


def _nccl(collective: str, x, out) -> Callable[[], object]:
    import torch.distributed as dist

    facts = facts_of(collective)
    if facts.shifts:
        return lambda: _shift(x, out)
    calls = {  # by torch.distributed's name (Facts.torch_op)
        "all_reduce": lambda: dist.all_reduce(out),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, x),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, x),
        "all_to_all_single": lambda: dist.all_to_all_single(out, x),
        "broadcast": lambda: dist.broadcast(out, src=0),
    }
    return calls[facts.torch_op or collective]  # a KeyError naming the collective where none fits


def _shift(x, out) -> None:
    """MSCCL++'s sendrecv through NCCL's point-to-point calls: x to the next rank, the previous rank's into out."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    for work in dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
    ):
        work.wait()


@dataclass(frozen=True)
class PeerCall:
    """A peer's call as the bench times it (``run``), and the same call on the row's input returning its result,
    for the check against NCCL (``result``)."""

    run: Callable[[], Any]
    result: Callable[[], Any]
    capture: Callable[[], Any] = contextlib.nullcontext  # entered around a graph's warm-up and capture


def _symm_mem_allreduce(x) -> tuple[dict[str, PeerCall], Any]:
    """One-shot and two-shot all-reduce on a symmetric-memory copy of x."""
    import torch
    import torch.distributed._symmetric_memory as symm_mem

    group = _world_group().group_name
    buf = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
    symm_mem.rendezvous(buf, group)
    buf.copy_(x)

    def one_shot():
        return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group)

    def two_shot():
        torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group)
        return buf

    def loaded(fn):  # the timed calls sum buf in place over and over: reload x before the checked call
        return lambda: (buf.copy_(x), fn())[1]

    return {
        "symm:one_shot": PeerCall(one_shot, loaded(one_shot)),
        "symm:two_shot": PeerCall(two_shot, loaded(two_shot)),
    }, buf


def _symm_mem_alltoall(x, out) -> dict[str, PeerCall]:
    """torch symmetric memory's all-to-all (``all_to_all_vdev``, NVSHMEM) with equal splits, on symmetric copies of
    x and out. The op's arguments changed across torch releases (the splits as one (3, world) tensor, or the input
    splits and a (2, world) tensor of output splits and offsets); the installed schema decides. Raises where torch
    has no NVSHMEM or no such op: the bench records why (``peers_refused``)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    if not hasattr(torch.ops.symm_mem, "all_to_all_vdev"):
        raise RuntimeError(f"torch {torch.__version__} has no torch.ops.symm_mem.all_to_all_vdev")
    if not symm_mem.is_nvshmem_available():
        raise RuntimeError("all_to_all_vdev needs NVSHMEM, which this torch cannot load")
    try:
        current = symm_mem.get_backend(x.device)
    except Exception:  # a torch without get_backend: set it (once per process is what it allows)
        current = None
    if current != "NVSHMEM":
        symm_mem.set_backend("NVSHMEM")
    group, world = _world_group().group_name, dist.get_world_size()
    symm_mem.enable_symm_mem_for_group(group)
    inp = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
    got = symm_mem.empty(out.numel(), dtype=x.dtype, device=x.device)
    inp.copy_(x)
    per_rank = x.numel() // world
    splits = torch.full((world,), per_rank, dtype=torch.int64, device=x.device)
    offsets = torch.arange(0, per_rank * world, per_rank, dtype=torch.int64, device=x.device)
    arguments = len(torch.ops.symm_mem.all_to_all_vdev.default._schema.arguments)
    if arguments == 4:  # (input, out, in_out_splits (3, world), group)
        table = symm_mem.empty((3, world), dtype=torch.int64, device=x.device)
        table[0].copy_(splits)

        def run():
            torch.ops.symm_mem.all_to_all_vdev(inp, got, table, group)
            return got
    else:  # (input, out, in_splits (world), out_splits_offsets (2, world), group)
        in_splits = symm_mem.empty(world, dtype=torch.int64, device=x.device)
        in_splits.copy_(splits)
        table = symm_mem.empty((2, world), dtype=torch.int64, device=x.device)
        table[0].copy_(splits)
        table[1].copy_(offsets)

        def run():
            torch.ops.symm_mem.all_to_all_vdev(inp, got, in_splits, table, group)
            return got

    return {"symm:all_to_all_vdev": PeerCall(run, run)}


SCATTER_GATHER_OPS = {"reduce_scatter_tensor", "all_gather_into_tensor"}  # torch ops with symmetric-memory peers


def _symm_mem_scatter_gather(collective: str, x) -> tuple[dict[str, Callable[[], Any]], Any]:
    """torch symmetric memory's reduce-scatter or all-gather on a symmetric copy of x, by name: its reduce-scatter
    kernel (``reduce_scatter_out``) and the low-contention copy-engine forms (``_low_contention_*``, joined back
    to the caller's stream by ``wait_tensor``). Only the ops this torch has; each returns its result. Also the
    symmetric input."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    group, world = _world_group().group_name, dist.get_world_size()
    buf = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
    symm_mem.rendezvous(buf, group)
    buf.copy_(x)
    ops, wait = torch.ops.symm_mem, torch.ops._c10d_functional.wait_tensor
    calls: dict[str, Callable[[], Any]] = {}
    if facts_of(collective).torch_op == "reduce_scatter_tensor":
        out = torch.empty(x.numel() // world, dtype=x.dtype, device=x.device)
        if hasattr(ops, "reduce_scatter_out"):
            calls["symm:reduce_scatter"] = lambda: ops.reduce_scatter_out(buf, group, False, out)
        if hasattr(ops, "_low_contention_reduce_scatter"):
            calls["symm:low_contention"] = lambda: wait(ops._low_contention_reduce_scatter(buf, "sum", group))
    elif hasattr(ops, "_low_contention_all_gather"):
        calls["symm:low_contention"] = lambda: wait(ops._low_contention_all_gather(buf, group))
    if not calls:
        raise RuntimeError(f"torch {torch.__version__} has no symmetric-memory {collective}")
    return calls, buf


def scatter_gather_peers(collective: str, x, keep: list) -> tuple[dict[str, PeerCall], dict[str, str]]:
    """The reduce-scatter and all-gather peers timed beside NCCL (torch symmetric memory's), and those refused, with
    why. A call that may leave its symmetric input changed reloads it from x before the checked run."""
    try:
        calls, buf = _symm_mem_scatter_gather(collective, x)
    except Exception as e:  # no symmetric memory here, another torch: a result, not the end of the bench
        return {}, {"symm": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    keep.append(calls)

    def loaded(run):  # reduce_scatter_out's schema lets it write its input: the checked call starts from x
        return lambda: (buf.copy_(x), run())[1]

    return {name: PeerCall(run, loaded(run)) for name, run in calls.items()}, {}


def alltoall_peers(x, out, keep: list) -> tuple[dict[str, PeerCall], dict[str, str]]:
    """The all-to-all peers timed beside NCCL (torch symmetric memory's), and those refused, with why."""
    try:
        calls = _symm_mem_alltoall(x, out)
    except Exception as e:  # no NVSHMEM, another torch: a result, not the end of the bench
        return {}, {"symm:all_to_all_vdev": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    keep.append(calls)
    return calls, {}


@dataclass
class Peers:
    """The peers made once per bench (their workspaces are collective and large): FlashInfer's all-reduce and
    vLLM's custom all-reduce, or why each is absent."""

    flashinfer: Any = None
    vllm: Any = None
    absent: dict | None = None

    @classmethod
    def create(cls, max_bytes: int, names: tuple[str, ...] = ("flashinfer", "vllm")) -> Peers:
        from executor.gpu import peers

        made, absent = {}, {}
        makers = {
            "flashinfer": lambda: peers.FlashInfer.create(max_bytes=max(max_bytes, 1 << 20)),
            "vllm": lambda: peers.VllmCustomAllReduce.create(),
        }
        for name, make in makers.items():
            if name not in names:
                continue
            try:
                made[name] = make()
            except Exception as e:  # a peer that cannot run here is a result, not the end of the bench
                absent[name] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        return cls(made.get("flashinfer"), made.get("vllm"), absent)

    def calls(self, x, keep: list) -> tuple[dict[str, PeerCall], dict[str, str]]:
        """This size's calls (out of place, on buffers kept in ``keep``), and the variants refused, with why."""
        import torch

        from executor.gpu import peers

        calls, refused = {}, {}
        if self.flashinfer is not None:
            tokens, hidden = peers.rows(x.numel())
            for variant in peers.VARIANTS:
                why = self.flashinfer.refusal(tokens, hidden, variant)
                if why:
                    refused[f"flashinfer:{variant}"] = why
                    continue
                out = torch.empty_like(x)
                keep.append(out)

                def run(v=variant, out=out):
                    return self.flashinfer.all_reduce(x, out, v)

                calls[f"flashinfer:{variant}"] = PeerCall(run, run)
        if self.vllm is not None:
            try:
                xin = self.vllm.input(x.numel(), x.dtype)
            except peers.PeerUnavailable as e:
                refused["vllm:custom_ar"] = str(e)
            else:
                xin.copy_(x)
                out = torch.empty_like(x)
                keep.append(out)

                def custom_ar(out=out):
                    return self.vllm.all_reduce(xin, out)

                calls["vllm:custom_ar"] = PeerCall(custom_ar, lambda: (xin.copy_(x), custom_ar())[1], self.vllm.capture)
        return calls, refused


def _timer(fn: Callable[[], Any], graph: bool, calls: int, capture: Callable[[], Any] = contextlib.nullcontext):
    """A function returning one sample (µs per call). ``capture`` is entered around the warm-up and the capture
    (``Communicator.capture`` for the inference communicator's calls)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        with capture():
            with torch.cuda.stream(stream):
                fn()  # warm-up outside the capture (contexts, NCCL and symm-mem setup)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=stream):
                for _ in range(calls):
                    fn()
        run = g.replay
    else:
        fn()  # warm-up, and where a launch is refused it is refused here

        def run() -> None:
            for _ in range(calls):
                fn()

    def sample() -> float:
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / calls

    return sample


def nccl_result(collective: str, x, world: int):
    """NCCL's result for this rank's input x, on fresh buffers."""
    import torch

    facts = Collective(collective, world)
    n_out = int(x.numel() * facts.output_fraction / facts.input_fraction)
    out = x.clone() if _one_tensor(facts) else torch.empty(n_out, dtype=x.dtype, device=x.device)
    _nccl(collective, x, out)()
    return out


SUM_TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2}


def within_rounding(got, ref, magnitude, dtype: str, terms: int) -> bool:
    """Whether two sums of ``terms`` values per element (got, and a correct ref) agree up to rounding. Each rounds
    terms - 1 partial sums in its own order, each by up to a unit in the last place of the partial sum, so they may
    differ by a few units of Σ|term| (``magnitude``, fp32) however much the terms cancel."""
    bound = SUM_TOLERANCE[dtype] * max(terms - 1, 1) * (magnitude.float() + 1.0)
    return bool(((got.float() - ref.float()).abs() <= bound).all())


def sum_magnitude(collective: str, x, world: int):
    """Σ over ranks of |x| (fp32, through NCCL) for each element of a sum: what its rounding scales with."""
    return nccl_result(collective, x.float().abs(), world)


def matches(collective: str, got, ref, dtype: str, magnitude, nranks: int) -> bool:
    """Bit-identical for copies; for sums, within the rounding two correct sums of ``nranks`` terms may differ by
    (``magnitude`` from ``sum_magnitude``)."""
    import torch

    if not facts_of(collective).combining:
        return bool(torch.equal(got, ref))
    return within_rounding(got, ref, magnitude, dtype, nranks)


def _every_rank(comm, what: str, value: Any) -> list[Any]:
    """``value`` from every rank, as plain data through the communicator's store (torch's all_gather_object would
    unpickle what peers send)."""
    return [value] if comm.world_size == 1 else comm.exchange(what, value)


def _refused_anywhere(comm, refused: str) -> bool:
    """Whether any rank could not run a plan (every rank then skips it, so all keep running the same plans)."""
    return any(_every_rank(comm, "bench-refused", refused))


def _slowest_rank(comm, medians: dict[str, float]) -> dict[str, float]:
    """Each implementation's median on its slowest rank: a collective takes as long as its last rank, and every rank
    must then pick the same fastest plan (a rank running another plan than its peers would wait for them)."""
    every = _every_rank(comm, "bench-medians", medians)
    return {k: max(m[k] for m in every) for k in medians}


def _check(
    collective: str, comm, plan: Plan, x, world: int, dtype: str, lines: bool = False, compiled: bool = False
) -> int:
    """1 if weft's result differs from NCCL's on this rank's data, else 0 (``compiled``: the compiled kernel's)."""
    ref, magnitude = nccl_result(collective, x, world), sum_magnitude(collective, x, world)
    kernel = {"compiled": True} if compiled else {}
    got = comm.execute(plan, x.clone() if plan.inplace else x, lines=lines, **kernel)  # in place: one buffer
    comm.synchronize()
    return int(not matches(collective, got, ref, dtype, magnitude, world))


def _check_peers(
    comm, calls: dict[str, PeerCall], x, world: int, dtype: str, collective: str = "allreduce"
) -> dict[str, int]:
    """Per peer, the ranks whose result differs from NCCL's on the same input (the bound of ``matches``)."""
    if not calls:
        return {}
    ref, magnitude = nccl_result(collective, x, world), sum_magnitude(collective, x, world)
    mine = {}
    for name, call in calls.items():
        got = call.result()
        comm.synchronize()
        mine[name] = int(not matches(collective, got.view(ref.shape), ref, dtype, magnitude, world))
    every = _every_rank(comm, "bench-peers-wrong", mine)  # plain data through the store
    return {name: sum(w[name] for w in every) for name in mine}


LINES_SUFFIX = Mode(lines=True).suffix  # a timer's name past the plan's: how it ran (registry.index.Mode)
COMPILED_SUFFIX = Mode(compiled=True).suffix


def _plan_timers(
    comm: Any,
    config: BenchConfig,
    candidates: list[Plan],
    nbytes: int,
    x: Any,
    out: Any,
    keep: list[Any],
    progress: Callable[[str], None] | None,
) -> tuple[dict[str, Callable[[], float]], dict[str, tuple[Plan, bool]], dict[str, tuple[Plan, bool]], dict[str, str]]:
    """A timer per weft plan (and per packet format, with ``config.ll128``; and per kernel, with
    ``config.compiled``: NAME+compiled, the plan compiled to a kernel of its own) that runs here on every rank, the
    timer name -> (plan, with LL128 lines) of the interpreter's and of the compiled kernels', and why a plan was
    not compiled (plan hash -> the reason). A plan refused on any rank is skipped (and said, with ``progress``);
    the buffers made go into ``keep``."""
    import torch

    timers: dict[str, Callable[[], float]] = {}
    runnable: dict[str, tuple[Plan, bool]] = {}  # timer name -> (plan, with LL128 lines)
    compiled: dict[str, tuple[Plan, bool]] = {}  # the same for the compiled kernels' timers
    not_compiled: dict[str, str] = {}
    formats = [(p, False) for p in candidates] + [
        (p, True) for p in candidates if config.ll128 and lines_possible(p, nbytes)
    ]
    kernels = (False, True) if config.compiled and hasattr(comm, "compiled_refused") else (False,)
    if True in kernels and hasattr(comm, "precompile"):  # every plan's kernel built side by side, not one by one
        calls = [(p, nbytes, config.dtype) for p in candidates]
        for call, why in comm.precompile(calls, lines=config.ll128).items():  # with lines: both kernels an LL plan has
            if progress:
                progress(f"not precompiled: {call}: {why}")
    for (plan, lines), kernel in ((f, k) for f in formats for k in kernels):
        # NCCL's all-reduce sums into ``out`` in place, call after call: weft's plans write elsewhere
        y = torch.empty_like(x) if facts_of(config.collective).sums_everywhere else out
        if plan.inplace and x.numel() == out.numel():  # MSCCL++'s plans run in place: one buffer, in and out
            y = x.clone()
        keep.append(y)
        options = {"lines": lines, **({"compiled": True} if kernel else {})}
        try:
            run = (
                (lambda p=plan, y=y, o=options: comm.execute(p, y, **o))
                if plan.inplace
                else (lambda p=plan, x=x, y=y, o=options: comm.execute(p, x, y, **o))
            )
            timer = _timer(run, config.graph, config.calls)
            why = comm.compiled_refused.get(plan.content_hash, "") if kernel else ""  # else the interpreter ran
        except ExecutorError as e:  # e.g. more thread blocks than the GPU holds at once
            timer, why = None, str(e)
        name = f"weft:{plan.name}{Mode(lines, kernel).suffix}"
        if _refused_anywhere(comm, why):
            if kernel:
                not_compiled[plan.content_hash + (LINES_SUFFIX if lines else "")] = why or "refused on another rank"
            if progress and why:
                progress(f"skipping {name[5:]}: {why}")
            continue
        timers[name] = timer
        (compiled if kernel else runnable)[name] = (plan, lines)
    return timers, runnable, compiled, not_compiled


def _compiled_columns(
    med: dict[str, float],
    compiled: dict[str, tuple[Plan, bool]],
    fastest: str | None,
    wrong: int,
    not_compiled: dict[str, str],
) -> dict[str, Any]:
    """A row's compiled-kernel columns (``BenchConfig.compiled``), beside the interpreter's: the fastest compiled
    plan's time and name, whether its result differed from NCCL's, each plan's time compiled (by plan hash, +ll128
    for lines) and why a plan was not compiled."""
    return {
        "compiled_us": med[fastest] if fastest else None,
        "compiled_plan": fastest[5 : -len(COMPILED_SUFFIX)] if fastest else None,
        "compiled_wrong": wrong,
        "plans_compiled_us": {
            p.content_hash + (LINES_SUFFIX if lines else ""): med[k] for k, (p, lines) in compiled.items()
        },
        "compiled_refused": not_compiled,
    }


def _size_peers(config: BenchConfig, peers: Peers, x, out, keep: list) -> tuple[dict[str, PeerCall], dict[str, str]]:
    """The peers timed at one size beside NCCL, on buffers kept in ``keep``, and those refused, with why: for the
    all-reduce torch symmetric memory and the installed peers, for reduce-scatter and all-gather symmetric memory's,
    for all-to-all symmetric memory's where ``config.peers`` names it."""
    facts = facts_of(config.collective)
    others: dict[str, PeerCall] = {}
    refused_peers = dict(peers.absent or {})
    found: list[tuple[dict[str, PeerCall], dict[str, str]]] = []
    if facts.sums_everywhere and config.symm:
        symm, buf = _symm_mem_allreduce(x)
        keep.append(buf)
        found += [(symm, {}), peers.calls(x, keep)]
    if facts.torch_op in SCATTER_GATHER_OPS and config.symm:
        found.append(scatter_gather_peers(config.collective, x, keep))
    if facts.chunking is Chunking.BLOCKS and config.symm and "symm" in config.peers:
        found.append(alltoall_peers(x, out, keep))
    for calls, refused in found:
        others.update(calls)
        refused_peers.update(refused)
    return others, refused_peers


def size_candidates(config: BenchConfig, plans: list[Plan], nbytes: int) -> list[Plan]:
    """The plans timed at ``nbytes``: those that run it in the config's dtype, and where ``config.contenders`` names
    the size, only those it names there."""
    candidates = [p for p in plans if p.runs(nbytes) and config.dtype in p.weft.dtypes]
    named = dict(config.contenders).get(nbytes)
    return candidates if named is None else [p for p in candidates if p.content_hash in named]


def run_bench(
    comm,
    config: BenchConfig,
    plans: list[Plan],
    progress: Callable[[str], None] | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """One row per size; weft's time is that of the fastest plan accepting the size (with ``config.ll128``, of the
    fastest plan and packet format: an LL plan with LL128 lines is named PLAN+ll128; with ``config.compiled``, of
    every plan interpreted and as its own kernel, PLAN+compiled, a kernel counting only where its result was right:
    the row's ``interpreted_*`` columns keep the interpreter's fastest). ``on_row`` sees each row as soon as its
    size is done (on every rank: it may be collective), before the next size starts."""
    import torch

    world, device = comm.world_size, torch.device("cuda", comm.device)
    dtype = getattr(torch, TORCH_DTYPES[config.dtype])
    rows = []
    facts = facts_of(config.collective)
    with_peers = facts.sums_everywhere and config.symm  # all-reduce peers; one host: CUDA IPC, as symm-mem
    peers = Peers.create(max(config.sizes), config.peers) if with_peers and config.peers else Peers(absent={})
    for nbytes in config.sizes:
        began = time.monotonic()
        x, out = _buffers(config.collective, nbytes, world, dtype, device)
        # sizes off a plan's granule run padded (InterpreterEngine.execute): their times include the copies
        candidates = size_candidates(config, plans, nbytes)
        timers: dict[str, Callable[[], float]] = {
            "nccl": _timer(_nccl(config.collective, x, out), config.graph, config.calls)
        }
        keep: list[Any] = []
        others, refused_peers = _size_peers(config, peers, x, out, keep)
        for name, call in others.items():
            try:
                timer, why = _timer(call.run, config.graph, config.calls, call.capture), ""
            except Exception as e:  # a peer refusing a shape at launch (its own checks) is a result
                timer, why = None, f"{type(e).__name__}: {e}".splitlines()[0][:300]
            if _refused_anywhere(comm, why):
                refused_peers[name] = why or "refused on another rank"
                continue
            timers[name] = timer
        plan_timers, runnable, compiled, not_compiled = _plan_timers(
            comm, config, candidates, nbytes, x, out, keep, progress
        )
        timers.update(plan_timers)
        comm.synchronize()
        raw: dict[str, list[float]] = {k: [] for k in timers}
        for i in range(config.warmup + config.samples):
            for name in turns(list(timers), i):  # alternate so drift hits every implementation alike
                t = timers[name]()
                if i >= config.warmup:
                    raw[name].append(t)
        comm.synchronize()
        med = _slowest_rank(comm, {k: statistics.median(v) for k, v in raw.items()})
        weft = {k: v for k, v in med.items() if k in runnable}
        fastest_compiled = min(compiled, key=med.__getitem__) if compiled else None
        best = min(weft, key=weft.__getitem__) if weft else None
        symm = [v for k, v in med.items() if k.startswith("symm:")]
        flashinfer = {k: v for k, v in med.items() if k.startswith("flashinfer:")}
        rivals = {k: v for k, v in med.items() if not k.startswith("weft:")}  # every peer timed, NCCL too
        compiled_wrong = 0
        if fastest_compiled:
            plan, lines = compiled[fastest_compiled]
            compiled_wrong = _check(config.collective, comm, plan, x, world, config.dtype, lines, compiled=True)
        best_peer = min(rivals, key=rivals.__getitem__)
        wrong = 0
        if best:
            plan, lines = runnable[best]
            wrong = _check(config.collective, comm, plan, x, world, config.dtype, lines)
        peers_wrong = _check_peers(
            comm, {k: others[k] for k in timers if k in others}, x, world, config.dtype, config.collective
        )
        interpreted, interpreted_wrong = best, wrong
        # weft's time is that of the fastest way selection could run it: a compiled kernel counts where it was faster
        # and right (the registry records both, and a compiling Communicator runs the faster)
        if fastest_compiled and not compiled_wrong and (best is None or med[fastest_compiled] < med[best]):
            best, wrong = fastest_compiled, compiled_wrong
        kinds = {**runnable, **compiled}
        weft_us = med[best] if best else None
        plan_hash = kinds[best][0].content_hash if best else None
        algbw = nbytes / (weft_us * 1e3) if weft_us else None
        rows.append(
            {
                "size": nbytes,
                "nccl_us": med["nccl"],
                "symm_us": min(symm) if symm else None,
                "weft_us": weft_us,
                "algbw": algbw,
                "busbw": algbw * Collective(config.collective, world).bus_factor if algbw else None,
                "speedup": med["nccl"] / weft_us if weft_us else None,
                "wrong": wrong,
                "flashinfer_us": min(flashinfer.values()) if flashinfer else None,
                "flashinfer_variant": min(flashinfer, key=flashinfer.__getitem__).split(":")[1] if flashinfer else None,
                "vllm_us": med.get("vllm:custom_ar"),
                "best_peer": best_peer,
                "best_peer_us": rivals[best_peer],
                "peers_wrong": peers_wrong,
                "peers_refused": refused_peers,
                "plan": best[5:] if best else None,
                "plan_hash": plan_hash,
                "lines": bool(best and kinds[best][1]),
                "compiled": bool(best and best in compiled),
                "raw_us": raw,
                "median_us": med,
                "plans_us": {p.content_hash: med[k] for k, (p, lines) in runnable.items() if not lines},
                "plans_ll128_us": {p.content_hash: med[k] for k, (p, lines) in runnable.items() if lines},
                **(
                    {
                        **_compiled_columns(med, compiled, fastest_compiled, compiled_wrong, not_compiled),
                        "interpreted_us": med[interpreted] if interpreted else None,
                        "interpreted_plan": interpreted[5:] if interpreted else None,
                        "interpreted_wrong": interpreted_wrong,
                    }
                    if config.compiled
                    else {}
                ),
            }
        )
        if progress:
            progress(
                f"{nbytes} B: "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(med.items(), key=lambda kv: kv[1]))
                + f" µs; wrong {wrong}, peers wrong {sum(peers_wrong.values())}; "
                f"{time.monotonic() - began:.1f} s"
            )
        if on_row:
            on_row(rows[-1])
        del keep
    return rows  # the peers' workspaces live until the process ends (freeing vLLM's IPC buffers is collective)
