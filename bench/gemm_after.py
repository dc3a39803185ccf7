"""tp_decode's batch-1 step taken apart: the gate-up GEMM after each backend's fused call, with more of the step
around it config by config, so that the configuration where that GEMM slows (107 µs alone, 115–122 µs in the step
beside weft and NCCL: bench/NOTES.md, the tenth and twentieth sessions) shows where the step's gap comes from.

Each config is a CUDA graph of eight layers of tp_decode's Llama-70B shape at TP=2, batch 1, built per backend:
  gemm  [the fused call on a fixed 1×8192 row; the gate-up GEMM on its normed output]  (this script's first job,
        bench/results/s20_h200/gemm_after_2xh200.json, in the first version's format)
  o     [the o-projection of a fixed attention output; the fused call; the gate-up GEMM]
  mlp   [o; the call; gate-up; silu(gate)·up; the down projection; the second call]  (the layer without attention)
  step  tp_decode's decode_step itself (qkv, the KV cat, attention, then as mlp)
The backends: weft (Communicator, captured inside ``capture()``), FlashInfer's fused kernel, NCCL (all-reduce, then
torch's add and norm) and ``none`` (torch's add and norm, no collective). A config's graphs replay in turns, then each
under torch's profiler: every rank's replay time and each kernel's median µs and count, gate-up's apart, and how
long NVML counted its clocks held down while the config replayed (executor.gpu.clocks). JSON to --json (rank 0).
More backends: ``--mix`` puts two backends' calls together (a/b, a+b, b>a; mix_ok), or a backend's call and an
empty kernel launched in or out of thread-block clusters (PROBES); ``--weft-variants`` adds weft on Communicators of
other options (WEFT_VARIANTS). What they found (the twenty-first session): the gate-up GEMM runs 7–8% faster after a
launch in clusters, which FlashInfer's kernel is and weft's was not; hence the Communicator's ``gemm_tail``.

    WEFT_REGISTRY=bench/registry_h200x2 torchrun --nproc-per-node 2 bench/gemm_after.py --configs gemm,o,mlp,step \
        --json $OUT/gemm_after_2xh200.json
    ... --configs step --weft-variants tail --mix weft+cluster2 --json $OUT/gemm_after_tail_2xh200.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "bench")]

import tp_decode  # noqa: E402  (its shapes, weights, KV cache, step, graph capture and replay timing)
from step_profile import GATE_UP  # noqa: E402

from executor.gpu import peers  # noqa: E402
from executor.gpu.bootstrap import all_gather_plain  # noqa: E402
from executor.gpu.clocks import grown, violation_reader  # noqa: E402

CONFIGS = ("gemm", "o", "mlp", "step")
HIDDEN, EPS = tp_decode.HIDDEN, tp_decode.EPS
Call = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # (y, x, n) -> (h, x)


def layers_of(
    config: str, calls: tuple[Call, Call], shape: tp_decode.Shape, weights, norms, cache, fixed
) -> Callable[[], list]:
    """The graph's body for ``config`` with the fused calls ``calls`` (the one after attention, before the gate-up
    GEMM, and the one after the MLP): a function that runs the eight layers and returns the tensors it ends with."""
    rows, attention = fixed
    before_mlp, after_mlp = calls

    def run() -> list:
        if config == "step":
            turn = iter(range(1 << 30))  # decode_step projects twice a layer: after attention, then after the MLP

            def project(a, w, x, n):
                return (before_mlp if next(turn) % 2 == 0 else after_mlp)(a @ w, x, n)

            return [tp_decode.decode_step(rows[0], weights, norms, cache, shape, project)]
        x, out = rows[0], []
        for i, layer in enumerate(weights):
            y = rows[i] if config == "gemm" else attention[i] @ layer["o"]
            h, x = before_mlp(y, x, norms[2 * i + 1])
            up = h @ layer["gate_up"]
            if config == "mlp":
                gate, up = up.chunk(2, dim=-1)
                h, x = after_mlp((F.silu(gate) * up) @ layer["down"], x, norms[2 * i + 2])
            out.append(up if config != "mlp" else h)
        return out

    return run


def kernels_of(graph: torch.cuda.CUDAGraph, replays: int) -> dict[str, list[float]]:
    """Each kernel name's µs over ``replays`` profiled replays (tp_decode's ``profiled_events``; collective: every
    rank profiles the same graphs in the same order, from a barrier)."""
    dist.barrier()
    out: dict[str, list[float]] = {}
    for name, _, us in tp_decode.profiled_events(graph, replays):
        out.setdefault(name, []).append(us)
    return out


def backends_of(
    comm, fi, mixes: list[str]
) -> dict[str, tuple[tuple[Call, Call], Callable[[], contextlib.AbstractContextManager]]]:
    """Each backend's fused calls (before and after the MLP) and the context its graphs are captured in; then each
    of ``mixes``: ``a/b`` (backend a's call before the MLP, b's after it), ``a+b`` (a's call, then b's on a spare
    row whose result is dropped, in both places) or ``b>a`` (b's on the spare row first, then a's)."""

    def nccl(y, x, n):
        t = y.clone()
        dist.all_reduce(t)
        x = x + t
        return F.rms_norm(x, (HIDDEN,), n, EPS), x

    def none(y, x, n):
        x = x + y
        return F.rms_norm(x, (HIDDEN,), n, EPS), x

    calls: dict[str, Call] = {
        "none": none,
        "nccl": nccl,
        "weft": lambda y, x, n: comm.all_reduce(y, residual=x, rms_weight=n, eps=EPS),
        "flashinfer": lambda y, x, n: fi.fused_norm(y, x, n, EPS, "auto"),
    }
    out = {name: ((c, c), comm.capture if name == "weft" else contextlib.nullcontext) for name, c in calls.items()}
    calls.update(probes())

    def spare(main: str, other: str, other_first: bool) -> Call:
        def call(y, x, n):
            if other_first:
                calls[other](y.clone(), x.clone(), n)
            got = calls[main](y, x, n)
            if not other_first:
                calls[other](y.clone(), x.clone(), n)
            return got

        return call

    for mix in mixes:
        kind, main, other = parse_mix(mix) or ("", "", "")  # checked by mix_ok before
        if kind == "/":
            pair = (calls[main], calls[other])
        else:
            one = spare(main, other, other_first=kind == ">")
            pair = (one, one)
        out[mix] = (pair, comm.capture if "weft" in (main, other) else contextlib.nullcontext)
    return out


PROBES = {"cluster8": (8, 8), "blocks8": (8, 1), "cluster2": (132, 2)}  # name: (blocks, blocks a cluster)
PROBE_SOURCE = r"""
extern "C" __global__ void probe(int* seen) { if (threadIdx.x == 0) seen[blockIdx.x] = blockIdx.x; }
"""


def probes() -> dict[str, Call]:
    """Calls that only launch an empty kernel of PROBES' geometry (128 threads a block) and return their inputs:
    spares for ``a+probe`` mixes, to tell whether a launch's cluster geometry alone moves the GEMM after it."""
    import cupy

    from executor.gpu import launch

    kernel = cupy.RawModule(code=PROBE_SOURCE, options=("-std=c++17",)).get_function("probe")
    function = getattr(kernel, "kernel", kernel).ptr  # the CUfunction (as executor.gpu.experts reads it)
    seen = torch.zeros(max(b for b, _ in PROBES.values()), dtype=torch.int32, device="cuda")  # torch's: no cupy stream
    launcher = launch.Launcher(programmatic=False)

    def call_of(blocks: int, cluster: int) -> Call:
        prepared = launcher.prepare(function, blocks, 128, launch.Arguments.pack([np.uint64(seen.data_ptr())]), cluster)

        def call(y, x, n):
            prepared(torch.cuda.current_stream().cuda_stream)
            return y, x

        return call

    return {name: call_of(*geometry) for name, geometry in PROBES.items()}


