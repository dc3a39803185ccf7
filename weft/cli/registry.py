"""``weft registry commit|list|show|select|remove|verify|export|import|rebuild-index``."""

from __future__ import annotations

import argparse
import json
import sys

from schedules.collectives import NAMES
from weft.cli.words import counted
from weft.units import format_bytes, parse_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("registry", help="commit, list and select verified plans",
                       description="The plan registry ($WEFT_REGISTRY, otherwise the user data dir; any fsspec URL).")
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
    q.add_argument("--ll128", action="store_true",
                   help="for an executor that can move LL packets as LL128 lines: their measured times count too")
    q.add_argument("--json", action="store_true")
    q = cmd("remove", "remove an entry", _remove)
    q.add_argument("id", help="the entry's id, or the name of the plan it holds")
    q = cmd("verify", "re-check every entry on the reference executor", _verify)
    q.add_argument("--json", action="store_true")
    q = cmd("export", "write every entry (plan, provenance, timings) as ID.json, and NCCL's times as "
                      "baselines.json, into a directory (exit 1 naming any entry skipped as unreadable)", _export)
    q.add_argument("directory")
    q = cmd("import", "verify and commit every plan file in a directory", _import)
    q.add_argument("directory")
    q = cmd("record", "store the times of `weft bench` results files: each plan's, and NCCL's (selection then runs "
                      "NCCL where it measured faster than every plan)", _record)
    q.add_argument("results", nargs="+", help="JSON written by `weft bench` (bench/results/...)")
    cmd("rebuild-index", "rebuild index.json from the entry files (exit 1 naming any left out as unreadable)",
        _rebuild)


def _registry(args: argparse.Namespace):
    from schedules.registry import Registry

    return Registry(args.registry)


def _fingerprint(spec: str) -> tuple[str, ...]:
    """Every fingerprint the fabric ``spec`` answers to (``Topology.fingerprints``)."""
    if spec.startswith("topo-"):
        return (spec,)
    from topologies import resolve

    return resolve(spec).fingerprints


def _range(entry) -> str:
    from schedules.plan import MAX_MESSAGE_SIZE

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
    parts = (f" that is a whole number of {plan.message_parts} equal parts (one per rank)"
             if plan.message_parts > 1 else "")
    return (f"runs any size in {_range(entry)}{parts}: multiples of {format_bytes(plan.granule)} directly, "
            f"others padded to the next multiple (each part staged at its padded place)")


def best_time(entry) -> tuple[str, float | None, int | None]:
    """(basis, µs, bytes): the entry's fastest measured time (with or without LL128 lines), else its fastest
    predicted time; ("none", None, None) where it has neither."""
    for basis, tables in (("measured", (entry.measured_us, entry.measured_ll128_us)), ("predicted",
                                                                                    (entry.predicted_us,))):
        points = [(us, size) for table in tables for size, us in table.items()]
        if points:
            us, size = min(points)
            return basis, us, size
    return "none", None, None


def prediction_note(entry) -> str:
    """What an entry's predicted times rest on, in a few words: the fabric's calibration, or the α-β model of the
    links where the fabric was never measured (or the entry was predicted before it was)."""
    from schedules.calibration import load_calibration

    if str(entry.provenance.get("prediction", "")).startswith("calibrated"):
        return "calibrated to measurements on this fabric"
    name = entry.provenance.get("topology_name") or entry.key.topology
    if load_calibration(entry.key.topology) is None:
        return f"fabric {name} never measured: α-β model of its links only"
    return f"α-β model of the links only, predicted before {name} was calibrated (commit again to calibrate)"


def plan_label(entry) -> str:
    """protocol, instances and threads per block: what tells two plans of one schedule apart."""
    plan = entry.plan
    return f"{plan.protocol.lower()}-x{plan.weft.instances}-t{plan.num_threads_per_block}"


def describe(entry) -> dict:
    """What `list --json` and `show` say about an entry, beyond its index row."""
    basis, us, size = best_time(entry)
    return entry.summary() | {"prediction": prediction_note(entry) if entry.predicted_us else "",
                              "topology_name": entry.provenance.get("topology_name") or entry.key.topology,
                              "plan_label": plan_label(entry), "accepts": accepted_sizes(entry),
                              "granule_bytes": entry.plan.granule, "message_parts": entry.plan.message_parts,
                              "best_basis": basis, "best_us": us, "best_at_bytes": size}


def _best_text(row: dict) -> str:
    if row["best_us"] is None:
        return "no time"
    note = f" ({row['prediction']})" if row["best_basis"] == "predicted" and row["prediction"] else ""
    return f"{row['best_us']:.2f} µs {row['best_basis']} at {format_bytes(row['best_at_bytes'])}{note}"


def _commit(args: argparse.Namespace) -> int:
    from weft import publish

    entry = publish.commit_file(args.plan, args.topology, args.registry)
    if args.json:
        print(json.dumps(entry.summary(), indent=2))
    else:
        print(f"committed {entry.id} ({entry.key.collective}, {counted(entry.key.nranks, 'rank')}, {_range(entry)}) "
              f"to {publish.registry_location(args.registry)}")
    return 0


