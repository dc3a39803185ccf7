"""``weft topo list|show|validate|export``: the topology catalog and topology files.

Other modules add sub-commands under ``weft topo`` (``weft.cli.topo.bound``, ``weft.cli.topo.detect``): each
exposes ``register(topo_subparsers)`` and is picked up here when it is importable.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from topologies import Topology, TopologyError, load_topology, resolve, save_topology
from topologies.catalog import entries
from weft.cli.words import counted

EXTRA_COMMANDS = ("weft.cli.topo.bound", "weft.cli.topo.detect", "weft.cli.topo.calibrate")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "topo",
        help="list, show, validate and export topologies",
        description="The topology catalog and weft.topology/1 files. TOPO is a catalog spec "
        "(dgx1, hgx_h100:nodes=2,gpus=4) or a topology file.",
    )
    topo_sub = p.add_subparsers(dest="topo_command", required=True, metavar="COMMAND")

    q = topo_sub.add_parser("list", help="the catalog: names, parameters, descriptions")
    q.add_argument("--json", action="store_true", help="print the catalog as JSON")
    q.set_defaults(func=run_list)

    q = topo_sub.add_parser("show", help="summarize a topology: ranks, hosts, switches, links by kind")
    q.add_argument("topology", metavar="TOPO", help="catalog spec or topology file")
    q.add_argument("--json", action="store_true", help="print the topology file (weft.topology/1)")
    q.set_defaults(func=run_show)

    q = topo_sub.add_parser("validate", help="check a topology file; print its fingerprint")
    q.add_argument("file", metavar="FILE", help="a weft.topology/1 file")
    q.set_defaults(func=run_validate)

    q = topo_sub.add_parser("export", help="write a topology as a weft.topology/1 file")
    q.add_argument("topology", metavar="TOPO", help="catalog spec or topology file")
    q.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    q.set_defaults(func=run_export)

    for name in EXTRA_COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue  # that command is not part of this build
        module.register(topo_sub)


def run_list(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = [
        {
            "name": e.name,
            "aliases": list(e.aliases),
            "params": {
                p.name: {"default": p.default, "min": p.minimum, "max": p.maximum, "help": p.help} for p in e.params
            },
            "description": e.description,
        }
        for e in entries()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        params = ",".join(f"{k}={v['default']}" for k, v in r["params"].items())
        aliases = f" (also: {', '.join(r['aliases'])})" if r["aliases"] else ""
        print(f"{r['name']:<{width}}  {params:<16}  {r['description']}{aliases}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    topology = resolve(args.topology)
    if args.json:
        print(json.dumps(topology.to_json(), indent=2))
        return 0
    for line in summary(topology):
        print(line)
    return 0


def summary(topology: Topology) -> list[str]:
    """The lines ``weft topo show`` prints: identity, then links grouped by kind and figures."""
    lines = [f"topology {topology.name} ({topology.fingerprint})"]
    if topology.description:
        lines.append(f"  {topology.description}")
    lines.append(f"ranks     {topology.nranks} on {counted(topology.nhosts, 'host')}")
    if topology.switches:
        lines.append(f"switches  {len(topology.switches)}: {_abbreviated(topology.switches)}")
    lines.append(f"links     {len(topology.links)} (unit bandwidth {topology.unit_bandwidth:g} GB/s)")
    groups = Counter((_kind(link.src, link.dst), link.count, link.bandwidth, link.latency) for link in topology.links)
    for (kind, count, bandwidth, latency), n in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1] * kv[0][2])):
        lanes = f"{count} × {bandwidth:g} GB/s = {count * bandwidth:g} GB/s" if count > 1 else f"{bandwidth:g} GB/s"
        lines.append(f"  {n:>5} {kind:<14} {lanes:<32} {latency:g} µs")
    if topology.sharing:
        lines.append(f"sharing   {counted(len(topology.sharing), 'group')}")
    return lines


def _kind(src: object, dst: object) -> str:
    return f"{_side(src)}->{_side(dst)}"


def _side(vertex: object) -> str:
    return "rank" if isinstance(vertex, int) else "switch"


def _abbreviated(names: tuple[str, ...], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names) - limit} more)"


def run_validate(args: argparse.Namespace) -> int:
    topology = load_topology(args.file)
    print(
        f"ok {args.file}: {topology.name}, {counted(topology.nranks, 'rank')}, "
        f"{counted(len(topology.links), 'link')}, "
        f"{topology.fingerprint}"
    )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from weftcore.jsonfile import check_output

    check_output(args.output, "output", TopologyError)
    topology = resolve(args.topology)
    out = Path(args.output)
    save_topology(topology, out)
    print(f"wrote {out}: {topology.name}, {counted(topology.nranks, 'rank')}, {topology.fingerprint}")
    return 0
