"""SMT on 16-GPU fabrics (dgx2, hgx_h100:nodes=2): the Pareto walk within a 300 s deadline, and what it found.

    python bench/smt_scale.py [--time-limit 300] [--topologies 'dgx2;hgx_h100:nodes=2'] [-o OUT.json]
    python bench/smt_scale.py --markdown bench/results/smt_scale.json   # the table in docs/synthesis.md

``wall_s`` also holds what comes before the first instance: the LP bound and the automorphism search
(dgx2's NVSwitch makes the latter most of its minute). The limit is the walk's deadline (``SmtOptions.time_limit``),
shared by its instances. Each instance decided (sat, unsat, unknown) is recorded with its time from the progress
lines, every point found is verified and priced at 1 GB, and the LP bound on rounds per chunk says how far the walk
got from the optimum. ``-o`` defaults to bench/results/smt_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from datetime import UTC, datetime

from schedules.bounds import lower_bound_us
from schedules.collectives import Collective
from schedules.cost import predict_us
from schedules.verify import require_valid
from synth import smt
from topologies.catalog import build

SIZE = 1 << 30
DECIDED = re.compile(
    r"smt: (\w+) on \S+ \(S=(\d+), R=(\d+), C=(\d+)\): (sat|unsat|unknown)(?: \(symmetric\))? "
    r"in ([\d.]+) s"
)


def machine() -> dict:
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def run(spec: str, name: str, time_limit: float) -> dict:
    topology = build(spec)
    lines: list[tuple[float, str]] = []
    start = time.perf_counter()
    frontier = smt.pareto(
        topology,
        Collective(name, topology.nranks),
        smt.SmtOptions(time_limit=time_limit),
        lambda line: lines.append((time.perf_counter() - start, line)),
    )
    wall = time.perf_counter() - start
    instances = []
    for at, line in lines:
        m = DECIDED.search(line)
        if m:
            instances.append(
                {
                    "steps": int(m[2]),
                    "rounds": int(m[3]),
                    "chunks": int(m[4]),
                    "status": m[5],
                    "solve_s": float(m[6]),
                    "at_s": round(at, 2),
                }
            )
    decided = {(i["steps"], i["rounds"], i["chunks"]): i["solve_s"] for i in instances if i["status"] == "sat"}
    points = []
    for point in frontier.points:
        require_valid(point.schedule, topology)
        predicted = predict_us(point.schedule, topology, SIZE)
        points.append(
            {
                "steps": point.steps,
                "rounds": point.rounds,
                "chunks": point.chunks,
                "rounds_per_chunk": str(point.rounds_per_chunk),
                "predicted_us": predicted,
                "pct_of_bound": 100 * lower_bound_us(topology, point.schedule.collective, SIZE) / predicted,
                # the instance's time as its progress line gave it (formula, symmetry and z3), else z3's
                "solve_s": decided.get(
                    (point.steps, point.rounds, point.chunks), round(point.schedule.meta.solve_time or 0.0, 2)
                ),
            }
        )
    return {
        "topology": spec,
        "collective": name,
        "method": "smt",
        "time_limit_s": time_limit,
        "wall_s": round(wall, 2),
        "lp_bound": str(frontier.lp_bound),
        "complete": frontier.complete,
        "points": points,
        "instances": instances,
        # the plot reader's row fields: the fastest point at 1 GB
        "solve_s": round(wall, 2),
        "predicted_us": min((p["predicted_us"] for p in points), default=None),
        "pct_of_bound": max((p["pct_of_bound"] for p in points), default=None),
    }


def markdown(doc: dict) -> str:
    lines = [
        "| topology | collective | wall (s) of limit | points (steps, rounds, chunks): solve s, % of bound at 1 GB "
        "| LP bound R/C | reached it | instances unknown |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["runs"]:
        points = (
            "; ".join(
                f"({p['steps']}, {p['rounds']}, {p['chunks']}): {p['solve_s']:.1f} s, {p['pct_of_bound']:.1f}%"
                for p in r["points"]
            )
            or "none"
        )
        unknown = [i for i in r["instances"] if i["status"] == "unknown"]
        shown = ", ".join(f"({i['steps']}, {i['rounds']}, {i['chunks']})" for i in unknown[:4])
        more = f" +{len(unknown) - 4}" if len(unknown) > 4 else ""
        lines.append(
            f"| {r['topology']} | {r['collective']} | {r['wall_s']:.0f} of {r['time_limit_s']:.0f} | "
            f"{points} | {r['lp_bound']} | {'yes' if r['complete'] else 'no'} | "
            f"{len(unknown)}{': ' + shown + more if unknown else ''} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--topologies", default="dgx2;hgx_h100:nodes=2")
    parser.add_argument("--collectives", default="allgather")
    parser.add_argument("-o", "--output", default="bench/results/smt_scale.json")
    parser.add_argument("--markdown", metavar="FILE", help="print the README table of a results file and exit")
    args = parser.parse_args()
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)), end="")
        return
    runs = []
    for spec in args.topologies.split(";"):
        for name in args.collectives.split(","):
            runs.append(run(spec, name, args.time_limit))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "instances"}), flush=True)
    doc = {
        "benchmark": "smt_scale",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "runs": runs,
        "rows": runs,
    }
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
