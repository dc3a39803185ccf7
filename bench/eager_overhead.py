"""Where an eager all-reduce call's host time goes: weft's Python path piece by piece (2 GPUs, torchrun).

    torchrun --nproc-per-node 2 bench/eager_overhead.py --registry bench/registry_h200x2 -o OUT.json

Times (µs per call, median of 7 rounds of --calls calls, host clock) of: a whole ``comm.execute`` call
(back-to-back, synchronized once at the end), reading its arguments (``_arguments``), describing one tensor,
finding the stream, the prepared driver launch alone, and torch's own ``torch.ops.aten.add_`` on the same tensor as
the floor any torch-facing op pays. Every rank runs the same launches, so the collective's kernels pair up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

NAME = "direct-allreduce-hgx_h200:gpus=2-ll-x1"


def per_call(fn, calls: int, sync) -> float:
    rounds = []
    for _ in range(7):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t0) * 1e6 / calls)
        sync()
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry", required=True)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    from executor.gpu import engine
    from registry.store import Registry

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    plan = next(e.plan for e in Registry(args.registry).entries(collective="allreduce") if e.plan.name == NAME)
    comm = engine.InterpreterEngine.from_process_group()
    x = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    comm.execute(plan, x, y)
    torch.cuda.synchronize()
    ctx = next(iter(comm._contexts.values()))
    launch = ctx.launch
    assert launch is not None  # prepared by the warm-up's execute
    stream = comm._stream_handle(None, "torch")
    sync = torch.cuda.synchronize
    rows = {
        "execute": per_call(lambda: comm.execute(plan, x, y), args.calls, sync),
        "arguments": per_call(lambda: comm._arguments(plan, x, y, None), args.calls, sync),
        "describe_one_tensor": per_call(lambda: engine._describe(x, "input"), args.calls, sync),
        "stream_handle": per_call(lambda: comm._stream_handle(None, "torch"), args.calls, sync),
        "driver_launch": per_call(lambda: launch(stream), args.calls, sync),
        "torch_add_": per_call(lambda: x.add_(0.0), args.calls, sync),
    }
    if rank == 0:
        print(json.dumps(rows, indent=1))
        if args.output:
            doc = {
                "plan": NAME,
                "size": x.numel() * 2,
                "unit": "us per call (host)",
                "calls": args.calls,
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "rows": rows,
            }
            with open(args.output, "w") as f:
                json.dump(doc, f, indent=1)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
