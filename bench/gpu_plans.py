"""Compile the plan set the GPU tests and benchmarks run: weft's own pipeline (baseline schedule -> codegen ->
reference-executor check), for one topology.

    python bench/gpu_plans.py tests/gpu/plans --topology hgx_h200:gpus=2
    python bench/gpu_plans.py /tmp/sweep --set sweep     # the tuning sweep: instances x threads x scratch
    python bench/gpu_plans.py /tmp/tuned --set tuned     # the registry set (bench/registry_h200x2), then
    for f in /tmp/tuned/*.json; do weft registry commit "$f" --registry bench/registry_h200x2; done
    python bench/gpu_plans.py tests/gpu/plans8 --topology hgx_h200:gpus=8 --set multipeer   # one-GPU-path tests
    python bench/gpu_plans.py /tmp/ab --set multipeer-ab  # 2 ranks: today's winners and their multi-peer forms
    python bench/gpu_plans.py tests/gpu/plans4 --topology hgx_h200:gpus=4 --set duplex   # duplex all-to-all tests
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from codegen import compile_schedule
from executor.reference.prove import check_plan
from schedules.collectives import Collective
from schedules.plan.io import save_plan_file
from synth import baselines
from topologies import resolve
from weft import pipeline

# (collective, method, protocol, instances): ring, direct and two-shot for every collective they exist for,
# LL variants for small messages and multi-instance variants for large ones.
VARIANTS = [
    ("allreduce", "ring", "simple", 1),
    ("allreduce", "direct", "simple", 1),
    ("allreduce", "twoshot", "simple", 1),
    ("allreduce", "direct", "ll", 1),
    ("allreduce", "twoshot", "ll", 1),
    ("allreduce", "direct", "ll", 4),
    ("allreduce", "twoshot", "simple", 8),
    ("allreduce", "twoshot", "simple", 16),
    ("allreduce", "direct", "simple", 16),
    ("allreduce", "twoshot", "simple", 32),
    ("allreduce", "direct", "ll", 8),
    ("allreduce", "direct", "ll", 16),
    ("allreduce", "twoshot", "ll", 8),
    ("allgather", "direct", "simple", 32),
    ("allgather", "direct", "ll", 8),
    ("reducescatter", "direct", "simple", 32),
    ("reducescatter", "direct", "ll", 8),
    ("allgather", "ring", "simple", 1),
    ("allgather", "direct", "simple", 1),
    ("allgather", "direct", "ll", 1),
    ("allgather", "direct", "simple", 16),
    ("reducescatter", "ring", "simple", 1),
    ("reducescatter", "direct", "simple", 1),
    ("reducescatter", "direct", "ll", 1),
    ("reducescatter", "direct", "simple", 16),
    ("broadcast", "ring", "simple", 1),
    ("broadcast", "direct", "simple", 1),
    ("alltoall", "direct", "simple", 1),
    ("alltoall", "ring", "simple", 1),
]


# The tuning sweep: (collective, method, protocol, instances, threads, double scratch) for bench/NOTES.md.
SWEEP = (
    [("allreduce", "direct", "ll", i, t, True) for i in (1, 4, 16, 32, 64) for t in (256, 1024)]
    + [("allreduce", "twoshot", "ll", i, 1024, True) for i in (8, 32)]
    + [("allreduce", "direct", "simple", i, 1024, d) for i in (16, 32, 64) for d in (False, True)]
    + [("allreduce", "twoshot", "simple", i, 1024, False) for i in (32, 64, 128)]
    + [
        (c, "direct", "simple", i, 1024, d)
        for c in ("allgather", "reducescatter")
        for i in (16, 32, 64)
        for d in (False, True)
    ]
    + [(c, "direct", "ll", i, 1024, True) for c in ("allgather", "reducescatter") for i in (1, 8, 32)]
)


# The registry set, from the sweep's winners and their neighbours (bench/NOTES.md): (collective, method, protocol,
# instances, threads, double scratch, pipeline).
TUNED = (
    [("allreduce", "direct", "ll", i, 256, True, 1) for i in (1, 4, 16, 32, 64)]
    + [("allreduce", "twoshot", "ll", i, 256, True, 1) for i in (32, 64)]
    + [
        ("allreduce", "direct", "simple", i, 1024, True, p)
        for i, p in ((16, 1), (32, 1), (64, 1), (32, 2), (32, 4), (64, 2), (16, 4))
    ]
    + [
        ("allreduce", "twoshot", "simple", i, t, False, p)
        for i, t, p in ((64, 1024, 1), (128, 1024, 1), (64, 1024, 2), (128, 1024, 2), (256, 512, 1))
    ]
    + [("allgather", "direct", "ll", i, t, True, 1) for i, t in ((1, 256), (8, 256), (8, 1024), (32, 256))]
    + [("allgather", "direct", "simple", i, 1024, d, 1) for i in (16, 32, 64, 128) for d in (False, True)]
    + [("reducescatter", "direct", "ll", i, t, True, 1) for i, t in ((1, 256), (8, 256), (8, 1024), (32, 256))]
    + [
        ("reducescatter", "direct", "simple", i, 1024, True, p)
        for i, p in ((32, 1), (64, 1), (128, 1), (32, 4), (64, 2))
    ]
)


# Multi-peer plans (codegen ``multipeer``) for the one-GPU-path tests at 4 and 8 ranks: (collective, method,
# protocol, instances, double scratch, pipeline, pull).
MULTIPEER = [
    ("allreduce", "twoshot", "simple", 1, False, 1, False),
    ("allreduce", "twoshot", "simple", 8, True, 1, False),
    ("allreduce", "twoshot", "simple", 4, True, 2, False),
    ("allreduce", "twoshot", "ll", 1, True, 1, False),
    ("allreduce", "twoshot", "simple", 1, False, 1, True),
    ("allreduce", "direct", "simple", 1, True, 1, False),
    ("allreduce", "direct", "ll", 4, True, 1, False),
    ("reducescatter", "direct", "simple", 1, True, 1, False),
    ("reducescatter", "direct", "ll", 1, True, 1, False),
    ("allgather", "direct", "simple", 4, False, 1, False),
    ("allgather", "direct", "ll", 1, True, 1, False),
]

# 2 ranks, all-reduce: the plans that won each size on 2×H200 (bench/NOTES.md, v6) and the same plans multi-peer:
# (method, protocol, instances, threads, pipeline, LL max MB).
AB = [
    ("direct", "ll", 64, 256, 1, 1),
    ("direct", "ll", 32, 512, 1, 8),
    ("direct", "ll", 128, 512, 1, 64),
    ("direct", "ll", 64, 1024, 1, 8),
    ("twoshot", "simple", 128, 1024, 1, 0),
    ("twoshot", "simple", 128, 1024, 2, 0),
    ("twoshot", "simple", 64, 1024, 1, 0),
]


# (protocol, instances, threads) of the direct all-to-all with duplex thread blocks (codegen.threadblocks), per rank
# count: the shape the traffic model favours at 128-256 MB on 4 GPUs, and LL ones for the packet path
DUPLEX = {2: [("simple", 16, 1024), ("ll", 4, 512)], 4: [("simple", 32, 1024), ("ll", 4, 512)]}


def duplex_set(out: Path, topology) -> None:
    schedule = baselines.direct(topology, Collective("alltoall", topology.nranks))
    for protocol, instances, threads in DUPLEX[topology.nranks]:
        plan = pipeline.compile_and_verify(
            schedule, topology, instances=instances, protocol=protocol, threads=threads, duplex=True
        )
        label = f"-t{threads}" if threads != 1024 else ""
        pipeline.save_plan(plan, out / f"alltoall-direct-{protocol}-x{instances}{label}-dx.json")
        print(plan.name, max(len(g.threadblocks) for g in plan.gpus), "thread blocks")


def multipeer_sets(out: Path, topology, which: str) -> None:
    if which == "multipeer":
        for name, method, protocol, instances, double, depth, pull in MULTIPEER:
            schedule = getattr(baselines, method)(topology, Collective(name, topology.nranks))
            plan = pipeline.compile_and_verify(
                schedule,
                topology,
                instances=instances,
                protocol=protocol,
                double_scratch=double,
                pipeline=depth,
                pull=pull,
                multipeer=True,
            )
            label = (
                (f"-p{depth}" if depth > 1 else "")
                + ("-2s" if double and protocol == "simple" else "")
                + ("-pull" if pull else "")
            )
            pipeline.save_plan(plan, out / f"{name}-{method}-{protocol}-x{instances}{label}-mp.json")
            print(plan.name)
        return
    for method, protocol, instances, threads, depth, ll_mb in AB:
        schedule = getattr(baselines, method)(topology, Collective("allreduce", topology.nranks))
        for multipeer in (False, True):
            extra: dict[str, Any] = {"ll_max_bytes": ll_mb << 20} if protocol == "ll" else {"pipeline": depth}
            plan = pipeline.compile_and_verify(
                schedule,
                topology,
                instances=instances,
                protocol=protocol,
                threads=threads,
                multipeer=multipeer,
                **extra,
            )
            pipeline.save_plan(plan, out / f"{plan.name.replace(':', '_').replace('=', '')}.json")
            print(plan.name, max(len(g.threadblocks) for g in plan.gpus), "thread blocks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--topology", default="hgx_h200:gpus=2")
    parser.add_argument(
        "--set",
        choices=("tests", "sweep", "tuned", "multipeer", "multipeer-ab", "duplex"),
        default="tests",
        help="which plan set to write",
    )
    args = parser.parse_args()
    topology = resolve(args.topology)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.set.startswith("multipeer"):
        multipeer_sets(out, topology, args.set)
        return
    if args.set == "duplex":
        duplex_set(out, topology)
        return
    if args.set == "tuned":
        for name, method, protocol, instances, threads, double, depth in TUNED:
            schedule = getattr(baselines, method)(topology, Collective(name, topology.nranks))
            plan = pipeline.compile_and_verify(
                schedule,
                topology,
                instances=instances,
                protocol=protocol,
                threads=threads,
                double_scratch=double,
                pipeline=depth,
            )
            pipeline.save_plan(plan, out / f"{plan.name.replace(':', '_').replace('=', '')}.json")
            print(plan.name)
        return
    variants: Sequence[tuple[str, str, str, int, int, bool | None]] = (
        SWEEP if args.set == "sweep" else [(*v, 1024, None) for v in VARIANTS]
    )
    for name, method, protocol, instances, threads, scratch_twice in variants:
        try:
            schedule = getattr(baselines, method)(topology, Collective(name, topology.nranks))
            plan = compile_schedule(
                schedule,
                topology,
                instances=instances,
                protocol=protocol,
                threads=threads,
                double_scratch=scratch_twice,
            )
        except Exception as e:  # a variant that does not exist here is reported and skipped
            print(f"skip {name} {method} {protocol} x{instances}: {e}")
            continue
        unit = plan.size_chunks * 4
        record = check_plan(plan, [unit * 4, unit * 16], dtypes=("fp32", "bf16"))
        path = out / (
            f"{name}-{method}-{protocol}-x{instances}.json"
            if args.set == "tests"
            else f"{plan.name.split('-hgx')[0]}-{plan.name.split('-', 2)[-1].split('-', 1)[-1]}.json"
        )
        save_plan_file(plan.with_meta(verification=record.to_json()), path)
        print(
            f"{path}: {plan.name}, {plan.protocol}, sizes {plan.min_message_size}..{plan.max_message_size}, "
            f"verified={record.ok}"
        )


if __name__ == "__main__":
    main()