BACKENDS = ("none", "nccl", "weft", "flashinfer")
WEFT_VARIANTS: dict[str, dict[str, object]] = {  # --weft-variants: the Communicator's options of each
    "c1": {"cluster": 1},
    "nopdl": {"programmatic": False},
    "nopdl-c1": {"programmatic": False, "cluster": 1},
    "c2": {"cluster": 2},
    "c8": {"cluster": 8},
    "tail": {"gemm_tail": True},
}


def parse_mix(mix: str) -> tuple[str, str, str] | None:
    """``mix`` as (kind, main, other): for a/b ("/") a's call before the MLP and b's after it; for a+b ("+") a's call
    then b's on a spare row; for b>a (">") b's on the spare row first, then a's. None where it has not one of the
    three separators, once."""
    seps = [c for c in "/+>" if c in mix]
    if len(seps) != 1 or mix.count(seps[0]) != 1:
        return None
    left, right = mix.split(seps[0])
    return (seps[0], right, left) if seps[0] == ">" else (seps[0], left, right)


def mix_ok(mix: str) -> bool:
    """Whether ``mix`` is a/b, a+b or b>a of BACKENDS, with a probe (PROBES) allowed as b's spare alone."""
    parsed = parse_mix(mix)
    if parsed is None:
        return False
    kind, main, other = parsed
    return main in BACKENDS and other in (set(BACKENDS) if kind == "/" else set(BACKENDS) | set(PROBES))


