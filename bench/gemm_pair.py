"""Does one GPU's HBM-bound GEMM run slower while its pair runs the same GEMM? tp_decode's batch-1 gap (bench/NOTES.md,
the tenth and twentieth sessions) sits in the gate-up GEMM after the post-attention call, which ran 106 µs a launch
on the rank that ran ahead beside FlashInfer and 115–122 µs where both ranks ran it at the same moment. This times
that GEMM (a batch-1 row of Llama-70B's hidden size times TP=2's gate-up weights, 470 MB of bf16, eight layers'
weights in one CUDA graph) on each GPU of a pair, alone (the other idle) and together (both replaying at once), in
alternating rounds, and writes the raw times as JSON. No collective runs: only the GEMMs and a CPU barrier (gloo).

    torchrun --nproc-per-node 2 bench/gemm_pair.py --rounds 10 --replays 20 --json $OUT/gemm_pair_2xh200.json
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.gpu.bootstrap import all_gather_plain  # noqa: E402

HIDDEN = 8192  # Llama-70B
GATE_UP = 28672  # 2 × 28672 columns over TP=2
LAYERS = 8


def graph_of_gemms(x: torch.Tensor, weights: list[torch.Tensor], out: torch.Tensor) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            for w in weights:
                torch.matmul(x, w, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            torch.matmul(x, w, out=out)
    return graph


def timed(graph: torch.cuda.CUDAGraph, replays: int) -> list[float]:
    """µs a GEMM, one figure a replay."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000 / LAYERS for s, e in zip(starts, ends, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gen = torch.Generator(device="cuda").manual_seed(rank)
    weights = [
        torch.randn(HIDDEN, GATE_UP, generator=gen, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(LAYERS)
    ]
    x = torch.randn(1, HIDDEN, generator=gen, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, GATE_UP, device="cuda", dtype=torch.bfloat16)
    graph = graph_of_gemms(x, weights, out)
    timed(graph, args.replays)  # warm
    modes = [f"alone_{r}" for r in range(world)] + ["together"]
    raw: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            dist.barrier()
            if mode == "together" or mode == f"alone_{rank}":
                raw[mode] += timed(graph, args.replays)
            dist.barrier()
            time.sleep(0.05)  # the idle rank idles; the clocks settle alike before each mode
    gathered: list[dict[str, list[float]]] = all_gather_plain(raw)  # JSON, not pickles (tests/test_bootstrap_trust.py)
    if rank == 0:
        rows = []
        for r, times in enumerate(gathered):
            for mode in (f"alone_{r}", "together"):
                median = statistics.median(times[mode])
                rows.append({"rank": r, "mode": mode, "median_us": median, "raw_us": times[mode]})
                print(f"rank {r} {mode:9s} {median:8.2f} µs a GEMM")
        doc = {
            "what": "gate-up GEMM (1x8192 @ 8192x28672 bf16, 8 layers' weights in one graph), alone and together",
            "machine": torch.cuda.get_device_name(0),
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rounds": args.rounds,
            "replays": args.replays,
            "rows": rows,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
