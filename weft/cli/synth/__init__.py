"""``weft synth COLLECTIVE -t TOPO --method M``: synthesize, verify, score, write, and optionally compile/commit."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
from pathlib import Path

from schedules.collectives import NAMES, Collective, collective_on
from schedules.schedule import Schedule, save_schedule
from topologies import Topology, resolve
from weft.cli import ArgumentError, file_in_the_way
from weft.cli import progress as _progress
from weft.cli.deadline import Deadline
from weft.cli.words import counted
from weft.synthesis import BASELINES
from weft.units import SIZE_HELP, format_bytes, parse_bytes
from weftcore.errors import WeftError
from weftcore.jsonfile import make_directory

FAMILIES = {
    "smt": "weft.cli.synth.smt",
    "milp": "weft.cli.synth.milp",
    "trees": "weft.cli.synth.trees",
    "pareto": "weft.cli.synth.pareto",
}
REPORT_SIZES = (1 << 10, 1 << 20, 1 << 30)
DEFAULT_TIME_LIMIT = 60.0
# The dgx1 frontier took 14 s on the idle 2-core machine and 79.5 s under load (issue 37): a minute stopped it
# after one point. Its progress lines say what is found and how much of the limit is left.
SMT_PARETO_TIME_LIMIT = 300.0
WAIT_CAP_S = 7 * 24 * 3600.0  # every wait is bounded; each instance keeps to --time-limit itself
SOLVER_PACKAGES = ("z3", "ortools")  # imported only when a method needs them
EARLY_CHECK_BYTES = 1 << 20  # topology files this large are checked against the expansion limit before reading whole
SCORE_RESERVE_S = 5.0  # of --time-limit, kept from the solver for verifying and pricing (at most a tenth)


def _family(method: str):
    try:
        return importlib.import_module(FAMILIES[method])
    except ModuleNotFoundError as e:
        raise ArgumentError(f"weft synth: --method {method} is not available in this build ({e.name})") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="synthesize a schedule for a topology",
        description="Synthesize a verified schedule. Nothing is written unless it verifies.",
    )
    p.add_argument("collective", help=f"one of: {', '.join(NAMES)}")
    p.add_argument("-t", "--topology", required=True, help="catalog spec (hgx_h100:nodes=2) or topology file")
    p.add_argument("--method", required=True, choices=BASELINES + tuple(FAMILIES))
    p.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="chunks per rank-slice (default 1; ring and tree use several rings/trees with more)",
    )
    p.add_argument("--root", type=int, default=0, help="root rank for rooted collectives")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="the whole command's deadline in seconds: reading the fabric, the bound, the solve, "
        "verification and pricing (the solver stops on it; any phase still running 2 s later "
        f"ends the command in one line) (default {DEFAULT_TIME_LIMIT:g}; smt --pareto: "
        f"{SMT_PARETO_TIME_LIMIT:g}, the whole frontier's)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="independent instances in N processes: each size of a --size sweep (1MB,64MB,1GB) is "
        "one; smt also races its instances on N workers (default 1; smt: one per CPU)",
    )
    p.add_argument(
        "--size",
        default="1MB",
        help="message size the solver optimizes for (milp; trees: chunks per "
        "tree; pct_of_bound is reported at it); a comma-separated list sweeps; " + SIZE_HELP,
    )
    p.add_argument(
        "-o",
        "--output",
        help="schedule file (a directory when the method returns several; default: "
        "$WEFT_SCHEDULES, otherwise the user data dir's weft/schedules; the path is printed)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--compile", action="store_true", help="also compile each schedule into a verified plan")
    p.add_argument("--commit", action="store_true", help="compile, verify and commit the plan to the registry")
    p.add_argument("--registry", help="registry location (default: $WEFT_REGISTRY or the user data dir)")
    p.add_argument("--instances", type=int, default=1, help="thread blocks per chunk when compiling")
    p.add_argument(
        "--protocol",
        default="auto",
        choices=("simple", "ll", "lamport", "auto"),
        help="when compiling: Simple, LL packets, Lamport, or auto (LL for schedules of at most 2 steps)",
    )
    for module in FAMILIES.values():
        with contextlib.suppress(ModuleNotFoundError):
            importlib.import_module(module).add_arguments(p)
    p.set_defaults(func=run)


def safe_name(name: str) -> str:
    """A file name from a schedule or plan name (catalog specs hold ':' and ',')."""
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in name)


def synthesize(args: argparse.Namespace, topology: Topology, collective: Collective) -> list[Schedule]:
    if args.method in BASELINES:
        from synth import baselines

        return [baselines.solver(args.method)(topology, collective)]
    family = _family(args.method)
    try:
        return list(family.synthesize(args, topology, collective, _progress))
    except ModuleNotFoundError as e:  # a solver imported lazily (z3, OR-Tools) that this machine lacks
        if (e.name or "").split(".")[0] not in SOLVER_PACKAGES:
            raise
        raise ArgumentError(
            f"weft synth: --method {args.method} needs {(e.name or '').split('.')[0]}, which is not "
            "installed here (pip install z3-solver ortools)"
        ) from None


def _one_size(job: tuple[argparse.Namespace, Topology, Collective, str]) -> list[Schedule]:
    """One instance of a sweep, in a pool process: the method at one size."""
    args, topology, collective, size = job
    return synthesize(argparse.Namespace(**{**vars(args), "size": size}), topology, collective)


def sweep(
    args: argparse.Namespace, topology: Topology, collective: Collective, sizes: list[str]
) -> list[tuple[str, list[Schedule]]]:
    """Every size's schedules, ``--jobs`` instances at a time in a process pool (one size: in this process).

    The instances share nothing but their inputs, so the same jobs could go to a cluster scheduler unchanged
    (docs/synthesis.md: "Sweeps on a cluster").
    """
    jobs = [(args, topology, collective, size) for size in sizes]
    if args.jobs <= 1 or len(jobs) == 1:
        return [(size, _one_size(job)) for size, job in zip(sizes, jobs, strict=False)]
    import queue
    import time

    from synth.workers import start_jobs, worker_init

    # a process a size, each killed on the way out (Ctrl-C, SIGTERM, an error), none holding a lock another waits on
    results: queue.Queue = queue.Queue()
    tagged = [(i, (job,)) for i, job in enumerate(jobs)]
    stop = start_jobs(_one_size, tagged, min(args.jobs, len(jobs)), results, worker_init, (os.getpid(),))
    try:
        done: dict[int, list[Schedule]] = {}
        give_up = time.monotonic() + WAIT_CAP_S
        while len(done) < len(jobs):
            i, value = results.get(timeout=max(0.01, give_up - time.monotonic()))
            if isinstance(value, BaseException):
                raise value
            if value is None:
                raise WeftError(f"weft synth: the worker for --size {sizes[i]} died without an answer")
            done[i] = value
        return [(size, done[i]) for i, size in enumerate(sizes)]
    finally:
        stop()


def run(args: argparse.Namespace) -> int:
    if args.chunks is not None and args.chunks < 1:
        raise ArgumentError(f"weft synth: --chunks must be a positive integer, got {args.chunks}")
    if args.time_limit is None:
        args.time_limit = default_time_limit(args)
    if not 0 < args.time_limit < math.inf:
        raise ArgumentError(f"weft synth: --time-limit must be positive seconds, got {args.time_limit}")
    if args.jobs < 1:
        raise ArgumentError(f"weft synth: --jobs must be a positive integer, got {args.jobs}")
    asked_sizes = [part.strip() for part in str(args.size).split(",")]
    for part in asked_sizes:
        parse_bytes(part)
    if len(asked_sizes) > 1 and args.method not in ("milp", "trees"):
        raise ArgumentError(
            f"weft synth: --size {args.size}: a sweep of sizes needs --method milp or trees "
            f"(--method {args.method} does not depend on the size)"
        )
    if len(asked_sizes) > 1 and args.output and Path(args.output).suffix == ".json":
        raise ArgumentError(
            f"weft synth: -o {args.output}: a sweep writes one schedule per size, so -o must name a folder, not a file"
        )
    if args.method == "smt" and args.jobs > 1:
        args.workers = args.jobs
    _check_output(args)
    _check_registry(args)
    if args.method in BASELINES:
        _refuse_early(args)
    limit = args.time_limit
    with Deadline("weft synth", limit, progress=_progress) as deadline:
        deadline.phase = f"reading topology {args.topology}"
        topology = resolve(args.topology)
        collective = collective_on(args.collective, topology.name, topology.nranks, args.chunks or 1, args.root)
        from weft.synthesis import require_affordable

        # a solver keeps to --time-limit itself; a baseline has no other bound on its time than this estimate
        require_affordable(
            collective,
            f"weft synth --method {args.method} on {args.topology}",
            limit if args.method in BASELINES else None,
        )
        deadline.phase = f"synthesizing {collective.name} on {topology.name} ({args.method})"
        deadline.quiet = args.method not in BASELINES  # solver families report their own progress
        # the solver gets what reading the fabric left, less a reserve for verifying and pricing its answer
        args.time_limit = max(0.1, deadline.left() - min(SCORE_RESERVE_S, 0.1 * limit))
        found = sweep(args, topology, collective, asked_sizes)
        deadline.quiet = False
        rows: list[tuple[Schedule, dict]] = []
        basis: set[str] = set()
        swept = tuple(parse_bytes(size_text) for size_text in asked_sizes)
        for size_text, schedules in found:
            rows += _score(topology, schedules, parse_bytes(size_text), args, basis, swept, deadline)
    written = _write(args, [s for s, _ in rows])
    with Deadline(
        "weft synth",
        limit,
        progress=_progress,
        started=deadline.started,
        after=f"the schedule is written ({', '.join(str(w) for w in written)}); no plan is",
    ) as deadline:
        deadline.phase = "compiling and checking plans"
        plans = _compile_and_commit(args, topology, [s for s, _ in rows])
    if args.json:
        shown = sorted({n for _, pct in rows for n in pct}, key=parse_bytes)
        compared = {"compared_us": references_us(topology, collective, shown)} if args.method == "2dh" else {}
        print(
            json.dumps(
                [
                    {**s.to_json(), "pct_of_bound_by_size": pct, "written": w, **compared}
                    for (s, pct), w in zip(rows, written, strict=False)
                ]
                + plans,
                indent=2,
            )
        )
    else:
        _print_table(topology, rows, written, plans)
        if args.method == "2dh":
            _print_references(topology, collective, sorted({n for _, pct in rows for n in pct}, key=parse_bytes))
        for made_by in sorted(basis):
            print(f"  times: {made_by}")
    return 0


def references_us(topology: Topology, collective: Collective, sizes: list[str]) -> dict[str, dict[str, float]]:
    """What a hierarchical schedule is compared with, at each size: the flat direct schedule's predicted time and
    the lower bound (the cut bound with the latency bound), in µs."""
    from schedules.bounds import lower_bound_us
    from schedules.cost import loads
    from synth.baselines import direct

    flat = loads(direct(topology, collective), topology).predict_many_us([parse_bytes(n) for n in sizes])
    return {
        "direct": dict(zip(sizes, flat, strict=False)),
        "bound": {n: lower_bound_us(topology, collective, parse_bytes(n)) for n in sizes},
    }


def _print_references(topology: Topology, collective: Collective, sizes: list[str]) -> None:
    from synth.baselines import direct, twodh
    from synth.baselines.twodh import host_messages

    refs = references_us(topology, collective, sizes)
    for name, label in (("direct", "flat direct (predicted)"), ("bound", "lower bound (cut, latency)")):
        print(f"  {label:<27} " + " ".join(f"{n}: {refs[name][n]:.2f} µs" for n in sizes))
    print(
        f"  messages a GPU sends across hosts: 2dh {host_messages(twodh(topology, collective), topology)}, flat "
        f"direct {host_messages(direct(topology, collective), topology)} (the model prices bytes, not messages)"
    )


def default_time_limit(args: argparse.Namespace) -> float:
    """The time limit without --time-limit: longer for a whole SMT frontier than for one solve."""
    if args.method == "smt" and getattr(args, "pareto", False):
        return SMT_PARETO_TIME_LIMIT
    return DEFAULT_TIME_LIMIT


def _refuse_early(args: argparse.Namespace) -> None:
    """A baseline past the expansion limit on a large fabric is refused from its rank count alone: a catalog spec
    before it is built (a 16,384-rank hypercube takes seconds to build), a large topology file before it is
    validated whole (a 100,000-rank ring takes seconds to validate)."""
    from topologies.catalog import spec_size
    from topologies.errors import TopologyError
    from weftcore.jsonfile import read_json

    path = Path(args.topology)
    if not path.is_file():
        try:
            sized = spec_size(args.topology)
        except WeftError:
            return  # not a catalog spec: resolve says what it is
        if sized is not None:
            _check_early(args, sized[0], sized[1])
        return
    if path.stat().st_size < EARLY_CHECK_BYTES:
        return
    data = read_json(path, "topology", TopologyError)
    if not isinstance(data, dict):
        return  # the full read says what is wrong
    nranks = data.get("nranks")
    if not isinstance(nranks, int) or isinstance(nranks, bool):
        return  # the full read says what is wrong
    _check_early(args, str(data.get("name") or path), nranks)


def _check_early(args: argparse.Namespace, fabric: str, nranks: int) -> None:
    from synth.baselines import check_sends

    try:
        collective = Collective(args.collective, nranks, args.chunks or 1, args.root)
    except WeftError:
        return
    check_sends(args.method, fabric, collective)


def _score(
    topology: Topology,
    schedules: list[Schedule],
    asked: int,
    args: argparse.Namespace,
    basis: set[str],
    swept: tuple[int, ...] = (),
    deadline: Deadline | None = None,
) -> list[tuple[Schedule, dict]]:
    """Verify each schedule and price it at the report sizes, ``asked`` and every size of the sweep (so each row
    fills every column); pct_of_bound is at ``asked``. On a calibrated fabric the prices are the calibrated model's
    for the plan the schedule compiles to (what the registry stores); ``basis`` collects what made them.
    ``deadline``: told each phase, for progress and the time-limit message."""
    from schedules.bounds import lower_bound_us
    from schedules.cost import loads
    from schedules.verify import require_valid
    from weft.calibrate import schedule_predictions
    from weft.predictions import ALPHA_BETA

    sizes = tuple(sorted(set(REPORT_SIZES) | {asked} | set(swept))) if asked else REPORT_SIZES
    rows = []
    for schedule in schedules:
        if deadline is not None:
            deadline.phase = (
                f"verifying {schedule.name or schedule.collective.name} ({counted(schedule.nsends, 'send')})"
            )
        require_valid(schedule, topology)
        if deadline is not None:
            deadline.phase = f"pricing {schedule.name or schedule.collective.name}"
        times = loads(schedule, topology).predict_many_us(sizes)  # index the fabric once, price every size
        calibrated = schedule_predictions(schedule, topology, sizes, args.instances, args.protocol)
        if calibrated is not None:
            times = [calibrated[0][n] for n in sizes]
        basis.add(calibrated[1] if calibrated else ALPHA_BETA)
        if deadline is not None:
            deadline.phase = f"computing the {schedule.collective.name} bound on {topology.name}"
        predicted = {format_bytes(n): t for n, t in zip(sizes, times, strict=False)}
        pct = {
            format_bytes(n): 100.0 * lower_bound_us(topology, schedule.collective, n) / predicted[format_bytes(n)]
            if predicted[format_bytes(n)]
            else 100.0
            for n in sizes
        }
        # pct_of_bound is at the size asked for (--size), the one a solver optimized for
        at = format_bytes(asked) if asked else format_bytes(1 << 30)
        rows.append((schedule.with_meta(predicted_us=predicted, pct_of_bound=pct[at]), pct))
    return rows


def default_output() -> str:
    """Where schedules land without -o: ``$WEFT_SCHEDULES``, otherwise the user data directory's weft/schedules."""
    import os

    import platformdirs

    return os.environ.get("WEFT_SCHEDULES") or str(Path(platformdirs.user_data_dir("weft")) / "schedules")