def measure(config: str, backends, shape, weights, norms, cache, fixed, iters: int, replays: int, read) -> dict:
    """This rank's figures for one config: per backend the replay µs (raw too), each kernel's median µs and count,
    gate-up's median µs, and whether its last tensor agrees with NCCL's; and, under ``clock_violations_ns``, how long
    NVML counted the clocks held down while the config's graphs replayed in turns (``read``: executor.gpu.clocks'
    reader, or None)."""
    graphs, outs = {}, {}
    side = torch.cuda.Stream()
    for name, (calls, capture) in backends.items():
        holder: list = []
        run = layers_of(config, calls, shape, weights, norms, cache, fixed)

        def body(run=run, holder=holder) -> None:
            holder[:] = run()  # the tensors of the captured replay, read after it

        graphs[name], outs[name] = tp_decode.graph_of(body, side, capture), holder
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in graphs}
    order = list(graphs)
    before = read() if read else {}
    for i in range(iters):
        for name in order[i % len(order) :] + order[: i % len(order)]:
            times[name].append(tp_decode.time_replay(graphs[name]) * 1000)
    result: dict = {"clock_violations_ns": grown(before, read()) if read else {}}
    for name, graph in graphs.items():
        kernels = kernels_of(graph, replays)
        gate_up = [us for k, v in kernels.items() if k.startswith(GATE_UP) for us in v]
        result[name] = {
            "replay_us": statistics.median(times[name]),
            "raw_replay_us": times[name],
            "gate_up_us": statistics.median(gate_up) if gate_up else None,
            "kernels": {k: [statistics.median(v), len(v) // replays] for k, v in sorted(kernels.items())},
            "agrees_with_nccl": bool(torch.allclose(outs[name][-1], outs["nccl"][-1], rtol=0.05, atol=0.5)),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--profile", type=int, default=5)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--weft-variants",
        default="",
        help=f"more weft backends, comma-separated, each on a Communicator of its own: {', '.join(WEFT_VARIANTS)} "
        "(c1/c2/c8: launches in no thread-block cluster / clusters of 2 / of 8; nopdl: without programmatic "
        "dependent launch; tail: an empty clustered launch after each call)",
    )
    parser.add_argument(
        "--mix",
        default="",
        help="more backends, comma-separated: a/b (a's call before the MLP, b's after it), a+b (a's call, then b's "
        "on a spare row, result dropped), b>a (b's on the spare row first); a and b among BACKENDS; a spare b may also "
        "be an empty kernel's launch (PROBES)",
    )
    args = parser.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    if set(configs) - set(CONFIGS):
        parser.error(f"--configs: {', '.join(sorted(set(configs) - set(CONFIGS)))}: not among {', '.join(CONFIGS)}")
    mixes = [m for m in args.mix.split(",") if m]
    if set(v for v in args.weft_variants.split(",") if v) - set(WEFT_VARIANTS):
        parser.error(f"--weft-variants: {args.weft_variants}: not a list of {', '.join(WEFT_VARIANTS)}")
    for m in mixes:
        if not mix_ok(m):
            parser.error(
                f"--mix: {m}: not a/b, a+b or b>a of {', '.join(BACKENDS)} (b's spare also {', '.join(PROBES)})"
            )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    shape = tp_decode.Shape(world, 8, 1024)
    weights = tp_decode.make_weights(shape, rank, device)
    norms = tp_decode.make_norms(shape, device)
    cache = tp_decode.make_cache(shape, 1, device)
    gen = torch.Generator(device=device).manual_seed(9)  # the same rows on every rank: the residual stream's input
    rows = [torch.randn(1, HIDDEN, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(shape.layers)]
    attention = [
        torch.randn(1, shape.q_heads * tp_decode.HEAD_DIM, device=device, dtype=torch.bfloat16)
        for _ in range(shape.layers)
    ]

    from executor import Communicator

    comm = Communicator.from_process_group()  # the Communicator's defaults
    fi = peers.FlashInfer.create(max_bytes=HIDDEN * 2)
    backends = backends_of(comm, fi, mixes)
    for variant in [v for v in args.weft_variants.split(",") if v]:  # weft again, each on a Communicator of its own
        other = Communicator.from_process_group(**WEFT_VARIANTS[variant])
        backends[f"weft-{variant}"] = backends_of(other, fi, [])["weft"]
    read = violation_reader(str(getattr(torch.cuda.get_device_properties(device), "uuid", "")))
    mine = {
        c: measure(c, backends, shape, weights, norms, cache, (rows, attention), args.iters, args.profile, read)
        for c in configs
    }
    everyone: list[dict] = all_gather_plain(mine)  # JSON, not pickles: nothing unpickles what a peer sent
    clusters = all_gather_plain({str(k): v for k, v in getattr(comm.engine, "launch_clusters", {}).items()})
    if rank == 0:
        print(f"weft's launches by blocks a cluster, by rank: {clusters}")
        for c in configs:
            print(f"{c:5s} clocks held down (ns, by rank): {[by[c]['clock_violations_ns'] for by in everyone]}")
            for name in backends:
                line = "  ".join(
                    f"r{r} {by[c][name]['replay_us']:8.1f} µs, gate-up {by[c][name]['gate_up_us'] or 0:7.2f}"
                    for r, by in enumerate(everyone)
                )
                print(f"{c:5s} {name:17s} {line}  agrees {all(by[c][name]['agrees_with_nccl'] for by in everyone)}")
        doc = {
            "what": "tp_decode's batch-1 layers at TP=2 taken apart (bench/gemm_after.py's docstring): per config, "
            "backend and rank the replay µs and each kernel's median µs and count a replay",
            "configs": configs,
            "machine": torch.cuda.get_device_name(device),
            "versions": peers.run_versions(torch, flashinfer=True),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "weft_paths": dict(comm.paths),
            # blocks a cluster -> weft launches prepared with it, by rank (the engine's cluster; 1: none)
            "weft_launch_clusters": clusters,
            "by_rank": everyone,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    # no barrier here: the first version's run wrote its JSON, then stalled until its limit in a dist.barrier()
    # that followed; tp_decode.py ends with destroy_process_group() alone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
