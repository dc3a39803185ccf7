"""``weft tune COLLECTIVE -t TOPO``: compile schedules many ways, prove each plan, commit them for selection by size."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from weft.cli import ArgumentError
from weft.cli.words import counted


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="compile a grid of plan variants (protocol x instances x threads) and commit them",
        description="Compile each schedule as every protocol x instances x threads variant that the GPU can hold, "
        "prove each on the reference executor and commit it. Then `weft bench COLLECTIVE --plans "
        "registry --record` measures them all, and selection takes the fastest for each size.",
    )
    p.add_argument("collective", help="allreduce, allgather, reducescatter, ...")
    p.add_argument("-t", "--topology", required=True, help="catalog spec or topology file")
    p.add_argument(
        "--method",
        action="append",
        dest="methods",
        help="baseline to compile (ring, direct, twoshot, rhd, tree, 2dh); repeatable; default direct and "
        "twoshot for allreduce, direct otherwise, those the topology has the links for (else ring)",
    )
    p.add_argument(
        "--schedule",
        action="append",
        dest="schedules",
        default=[],
        help="a schedule file (weft.schedule/1) to compile too; repeatable (default: none)",
    )
    p.add_argument("--instances", default="1,4,16,32,64,128", help="instance counts, comma-separated")
    p.add_argument("--threads", default="256,1024", help="thread-block sizes, comma-separated")
    p.add_argument(
        "--protocols",
        help="any of ll, simple and lamport, comma-separated (lamport: data that is its own flag, 1x the bytes on the "
        "wire; the interpreter engine runs it, the port engine does not). Default: all three on one host, simple alone "
        "for a topology of several hosts, whose port channels carry plain puts",
    )
    p.add_argument(
        "--sms",
        type=int,
        default=132,
        help="SMs of the target GPU (H100/H200: 132): variants with more thread blocks than it holds at "
        "once are left out",
    )
    p.add_argument("--pull", action="store_true", help="also Simple variants that read peers' inputs (get/rre)")
    p.add_argument(
        "--pipeline",
        default="1",
        help="Simple variants' pipeline depths, comma-separated: each "
        "instance's piece cut into that many sub-pieces that overlap "
        "transfer and combining",
    )
    p.add_argument(
        "--multipeer",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also variants in which one thread block per instance serves every peer (default: for "
        "more than 2 ranks); --no-multipeer leaves them out",
    )
    p.add_argument(
        "--duplex",
        action="store_true",
        help="also variants in which one thread block per peer both writes it and waits for it (where the "
        "proof allows: receive roles that forward nothing, as in a direct all-to-all)",
    )
    p.add_argument(
        "--ll-max-bytes",
        default="1MB",
        help="the largest message LL variants accept (whole MB; higher pays with --ll128 executors)",
    )
    p.add_argument(
        "--lamport-max-bytes",
        help="the largest message Lamport variants accept (whole MB; default: 16MB for variants whose scratch "
        "holds at most twice the message per copy, such as two-shots, 4MB for the others)",
    )
    p.add_argument("--registry", help="registry location (default: $WEFT_REGISTRY or the user data dir)")
    p.add_argument("-o", "--output", help="also write each plan file into this directory")
    p.add_argument("--dry-run", action="store_true", help="compile and prove, but commit and write nothing")
    p.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    from weft.cli.values import comma_ints

    return comma_ints(text, f"weft tune: {flag}")


def run(args: argparse.Namespace) -> int:
    from schedules.schedule import load_schedule
    from schedules.verify import require_valid
    from topologies import resolve
    from weft import publish
    from weft.cli.values import comma_items
    from weft.synthesis import synthesize
    from weft.tuning import (
        DEFAULT_PROTOCOLS,
        TuneOptions,
        compile_variants,
        default_protocols,
        default_schedules,
        grid,
    )
    from weft.units import parse_bytes
    from weftcore.jsonfile import make_directory

    options = TuneOptions(
        instances=_ints(args.instances, "--instances"),
        threads=_ints(args.threads, "--threads"),
        protocols=tuple(p.lower() for p in comma_items(args.protocols, "weft tune: --protocols"))
        if args.protocols is not None
        else DEFAULT_PROTOCOLS,  # narrowed to the topology's below
        sms=args.sms,
        pull=args.pull,
        pipelines=_ints(args.pipeline, "--pipeline"),
        ll_max_bytes=parse_bytes(args.ll_max_bytes, "--ll-max-bytes"),
        lamport_max_bytes=None
        if args.lamport_max_bytes is None
        else parse_bytes(args.lamport_max_bytes, "--lamport-max-bytes"),
        multipeer=args.multipeer,
        duplex=args.duplex,
    )
    topology = resolve(args.topology)
    if args.protocols is None:
        options = dataclasses.replace(options, protocols=default_protocols(topology))
    if args.output and not args.dry_run:
        make_directory(args.output, "output", ArgumentError)  # before any commit, so a bad -o commits nothing
    # the user's files first, so a bad one is the error they see (not a default baseline's, built after)
    given = []
    for f in args.schedules:
        schedule = load_schedule(f)
        if schedule.collective.name != args.collective:
            raise ArgumentError(
                f"weft tune: schedule {f}: collective: {schedule.collective.name}, not {args.collective}"
            )
        require_valid(schedule, topology, source=f)
        given.append(schedule)
    if args.methods:
        schedules = [synthesize(topology, args.collective, m) for m in args.methods] + given
    else:
        defaults, notes = default_schedules(topology, args.collective)
        for note in notes:
            print(f"weft tune: {note}", file=sys.stderr)
        schedules = defaults + given

    rows: list[dict] = []
    width = max(len(v.label) for v in grid(options))
    for schedule in schedules:
        if not args.json:
            n = schedule.nsteps
            print(
                f"schedule {schedule.name or schedule.meta.solver} ({schedule.meta.solver or 'given'}, "
                f"{counted(n, 'step')}):",
                flush=True,
            )

        def keep(o, schedule=schedule) -> None:
            row = _row(o, schedule, topology, args)
            rows.append(row)
            if not args.json:
                print("  " + _line(row, width), flush=True)  # as each variant is decided: a long grid is never silent

        compile_variants(schedule, topology, options, keep)
    made = [r for r in rows if r["plan"]]
    if args.json:
        print(
            json.dumps(
                {"registry": publish.registry_location(args.registry), "dry_run": args.dry_run, "variants": rows},
                indent=2,
            )
        )
    else:
        where = (
            "checked, nothing committed (--dry-run)"
            if args.dry_run
            else f"committed to {publish.registry_location(args.registry)}"
        )
        print(
            f"{len(made)} of {counted(len(rows), 'variant')} proven and {where}; measure them "
            f"with `weft bench {args.collective} --plans registry --record`"
        )
    return 0 if made else 1


def _row(o, schedule, topology, args: argparse.Namespace) -> dict:
    """One variant's outcome, committed (and written with -o) unless --dry-run."""
    from weft import publish

    row = {
        "schedule": schedule.name,
        "variant": o.variant.label,
        "plan": o.plan.name if o.plan else None,
        "threadblocks": o.threadblocks,
        "skipped": o.skipped,
        "powers_of_two": o.powers_of_two,
    }
    if o.plan and not args.dry_run:
        row["registry_entry"] = publish.commit(o.plan, topology, args.registry, schedule=schedule).id
        if args.output:
            from weft import pipeline
            from weft.cli.synth import safe_name

            path = Path(args.output) / f"{safe_name(o.plan.name)}.plan.json"
            pipeline.save_plan(o.plan, path)
            row["plan_file"] = str(path)
    return row


def _line(row: dict, width: int) -> str:
    n = row["threadblocks"]
    what = f"{row['plan']} ({counted(n, 'thread block')})" if row["plan"] else "skipped: " + row["skipped"]
    if row["plan"] and not row["powers_of_two"]:
        what += "; warning: it accepts no power-of-two size (1 KB to 1 GB), so benches of those sizes skip it"
    return f"{row['variant']:<{width}}  {what}" + (f" -> {row['registry_entry']}" if row.get("registry_entry") else "")
