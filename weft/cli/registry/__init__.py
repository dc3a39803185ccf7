"""``weft registry commit|list|show|select|remove|verify|export|import|record|rebuild-index|compact``."""

from __future__ import annotations

import argparse
import json
import sys

from schedules.collectives import NAMES
from weft.cli import progress_after
from weft.cli.words import counted
from weft.units import format_bytes, parse_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "registry",
        help="commit, list and select verified plans",
        description="The plan registry ($WEFT_REGISTRY, otherwise the user data dir; any fsspec URL).",
    )
    rs = p.add_subparsers(dest="registry_command", required=True, parser_class=type(p))

    def cmd(name: str, help: str, func) -> argparse.ArgumentParser:
        q = rs.add_parser(name, help=help, description=help)
        q.add_argument("--registry", help="registry location (path or fsspec URL)")
        q.set_defaults(func=func)
        return q

    q = cmd("commit", "verify a plan on the reference executor and commit it", _commit)
    q.add_argument("plan", help="plan file (MSCCL++ execution-plan JSON)")
    q.add_argument("-t", "--topology", help="topology the plan is for (default: the fingerprint in the plan)")
    q.add_argument("--json", action="store_true")
    q = cmd("list", "list entries", _list)
    q.add_argument("--topology", help="only entries for this topology (spec, file or fingerprint)")
    q.add_argument("--collective", choices=NAMES)
    q.add_argument("--json", action="store_true")
    q = cmd("show", "show one entry", _show)
    q.add_argument("id", help="the entry's id, or the name of the plan it holds (as select and synth print it)")
    q = cmd("select", "the best plan for a topology, collective and size", _select)
    q.add_argument("collective", choices=NAMES)
    q.add_argument("-t", "--topology", required=True)
    q.add_argument("--size", required=True, help="message size, e.g. 4MB")
    q.add_argument("--dtype", choices=("fp32", "fp16", "bf16"))
    q.add_argument(
        "--ll128",
        action="store_true",
        help="for an executor that can move LL packets as LL128 lines: their measured times count too",
    )
    q.add_argument(
        "--compiled",
        action="store_true",
        help="for an executor that can run a plan as its own compiled kernel (the GPU interpreter's Communicator): "
        "the times measured so count too",
    )
    q.add_argument("--json", action="store_true")
    q = cmd("remove", "remove an entry", _remove)
    q.add_argument("id", help="the entry's id, or the name of the plan it holds")
    q = cmd("verify", "re-check every entry on the reference executor", _verify)
    q.add_argument("--json", action="store_true")
    q = cmd(
        "export",
        "write every entry (plan, provenance, timings) as ID.json, and NCCL's times as "
        "baselines.json, into a directory (exit 1 naming any entry skipped as unreadable)",
        _export,
    )
    q.add_argument("directory")
    q = cmd("import", "verify and commit every plan file in a directory", _import)
    q.add_argument("directory")
    q = cmd(
        "record",
        "store the times of `weft bench` results files: each plan's, and NCCL's (selection then runs "
        "NCCL where it measured faster than every plan); of bench/norm_peers.py's, the fused all-reduce + "
        "RMSNorm call's per plan (norm.json: selection for that call then ranks by them)",
        _record,
    )
    q.add_argument("results", nargs="+", help="JSON written by `weft bench` or bench/norm_peers.py (bench/results/...)")
    cmd("rebuild-index", "rebuild index.json from the entry files (exit 1 naming any left out as unreadable)", _rebuild)
    cmd(
        "compact",
        "rewrite entry files of the older, plain form (weft.registry-entry/1) in the compact form weft writes "
        "(/2: the plan's ops compressed); ids, plans and timings stay (exit 1 naming any entry left as unreadable)",
        _compact,
    )


def _registry(args: argparse.Namespace):
    from registry.store import Registry

    return Registry(args.registry)


