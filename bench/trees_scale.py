"""Scale benchmark: the exact cut bound and ForestColl-class trees on hgx_h100 from 2 to 128 nodes, and dgx2:nodes=2.

    python bench/trees_scale.py [--nodes 2,8,32,128] [--verify-up-to 128] [-o bench/results/trees_scale.json]
    python bench/trees_scale.py --markdown bench/results/trees_scale.json   # the table in docs/synthesis.md
    python bench/trees_scale.py --pipeline 'dgx1;hgx_h100:nodes=2' -o bench/results/trees_scale_pipeline.json

Times each stage (bound, tree packing, the compact pipeline of one wave, pricing its step shapes,
verification) on this machine and writes rows {topology, collective, method, solve_s, predicted_us,
pct_of_bound} at 1 GB plus the stage times, the waves (chunks per tree) the cost model picks at each size
from 1 MB to 4 GB with the % of the bound there, and the machine. solve_s is bound + packing + schedule +
pricing. An allgather is verified whole in the compact form `weft synth` writes (one wave and the shift to the
next; 29 million sends at 1024 GPUs); other collectives expanded up to MAX_EXPANDED sends, else one wave.
``--pipeline`` shows the α = 0 limit instead: the cost model's prediction at 1 PB (where latency terms vanish)
as chunks per tree grow from 1 to 64.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from datetime import UTC, datetime
from math import lcm

from schedules.bounds import allgather_cut_bound, bandwidth_bound_us, lower_bound_us
from schedules.collectives import Collective
from schedules.cost import loads
from schedules.verify import verify
from synth.trees import TreeOptions, forests_for, pipeline, schedule
from topologies.catalog import build
from weft.units import format_bytes

SIZE = 1 << 30
SIZES = tuple(1 << k for k in range(20, 33, 2))  # 1 MB .. 4 GB
MAX_EXPANDED = 4_000_000  # verify the expanded schedule up to this many sends, else one wave


def machine() -> dict:
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def row(spec: str, check: bool, collective_name: str) -> dict:
    """Bound, forest and compact pipeline timed; waves chosen per size; % of the bound from 1 MB to 4 GB."""
    topology = build(spec)
    c1 = Collective(collective_name, topology.nranks)
    t0 = time.perf_counter()
    ratio = allgather_cut_bound(topology.reversed() if c1.combining else topology)
    t1 = time.perf_counter()
    forests = forests_for(topology, c1, TreeOptions(time_limit=600))
    t2 = time.perf_counter()
    wave = pipeline(topology, c1, forests)
    t3 = time.perf_counter()
    waves = wave.best_waves(SIZE)
    predicted = wave.predict_us(SIZE, waves)  # the first call prices the step shapes
    t4 = time.perf_counter()
    by_size = {}
    for size in SIZES:
        w = wave.best_waves(size)
        us = wave.predict_us(size, w)
        by_size[format_bytes(size)] = {
            "waves": w,
            "predicted_us": us,
            "pct_of_bound": 100 * lower_bound_us(topology, wave.sized(w), size) / us,
        }
    pipelined = wave.with_waves(waves)
    expanded_sends = wave.sends_per_wave * waves
    verified, verify_s, checked = None, None, None
    if check:
        v0 = time.perf_counter()
        if not c1.combining and not c1.rooted:  # allgather, the one the compact pipeline writes
            compact = pipelined.compact()  # what `weft synth` writes: verified whole, by its symmetry
            verified = verify(compact, topology).ok
            assert abs(loads(compact, topology).predict_us(SIZE) - predicted) <= 1e-6 * predicted
            checked = f"the whole compact schedule ({expanded_sends} sends), as weft synth writes it"
        elif expanded_sends <= MAX_EXPANDED:
            explicit = pipelined.expand()
            verified = verify(explicit, topology).ok
            assert abs(loads(explicit, topology).predict_us(SIZE) - predicted) <= 1e-6 * predicted
            checked = "the whole pipelined schedule, expanded (its cost equals the compact form's)"
        else:
            verified = verify(wave.expand(), topology).ok
            checked = (
                f"one wave ({wave.sends_per_wave} sends); the {waves} waves repeat it on disjoint chunks, "
                f"each layer one step after the last ({expanded_sends} sends written out)"
            )
        verify_s = time.perf_counter() - v0
    bound = lower_bound_us(topology, pipelined.sized(), SIZE)
    return {
        "topology": spec,
        "collective": collective_name,
        "method": "trees",
        "nranks": topology.nranks,
        "solve_s": round(t4 - t0, 3),
        "predicted_us": predicted,
        "pct_of_bound": 100 * bound / predicted,
        "size": SIZE,
        "bound_us": bound,
        "cut_ratio": str(ratio),
        "bound_s": round(t1 - t0, 3),
        "forest_s": round(t2 - t1, 3),
        "schedule_s": round(t3 - t2, 3),
        "price_s": round(t4 - t3, 3),
        "verify_s": None if verify_s is None else round(verify_s, 3),
        "verified": verified,
        "verified_what": checked,
        "trees_per_root": wave.per_root,
        "waves": waves,
        "chunks": wave.per_root * waves,
        "layers": [len(phase) for phase in wave.phases],
        "sends_per_wave": wave.sends_per_wave,
        "sends_expanded": expanded_sends,
        "pct_of_optimal": min(f.pct_of_optimal for f in forests),
        "pct_of_bound_by_size": by_size,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def markdown(doc: dict) -> str:
    """The README's table: stage times, and % of the bound with the waves chosen, from 1 MB to 4 GB."""
    rows = [r for r in doc["rows"] if "pct_of_bound_by_size" in r]
    sizes = list(rows[0]["pct_of_bound_by_size"]) if rows else []
    head = (
        "| topology | GPUs | bound + trees + schedule + pricing (s) | verify (s) | % of optimal rate | "
        + " | ".join(f"% of bound at {s} (waves)" for s in sizes)
        + " |"
    )
    lines = [head, "|" + "---|" * (5 + len(sizes))]
    for r in rows:
        cells = " | ".join(f"{v['pct_of_bound']:.1f} ({v['waves']})" for v in r["pct_of_bound_by_size"].values())
        verify_s = "-" if r["verify_s"] is None else f"{r['verify_s']:.1f}"
        lines.append(
            f"| {r['topology']} | {r['nranks']} | {r['solve_s']:.1f} | {verify_s} | "
            f"{r['pct_of_optimal']:.0f} | {cells} |"
        )
    return "\n".join(lines) + "\n"


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
            rows.append(
                {
                    "topology": spec,
                    "collective": name,
                    "method": "trees",
                    "solve_s": round(solve_s, 3),
                    "predicted_us": predicted,
                    "size": huge,
                    "pct_of_bound": 100 * bandwidth_bound_us(topology, collective, huge) / predicted,
                    "waves": waves,
                    "chunks": collective.chunks,
                    "steps": s.nsteps,
                    "pct_of_optimal": min(f.pct_of_optimal for f in forests),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,8,32,128")
    parser.add_argument("--collective", default="allgather")
    parser.add_argument("--verify-up-to", type=int, default=128, help="verify schedules up to this many nodes")
    parser.add_argument("--pipeline", metavar="SPECS", help="';'-separated topologies for the α = 0 series")
    parser.add_argument(
        "--also",
        metavar="SPECS",
        default="dgx2:nodes=2",
        help="';'-separated topologies measured after hgx_h100 (default: dgx2:nodes=2, whose NICs "
        "are shared by two GPUs)",
    )
    parser.add_argument("-o", "--output", default="bench/results/trees_scale.json")
    parser.add_argument("--markdown", metavar="FILE", help="print the README table of a results file and exit")
    args = parser.parse_args()
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)), end="")
        return
    rows = []
    if args.pipeline:
        for spec in args.pipeline.split(";"):
            rows += pipeline_rows(spec)
            print(json.dumps(rows[-1]), flush=True)
    else:
        specs = [(f"hgx_h100:nodes={n}", int(n) <= args.verify_up_to) for n in args.nodes.split(",")]
        specs += [(spec, True) for spec in args.also.split(";") if spec]
        for spec, verify_it in specs:
            rows.append(row(spec, verify_it, args.collective))
            print(json.dumps(rows[-1]), flush=True)
    doc = {
        "benchmark": "trees_scale",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "rows": rows,
    }
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
