"""The fused all-reduce + residual add + RMSNorm per plan: each candidate forced in turn, timed in the decode step's
shape (2 GPUs, torchrun), against NCCL's all-reduce + add + norm in the same job.

    WEFT_REGISTRY=bench/registry_h200x2 torchrun --nproc-per-node 2 bench/norm_plans.py -o OUT.json

For each batch, a CUDA graph of ``--calls`` projections (``a @ w``, 4096 -> 8192 as at TP=2) each followed by the
call (``comm.all_reduce(y, residual=h, rms_weight=w, eps=)`` on the forced plan, or NCCL's in-place all-reduce, torch's
add and ``rms_norm``), less the graph of the projections alone, as examples/tp_decode.py measures the call in the
step; and a graph of the calls alone, back to back. Graphs take turns replay by replay. Every candidate's last
normed rows are checked against the definition (fp32 mean of squares, ``x * rstd * w`` rounded once): elements more
than one bf16 ulp off must be 0. "auto" is the plan the Communicator picks itself (``norm_plan_for``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HIDDEN, EPS = 8192, 1e-5
P = "direct-allreduce-hgx_h200:gpus=2-"
CANDIDATES = {  # batch -> plans (whole rows per block: -rowsG at G = batch or fewer; slices: more blocks than rows)
    1: (
        "ll-x32-t512-max8MB-rows1",
        "ll-x32-t512-max8MB-rows8",
        "ll-x32-t512-max8MB-rows16",
        "ll-x32-t512-max8MB",
        "ll-x64-t512-max8MB",
        "ll-x32-t256",
        "ll-x16-t256",
    ),
    4: (
        "ll-x32-t512-max8MB-rows4",
        "ll-x32-t512-max8MB-rows16",
        "ll-x32-t512-max8MB",
        "ll-x64-t512-max8MB-rows16",
        "ll-x64-t512-max8MB",
    ),
    16: (
        "ll-x64-t512-max8MB-rows16",
        "ll-x64-t512-max8MB-rows32",
        "ll-x64-t512-max8MB",
        "ll-x128-t512-max8MB",
        "ll-x128-t512-max64MB",
        "ll-x32-t512-max8MB",
    ),
}


def _median_replays(graphs: dict[str, Any], iters: int, time_replay: Any) -> dict[str, float]:
    """Each graph's median replay time over ``iters`` rounds, the graphs interleaved within a round."""
    times: dict[str, list[float]] = {k: [] for k in graphs}
    for _ in range(iters):
        for k, g in graphs.items():
            times[k].append(time_replay(g))
    return {k: statistics.median(t) for k, t in times.items()}


def _capture_candidate(
    name: str,
    plan: Any,
    pin: Any,
    capture: Any,
    steps: tuple[Any, Any],
    graphs: dict[str, Any],
    kept: dict[str, Any],
    results: dict[str, dict[str, Any]],
) -> None:
    """Pin ``plan`` (``pin``) and capture (``capture``) its step and its call alone (``steps``) into ``graphs``;
    its result into ``results``."""
    if plan is None:
        results[name] = {"error": "not in the registry"}
        return
    fused_step, fused_alone = steps
    try:
        pin(plan)
        kept[name] = {}, {}
        graphs[name] = capture(fused_step(kept[name][0]))
        graphs[name + "/alone"] = capture(fused_alone(kept[name][1]))
        results[name] = {"plan": plan.name}
    except Exception as e:  # a candidate that cannot run is a result
        results[name] = {"error": f"{type(e).__name__}: {e}"}
        graphs.pop(name, None)


def _grade(
    results: dict[str, dict[str, Any]],
    med: dict[str, float],
    in_step: dict[str, float],
    kept: dict[str, Any],
    weight: Any,
    calls: int,
) -> None:
    """Add each candidate's times and its normed output's distance from the float64 RMSNorm to ``results``."""
    import torch

    for name, r in results.items():
        if "error" in r:
            continue
        r["in_step_us"] = in_step[name]
        r["alone_us"] = med[name + "/alone"] * 1e3 / calls
        r["ratio_vs_nccl"] = in_step[name] / in_step["nccl"]
        normed, residual = kept[name][0]["normed"], kept[name][0]["residual"]
        x = residual.float()
        rstd = 1.0 / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True).float() + EPS)
        want = ((x * rstd) * weight.float()).to(torch.bfloat16)
        ulp = torch.maximum(want.float().abs(), torch.tensor(2.0**-126, device=weight.device)) * 2.0**-7
        r["off_by_more_than_one_ulp"] = int(((normed.float() - want.float()).abs() > ulp).sum())
        r["bitwise_fraction"] = float((normed == want).float().mean())