def _fingerprint(spec: str) -> tuple[str, ...]:
    """Every fingerprint the fabric ``spec`` answers to (``Topology.fingerprints``)."""
    if spec.startswith("topo-"):
        return (spec,)
    from topologies import resolve

    return resolve(spec).fingerprints


def _range(entry) -> str:
    from schedules.plan.types import MAX_MESSAGE_SIZE

    hi = "∞" if entry.key.max_bytes in (0, MAX_MESSAGE_SIZE) else format_bytes(entry.key.max_bytes)
    return f"{format_bytes(entry.key.min_bytes)}..{hi}"


def accepted_sizes(entry) -> str:
    """The message sizes an entry's plan runs, as the plan defines them: its range, the parts a size must be a
    whole number of (one per rank where the collective moves slices), and the granule that the sizes it runs
    directly are multiples of (others run padded to it): the one place that reads this from Plan."""
    plan = entry.plan
    parts = f", {plan.message_parts} parts" if plan.message_parts > 1 else ""
    return f"{_range(entry)}{parts}, granule {format_bytes(plan.granule)}"


def sizes_sentence(entry) -> str:
    """``accepted_sizes`` as a sentence, for `show`."""
    plan = entry.plan
    parts = (
        f" that is a whole number of {plan.message_parts} equal parts (one per rank)" if plan.message_parts > 1 else ""
    )
    return (
        f"runs any size in {_range(entry)}{parts}: multiples of {format_bytes(plan.granule)} directly, "
        f"others padded to the next multiple (each part staged at its padded place)"
    )


def best_time(entry) -> tuple[str, float | None, int | None]:
    """(basis, µs, bytes): the entry's fastest measured time (in any mode: LL128 lines, compiled), else its fastest
    predicted time, among the sizes it serves (its range's smallest size, and the recorded sizes inside the
    range); ("none", None, None) where it has neither."""
    from registry.index import interpolate

    for basis, tables in (
        ("measured", tuple(entry.measured_tables().values())),
        ("predicted", (entry.predicted_us,)),
    ):
        points = [(us, size) for table in tables for size, us in table.items() if entry.key.covers(size)]
        points += [
            (interpolate(table, entry.key.min_bytes), entry.key.min_bytes)
            for table in tables
            if table and entry.key.min_bytes > 0
        ]
        if points:
            us, size = min(points)
            return basis, us, size
    return "none", None, None


def prediction_note(entry, name: str | None = None) -> str:
    """What an entry's predicted times rest on, in a few words: the fabric's calibration, or the α-β model of the
    links where the fabric was never measured (or the entry was predicted before it was)."""
    from schedules.calibration import load_calibration

    if str(entry.provenance.get("prediction", "")).startswith("calibrated"):
        return "calibrated to measurements on this fabric"
    name = entry.provenance.get("topology_name") or name or entry.key.topology
    calibration = load_calibration(entry.key.topology)
    if calibration is None:
        return f"fabric {name} never measured: α-β model of its links only"
    if entry.plan.protocol not in calibration.protocols:
        return f"α-β model of the links only: {name} was calibrated without {entry.plan.protocol} plans"
    return f"α-β model of the links only, predicted before {name} was calibrated (commit again to calibrate)"


def plan_label(entry) -> str:
    """protocol, instances and threads per block: what tells two plans of one schedule apart."""
    plan = entry.plan
    return f"{plan.protocol.lower()}-x{plan.weft.instances}-t{plan.num_threads_per_block}"


def describe(entry, names: dict[str, str] | None = None) -> dict:
    """What `list --json` and `show` say about an entry, beyond its index row (``names``: a name for each
    fingerprint that some entry gives, for entries committed by fingerprint alone)."""
    basis, us, size = best_time(entry)
    named = entry.provenance.get("topology_name") or (names or {}).get(entry.key.topology) or entry.key.topology
    return entry.summary() | {
        "prediction": prediction_note(entry, named) if entry.predicted_us else "",
        "topology_name": named,
        "plan_label": plan_label(entry),
        "accepts": accepted_sizes(entry),
        "granule_bytes": entry.plan.granule,
        "message_parts": entry.plan.message_parts,
        "best_basis": basis,
        "best_us": us,
        "best_at_bytes": size,
    }