def _check_registry(args: argparse.Namespace) -> None:
    """Before any solve: a --commit whose registry folder cannot be made fails at once, not after the proofs."""
    if not args.commit:
        return
    from registry.store import RegistryError
    from weft.publish import registry_location

    location = registry_location(args.registry)
    if "://" not in location and file_in_the_way(Path(location) / "index.json"):
        raise RegistryError(
            f"registry {location}: cannot write: {file_in_the_way(Path(location) / 'index.json')} "
            "is a file, not a folder"
        )


def _several(args: argparse.Namespace) -> bool:
    """Whether the method returns one schedule per point (a frontier), so -o must name a folder."""
    return args.method == "pareto" or (args.method == "smt" and getattr(args, "pareto", False)) or "," in str(args.size)


def _check_output(args: argparse.Namespace) -> None:
    """Before any solve: -o names a folder where several schedules come back; without -o, the default folder."""
    from weftcore.jsonfile import check_output

    if args.output is None:
        args.output = default_output()
        return
    out = Path(args.output)
    check_output(out, "output", ArgumentError, folder=not (out.suffix == ".json" and not _several(args)))
    if _several(args) and (out.suffix == ".json" or out.is_file()):
        raise ArgumentError(
            f"weft synth: -o {args.output}: this method writes one schedule per point and "
            "frontier.json, so -o must name a folder, not a file"
        )


