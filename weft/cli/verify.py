"""``weft verify FILE``: a schedule against a topology, or a plan on the reference executor."""

from __future__ import annotations

import argparse
import json

from weft.cli import ArgumentError, progress_after
from weft.cli.words import counted
from weft.units import SIZE_HELP, parse_size_range


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="verify a schedule (needs -t) or a plan (reference executor)",
        description="A weft.schedule/1 or /2 file is re-simulated against the topology. A plan "
        "(MSCCL++ execution-plan JSON) runs on the CPU reference executor on random "
        "data for several sizes and its dtypes. Exit 1 when a check fails.",
    )
    p.add_argument("file", help="schedule or plan file")
    p.add_argument(
        "-t",
        "--topology",
        help="catalog spec or topology file (required for schedules; for a plan: "
        "also check that it is for this fabric)",
    )
    p.add_argument(
        "--sizes", help="plan sizes to run, e.g. 1KB,4KB+12 (default: 3 sizes incl. a ragged one); " + SIZE_HELP
    )
    p.add_argument("--dtypes", default=None, help="comma-separated fp32,fp16,bf16 (default: the plan's)")
    p.add_argument("--seed", type=int, default=0, help="random data seed")
    p.add_argument("--json", action="store_true", help="print the verification record as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from schedules.schedule import Schedule
    from weft import pipeline
    from weft.cli.values import comma_items

    if args.seed < 0:
        raise ArgumentError(f"weft verify: --seed must be a non-negative integer, got {args.seed}")
    _, document = pipeline.read_document(args.file)
    if isinstance(document, Schedule):  # read_document's "schedule" kind
        return _schedule(args, document)
    sizes = parse_size_range(args.sizes) if args.sizes is not None else None
    dtypes = comma_items(args.dtypes, "weft verify: --dtypes") if args.dtypes is not None else None
    wrong = _fabric_refusal(document, args.topology) if args.topology else ""
    if wrong:
        if args.json:
            print(json.dumps({"plan_hash": document.content_hash, "ok": False, "errors": [wrong]}, indent=2))
        else:
            print(f"plan {document.name} ({document.content_hash}): FAILED\n  {wrong}")
        return 1
    record = pipeline.check(document, sizes, dtypes, args.seed, progress=progress_after())
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        fabric = f", for topology {args.topology}" if args.topology else ""
        print(f"plan {document.name} ({record['plan_hash']}): ok on the reference executor{fabric}")
        for line in record["checks"]:
            print(f"  {line}")
    return 0


def _fabric_refusal(plan, spec: str) -> str:
    """Why ``plan`` is not for the fabric ``spec`` (its rank count, the fingerprint it records, or a memory
    channel between hosts), in the user's words; '' where it is."""
    from executor.hosts import ipc_across_hosts
    from topologies import resolve

    topology = resolve(spec)
    if plan.nranks != topology.nranks:
        return f"topology: the plan has {counted(plan.nranks, 'rank')}, {spec} has {topology.nranks}"
    if plan.weft.topology and not topology.known_as(plan.weft.topology):
        return f"topology: the plan is for {plan.weft.topology}, not {spec} ({topology.fingerprint})"
    return ipc_across_hosts(plan, topology.hosts).replace("(host ", f"({spec} host ")


def _schedule(args: argparse.Namespace, schedule) -> int:
    from schedules.verify import verify
    from topologies import resolve

    if not args.topology:
        raise ArgumentError(f"weft verify: {args.file} is a schedule: pass -t TOPO to check it against a topology")
    result = verify(schedule, resolve(args.topology))
    if args.json:
        print(json.dumps({"ok": result.ok, "checks": list(result.checks), "errors": list(result.errors)}, indent=2))
    else:
        name = schedule.name or schedule.collective.name
        print(f"schedule {name} ({schedule.content_hash}): {'ok' if result.ok else 'FAILED'}")
        for line in result.errors[:20]:
            print(f"  {line}")
    return 0 if result.ok else 1