def _best_text(row: dict) -> str:
    if row["best_us"] is None:
        return "no time"
    note = f" ({row['prediction']})" if row["best_basis"] == "predicted" and row["prediction"] else ""
    return f"{row['best_us']:.2f} µs {row['best_basis']} at {format_bytes(row['best_at_bytes'])}{note}"


def fabric_names(entries) -> dict[str, str]:
    """A name for each fingerprint: one that some entry records (the first by id), else the catalog default whose
    fingerprint it is, so that one fabric is listed once (not as dgx1 and as topo-...)."""
    from topologies.catalog import build, catalog_specs

    names: dict[str, str] = {}
    for e in sorted(entries, key=lambda e: e.id):
        if e.provenance.get("topology_name"):
            names.setdefault(e.key.topology, e.provenance["topology_name"])
    if any(e.key.topology not in names for e in entries):
        for spec in catalog_specs():
            names.setdefault(build(spec).fingerprint, spec)
    return names


def _commit(args: argparse.Namespace) -> int:
    from weft import publish

    entry = publish.commit_file(args.plan, args.topology, args.registry, progress_after())
    if args.json:
        print(json.dumps(entry.summary(), indent=2))
    else:
        print(
            f"committed {entry.id} ({entry.key.collective}, {counted(entry.key.nranks, 'rank')}, {_range(entry)}) "
            f"to {publish.registry_location(args.registry)}"
        )
    return 0


def _list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    found, bad = reg.load()
    for line in bad:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    fingerprint = _fingerprint(args.topology) if args.topology else None
    entries = [
        e
        for e in found
        if (fingerprint is None or e.key.topology in fingerprint)
        and (args.collective is None or e.key.collective == args.collective)
    ]
    names = fabric_names(found)
    rows = [describe(e, names) for e in entries]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max([len(r["topology_name"]) for r in rows] + [8])
    print(
        f"{'id':<34} {'collective':<13} {'ranks':>5} {'topology':<{width}} {'plan':<18} {'solver':<8} "
        f"{'sizes':<32} best time"
    )
    for r in rows:
        print(
            f"{r['id']:<34} {r['collective']:<13} {r['nranks']:>5} {r['topology_name']:<{width}} "
            f"{r['plan_label']:<18} {r['solver']:<8} {r['accepts']:<32} {_best_text(r)}"
        )
    print(f"{counted(len(entries), 'entry', 'entries')} in {reg.location}")
    return 0


def _entry_id(reg, text: str) -> str:
    """An entry's id from its id or from the name of the one plan it holds (a name several entries share is
    refused, naming them). Names come from index.json where it still describes the entries, else from the
    entries themselves (a damaged index is a warning, never a refusal)."""
    from registry.store import ID_PATTERN

    if ID_PATTERN.fullmatch(text) and reg.exists(reg.entry_path(text)):
        return text
    scan = reg.rows()
    for line in scan.warnings:
        print(f"weft: warning: {line}", file=sys.stderr)
    named = sorted(row.id for row in scan.rows if row.plan == text)
    if len(named) > 1:
        from weft.cli import ArgumentError

        raise ArgumentError(
            f"weft registry: plan {text!r} is in {counted(len(named), 'entry', 'entries')} "
            f"({', '.join(named)}): give the id"
        )
    return named[0] if named else text  # an unknown id: get() and remove() name it