def _write(args: argparse.Namespace, schedules: list[Schedule]) -> list[str | None]:
    out = Path(args.output)
    if len(schedules) == 1 and out.suffix == ".json":
        make_directory(out.parent, "output", ArgumentError)
        save_schedule(schedules[0], out)
        return [str(out)]
    make_directory(out, "output", ArgumentError)
    paths: list[str | None] = []
    for schedule in schedules:
        path = out / f"{safe_name(schedule.name or schedule.collective.name)}-{schedule.content_hash[:8]}.json"
        save_schedule(schedule, path)
        paths.append(str(path))
    return paths


def _compile_and_commit(args: argparse.Namespace, topology: Topology, schedules: list[Schedule]) -> list[dict]:
    if not (args.compile or args.commit):
        return []
    from weft import pipeline

    results = []
    for s, plan in ((one, p) for one in schedules for p in _plans_for(args, topology, one)):
        entry = {"plan": plan.name, "plan_hash": plan.content_hash}
        if args.output:
            path = Path(args.output)
            path = (path.parent if path.suffix == ".json" else path) / f"{safe_name(plan.name)}.plan.json"
            pipeline.save_plan(plan, path)
            entry["plan_file"] = str(path)
        if args.commit:
            from weft import publish

            _progress(f"committing {plan.name}: proving it on the reference executor once more")
            committed = publish.commit(plan, topology, args.registry, schedule=s)
            entry["registry_entry"] = committed.id
            entry["registry"] = publish.registry_location(args.registry)
        results.append(entry)
    return results


