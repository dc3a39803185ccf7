"""One hop of the port engine's transport: NCCL point-to-point between two ranks, as the port engine drives it.

Run as two ranks (torchrun, one GPU each; set NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 to force NCCL's network path
between the GPUs of one machine). Rank 0 sends SIZE bytes to rank 1, which sends them back, ``iters`` times; the
one-way time is the round trip's half, timed with CUDA events on rank 0. Writes the results JSON (rank 0):

    torchrun … python bench/port_hop.py OUT.json [--sizes 1KB,64MB] [--iters 50]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from weft.units import parse_size_range  # noqa: E402


def one_way_us(torch, dist, rank: int, nbytes: int, iters: int, warmup: int = 3) -> float:
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    peer = 1 - rank

    def round_trip() -> None:
        if rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)

    for _ in range(warmup):
        round_trip()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        round_trip()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (2 * iters)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--sizes", default="1KB,64MB")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    rows = []
    for nbytes in parse_size_range(args.sizes):
        iters = args.iters if nbytes <= (1 << 20) else max(args.iters // 5, 5)
        us = one_way_us(torch, dist, rank, nbytes, iters)
        rows.append({"size": nbytes, "one_way_us": us, "bandwidth_GBps": nbytes / (us * 1e3), "iters": iters})
    if rank == 0:
        keys = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_IB_DISABLE", "WEFT_HOST")
        doc = {
            "engine": "nccl point-to-point (torch.distributed send/recv)",
            "env": {k: os.environ[k] for k in keys if k in os.environ},
            "machine": {"gpu": torch.cuda.get_device_name(), "gpus": dist.get_world_size(), "host": platform.node()},
            "versions": {
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "cuda": torch.version.cuda,
                "python": platform.python_version(),
            },
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "method": "ping-pong, one-way time = round trip / 2, CUDA events on rank 0",
            "rows": rows,
        }
        Path(args.output).write_text(json.dumps(doc, indent=1) + "\n")
        for r in rows:
            print(f"{r['size']:>12} B  {r['one_way_us']:10.2f} us one way  {r['bandwidth_GBps']:8.3f} GB/s")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