def _show(args: argparse.Namespace) -> int:
    reg = _registry(args)
    entry = reg.get(_entry_id(reg, args.id))
    doc = entry.to_json()
    doc["plan"] = {k: v for k, v in doc["plan"].items() if k != "gpus"} | {"gpus": counted(len(entry.plan.gpus), "gpu")}
    row = describe(entry)
    print(
        f"{entry.id}: {entry.key.collective} on {counted(entry.key.nranks, 'rank')} of {row['topology_name']}, plan "
        f"{entry.plan.name} ({row['plan_label']}), sizes {row['accepts']}, best {_best_text(row)}"
    )
    print(f"sizes: {sizes_sentence(entry)}")
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


def _select(args: argparse.Namespace) -> int:
    from registry.index import Mode
    from weft import publish

    nbytes = parse_bytes(args.size)
    sel = publish.select(
        args.registry, args.topology, args.collective, nbytes, args.dtype, args.ll128, progress_after(), args.compiled
    )
    for line in sel.skipped:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    for line in sel.warnings:
        print(f"weft: warning: {line}", file=sys.stderr)
    for line in sel.refused:
        print(f"weft: warning: refused {line}", file=sys.stderr)
    if args.json:
        note = prediction_note(sel.entry, args.topology) if sel.entry is not None and sel.basis == "predicted" else ""
        print(
            json.dumps(
                {
                    "entry": sel.entry.id if sel.entry else None,
                    "basis": sel.basis,
                    "time_us": sel.time_us,
                    "lines": sel.lines,
                    "compiled": sel.compiled,
                    "reason": sel.reason,
                    "prediction": note,
                },
                indent=2,
            )
        )
    elif sel.entry is None and sel.basis == "nccl":  # the library's line names bytes; here, the size as typed
        size = args.size if args.size == format_bytes(nbytes) else f"{args.size} ({format_bytes(nbytes)})"
        print(
            f"no plan: {sel.reason.replace(f' at {nbytes} bytes ', f' at {size} ', 1)} "
            "(the executor falls back to NCCL)"
        )
    elif sel.entry is None:
        print(f"no plan: {no_plan(args, nbytes, sel)} (the executor falls back to NCCL)")
    else:
        time = "(no time recorded)" if sel.time_us is None else f"{sel.time_us:.2f} µs"
        table = sel.entry.predicted_us if sel.basis == "predicted" else sel.entry.measured_us
        where = between(table, nbytes)
        if sel.basis == "predicted":
            note = f" ({prediction_note(sel.entry, args.topology)}{where})"
        else:
            note = f" ({where[2:]})" if where and not (sel.lines or sel.compiled) else ""
        print(
            f"{sel.entry.id}  {sel.entry.plan.name}{Mode(sel.lines, sel.compiled).suffix}  {sel.basis} "
            f"{time} at {format_bytes(nbytes)}{note}"
        )
    return 0 if sel.entry else 1


def between(table: dict[int, float], nbytes: int) -> str:
    """'' where ``table`` holds ``nbytes``, else which of its sizes the time was read between (or beyond)."""
    if not table or nbytes in table:
        return ""
    below, above = [n for n in table if n < nbytes], [n for n in table if n > nbytes]
    if below and above:
        return f"; interpolated between {format_bytes(max(below))} and {format_bytes(min(above))}"
    edge = max(below) if below else min(above)
    return f"; from {format_bytes(edge)}, the {'largest' if below else 'smallest'} size stored"


def no_plan(args: argparse.Namespace, nbytes: int, sel) -> str:
    """Why no plan serves, in what the user typed (the fabric as given, the size as given), with the nearest useful
    thing the registry holds: the same collective on another fabric of the same rank count."""
    dtype = f" in {args.dtype}" if args.dtype else ""
    why = f" ({sel.detail})" if sel.detail else ""
    refused = f" (refused: {counted(len(sel.refused), 'plan')}, named above)" if sel.refused else ""
    size = args.size if args.size == format_bytes(nbytes) else f"{args.size} ({format_bytes(nbytes)})"
    text = f"no {args.collective} plan for {args.topology} at {size}{dtype}{why}{refused}"
    if sel.nearest:
        shown = ", ".join(f"{name or fp} ({fp}, {counted(n, 'rank')})" for fp, name, n in sel.nearest[:3])
        text += (
            f"; the registry holds {args.collective} plans for {shown}: is that the fabric you meant? "
            "(`weft registry list` shows them)"
        )
    return text


