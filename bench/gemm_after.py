"""The gate-up GEMM right after each backend's fused all-reduce + add + RMSNorm, alone in a graph: does what a
collective leaves behind slow the HBM-bound GEMM after it? (tp_decode's batch-1 gap, bench/NOTES.md: the gate-up GEMM
ran 106 µs a launch on the rank that ran ahead beside FlashInfer and 115–122 µs beside weft and NCCL; bench/gemm_pair.py
found it at 107 µs alone and with the pair GPU running it at the same moment.)

Each backend's graph is eight layers of [its fused call on a batch-1 row of 8192 bf16, then the normed row times that
layer's gate-up weights (8192 × 28672 bf16, TP=2's, 470 MB)]: weft (Communicator, inside ``capture()``),
FlashInfer's fused kernel, NCCL (all-reduce, then torch's add and norm) and ``none`` (torch's add and norm, no
collective). The graphs replay in turns, then each under torch's profiler: every rank's median µs of the GEMM
kernels and of the collective kernels, and the replay time. JSON to --json (rank 0).

    WEFT_REGISTRY=bench/registry_h200x2 torchrun --nproc-per-node 2 bench/gemm_after.py --json $OUT/gemm_after.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.gpu import peers  # noqa: E402

HIDDEN = 8192  # Llama-70B
GATE_UP = 28672  # 2 × 28672 columns over TP=2
LAYERS = 8
EPS = 1e-5
GEMM_NAMES = ("nvjet", "gemm", "cutlass", "sm90_")


def kernel_times(graph: torch.cuda.CUDAGraph, replays: int) -> dict[str, list[float]]:
    """µs of each GEMM kernel and each other kernel over ``replays`` profiled replays (collective: every rank
    profiles the same graphs in the same order)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    out: dict[str, list[float]] = {"gemm": [], "other": []}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            kind = "gemm" if e.name.lower().startswith(GEMM_NAMES) else "other"
            out[kind].append(e.time_range.elapsed_us())
    return out


def replay_us(graph: torch.cuda.CUDAGraph) -> float:
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--profile", type=int, default=5)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    gen = torch.Generator(device=device).manual_seed(rank)
    weights = [
        torch.randn(HIDDEN, GATE_UP, generator=gen, device=device, dtype=torch.bfloat16) / 64 for _ in range(LAYERS)
    ]
    ys = [torch.randn(1, HIDDEN, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(LAYERS)]
    norm = torch.rand(HIDDEN, generator=gen, device=device, dtype=torch.bfloat16) + 0.5
    x0 = torch.randn(1, HIDDEN, generator=torch.Generator(device=device).manual_seed(9), device=device)
    x0 = x0.to(torch.bfloat16)

    from executor import Communicator

    comm = Communicator.from_process_group()
    fi = peers.FlashInfer.create(max_bytes=HIDDEN * 2)

    def weft_norm(y, x):
        return comm.all_reduce(y, residual=x, rms_weight=norm, eps=EPS)

    def fi_norm(y, x):
        return fi.fused_norm(y, x, norm, EPS, "auto")

    def nccl_norm(y, x):
        t = y.clone()
        dist.all_reduce(t)
        x = x + t
        return F.rms_norm(x, (HIDDEN,), norm, EPS), x

    def torch_norm(y, x):
        x = x + y
        return F.rms_norm(x, (HIDDEN,), norm, EPS), x

    backends = {"none": (torch_norm, None), "nccl": (nccl_norm, None), "weft": (weft_norm, comm.capture)}
    backends["flashinfer"] = (fi_norm, None)
    outs: dict[str, list[torch.Tensor]] = {}
    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    for name, (call, capture) in backends.items():
        holder: list[torch.Tensor] = []

        def layers(call=call, holder=holder) -> None:
            holder.clear()
            x = x0
            for y, w in zip(ys, weights, strict=True):
                h, x = call(y, x)
                holder.append(h @ w)

        side = torch.cuda.Stream()
        with capture() if capture else torch.cuda.device(device):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    layers()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                layers()
        graphs[name], outs[name] = graph, holder
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    agree = {name: bool(torch.allclose(outs[name][-1], outs["nccl"][-1], rtol=0.05, atol=0.5)) for name in graphs}
    times: dict[str, list[float]] = {name: [] for name in graphs}
    order = list(graphs)
    for i in range(args.iters):
        for name in order[i % len(order) :] + order[: i % len(order)]:
            times[name].append(replay_us(graphs[name]))
    kernels = {name: kernel_times(g, args.profile) for name, g in graphs.items()}
    mine = {
        name: {
            "replay_us": statistics.median(times[name]),
            "raw_replay_us": times[name],
            "gemm_us": statistics.median(kernels[name]["gemm"]),
            "raw_gemm_us": kernels[name]["gemm"],
            "other_us_per_layer": sum(kernels[name]["other"]) / args.profile / LAYERS,
            "agrees_with_nccl": agree[name],
        }
        for name in graphs
    }
    everyone: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        for r, rows in enumerate(everyone):
            for name, row in rows.items():
                print(
                    f"rank {r} {name:10s} replay {row['replay_us']:8.1f} µs  gemm {row['gemm_us']:7.2f} µs  "
                    f"other {row['other_us_per_layer']:6.2f} µs/layer  agrees {row['agrees_with_nccl']}"
                )
        doc = {
            "what": "8 × [fused all-reduce + add + RMSNorm of a 1×8192 bf16 row; that row @ 8192×28672 bf16]",
            "machine": torch.cuda.get_device_name(device),
            "versions": peers.run_versions(torch, flashinfer=True),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "weft_paths": dict(comm.paths),
            "by_rank": everyone,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    # no barrier here: its first run (twentieth session) wrote the JSON, then stalled until its limit in a
    # dist.barrier() that followed; tp_decode.py ends with destroy_process_group() alone
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