def _plans_for(args: argparse.Namespace, topology: Topology, schedule: Schedule) -> list:
    """Verified plans for a schedule. A pareto point's size range is covered whole: where the chosen protocol
    stops short of it (LL plans end at 1 MB), a Simple plan takes the sizes above."""
    from weft import pipeline, publish

    _progress(f"compiling {schedule.name or schedule.collective.name} and proving the plan on the reference executor")
    plan = pipeline.compile_and_verify(schedule, topology, instances=args.instances, protocol=args.protocol)
    if "min_bytes" not in schedule.meta.options:
        return [plan]
    lo, hi = schedule.meta.options["min_bytes"], schedule.meta.options["max_bytes"]

    def narrow(plan, lo: int, hi: int):
        _progress(f"proving {plan.name} for {format_bytes(max(lo, 1))}..{format_bytes(hi) if hi else '∞'}")
        return publish.narrow(plan, lo, hi)

    plans = [narrow(plan, lo, hi)]
    if plan.protocol == "LL" and args.protocol == "auto" and (hi == 0 or hi > plan.max_message_size):
        _progress(f"compiling {schedule.name} as a Simple plan for the sizes above LL's")
        rest = pipeline.compile_and_verify(schedule, topology, instances=args.instances, protocol="simple")
        plans.append(narrow(rest, max(lo, plan.max_message_size + 1), hi))
    return [p for p in plans if p.min_message_size <= p.max_message_size]


