"""``weft topo bound TOPO COLLECTIVE [--size 1GB] [--json]``: the lower bound on a collective's time."""

from __future__ import annotations

import argparse
import json
import math
import sys
from fractions import Fraction

from schedules.collectives import NAMES, Chunking, Collective, collective_on
from topologies import resolve
from weft.cli import ArgumentError
from weft.cli.deadline import Deadline, TimeLimitReached
from weft.cli.words import counted
from weft.units import format_bytes, parse_bytes


def register(topo_sub: argparse._SubParsersAction) -> None:
    q = topo_sub.add_parser(
        "bound",
        help="lower bound on a collective's time (ForestColl's cut bound, latency)",
        description="The bandwidth bound as an exact fraction, the bottleneck cut, and the "
        "bound in µs and GB/s for a message size.",
    )
    q.add_argument("topology", metavar="TOPO", help="catalog spec or topology file")
    q.add_argument("collective", help=f"one of: {', '.join(NAMES)}")
    q.add_argument("--size", default="1GB", help="message size, nccl-tests terms (default 1GB)")
    q.add_argument("--root", type=int, default=0, help="root rank for rooted collectives")
    q.add_argument("--json", action="store_true", help="print the bound as JSON")
    q.add_argument(
        "--time-limit", type=float, default=60.0, help="the command's deadline in seconds, reading the fabric included"
    )
    q.set_defaults(func=run)


def bound_report(topology, collective: Collective, nbytes: int) -> dict:
    """The numbers `weft topo bound` prints."""
    from schedules import bounds
    from schedules.cost import bus_factor

    factor = bounds.bandwidth_factor(topology, collective)
    latency = bounds.latency_bound_us(topology, collective)
    bandwidth = bounds.bandwidth_bound_us(topology, collective, nbytes)
    total = max(latency, bandwidth)
    report = {
        "topology": topology.name,
        "fingerprint": topology.fingerprint,
        "collective": collective.name,
        "nranks": topology.nranks,
        "size": nbytes,
        "factor": str(factor),
        "factor_doc": "bandwidth bound in µs = size in bytes × factor / 1e3; 1/(GB/s)",
        "latency_us": latency,
        "bandwidth_us": bandwidth,
        "bound_us": total,
        "algbw_max": nbytes / (total * 1e3) if total else None,
        "busbw_max": nbytes / (total * 1e3) * bus_factor(collective) if total else None,
    }
    if collective.facts.phases and topology.nranks > 1:
        report["allreduce"] = {
            "smallest_rank_cut_gbps": str(bounds.smallest_rank_cut(topology)),
            "doc": "max(1 / smallest rank-to-rank cut, 2(N-1) / ranks' ingress, "
            "2(H-1) / hosts' ingress), per message byte",
        }
    if _cut_bound(collective) and topology.nranks > 1:
        fabric = topology.reversed() if collective.combining else topology
        cut = bounds.bottleneck_cut(fabric)
        report["cut"] = {
            "ratio": str(cut.ratio),
            "ranks": cut.ranks,
            "capacity": str(cut.capacity),
            "rounds_per_chunk": str(cut.ratio * bounds.exact(fabric.unit_bandwidth)),
            "optimal_rate": str(1 / cut.ratio),
            "optimal_rate_gbps": float(1 / cut.ratio),
        }
    return report


def _cut_bound(collective: Collective) -> bool:
    """Whether the bound is the allgather cut bound (allgather; reducescatter on the reversed fabric): every rank's
    slice to every rank, in one phase."""
    return not collective.rooted and collective.facts.chunking is Chunking.SLICES and not collective.facts.phases


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _refuse_past(topology, collective: Collective, deadline: Deadline) -> None:
    """TimeLimitReached at once where the cut bound's least possible cost is already past the time left."""
    if not _cut_bound(collective):
        return
    from schedules.bounds import cut_bound_floor_s

    deadline.phase = f"estimating the {collective.name} bound's cost on {topology.name}"
    floor, flows = cut_bound_floor_s(topology)
    if floor > deadline.left():
        raise TimeLimitReached(
            f"weft topo bound: the cut bound on {topology.name} takes at least {floor:.0f} s ({flows:,} max-flows "
            f"over {len(topology.vertices) + len(topology.links):,} vertices and links), past --time-limit "
            f"{deadline.limit_s:g} s; nothing computed"
        )


def run(args: argparse.Namespace) -> int:
    nbytes = parse_bytes(args.size)
    if not 0 < args.time_limit < math.inf:
        raise ArgumentError(f"weft topo bound: --time-limit must be positive seconds, got {args.time_limit}")
    with Deadline("weft topo bound", args.time_limit, progress=_progress) as deadline:
        deadline.phase = f"reading topology {args.topology}"
        topology = resolve(args.topology)
        collective = collective_on(args.collective, topology.name, topology.nranks, 1, args.root)
        _refuse_past(topology, collective, deadline)
        deadline.phase = f"computing the {collective.name} bound on {topology.name}"
        report = bound_report(topology, collective, nbytes)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"topology {topology.name} ({topology.fingerprint}, {counted(topology.nranks, 'rank')}), {collective.name}, "
        f"{format_bytes(nbytes)}"
    )
    if "cut" in report:
        cut = report["cut"]
        print(
            f"  cut bound: {cut['ratio']} per (GB/s) = max |S ∩ ranks| / B+(S), at S with "
            f"{counted(cut['ranks'], 'rank')} and {cut['capacity']} GB/s leaving; "
            f"{cut['rounds_per_chunk']} rounds per chunk in SCCL units; "
            f"optimal rate {cut['optimal_rate_gbps']:.6g} GB/s per rank's slice"
        )
    if "allreduce" in report:
        print(
            f"  all-reduce bound: every cut between ranks carries the message each way (smallest rank cut "
            f"{report['allreduce']['smallest_rank_cut_gbps']} GB/s), and every element takes 2(N-1) transfers "
            "into ranks (one-way gossip) and 2(H-1) into hosts"
        )
    size = format_bytes(nbytes)
    factor = Fraction(report["factor"])
    if factor:  # seconds per GB of message: its inverse is the fastest algbw any schedule reaches
        rate = 1 / factor
        exact = "" if rate.denominator == 1 else f" = {rate}"
        print(f"  bandwidth bound: {report['bandwidth_us']:.3f} µs for {size} (algbw <= {float(rate):.2f}{exact} GB/s)")
    else:
        print(f"  bandwidth bound: 0 µs for {size} (nothing crosses a link)")
    print(f"  latency bound:   {report['latency_us']:.3f} µs")
    if report["algbw_max"] is not None:
        print(
            f"  lower bound:     {report['bound_us']:.3f} µs for {size} (algbw <= {report['algbw_max']:.2f} GB/s, "
            f"busbw <= {report['busbw_max']:.2f} GB/s)"
        )
    else:
        print("  lower bound:     0 µs (one rank)")
    return 0