def _remove(args: argparse.Namespace) -> int:
    reg = _registry(args)
    id = _entry_id(reg, args.id)
    reg.remove(id)
    print(f"removed {id}" + ("" if id == args.id else f" ({args.id})"))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from weft import publish

    report = publish.verify_registry(args.registry, progress_after())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for row in report["entries"]:
            print(f"{'ok ' if row['ok'] else 'BAD'} {row['id']}" + ("" if row["ok"] else f": {row['error']}"))
        for name in report["orphans"]:
            print(f"BAD orphaned temporary file {name} (a commit killed before its rename)")
        for line in report["index"]:
            print(f"BAD {line}")
        repair = (
            " (`weft registry rebuild-index` repairs the index and orphans)"
            if report["orphans"] or report["index"]
            else ""
        )
        print(
            f"{report['ok']} ok, {report['bad']} bad, {counted(len(report['orphans']), 'orphaned file')}, "
            f"{counted(len(report['index']), 'index problem')}{repair}"
        )
    return 0 if report["bad"] == 0 and not report["orphans"] and not report["index"] else 1


def _export(args: argparse.Namespace) -> int:
    from weft import publish

    count, bad, warnings = publish.export_directory(args.directory, args.registry)
    for line in bad:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    for line in warnings:
        print(f"weft: warning: {line}", file=sys.stderr)
    print(
        f"exported {counted(count, 'entry', 'entries')} to {args.directory}"
        + (f", {len(bad)} unreadable skipped" if bad else "")
    )
    return 1 if bad else 0


def _import(args: argparse.Namespace) -> int:
    from weft import publish

    entries = publish.import_directory(args.directory, args.registry, progress_after())
    print(f"imported {counted(len(entries), 'entry', 'entries')} into {publish.registry_location(args.registry)}")
    return 0


def _record(args: argparse.Namespace) -> int:
    from weft import publish

    for path in args.results:
        done = publish.record_results_file(path, args.registry)  # norm_peers.py's fused-call times: norm.json
        into = f"at {counted(done.sizes, 'size')} recorded into {publish.registry_location(args.registry)}"
        if done.fused:
            print(f"{path}: {counted(done.stored, 'fused-call time')} {into} (norm.json)")
        else:
            cut = done.planned is not None
            print(
                f"{path}: {counted(done.stored, 'plan time')} and NCCL's {into}"
                + (f" (its job stopped after {done.sizes} of the {done.planned} sizes it planned)" if cut else "")
            )
        if done.skipped:
            print(
                f"{path}: skipped {counted(len(done.skipped), 'plan')} not in the registry: {', '.join(done.skipped)}"
            )
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    reg = _registry(args)
    orphans = reg.orphans()
    index, bad = reg.rebuild_index()
    for line in bad:
        print(f"weft: warning: left out {line}", file=sys.stderr)
    print(
        f"index rebuilt: {counted(len(index['entries']), 'entry', 'entries')}"
        + (f", {counted(len(orphans), 'orphaned temporary file')} removed" if orphans else "")
        + (f", {len(bad)} unreadable left out" if bad else "")
    )
    return 1 if bad else 0


def _compact(args: argparse.Namespace) -> int:
    done = _registry(args).compact()
    for line in done.bad:
        print(f"weft: warning: left as it is: {line}", file=sys.stderr)
    print(
        f"compacted {done.rewritten} of {counted(done.entries, 'entry', 'entries')}: entry files "
        f"{done.bytes_before / 1e6:.2f} MB -> {done.bytes_after / 1e6:.2f} MB"
        + (f", {len(done.bad)} unreadable left as they are" if done.bad else "")
    )
    return 1 if done.bad else 0
