"""A Llama-70B-shaped tensor-parallel decode step, with NCCL or weft all-reduce, under CUDA graphs.

Each layer is attention (64 query and 8 KV heads of 128, a KV cache) then an MLP (8192 -> 28672 -> 8192),
sharded Megatron-style over TP ranks, with one all-reduce after attention and one after the MLP, each summed
into the residual stream (``x = x + all_reduce(a @ w)``) and followed by the next RMSNorm (with its weight; the
last one before the LM head), as vLLM runs it. The backends run in the same job on the same random bf16 weights
and inputs: NCCL (in place on the projection's output, then torch's add and rms_norm), weft (its all-reduce, then
torch's add and rms_norm), weft-fused (``comm.all_reduce(a @ w, residual=x)``: the add inside the all-reduce's
launch, then torch's rms_norm) and weft-fused-norm (``comm.all_reduce(a @ w, residual=x, rms_weight=w, eps=)``:
the add and the norm inside the launch), and, where FlashInfer is installed (the ``peers`` extra), flashinfer-fused
(FlashInfer's ``trtllm_allreduce_fusion`` with ``kARResidualRMSNorm``, one-shot or two-shot by its own choice: the
add and the norm inside its launch, as vLLM's fusion pass runs it; its plain all-reduce where the step has no norm).
The backends take turns replay by replay. The script reports decode-step latency, tokens/s, the share of the
step spent in all-reduce, and checks that the logits agree. weft's graphs are captured inside ``comm.capture()``, so
their all-reduces read and write the captured tensors (no staging copies).

    WEFT_REGISTRY=bench/registry_h200x2 torchrun --nproc-per-node 2 examples/tp_decode.py \
        --batch 1,4,16,64 --json bench/results/tp_decode_2xh200.json

The JSON is written after every batch (``complete`` false until the last), so a run cut by a time limit keeps the
batches it measured. Each row carries ``clock_violations_ns_by_rank``: how long NVML counted each GPU's clocks held
down (power, thermal, ...) while that batch was timed (executor.gpu.clocks).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor import RowNorm
from executor.gpu import peers
from executor.gpu.bench import turns
from executor.gpu.clocks import grown, violation_reader
from schedules.plan import load_plan

HIDDEN, MLP, Q_HEADS, KV_HEADS, HEAD_DIM, VOCAB = 8192, 28672, 64, 8, 128, 32000
EPS = 1e-5  # Llama's RMSNorm epsilon
LOGITS_BOUND = 2e-2  # |a - b| / |a| over the logits: bf16 (8 mantissa bits) over 16 all-reduce + norm roundings


@dataclass(frozen=True)
class Shape:
    tp: int
    layers: int
    context: int

    @property
    def q_heads(self) -> int:
        return Q_HEADS // self.tp

    @property
    def kv_heads(self) -> int:
        return max(KV_HEADS // self.tp, 1)

    @property
    def mlp(self) -> int:
        return MLP // self.tp


def make_weights(shape: Shape, rank: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    scale = HIDDEN**-0.5

    def w(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=gen, device=device, dtype=torch.bfloat16) * scale

    qkv = (shape.q_heads + 2 * shape.kv_heads) * HEAD_DIM
    return [
        {
            "qkv": w(HIDDEN, qkv),
            "o": w(shape.q_heads * HEAD_DIM, HIDDEN),
            "gate_up": w(HIDDEN, 2 * shape.mlp),
            "down": w(shape.mlp, HIDDEN),
        }
        for _ in range(shape.layers)
    ]


def make_norms(shape: Shape, device: torch.device) -> list[torch.Tensor]:
    """The RMSNorm weights, the same on every rank (replicated, as in tensor parallelism): before attention and
    before the MLP of each layer, then the final norm."""
    gen = torch.Generator(device=device).manual_seed(4321)
    return [
        (1.0 + 0.1 * torch.randn(HIDDEN, generator=gen, device=device)).to(torch.bfloat16)
        for _ in range(2 * shape.layers + 1)
    ]


def make_cache(shape: Shape, batch: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator(device=device).manual_seed(99)
    dims = (batch, shape.kv_heads, shape.context, HEAD_DIM)
    return [
        (
            torch.randn(*dims, generator=gen, device=device, dtype=torch.bfloat16),
            torch.randn(*dims, generator=gen, device=device, dtype=torch.bfloat16),
        )
        for _ in range(shape.layers)
    ]


def decode_step(x: torch.Tensor, weights, norms, cache, shape: Shape, project) -> torch.Tensor:
    """One token for every sequence in the batch through every layer; returns the final hidden state, normed.

    ``project(a, w, x, n)`` is the row-parallel projection into the residual stream and the norm after it:
    ``x + sum(a @ w)`` over ranks (the layer's all-reduce) and its RMSNorm with weight ``n``, as (normed, x).
    """
    batch = x.shape[0]
    h = F.rms_norm(x, (HIDDEN,), norms[0], EPS)
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(weights, cache, strict=True)):
        qkv = h @ layer["qkv"]
        q, k, v = qkv.split([shape.q_heads * HEAD_DIM, shape.kv_heads * HEAD_DIM, shape.kv_heads * HEAD_DIM], -1)
        q = q.view(batch, shape.q_heads, 1, HEAD_DIM)
        keys = torch.cat([k_cache, k.view(batch, shape.kv_heads, 1, HEAD_DIM)], dim=2)
        values = torch.cat([v_cache, v.view(batch, shape.kv_heads, 1, HEAD_DIM)], dim=2)
        attn = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        h, x = project(attn.reshape(batch, -1), layer["o"], x, norms[2 * i + 1])
        gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
        h, x = project(F.silu(gate) * up, layer["down"], x, norms[2 * i + 2])
    return h


def nccl_all_reduce(t: torch.Tensor) -> torch.Tensor:
    """In place: the projection's output is a temporary, so NCCL needs no copy (as vLLM's NCCL path)."""
    dist.all_reduce(t)
    return t


@dataclass(frozen=True)
class Backend:
    add: Callable  # (a, w, x) -> x + a @ w summed over ranks
    all_reduce: Callable  # t -> t summed over ranks
    capture: Callable[[], contextlib.AbstractContextManager] = (
        contextlib.nullcontext
    )  # around each graph's warm-up and capture
    norm: Callable | None = None  # (a, w, x, n) -> (rms_norm(x + sum(a @ w)) * n, x + sum(a @ w)); default add + torch

    def project(self, a, w, x, n):
        if self.norm is not None:
            return self.norm(a, w, x, n)
        x = self.add(a, w, x)
        return F.rms_norm(x, (HIDDEN,), n, EPS), x


def reducing(all_reduce):
    """The projection ``a @ w``, then ``all_reduce``, then the residual added by torch."""
    return lambda a, w, x: x + all_reduce(a @ w)


def fused(comm):
    """The projection ``a @ w``, then weft's all-reduce adding the residual in its own launch."""
    return lambda a, w, x: comm.all_reduce(a @ w, residual=x)


