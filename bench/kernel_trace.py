"""Where a collective's kernel time goes: the timed interpreter build on the bench's plans (2 GPUs, torchrun).

    torchrun --nproc-per-node 2 bench/kernel_trace.py --registry bench/registry_h200x2 [--lines] -o OUT.json
    torchrun --nproc-per-node 2 bench/kernel_trace.py --lamport -o OUT.json
    torchrun --nproc-per-node 4 bench/kernel_trace.py --registry DIR --case PLAN:BYTES ... [--compiled] -o OUT.json

Each (plan, size) runs as CUDA-graph replays of --calls back-to-back calls (PDL overlapping them, as in
``weft bench``), then every thread block's mean phase times per launch are read back (executor/gpu/trace.py).
Blocks that run the same ops are summarized together: the median of each phase over them, and their slowest
total. The timed build spills a few registers, so its totals run somewhat above the production kernel's.
``--lamport``: LAMPORT_CASES, each an LL plan and the Lamport plan of the same schedule, instances and threads, built
here (no registry), side by side at one size: where the Lamport kernel's time goes that LL's does not (its reset op,
its polls). ``--case PLAN:BYTES`` (repeatable, with --registry): those plans and sizes instead of CASES.
``--compiled``: each case runs as its plan compiled to a kernel of its own (the timed build of it), whose blocks
keep the interpreter's phase numbering (no op window: its slot is the dependency wait alone).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from schedules.plan.types import Plan

P = "direct-allreduce-hgx_h200:gpus=2-"
CASES = (
    (P + "ll-x1", 1 << 10, False),
    (P + "ll-x64-t256", 1 << 10, False),
    (P + "ll-x64-t256", 256 << 10, False),
    (P + "simple-x64-2s", 1 << 20, False),
    (P + "simple-x64-2s", 4 << 20, False),
    ("twoshot-allreduce-hgx_h200:gpus=2-simple-x128", 64 << 20, False),
)
# --lines: the LL128 plans that the bench chose from 256 KB to 16 MB
LINE_CASES = (
    (P + "ll-x128-t512-max64MB", 1 << 20, True),
    (P + "ll-x128-t512-max64MB", 4 << 20, True),
    (P + "ll-x64-max8MB", 4 << 20, True),
    (P + "ll-x128-t512-max64MB", 16 << 20, True),
    (P + "ll-x128-t256-max8MB", 4 << 20, True),
)

# --lamport: (algorithm, instances, size); each runs as LL and as Lamport
# (sizes that both protocols accept: an LL plan takes up to 1 MB, its scratch holding flags beside the data)
LAMPORT_CASES = (("direct", 1, 1 << 10), ("direct", 4, 64 << 10), ("twoshot", 4, 64 << 10), ("twoshot", 64, 1 << 20))


def lamport_pairs(nranks: int) -> list[tuple[Plan, int, bool]]:
    """(plan, size, lines) for LAMPORT_CASES: the LL plan, then the Lamport plan of the same schedule. A case that
    either plan would refuse is an error here, before any GPU work."""
    from topologies.catalog import build
    from weft.pipeline import compile_and_verify
    from weft.synthesis import synthesize

    topology = build(f"hgx_h200:gpus={nranks}")
    out = []
    for algorithm, instances, nbytes in LAMPORT_CASES:
        schedule = synthesize(topology, "allreduce", algorithm)
        for protocol in ("ll", "lamport"):
            plan = compile_and_verify(schedule, topology, instances, protocol=protocol)
            if not plan.accepts(nbytes):
                raise ValueError(f"kernel_trace: {plan.name} does not accept {nbytes} B (LAMPORT_CASES)")
            out.append((plan, nbytes, False))
    return out


def _case(text: str) -> tuple[str, int, bool]:
    """``PLAN:BYTES`` (the plan name holds colons: the size is after the last) as a case on packets."""
    name, _, nbytes = text.rpartition(":")
    return name, int(nbytes), False


def groups(times, ops_of) -> list[dict]:
    """Blocks running the same ops summarized: the median of each phase and op, the slowest total."""
    by: dict[tuple, list] = {}
    for t in times:
        by.setdefault(ops_of[t.block], []).append(t)
    out = []
    for ops, members in sorted(by.items()):
        out.append(
            {
                "blocks": len(members),
                "ops": len(ops),
                "op_names": list(ops),
                "phases_us": {k: statistics.median(m.phases[k] for m in members) for k in members[0].phases},
                "ops_us": [statistics.median(m.ops[i] for m in members) for i in range(len(members[0].ops))],
                "total_us_median": statistics.median(m.total for m in members),
                "total_us_max": max(m.total for m in members),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry", help="the plans of CASES (not with --lamport)")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--lines", action="store_true", help="the LL128 cases (LINE_CASES) instead")
    parser.add_argument("--lamport", action="store_true", help="LL against Lamport (LAMPORT_CASES), plans built here")
    parser.add_argument("--case", action="append", default=[], help="PLAN:BYTES from --registry, instead of CASES")
    parser.add_argument("--compiled", action="store_true", help="run each case compiled to a kernel of its own")
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    from executor.gpu import bootstrap
    from executor.gpu.engine import InterpreterEngine
    from registry.store import Registry

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    if args.lamport:
        cases = lamport_pairs(dist.get_world_size())
    elif args.registry:
        plans = {e.plan.name: e.plan for e in Registry(args.registry).entries(collective="allreduce")}
        chosen = [_case(c) for c in args.case] or (LINE_CASES if args.lines else CASES)
        cases = [(plans[name], nbytes, lines) for name, nbytes, lines in chosen]
    else:
        parser.error("--registry is needed, but with --lamport")
    comm = InterpreterEngine(rank, dist.get_world_size(), bootstrap.process_group_store(None), trace=True)
    rows = []
    for plan, nbytes, lines in cases:
        name = plan.name
        x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            comm.execute(plan, x, y, lines=lines, compiled=args.compiled)
        torch.cuda.synchronize()
        comm.reset_kernel_times()  # graph replays only: the eager warm-up may wait for a peer still starting
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(args.calls):
                comm.execute(plan, x, y, lines=lines, compiled=args.compiled)
        for _ in range(args.replays):
            graph.replay()
        torch.cuda.synchronize()
        ops_of = [tuple(op.name for op in tb.ops) for tb in plan.gpus[rank].threadblocks]
        rows.append(
            {
                "plan": name,
                "size": nbytes,
                "lines": lines,
                "compiled": args.compiled,
                "compiled_refused": comm.compiled_refused.get(plan.content_hash, "") if args.compiled else "",
                "groups": groups(comm.kernel_times(plan, nbytes, "bf16", lines=lines), ops_of),
            }
        )
        if rank == 0:
            print(json.dumps(rows[-1]))
    if rank == 0 and args.output:
        with open(args.output, "w") as f:
            json.dump(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "calls": args.calls,
                    "replays": args.replays,
                    "unit": "us per launch (block mean)",
                    "rows": rows,
                },
                f,
                indent=1,
            )
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
