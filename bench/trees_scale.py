"""Scale benchmark: the exact cut bound and ForestColl-class trees on hgx_h100 from 2 to 128 nodes.

    python bench/trees_scale.py [--nodes 2,8,32,128] [--verify-up-to 32] [-o bench/results/trees_scale.json]
    python bench/trees_scale.py --pipeline 'dgx1;hgx_h100:nodes=2' -o bench/results/trees_scale_pipeline.json

Times each stage (bound, tree packing, schedule construction, cost model, verification) on this machine and
writes rows {topology, collective, method, solve_s, predicted_us, pct_of_bound} plus the stage times and the
machine. solve_s is bound + packing + schedule. Chunks per rank default to 8 waves per tree below 1M sends
(at 1024 GPUs one wave: a million sends already), so the pipeline's fill shows in pct_of_bound at 1 GB
while pct_of_optimal is the forest's steady-state rate. ``--pipeline`` shows the α = 0 limit instead: the
cost model's prediction at 1 PB (where latency terms vanish) as chunks per tree grow from 1 to 64.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from datetime import datetime, timezone
from math import lcm

from schedules.bounds import allgather_cut_bound, bandwidth_bound_us, lower_bound_us
from schedules.collectives import Collective
from schedules.cost import loads
from schedules.verify import verify
from synth.trees import TreeOptions, forests_for, schedule
from topologies.catalog import build
from weft.cli.synth_trees import default_chunks

SIZE = 1 << 30


def machine() -> dict:
    return {"host": platform.node(), "python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}


def row(nodes: int, verify_up_to: int, collective_name: str) -> dict:
    spec = f"hgx_h100:nodes={nodes}"
    topology = build(spec)
    t0 = time.perf_counter()
    ratio = allgather_cut_bound(topology if collective_name == "allgather" else topology.reversed())
    t1 = time.perf_counter()
    forests = forests_for(topology, Collective(collective_name, topology.nranks), TreeOptions(time_limit=600))
    t2 = time.perf_counter()
    per_root = lcm(*(f.per_root for f in forests))
    collective = Collective(collective_name, topology.nranks, default_chunks(topology, per_root, len(forests)))
    s = schedule(topology, collective, forests)
    t3 = time.perf_counter()
    predicted = loads(s, topology).predict_us(SIZE)
    t4 = time.perf_counter()
    verified, verify_s = None, None
    if nodes <= verify_up_to:
        verified = verify(s, topology).ok
        verify_s = time.perf_counter() - t4
    bound = lower_bound_us(topology, collective, SIZE)
    return {
        "topology": spec, "collective": collective_name, "method": "trees", "nranks": topology.nranks,
        "solve_s": round(t3 - t0, 3), "predicted_us": predicted, "pct_of_bound": 100 * bound / predicted,
        "size": SIZE, "bound_us": bound, "cut_ratio": str(ratio), "bound_s": round(t1 - t0, 3),
        "forest_s": round(t2 - t1, 3), "schedule_s": round(t3 - t2, 3), "predict_s": round(t4 - t3, 3),
        "verify_s": None if verify_s is None else round(verify_s, 3), "verified": verified,
        "trees_per_root": per_root, "chunks": collective.chunks, "steps": s.nsteps, "sends": s.nsends,
        "pct_of_optimal": min(f.pct_of_optimal for f in forests),
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def pipeline_rows(spec: str) -> list[dict]:
    """% of the bandwidth bound at α = 0 as waves (chunks per tree) grow: (P + depth - 1)/P -> 1."""
    huge = 1e15
    topology = build(spec)
    rows = []
    for name in ("allgather", "allreduce"):
        forests = forests_for(topology, Collective(name, topology.nranks), TreeOptions())
        per_root = lcm(*(f.per_root for f in forests))
        for waves in (1, 2, 4, 8, 16, 32, 64):
            start = time.perf_counter()
            collective = Collective(name, topology.nranks, per_root * waves)
            s = schedule(topology, collective, forests)
            solve_s = time.perf_counter() - start
            predicted = loads(s, topology).predict_us(huge)
            rows.append({"topology": spec, "collective": name, "method": "trees", "solve_s": round(solve_s, 3),
                         "predicted_us": predicted, "size": huge,
                         "pct_of_bound": 100 * bandwidth_bound_us(topology, collective, huge) / predicted,
                         "waves": waves, "chunks": collective.chunks, "steps": s.nsteps,
                         "pct_of_optimal": min(f.pct_of_optimal for f in forests)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,8,32,128")
    parser.add_argument("--collective", default="allgather")
    parser.add_argument("--verify-up-to", type=int, default=128, help="verify schedules up to this many nodes")
    parser.add_argument("--pipeline", metavar="SPECS", help="';'-separated topologies for the α = 0 series")
    parser.add_argument("-o", "--output", default="bench/results/trees_scale.json")
    args = parser.parse_args()
    rows = []
    if args.pipeline:
        for spec in args.pipeline.split(";"):
            rows += pipeline_rows(spec)
            print(json.dumps(rows[-1]), flush=True)
    else:
        for nodes in (int(n) for n in args.nodes.split(",")):
            rows.append(row(nodes, args.verify_up_to, args.collective))
            print(json.dumps(rows[-1]), flush=True)
    doc = {"benchmark": "trees_scale", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": machine(), "rows": rows}
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
