"""``weft registry commit|list|show|select|remove|verify|export|import|rebuild-index``."""

from __future__ import annotations

import argparse
import json
import sys

from schedules.collectives import NAMES
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
    q.add_argument("id")
    q = cmd("select", "the best plan for a topology, collective and size", _select)
    q.add_argument("collective", choices=NAMES)
    q.add_argument("-t", "--topology", required=True)
    q.add_argument("--size", required=True, help="message size, e.g. 4MB")
    q.add_argument("--dtype", choices=("fp32", "fp16", "bf16"))
    q.add_argument("--ll128", action="store_true",
                   help="for an executor that can move LL packets as LL128 lines: their measured times count too")
    q.add_argument("--json", action="store_true")
    q = cmd("remove", "remove an entry", _remove)
    q.add_argument("id")
    q = cmd("verify", "re-check every entry on the reference executor", _verify)
    q.add_argument("--json", action="store_true")
    q = cmd("export", "write every entry (plan, provenance, timings) as ID.json into a directory", _export)
    q.add_argument("directory")
    q = cmd("import", "verify and commit every plan file in a directory", _import)
    q.add_argument("directory")
    q = cmd("record", "store the times of `weft bench` results files: each plan's, and NCCL's (selection then runs "
                      "NCCL where it measured faster than every plan)", _record)
    q.add_argument("results", nargs="+", help="JSON written by `weft bench` (bench/results/...)")
    cmd("rebuild-index", "rebuild index.json from the entry files", _rebuild)


def _registry(args: argparse.Namespace):
    from schedules.registry import Registry

    return Registry(args.registry)


def _fingerprint(spec: str) -> str:
    if spec.startswith("topo-"):
        return spec
    from topologies import resolve

    return resolve(spec).fingerprint


def _range(entry) -> str:
    from schedules.plan import MAX_MESSAGE_SIZE

    hi = "∞" if entry.key.max_bytes in (0, MAX_MESSAGE_SIZE) else format_bytes(entry.key.max_bytes)
    return f"{format_bytes(entry.key.min_bytes)}..{hi}"


def _commit(args: argparse.Namespace) -> int:
    from weft import publish

    entry = publish.commit_file(args.plan, args.topology, args.registry)
    if args.json:
        print(json.dumps(entry.summary(), indent=2))
    else:
        print(f"committed {entry.id} ({entry.key.collective}, {entry.key.nranks} ranks, {_range(entry)}) "
              f"to {publish.registry_location(args.registry)}")
    return 0


def _list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    found, bad = reg.load()
    for line in bad:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    fingerprint = _fingerprint(args.topology) if args.topology else None
    entries = [e for e in found if (fingerprint is None or e.key.topology == fingerprint)
               and (args.collective is None or e.key.collective == args.collective)]
    if args.json:
        print(json.dumps([e.summary() for e in entries], indent=2))
        return 0
    print(f"{'id':<34} {'collective':<13} {'ranks':>5} {'sizes':<16} {'solver':<10} {'topology':<22} measured")
    for e in entries:
        print(f"{e.id:<34} {e.key.collective:<13} {e.key.nranks:>5} {_range(e):<16} "
              f"{str(e.provenance.get('solver', '')):<10} {e.key.topology:<22} {'yes' if e.measured_us else 'no'}")
    print(f"{len(entries)} entries in {reg.location}")
    return 0


def _show(args: argparse.Namespace) -> int:
    entry = _registry(args).get(args.id)
    doc = entry.to_json()
    doc["plan"] = {k: v for k, v in doc["plan"].items() if k != "gpus"} | {"gpus": f"{len(entry.plan.gpus)} gpus"}
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


def _select(args: argparse.Namespace) -> int:
    nbytes = parse_bytes(args.size)
    sel = _registry(args).select(_fingerprint(args.topology), args.collective, nbytes, args.dtype, ll128=args.ll128)
    for line in sel.skipped:
        print(f"weft: warning: skipped {line}", file=sys.stderr)
    if args.json:
        print(json.dumps({"entry": sel.entry.id if sel.entry else None, "basis": sel.basis, "time_us": sel.time_us,
                          "lines": sel.lines, "reason": sel.reason}, indent=2))
    elif sel.entry is None:
        print(f"no plan: {sel.reason} (the executor falls back to NCCL)")
    else:
        time = "(no time recorded)" if sel.time_us is None else f"{sel.time_us:.2f} µs"
        print(f"{sel.entry.id}  {sel.entry.plan.name}{'+ll128' if sel.lines else ''}  {sel.basis} "
              f"{time} at {format_bytes(nbytes)}")
    return 0 if sel.entry else 1


def _remove(args: argparse.Namespace) -> int:
    _registry(args).remove(args.id)
    print(f"removed {args.id}")
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
    from schedules.registry import RegistryError, dumps
    from topologies.jsonfile import make_directory, write_text

    entries = _registry(args).entries()
    out = make_directory(args.directory, "registry export", RegistryError)
    for e in entries:
        write_text(out / f"{e.id}.json", dumps(e.to_json()), "registry export", RegistryError)
    print(f"exported {len(entries)} entries to {out}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from weft import publish

    entries = publish.import_directory(args.directory, args.registry)
    print(f"imported {len(entries)} entries into {publish.registry_location(args.registry)}")
    return 0


def _record(args: argparse.Namespace) -> int:
    from weft import publish

    for path in args.results:
        stored, sizes = publish.record_bench_file(path, args.registry)
        print(f"{path}: {stored} plan times and NCCL's at {sizes} sizes recorded into "
              f"{publish.registry_location(args.registry)}")
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    index = _registry(args).rebuild_index()
    print(f"index rebuilt: {len(index['entries'])} entries")
    return 0