def _print_batch(batch: int, nccl_in_step_us: float, results: dict[str, dict[str, Any]]) -> None:
    print(f"batch {batch}: nccl {nccl_in_step_us:.2f} us/call in the step", flush=True)
    for name, r in results.items():
        print(
            f"  {name:32s} "
            + (
                f"{r['in_step_us']:.2f} us in step ({r['ratio_vs_nccl']:.3f}x), "
                f"{r['alone_us']:.2f} alone, off {r['off_by_more_than_one_ulp']}, "
                f"bitwise {r['bitwise_fraction']:.4f}  {r['plan']}"
                if "error" not in r
                else r["error"]
            ),
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="1,4,16")
    p.add_argument("--calls", type=int, default=16)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("-o", "--output")
    args = p.parse_args()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from executor import Communicator
    from executor.reference.norm import RowNorm

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import tp_decode  # its graph capture and replay timing, so that both measure the call alike

    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    comm = Communicator.from_process_group(ll128=True)
    plans = {e.plan.name: e.plan for e in comm.choice.entries}
    rows = RowNorm(HIDDEN, EPS)
    gen = torch.Generator(device=device).manual_seed(99)
    weight = (1.0 + 0.1 * torch.randn(HIDDEN, generator=gen, device=device)).to(torch.bfloat16)
    side = torch.cuda.Stream()
    out = []

    for batch in (int(b) for b in args.batch.split(",")):
        nbytes = batch * HIDDEN * 2
        a = torch.randn(batch, HIDDEN // 2, generator=gen, device=device, dtype=torch.bfloat16)
        w = torch.randn(HIDDEN // 2, HIDDEN, generator=gen, device=device, dtype=torch.bfloat16) * 0.02
        h = torch.randn(
            batch, HIDDEN, generator=torch.Generator(device=device).manual_seed(5), device=device, dtype=torch.bfloat16
        )
        y = torch.randn(batch, HIDDEN, generator=gen, device=device, dtype=torch.bfloat16)
        results: dict[str, dict[str, Any]] = {}

        def fused_step(keep, a=a, w=w, h=h):
            def run():
                for _ in range(args.calls):
                    keep["normed"], keep["residual"] = comm.all_reduce(a @ w, residual=h, rms_weight=weight, eps=EPS)

            return run

        def fused_alone(keep, y=y, h=h):
            def run():
                for _ in range(args.calls):
                    keep["normed"], keep["residual"] = comm.all_reduce(y, residual=h, rms_weight=weight, eps=EPS)

            return run

        def nccl_step(a=a, w=w, h=h):
            for _ in range(args.calls):
                t = a @ w
                dist.all_reduce(t)
                F.rms_norm(h + t, (HIDDEN,), weight, EPS)

        def matmul(a=a, w=w):
            for _ in range(args.calls):
                a @ w

        graphs = {
            "matmul": tp_decode.graph_of(matmul, side, contextlib.nullcontext),
            "nccl": tp_decode.graph_of(nccl_step, side, contextlib.nullcontext),
        }
        kept: dict[str, Any] = {}
        auto = comm.norm_plan_for(nbytes, torch.bfloat16, rows)
        for name in ("auto",) + CANDIDATES.get(batch, ()):
            _capture_candidate(
                name,
                auto if name == "auto" else plans.get(P + name),
                lambda plan, nbytes=nbytes: comm.pin_norm_plan(nbytes, torch.bfloat16, rows, plan),
                lambda fn: tp_decode.graph_of(fn, side, comm.capture),
                (fused_step, fused_alone),
                graphs,
                kept,
                results,
            )
        comm.pin_norm_plan(nbytes, torch.bfloat16, rows, None)
        med = _median_replays(graphs, args.iters, tp_decode.time_replay)
        in_step = {k: (med[k] - med["matmul"]) * 1e3 / args.calls for k in graphs if not k.endswith("/alone")}
        _grade(results, med, in_step, kept, weight, args.calls)
        row = {"batch": batch, "nccl_in_step_us": in_step["nccl"], "candidates": results}
        out.append(row)
        if rank == 0:
            _print_batch(batch, in_step["nccl"], results)
    if rank == 0 and args.output:
        doc = {
            "name": "norm_plans",
            "machine": {"gpu": torch.cuda.get_device_name(device), "count": 2},
            "versions": {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))},
            "calls": args.calls,
            "iters": args.iters,
            "rows": out,
        }
        with open(args.output, "w") as f:
            json.dump(doc, f, indent=2)
    dist.barrier()
    dist.destroy_process_group()  # as tp_decode ends (a run that closed the communicator first overran its bound)


if __name__ == "__main__":
    main()
