"""``weft topo detect``: this machine's topology through NVML."""

from __future__ import annotations

import argparse
import json


def register(topo_sub: argparse._SubParsersAction) -> None:
    q = topo_sub.add_parser(
        "detect",
        help="build this machine's topology through NVML",
        description="Build this machine's topology from NVML (NVLink lanes and PCIe). A board "
        "the catalog knows gets the catalog's topology and fingerprint.",
    )
    q.add_argument("--facts", help="replay recorded NVML answers (weft.nvml-facts/1) instead of asking NVML")
    q.add_argument("--record", help="also write the NVML answers to this file")
    q.add_argument("-o", "--output", help="write the topology file here")
    q.add_argument("--json", action="store_true", help="print the topology file")
    q.set_defaults(func=_detect)


def _detect(args: argparse.Namespace) -> int:
    from topologies.detect import load_facts, read_facts, topology_from_facts
    from topologies.errors import TopologyError
    from topologies.io import save_topology
    from weftcore.jsonfile import check_output, write_text

    for path in (args.record, args.output):
        if path:
            check_output(path, "output", TopologyError)  # both before either is written
    facts = load_facts(args.facts) if args.facts else read_facts()
    topo = topology_from_facts(facts)
    if args.record:
        write_text(args.record, json.dumps(facts.to_json(), indent=2) + "\n", "nvml facts", TopologyError)
    if args.output:
        save_topology(topo, args.output)
    if args.json:
        print(json.dumps(topo.to_json(), indent=2))
    else:
        print(
            f"{topo.name}: {topo.nranks} × {facts.gpus[0].name}, fingerprint {topo.fingerprint}"
            + (f", written to {args.output}" if args.output else "")
        )
    return 0