def _list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    found, bad = reg.load()
    for line in bad:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    fingerprint = _fingerprint(args.topology) if args.topology else None
    entries = [e for e in found if (fingerprint is None or e.key.topology in fingerprint)
               and (args.collective is None or e.key.collective == args.collective)]
    rows = [describe(e) for e in entries]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max([len(r["topology_name"]) for r in rows] + [8])
    print(f"{'id':<34} {'collective':<13} {'ranks':>5} {'topology':<{width}} {'plan':<18} {'solver':<8} "
          f"{'sizes':<32} best time")
    for r in rows:
        print(f"{r['id']:<34} {r['collective']:<13} {r['nranks']:>5} {r['topology_name']:<{width}} "
              f"{r['plan_label']:<18} {r['solver']:<8} {r['accepts']:<32} {_best_text(r)}")
    print(f"{counted(len(entries), 'entry', 'entries')} in {reg.location}")
    return 0


def _entry_id(reg, text: str) -> str:
    """An entry's id from its id or from the name of the one plan it holds (a name several entries share is
    refused, naming them)."""
    from schedules.registry import ID_PATTERN

    if ID_PATTERN.fullmatch(text) and reg.fs.exists(reg.entry_path(text)):
        return text
    named = sorted(row["id"] for row in reg.index()["entries"] if row["plan"] == text)  # the index, not every entry
    if len(named) > 1:
        from weft.cli import ArgumentError

        raise ArgumentError(f"weft registry: plan {text!r} is in {counted(len(named), 'entry', 'entries')} "
                            f"({', '.join(named)}): give the id")
    return named[0] if named else text  # an unknown id: get() and remove() name it


def _show(args: argparse.Namespace) -> int:
    reg = _registry(args)
    entry = reg.get(_entry_id(reg, args.id))
    doc = entry.to_json()
    doc["plan"] = {k: v for k, v in doc["plan"].items() if k != "gpus"} | {"gpus": counted(len(entry.plan.gpus), "gpu")}
    row = describe(entry)
    print(f"{entry.id}: {entry.key.collective} on {counted(entry.key.nranks, 'rank')} of {row['topology_name']}, plan "
          f"{entry.plan.name} ({row['plan_label']}), sizes {row['accepts']}, best {_best_text(row)}")
    print(f"sizes: {sizes_sentence(entry)}")
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


def _select(args: argparse.Namespace) -> int:
    nbytes = parse_bytes(args.size)
    sel = _registry(args).select(_fingerprint(args.topology), args.collective, nbytes, args.dtype, ll128=args.ll128)
    for line in sel.skipped:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    if args.json:
        note = prediction_note(sel.entry) if sel.entry is not None and sel.basis == "predicted" else ""
        print(json.dumps({"entry": sel.entry.id if sel.entry else None, "basis": sel.basis, "time_us": sel.time_us,
                          "lines": sel.lines, "reason": sel.reason, "prediction": note}, indent=2))
    elif sel.entry is None:
        print(f"no plan: {sel.reason} (the executor falls back to NCCL)")
    else:
        time = "(no time recorded)" if sel.time_us is None else f"{sel.time_us:.2f} µs"
        note = f" ({prediction_note(sel.entry)})" if sel.basis == "predicted" else ""
        print(f"{sel.entry.id}  {sel.entry.plan.name}{'+ll128' if sel.lines else ''}  {sel.basis} "
              f"{time} at {format_bytes(nbytes)}{note}")
    return 0 if sel.entry else 1


def _remove(args: argparse.Namespace) -> int:
    reg = _registry(args)
    id = _entry_id(reg, args.id)
    reg.remove(id)
    print(f"removed {id}" + ("" if id == args.id else f" ({args.id})"))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from weft import publish

    report = publish.verify_registry(args.registry)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for row in report["entries"]:
            print(f"{'ok ' if row['ok'] else 'BAD'} {row['id']}" + ("" if row["ok"] else f": {row['error']}"))
        print(f"{report['ok']} ok, {report['bad']} bad")
    return 0 if report["bad"] == 0 else 1


def _export(args: argparse.Namespace) -> int:
    from weft import publish

    count, bad = publish.export_directory(args.directory, args.registry)
    for line in bad:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    print(f"exported {counted(count, 'entry', 'entries')} to {args.directory}"
          + (f", {len(bad)} unreadable skipped" if bad else ""))
    return 1 if bad else 0


def _import(args: argparse.Namespace) -> int:
    from weft import publish

    entries = publish.import_directory(args.directory, args.registry)
    print(f"imported {counted(len(entries), 'entry', 'entries')} into {publish.registry_location(args.registry)}")
    return 0


def _record(args: argparse.Namespace) -> int:
    from weft import publish

    for path in args.results:
        stored, sizes = publish.record_bench_file(path, args.registry)
        print(f"{path}: {counted(stored, 'plan time')} and NCCL's at {counted(sizes, 'size')} recorded into "
              f"{publish.registry_location(args.registry)}")
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    index, bad = _registry(args).rebuild_index()
    for line in bad:
        print(f"weft: warning: left out {line}", file=sys.stderr)
    print(f"index rebuilt: {counted(len(index['entries']), 'entry', 'entries')}"
          + (f", {len(bad)} unreadable left out" if bad else ""))
    return 1 if bad else 0
