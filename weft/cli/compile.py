"""``weft compile SCHEDULE -t TOPO``: verify a schedule, compile it into a plan, prove the plan, write it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from weft.cli import ArgumentError, file_in_the_way, progress_after
from weft.cli.words import counted


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compile",
        help="compile a schedule into an execution plan (or MSCCL XML)",
        description="Verify a schedule, compile it, and prove the plan on the reference executor "
        "(3 sizes incl. a ragged one × fp32/fp16/bf16). Nothing is written unless "
        "every check passes.",
    )
    p.add_argument("schedule", help="schedule file (weft.schedule/1 or /2)")
    p.add_argument("-t", "--topology", required=True, help="catalog spec or topology file the schedule is for")
    p.add_argument("--instances", type=int, default=1, help="thread blocks per chunk (each chunk split k ways)")
    p.add_argument(
        "--protocol",
        default="auto",
        choices=("simple", "ll", "lamport", "auto"),
        help="Simple, LL packets, Lamport (data as its own flag, three rotating buffers), or auto (LL for "
        "schedules of at most 2 steps)",
    )
    p.add_argument(
        "--pipeline",
        type=int,
        default=1,
        help="sub-pieces per instance, moved in turn so that transfer and combining overlap",
    )
    p.add_argument("--threads", type=int, default=1024, help="threads per thread block (multiple of 32, <= 1024)")
    p.add_argument(
        "--double-scratch",
        dest="double_scratch",
        action="store_true",
        default=None,
        help="alternate scratch halves between launches (LL always does; Simple: 2x scratch, fewer entry handshakes)",
    )
    p.add_argument(
        "--pull",
        action="store_true",
        help="receivers read chunks straight from their peers' inputs (get/rre) instead of peers "
        "writing them into scratch (Simple, out-of-place)",
    )
    p.add_argument(
        "--multipeer",
        action="store_true",
        help="one thread block per instance serves every peer, each phase one op over all its channels",
    )
    p.add_argument("--ll-max-bytes", help="the largest message an LL plan accepts (whole MB; default 1MB)")
    p.add_argument("--inplace", action="store_true", help="input and output share one buffer")
    p.add_argument("--format", default="plan", choices=("plan", "msccl-xml"), help="output format")
    p.add_argument("-o", "--output", required=True, help="file to write")
    p.add_argument("--json", action="store_true", help="print a summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from codegen.protocol import LL_MAX_BYTES
    from schedules.mscclpp_format import mscclpp_verdict
    from schedules.schedule import load_schedule
    from topologies import resolve
    from weft import pipeline
    from weft.units import parse_bytes
    from weftcore.jsonfile import check_output, write_text

    if args.instances < 1:
        raise ArgumentError(f"weft compile: --instances must be a positive integer, got {args.instances}")
    check_output(args.output, "output", ArgumentError)  # before the work: a FIFO or device is never replaced
    schedule = load_schedule(args.schedule)
    topology = resolve(args.topology)
    out = Path(args.output)
    if out.is_dir() or file_in_the_way(out):  # before the proof, which takes seconds
        raise ArgumentError(
            f"weft compile: -o {out}: cannot write a file there "
            f"({'a folder' if out.is_dir() else str(file_in_the_way(out)) + ' is a file'})"
        )
    plan = pipeline.compile_and_verify(
        schedule,
        topology,
        instances=args.instances,
        protocol=args.protocol,
        inplace=args.inplace,
        progress=progress_after(),
        threads=args.threads,
        pipeline=args.pipeline,
        double_scratch=args.double_scratch,
        pull=args.pull,
        multipeer=args.multipeer,
        ll_max_bytes=parse_bytes(args.ll_max_bytes, "--ll-max-bytes") if args.ll_max_bytes else LL_MAX_BYTES,
    )
    if args.format == "msccl-xml":
        from codegen.msccl_xml import to_msccl_xml

        write_text(
            out,
            to_msccl_xml(schedule, instances=args.instances, protocol=args.protocol),
            "output",
            ArgumentError,
            parents=True,
        )
    else:
        pipeline.save_plan(plan, out)
    record = plan.weft.verification or {}
    summary = {
        "plan": plan.name,
        "plan_hash": plan.content_hash,
        "protocol": plan.protocol,
        "instances": args.instances,
        "pipeline": args.pipeline,
        "threads": plan.num_threads_per_block,
        "threadblocks": max(len(g.threadblocks) for g in plan.gpus),
        "min_message_size": plan.min_message_size,
        "max_message_size": plan.max_message_size,
        "verified_sizes": record.get("sizes", []),
        "verified_dtypes": record.get("dtypes", []),
        "format": args.format,
        "written": str(out),
        "mscclpp": mscclpp_verdict(plan.to_json()),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"plan {plan.name} ({plan.content_hash}): {plan.protocol}, {counted(args.instances, 'instance')}, "
            f"{counted(summary['threadblocks'], 'thread block')} per GPU"
        )
        print(
            f"  verified on the reference executor: sizes {summary['verified_sizes']} B × "
            f"{', '.join(summary['verified_dtypes'])}"
        )
        print(f"  written to {out} ({args.format}); {summary['mscclpp']}")
    sys.stdout.flush()
    return 0
