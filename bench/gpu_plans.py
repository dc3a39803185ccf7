"""Compile the plan set the GPU tests and benchmarks run: weft's own pipeline (baseline schedule -> codegen ->
reference-executor check), for one topology.

    python bench/gpu_plans.py tests/gpu/plans --topology hgx_h200:gpus=2
"""

from __future__ import annotations

import argparse
from pathlib import Path

from codegen import compile_schedule
from executor.reference import check_plan
from schedules.collectives import Collective
from schedules.plan import save_plan_file
from synth import baselines
from topologies import resolve

# (collective, method, protocol, instances): ring, direct and two-shot for every collective they exist for,
# LL variants for small messages and multi-instance variants for large ones.
VARIANTS = [
    ("allreduce", "ring", "simple", 1), ("allreduce", "direct", "simple", 1), ("allreduce", "twoshot", "simple", 1),
    ("allreduce", "direct", "ll", 1), ("allreduce", "twoshot", "ll", 1), ("allreduce", "direct", "ll", 4),
    ("allreduce", "twoshot", "simple", 8), ("allreduce", "twoshot", "simple", 16), ("allreduce", "direct", "simple", 16),
    ("allreduce", "twoshot", "simple", 32), ("allreduce", "direct", "ll", 8), ("allreduce", "direct", "ll", 16),
    ("allreduce", "twoshot", "ll", 8), ("allgather", "direct", "simple", 32), ("allgather", "direct", "ll", 8),
    ("reducescatter", "direct", "simple", 32), ("reducescatter", "direct", "ll", 8),
    ("allgather", "ring", "simple", 1), ("allgather", "direct", "simple", 1), ("allgather", "direct", "ll", 1),
    ("allgather", "direct", "simple", 16),
    ("reducescatter", "ring", "simple", 1), ("reducescatter", "direct", "simple", 1),
    ("reducescatter", "direct", "ll", 1), ("reducescatter", "direct", "simple", 16),
    ("broadcast", "ring", "simple", 1), ("broadcast", "direct", "simple", 1),
    ("alltoall", "direct", "simple", 1), ("alltoall", "ring", "simple", 1),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--topology", default="hgx_h200:gpus=2")
    args = parser.parse_args()
    topology = resolve(args.topology)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, method, protocol, instances in VARIANTS:
        try:
            schedule = getattr(baselines, method)(topology, Collective(name, topology.nranks))
            plan = compile_schedule(schedule, topology, instances=instances, protocol=protocol)
        except Exception as e:  # a variant that does not exist here is reported and skipped
            print(f"skip {name} {method} {protocol} x{instances}: {e}")
            continue
        unit = plan.size_chunks * 4
        record = check_plan(plan, [unit * 4, unit * 16], dtypes=("fp32", "bf16"))
        path = out / f"{name}-{method}-{protocol}-x{instances}.json"
        save_plan_file(plan.with_meta(verification=record.to_json()), path)
        print(f"{path}: {plan.name}, {plan.protocol}, sizes {plan.min_message_size}..{plan.max_message_size}, "
              f"verified={record.ok}")


if __name__ == "__main__":
    main()