def fused_norm(comm):
    """The projection ``a @ w``, then weft's all-reduce adding the residual and normalizing in its own launch."""
    return lambda a, w, x, n: comm.all_reduce(a @ w, residual=x, rms_weight=n, eps=EPS)


def flashinfer_backend(fi) -> Backend:
    """FlashInfer (executor.gpu.peers.FlashInfer): its fused all-reduce + add + RMSNorm in the step, its plain
    all-reduce (then torch's add) where a graph measures the all-reduce alone."""

    def all_reduce(t):
        return fi.all_reduce(t, torch.empty_like(t), "auto")

    return Backend(reducing(all_reduce), all_reduce, norm=lambda a, w, x, n: fi.fused_norm(a @ w, x, n, EPS, "auto"))


def graph_of(
    fn, warmup_stream: torch.cuda.Stream, capture: Callable[[], contextlib.AbstractContextManager]
) -> torch.cuda.CUDAGraph:
    with capture():
        warmup_stream.wait_stream(torch.cuda.current_stream())  # after what capture() prepared on this stream
        with torch.cuda.stream(warmup_stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(warmup_stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    return graph


# Kernel families of the step, by name (lower case, first match): the collective's own kernels, then the model's
KERNEL_CLASSES = (
    ("weft", ("weft_",)),
    ("flashinfer", ("allreduce_fusion", "lamport", "trtllm", "flashinfer")),
    ("nccl", ("nccl",)),
    ("gemm", ("gemm", "xmma", "cutlass", "cublas", "nvjet", "sm90_")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "softmax")),
    ("norm", ("rms", "norm")),
)


def kernel_class(name: str) -> str:
    """The family of a kernel of the step (``KERNEL_CLASSES``), else 'other'."""
    low = name.lower()
    return next((cls for cls, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


def step_kernels(events, replays: int, top: int = 12, sequence: int = 400) -> dict:
    """Device time per step of the (kernel name, start µs, µs) ``events`` of ``replays`` replays of one step graph:
    by family (``kernel_class``), the ``top`` kernels by time, each as [name (100 characters), µs, launches per
    step], and the last replay's first ``sequence`` kernels in launch order, each as [name (60 characters), start µs
    from that replay's first kernel, µs], which shows the gaps between kernels and which kernel follows which."""
    per_kernel: dict[str, list[float]] = {}
    for name, _, us in events:
        entry = per_kernel.setdefault(name, [0.0, 0])
        entry[0] += us
        entry[1] += 1
    classes: dict[str, float] = {}
    for name, (us, _) in per_kernel.items():
        family = kernel_class(name)
        classes[family] = classes.get(family, 0.0) + us / replays
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    ordered = sorted(events, key=lambda e: e[1])
    last = ordered[len(ordered) - len(ordered) // max(replays, 1) :]
    start = last[0][1] if last else 0.0
    return {
        "classes_us": {k: round(v, 2) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
        "top": [[name[:100], round(us / replays, 2), count / replays] for name, (us, count) in ranked],
        "sequence": [[name[:60], round(at - start, 2), round(us, 2)] for name, at, us in last[:sequence]],
    }


def profiled_events(graph: torch.cuda.CUDAGraph, replays: int) -> list[tuple[str, float, float]]:
    """(kernel name, start µs, µs) of every device event in ``replays`` replays of ``graph`` under torch's profiler
    (CUPTI traces the graph's kernel nodes). Collective where the graph holds collectives: every rank profiles the
    same graphs in the same order, so their collectives meet."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    return [
        (e.name, e.time_range.start, e.time_range.elapsed_us())
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]


def profile_step(graph: torch.cuda.CUDAGraph, replays: int) -> dict:
    """``step_kernels`` of ``replays`` profiled replays of ``graph`` (``profiled_events``; collective)."""
    return step_kernels(profiled_events(graph, replays), replays)


def profile_columns(kernels: dict) -> dict:
    """The row's profile columns (collective; empty without ``--profile``): ``step_kernels``, this rank's (rank
    0 writes the row), and ``step_kernels_by_rank``, every rank's: the step's pace is its slowest rank's, and a rank
    that waits longer inside a collective shows a peer that ran behind."""
    if not kernels:
        return {}
    from executor.gpu.bootstrap import all_gather_plain

    return {"step_kernels": kernels, "step_kernels_by_rank": all_gather_plain(kernels, None)}


def clock_limits(spent: dict[str, int]) -> dict:
    """The row's ``clock_violations_ns_by_rank`` (collective): each rank's ns of clocks held down while the batch
    was timed, by NVML's reason (executor.gpu.clocks; {} on a rank where NVML cannot answer), and a line on stderr
    (rank 0) where a power, thermal or board limit counted any."""
    from executor.gpu.bootstrap import all_gather_plain

    by_rank = all_gather_plain(spent, None)
    held = [
        f"rank {r} {name} {ns / 1000:.0f} µs"
        for r, counts in enumerate(by_rank)
        for name, ns in counts.items()
        if ns and name in ("power", "thermal", "board_limit", "reliability")
    ]
    if held and dist.get_rank() == 0:
        print(f"tp_decode: clocks held down while timing: {', '.join(held)}", file=sys.stderr)
    return {"clock_violations_ns_by_rank": by_rank}


def time_replay(graph: torch.cuda.CUDAGraph) -> float:
    """Milliseconds of one replay, timed with CUDA events after a barrier so that ranks start together."""
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


KINDS = ("step", "matmul", "all_reduce", "all_reduce_add", "all_reduce_add_norm", "alone")


@dataclass
class Graphs:
    """One backend's graphs at one batch size (KINDS), and where their results land."""

    graphs: dict[str, torch.cuda.CUDAGraph]
    out: dict
    inputs: tuple  # the tensors the graphs read: a graph does not keep them alive


@dataclass(frozen=True)
class Inputs:
    """What every backend's graphs read at one batch, made once and shared, so that no backend's tensors sit at
    addresses of their own (the seventeenth session's files: the projections alone, the same work for every
    backend, took up to 5% longer for some backends than for others, as much as the gaps being measured). Only
    read: the step's input and KV cache, the projections' activations, weights and residual."""

    x: torch.Tensor
    cache: list[tuple[torch.Tensor, torch.Tensor]]
    probe_a: torch.Tensor
    probe_w: torch.Tensor
    probe_x: torch.Tensor


def make_inputs(shape: Shape, batch: int, device: torch.device) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(7)
    x = torch.randn(batch, HIDDEN, generator=gen, device=device, dtype=torch.bfloat16)
    return Inputs(
        x,
        make_cache(shape, batch, device),
        torch.randn(batch, HIDDEN // shape.tp, device=device, dtype=torch.bfloat16),
        torch.randn(HIDDEN // shape.tp, HIDDEN, device=device, dtype=torch.bfloat16),
        torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16),
    )


def build(impl: Backend, shape: Shape, batch: int, weights, norms, inputs: Inputs, device) -> Graphs:
    """The decode step, the projections alone, with their all-reduce, with all-reduce and residual add, with
    all-reduce, add and norm, and the all-reduce alone: each ``2 × layers`` calls in one graph, on ``inputs``."""
    x, cache = inputs.x, inputs.cache
    out = {}
    side = torch.cuda.Stream()
    calls = 2 * shape.layers
    probe_a, probe_w, probe_x = inputs.probe_a, inputs.probe_w, inputs.probe_x
    probe = torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16)  # its own: NCCL sums into it in place

    def step():
        out["hidden"] = decode_step(x, weights, norms, cache, shape, impl.project)

    def projections(project) -> Callable[[], None]:
        def run():
            for _ in range(calls):
                out["probe"] = project(probe_a, probe_w, probe_x)

        return run

    def isolated():  # NCCL's in-place sums grow to inf here; its time does not depend on the values
        for _ in range(calls):
            out["alone"] = impl.all_reduce(probe)

    graphs = {
        "step": graph_of(step, side, impl.capture),
        "matmul": graph_of(projections(lambda a, w, r: a @ w), side, contextlib.nullcontext),
        # the projections with their all-reduce alone (weft-fused runs weft's plain all-reduce here) ...
        "all_reduce": graph_of(projections(lambda a, w, r: impl.all_reduce(a @ w)), side, impl.capture),
        # ... and with the residual added as the step adds it
        "all_reduce_add": graph_of(projections(impl.add), side, impl.capture),
        # ... and with the norm after it (weft-fused-norm: the one fused call)
        "all_reduce_add_norm": graph_of(
            projections(lambda a, w, r: impl.project(a, w, r, norms[1])), side, impl.capture
        ),
        "alone": graph_of(isolated, side, impl.capture),
    }
    return Graphs(graphs, out, (inputs, probe))


def time_alternating(built: dict[str, Graphs], iters: int) -> dict[str, dict[str, list[float]]]:
    """Each graph's replay times, the backends taking turns replay by replay, so that a drift of the machine
    (clocks, temperature, a neighbour) falls on every backend alike, in an order that changes (``turns``): with one
    fixed order the first backend always followed another kind's graph and each other one the same backend."""
    times: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in KINDS} for name in built}
    for i in range(iters):
        order = turns(list(built), i)
        for kind in KINDS:
            for name in order:
                times[name][kind].append(time_replay(built[name].graphs[kind]))
    return times


def summarize(name: str, g: Graphs, times: dict[str, list[float]], shape: Shape, batch: int, lm_head) -> dict:
    g.graphs["step"].replay()
    torch.cuda.synchronize()
    logits = (g.out["hidden"] @ lm_head).float()
    calls = 2 * shape.layers
    med = {kind: statistics.median(t) for kind, t in times.items()}
    # the all-reduce share: projections with their all-reduce (and with the residual add), less the projections
    all_reduce_ms = max(med["all_reduce"] - med["matmul"], 0.0)
    with_add_ms = max(med["all_reduce_add"] - med["matmul"], 0.0)
    with_norm_ms = max(med["all_reduce_add_norm"] - med["matmul"], 0.0)
    return {
        "backend": name,
        "step_ms": med["step"],
        "all_reduce_ms": all_reduce_ms,
        "all_reduce_us_per_call": all_reduce_ms * 1e3 / calls,
        "all_reduce_add_ms": with_add_ms,
        "all_reduce_add_us_per_call": with_add_ms * 1e3 / calls,
        "all_reduce_add_norm_ms": with_norm_ms,
        "all_reduce_add_norm_us_per_call": with_norm_ms * 1e3 / calls,
        "isolated_us_per_call": med["alone"] * 1e3 / calls,
        "tokens_per_s": batch / med["step"] * 1e3,
        **{f"raw_{kind}_ms": t for kind, t in times.items() if kind != "alone"},
        "logits": logits,
    }


def block_medians(times) -> dict:
    """Medians over thread blocks of each phase and op (µs per launch), and the slowest block's total."""
    return {
        "phases_us": {k: statistics.median(t.phases[k] for t in times) for k in times[0].phases},
        "ops_us": [
            statistics.median(t.ops[i] for t in times if len(t.ops) > i) for i in range(max(len(t.ops) for t in times))
        ],
        "total_us_median": statistics.median(t.total for t in times),
        "total_us_max": max(t.total for t in times),
    }


def trace_in_step(shape: Shape, batch: int, weights, device, ll128: bool, iters: int) -> dict:
    """weft-fused's all-reduce in the timed kernel build: inside the decode step, and back to back alone.

    Each on a communicator of its own, and only over graph replays: the sums of the eager warm-ups, where the
    ranks drift apart, are zeroed before them."""
    from executor import Communicator

    nbytes = batch * HIDDEN * 2
    out = {}
    for where in ("step", "alone"):
        comm = Communicator.from_process_group(ll128=ll128, trace=True)
        side = torch.cuda.Stream()
        x = torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16)
        h = torch.randn(batch, HIDDEN, device=device, dtype=torch.bfloat16)
        cache = make_cache(shape, batch, device)
        norms = make_norms(shape, device)

        def step(x=x, norms=norms, cache=cache, comm=comm):
            decode_step(x, weights, norms, cache, shape, Backend(fused(comm), comm.all_reduce).project)

        def alone(x=x, h=h, comm=comm):
            for _ in range(2 * shape.layers):
                comm.all_reduce(x, residual=h)

        graph = graph_of(step if where == "step" else alone, side, comm.capture)
        time_replay(graph)
        comm.engine.reset_kernel_times()  # the eager warm-ups (ranks drift apart between them) left out
        for _ in range(iters):
            time_replay(graph)
        plan = comm.plan_for("allreduce", nbytes, torch.bfloat16)
        lines = comm.lines_for("allreduce", nbytes, torch.bfloat16)
        out[where] = block_medians(comm.engine.kernel_times(plan, nbytes, "bf16", lines=lines, residual=True))
        out["plan"] = plan.name + ("+ll128" if lines else "")
        comm.close()
    return out


def _weft_columns(row: dict, comm, batch: int) -> None:
    """The plans weft chose for this batch's all-reduce and fused norm, and its calls by path, into ``row``."""
    plan = comm.plan_for("allreduce", batch * HIDDEN * 2, torch.bfloat16)
    lined = comm.lines_for("allreduce", batch * HIDDEN * 2, torch.bfloat16)
    row["weft_plan"] = plan.name + ("+ll128" if lined else "") if plan is not None else "nccl (no plan)"
    plan = comm.norm_plan_for(batch * HIDDEN * 2, torch.bfloat16, RowNorm(HIDDEN, EPS))
    row["weft_norm_plan"] = (
        plan.name + ("+ll128" if lined else "")
        if plan is not None
        else ("unfused: " + comm.norm_reason(batch * HIDDEN * 2, torch.bfloat16, RowNorm(HIDDEN, EPS)))
    )
    row["weft_paths"] = dict(comm.paths)


def _build_all(backends: dict, shape, batch: int, weights, norms, device, rank: int) -> tuple[dict, dict[str, str]]:
    """Each backend's captured step at this batch, and why each that could not be built failed."""
    built, failed = {}, {}
    inputs = make_inputs(shape, batch, device)  # one set for every backend
    for name, impl in backends.items():
        began = time.monotonic()
        try:
            built[name] = build(impl, shape, batch, weights, norms, inputs, device)
        except Exception as e:  # one backend's failure is a result, not the end of the comparison
            failed[name] = f"{type(e).__name__}: {e}"
            print(f"rank {rank}: {name} failed at batch {batch}: {failed[name]}", flush=True)
        if rank == 0:  # where a cold machine's time goes (its kernels, proofs and captures): stderr, not the results
            print(f"tp_decode: batch {batch}: {name} built in {time.monotonic() - began:.1f} s", file=sys.stderr)
    return built, failed


def _print_row(world: int, batch: int, row: dict, results: dict[str, dict]) -> None:
    cells = "  ".join(
        f"{n}: {r['step_ms']:.3f} ms ({r['tokens_per_s']:.0f} tok/s, all-reduce "
        f"{r['all_reduce_us_per_call']:.1f} us/call in the step, "
        f"{r['all_reduce_add_us_per_call']:.1f} with the add, "
        f"{r['all_reduce_add_norm_us_per_call']:.1f} with add and norm, "
        f"{r['isolated_us_per_call']:.1f} alone = "
        f"{100 * r['all_reduce_ms'] / r['step_ms']:.0f}%)"
        for n, r in results.items()
    )
    extra = "".join(
        f"  {n}: {row[f'{n}_speedup']:.3f}x step, all-reduce {row[f'{n}_all_reduce_ratio']:.2f}x, "
        f"with the add {row[f'{n}_all_reduce_add_ratio']:.2f}x, "
        f"with add and norm {row[f'{n}_all_reduce_add_norm_ratio']:.2f}x, "
        f"logits rel err {row[f'{n}_logits_rel_err']:.1e}"
        for n in results
        if f"{n}_speedup" in row
    )
    print(f"tp={world} batch={batch:>3}  {cells}{extra}  [{row.get('weft_plan', '')}]", flush=True)


def _result_columns(row: dict, results: dict[str, dict]) -> None:
    """Each backend's times into ``row``, as ``{backend}_{measure}`` columns."""
    for name, r in results.items():
        row[f"{name}_ms"] = r["step_ms"]
        row[f"{name}_all_reduce_ms"] = r["all_reduce_ms"]
        row[f"{name}_all_reduce_us_per_call"] = r["all_reduce_us_per_call"]
        row[f"{name}_all_reduce_add_ms"] = r["all_reduce_add_ms"]
        row[f"{name}_all_reduce_add_us_per_call"] = r["all_reduce_add_us_per_call"]
        row[f"{name}_isolated_us_per_call"] = r["isolated_us_per_call"]
        row[f"{name}_tokens_per_s"] = r["tokens_per_s"]
        row[f"{name}_all_reduce_share"] = r["all_reduce_ms"] / r["step_ms"]
        row[f"{name}_all_reduce_add_norm_ms"] = r["all_reduce_add_norm_ms"]
        row[f"{name}_all_reduce_add_norm_us_per_call"] = r["all_reduce_add_norm_us_per_call"]
        for raw in ("step", "all_reduce", "all_reduce_add", "all_reduce_add_norm", "matmul"):
            row[f"{name}_raw_{raw}_ms"] = r[f"raw_{raw}_ms"]


def _nccl_columns(row: dict, results: dict[str, dict]) -> None:
    """Each other backend against NCCL into ``row`` (where NCCL ran): its logits' error, speedup and time ratios."""
    if "nccl" not in results:
        return
    a = results["nccl"]["logits"]
    for name in (n for n in results if n != "nccl"):
        b = results[name]["logits"]
        rel = ((a - b).norm() / a.norm()).item()
        row[f"{name}_logits_rel_err"] = rel
        row[f"{name}_logits_max_abs_err"] = (a - b).abs().max().item()
        row[f"{name}_logits_agree"] = rel < LOGITS_BOUND
        row[f"{name}_speedup"] = results["nccl"]["step_ms"] / results[name]["step_ms"]
        row[f"{name}_all_reduce_ratio"] = results[name]["all_reduce_ms"] / max(results["nccl"]["all_reduce_ms"], 1e-9)
        row[f"{name}_all_reduce_add_ratio"] = results[name]["all_reduce_add_ms"] / max(
            results["nccl"]["all_reduce_add_ms"], 1e-9
        )
        row[f"{name}_all_reduce_add_norm_ratio"] = results[name]["all_reduce_add_norm_ms"] / max(
            results["nccl"]["all_reduce_add_norm_ms"], 1e-9
        )


def parse_args() -> tuple[argparse.Namespace, set[str]]:
    """The script's arguments, and the backends whose kernels launch without PDL (``--no-pdl``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="1,4,16,64")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument(
        "--backend",
        choices=("nccl", "weft", "both", "norm"),
        default="both",
        help="both: NCCL, weft (all-reduce, then torch's residual add), weft-fused (the add inside "
        "the all-reduce), weft-fused-norm (the add and the norm inside it) and flashinfer-fused "
        "(where FlashInfer is installed); norm: NCCL, weft-fused-norm and flashinfer-fused",
    )
    p.add_argument("--json", help="write results here (rank 0)")
    p.add_argument(
        "--trace",
        action="store_true",
        help="instead: weft-fused's all-reduce in the timed kernel build, in the step and alone "
        "(per-block phase times)",
    )
    p.add_argument(
        "--no-ll128",
        dest="ll128",
        action="store_false",
        help="weft's LL plans move LL16 packets only (by default LL128 lines where the registry measured them faster)",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timing, N replays of each backend's step under torch's profiler: device time per step by "
        "kernel family and the top kernels (step_kernels in the JSON)",
    )
    p.add_argument(
        "--no-pdl",
        default="",
        help="comma-separated: weft, flashinfer: launch that backend's kernels without programmatic dependent "
        "launch (an A/B of what PDL does to the step)",
    )
    p.add_argument(
        "--weft-late-trigger",
        action="store_true",
        help="weft's compiled kernels let the next programmatic launch start at their end, not their start",
    )
    p.add_argument(
        "--weft-cluster",
        type=int,
        default=1,
        metavar="N",
        help="blocks a thread-block cluster in weft's launches (default 1: none, the Communicator's)",
    )
    p.add_argument(
        "--weft-gemm-tail",
        action="store_true",
        help="an empty clustered launch after each of weft's calls (the Communicator's gemm_tail): the gate-up GEMM "
        "after the call then runs as after FlashInfer's (bench/gemm_after.py)",
    )
    p.add_argument(
        "--weft-tail-ab",
        action="store_true",
        help="one more backend, weft-fused-norm-tail: weft-fused-norm on a Communicator of its own with gemm_tail, "
        "timed in the same job (an A/B of the tail; --weft-norm-plan pins weft-fused-norm's plan only)",
    )
    p.add_argument(
        "--only",
        default="",
        metavar="NAMES",
        help="keep only these of --backend's backends, comma-separated (e.g. flashinfer-fused): one backend a job, "
        "so that a step's kernels can be profiled without another backend's graphs between its replays",
    )
    p.add_argument(
        "--weft-norm-plan",
        metavar="PLAN",
        help="a plan file: weft-fused-norm runs its fused call on this plan at every batch (Communicator."
        "pin_norm_plan, as the registry measured that plan, else interpreted), not the one selection picks",
    )
    args = p.parse_args()
    no_pdl = {x for x in args.no_pdl.split(",") if x}
    if no_pdl - {"weft", "flashinfer"}:
        p.error(f"--no-pdl: {', '.join(sorted(no_pdl - {'weft', 'flashinfer'}))}: only weft and flashinfer")
    if args.weft_cluster < 1:
        p.error(f"--weft-cluster {args.weft_cluster}: a cluster holds 1 block or more")
    if args.weft_tail_ab and args.weft_gemm_tail:
        p.error("--weft-tail-ab: weft-fused-norm-tail is the tail's side of the A/B; leave out --weft-gemm-tail")
    return args, no_pdl


def make_backends(args: argparse.Namespace, no_pdl: set[str], rank: int) -> tuple[dict[str, Backend], Any, Any]:
    """The backends ``--backend`` names (each a Backend), the weft Communicator (or None) and FlashInfer's peer
    (or None, where it is not installed or refused its workspace)."""
    comm: Any = None
    fi: Any = None
    backends = {"nccl": Backend(reducing(nccl_all_reduce), nccl_all_reduce)}
    if args.backend in ("weft", "both", "norm"):
        from executor import Communicator

        options = {
            "ll128": args.ll128,
            "programmatic": "weft" not in no_pdl,
            "late_trigger": args.weft_late_trigger,
            "cluster": args.weft_cluster,
        }
        comm = Communicator.from_process_group(**options, gemm_tail=args.weft_gemm_tail)
        if args.backend != "norm":
            backends["weft"] = Backend(reducing(comm.all_reduce), comm.all_reduce, comm.capture)
            backends["weft-fused"] = Backend(fused(comm), comm.all_reduce, comm.capture)
        backends["weft-fused-norm"] = Backend(fused(comm), comm.all_reduce, comm.capture, fused_norm(comm))
        if args.weft_tail_ab:  # the same on a Communicator of its own that launches the cluster tail
            tail = Communicator.from_process_group(**options, gemm_tail=True)
            backends["weft-fused-norm-tail"] = Backend(fused(tail), tail.all_reduce, tail.capture, fused_norm(tail))
    if args.backend in ("both", "norm"):
        try:
            fi = peers.FlashInfer.create(
                max_bytes=max(int(b) for b in args.batch.split(",")) * HIDDEN * 2, pdl="flashinfer" not in no_pdl
            )
            backends["flashinfer-fused"] = flashinfer_backend(fi)
        except Exception as e:  # not installed, or its workspace refused: the other backends still run
            if rank == 0:
                print(f"flashinfer-fused not run: {type(e).__name__}: {e}", flush=True)
    if args.backend == "weft":
        backends.pop("nccl")
    only = [name for name in args.only.split(",") if name]
    unknown = [name for name in only if name not in backends]
    if unknown:
        raise SystemExit(f"tp_decode: --only {','.join(unknown)}: not among this run's backends {', '.join(backends)}")
    return ({k: v for k, v in backends.items() if k in only} if only else backends), comm, fi


def _results_writer(args, no_pdl, world, device, backends, fi, pinned, batches):
    """A function that writes the rows so far to ``args.json`` (rank 0), whole each time and atomically, with
    ``complete`` False until every batch of ``batches`` is in: a run cut by its time limit keeps the batches it
    measured. None without ``--json``."""
    if not args.json:
        return None
    doc = {
        "name": "tp_decode",
        "model": "llama-70b-shaped",
        "layers": args.layers,
        "context": args.context,
        "nranks": world,
        "mode": "graph",
        "timing": "backends alternate replay by replay, in orders of a Williams design, on shared inputs",
        "dtype": "bf16",
        "trace": args.trace,
        "no_pdl": sorted(no_pdl),  # backends launched without programmatic dependent launch (--no-pdl)
        "weft_late_trigger": args.weft_late_trigger,
        "weft_cluster": args.weft_cluster,  # blocks a cluster in weft's launches (--weft-cluster)
        "weft_gemm_tail": args.weft_gemm_tail,  # an empty clustered launch after each weft call (--weft-gemm-tail)
        "weft_tail_ab": args.weft_tail_ab,  # weft-fused-norm-tail beside weft-fused-norm (--weft-tail-ab)
        "weft_norm_plan": pinned.name if pinned is not None else None,  # --weft-norm-plan
        "backends_run": sorted(backends),  # the backends this run kept (--backend, --only)
        "eps": EPS,
        "logits_bound": LOGITS_BOUND,
        "machine": {"gpu": torch.cuda.get_device_name(device), "count": world, "host": platform.node()},
        "versions": peers.run_versions(torch, flashinfer=bool(fi)),
        "date": time.strftime("%Y-%m-%d"),
        "batches_planned": batches,
    }

    def write(rows: list[dict]) -> None:
        done = {r["batch"] for r in rows if "tp" in r}  # the timed rows (a trace row has no "tp")
        whole = {**doc, "complete": set(batches) <= done, "rows": rows}
        partial = f"{args.json}.partial"
        with open(partial, "w") as f:
            json.dump(whole, f, indent=2)
        os.replace(partial, args.json)

    return write


def main() -> None:
    args, no_pdl = parse_args()

    for var in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
        os.environ.setdefault(var, "0" if var == "NCCL_NVLS_ENABLE" else "1")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    shape = Shape(world, args.layers, args.context)
    weights = make_weights(shape, rank, device)
    norms = make_norms(shape, device)
    lm_head = (
        torch.randn(
            HIDDEN, VOCAB, generator=torch.Generator(device=device).manual_seed(5), device=device, dtype=torch.bfloat16
        )
        * HIDDEN**-0.5
    )
    backends, comm, fi = make_backends(args, no_pdl, rank)

    rows = []
    if args.trace:
        for batch in (int(b) for b in args.batch.split(",")):
            rows.append({"batch": batch, **trace_in_step(shape, batch, weights, device, args.ll128, args.iters)})
            if rank == 0:
                print(f"trace batch={batch}: {json.dumps(rows[-1])}", flush=True)
        backends = {}
    pinned = load_plan(args.weft_norm_plan) if args.weft_norm_plan and "weft-fused-norm" in backends else None
    batches = [int(b) for b in args.batch.split(",")] if backends else []
    write = _results_writer(args, no_pdl, world, device, backends, fi, pinned, batches) if rank == 0 else None
    if write:
        write(rows)  # the trace's rows, or none yet: a run cut later still leaves what it measured
    read_limits = violation_reader(str(getattr(torch.cuda.get_device_properties(device), "uuid", "")))
    for batch in batches:
        if pinned is not None:
            comm.pin_norm_plan(batch * HIDDEN * 2, torch.bfloat16, RowNorm(HIDDEN, EPS), pinned)
        built, failed = _build_all(backends, shape, batch, weights, norms, device, rank)
        began = time.monotonic()
        before = read_limits() if read_limits else {}
        times = time_alternating(built, args.iters)
        limited = clock_limits(grown(before, read_limits()) if read_limits else {})
        if rank == 0:
            print(f"tp_decode: batch {batch}: timed in {time.monotonic() - began:.1f} s", file=sys.stderr)
        results = {name: summarize(name, g, times[name], shape, batch, lm_head) for name, g in built.items()}
        kernels = {name: profile_step(g.graphs["step"], args.profile) for name, g in built.items() if args.profile}
        del built
        row = {"batch": batch, "tp": world, "failed": failed, **limited, **profile_columns(kernels)}
        if comm is not None and any(name.startswith("weft") for name in backends):
            _weft_columns(row, comm, batch)
        _result_columns(row, results)
        _nccl_columns(row, results)
        rows.append(row)
        if rank == 0:
            _print_row(world, batch, row, results)
        if write:
            write(rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