def _print_table(topology: Topology, rows, written, plans) -> None:
    print(f"topology {topology.name} ({topology.fingerprint}, {counted(topology.nranks, 'rank')})")
    from weft.units import parse_bytes as size_of

    shown = sorted({n for _, pct in rows for n in pct}, key=size_of) or [format_bytes(n) for n in REPORT_SIZES]
    width = max([len(s.name or s.collective.name) for s, _ in rows] + [len("schedule")])  # names are never cut
    head = f"{'schedule':<{width}} {'steps':>5} {'rounds':>6} {'chunks':>6} " + " ".join(
        f"{n + ' µs':>11} {'%bound':>6}" for n in shown
    )
    print(head)
    for (s, pct), path in zip(rows, written, strict=False):
        cells = " ".join(
            f"{s.meta.predicted_us[n]:>11.2f} {pct[n]:>6.1f}" if n in pct else f"{'-':>11} {'-':>6}" for n in shown
        )
        print(
            f"{(s.name or s.collective.name):<{width}} {s.nsteps:>5} {s.total_rounds:>6} "
            f"{s.collective.chunks:>6} {cells}"
        )
        print(
            f"  verified: {counted(s.nsends, 'send')}, hash {s.content_hash}" + (f", written to {path}" if path else "")
        )
    for p in plans:
        line = f"  plan {p['plan']} ({p['plan_hash']}) verified on the reference executor"
        if "plan_file" in p:
            line += f", written to {p['plan_file']}"
        if "registry_entry" in p:
            line += f", committed as {p['registry_entry']} to {p['registry']}"
        print(line)
