"""Allgather with the MILP synthesizer on multi-node fabrics: predicted time, algbw, % of the cut bound.

    python bench/milp_bench.py [--time-limit 120] [--out bench/results/milp_allgather.json]
    python bench/milp_bench.py --markdown bench/results/milp_allgather.json   # the README table

Each case solves once (CP-SAT, wall-clock time limit) and scores the schedule with ``schedules.cost`` and
``schedules.bounds``; the best baseline on the same fabric and size is scored alongside. The machine's load
average is recorded, since CP-SAT's result within a wall-clock limit depends on the cores it gets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import ortools

from schedules.bounds import lower_bound_us
from schedules.collectives import Collective
from schedules.cost import algbw, predict_us
from schedules.verify import require_valid
from synth import baselines
from synth.errors import NotApplicable
from synth.milp import MilpOptions, Sketch, solve
from synth.trees import pipeline
from topologies.catalog import build
from weft.units import format_bytes

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30
# (topology, size, chunks per rank, symmetry offset = GPUs per node)
CASES = (
    ("ndv2:nodes=2", KB, 1, 8),
    ("ndv2:nodes=2", MB, 1, 8),
    ("ndv2:nodes=2", GB, 4, 8),
    ("hgx_h100:nodes=2", MB, 1, 8),
    ("hgx_h100:nodes=2", GB, 3, 8),
    ("dgx2:nodes=2", MB, 1, 16),
    ("dgx2:nodes=2", GB, 2, 16),
)


def row(spec: str, collective: Collective, method: str, nbytes: int, solve_s: float, us: float,
        bound: float, **extra) -> dict:
    return {"topology": spec, "collective": collective.name, "method": method, "size": nbytes,
            "solve_s": round(solve_s, 2), "predicted_us": round(us, 3),
            "algbw": round(algbw(collective, nbytes, us), 3),
            "pct_of_bound": round(100.0 * bound / us, 2), **extra}


def best_baseline(topology, collective, nbytes) -> tuple[str, float, float]:
    best = ("none", float("inf"), 0.0)
    for method in baselines.METHODS:
        start = time.monotonic()
        try:
            us = predict_us(getattr(baselines, method)(topology, collective), topology, nbytes)
        except NotApplicable:
            continue
        if us < best[1]:
            best = (method, us, time.monotonic() - start)
    return best


def run_case(spec: str, nbytes: int, chunks: int, offset: int, time_limit: float) -> list[dict]:
    topology = build(spec)
    collective = Collective("allgather", topology.nranks, chunks)
    start = time.monotonic()
    schedule = solve(topology, collective, MilpOptions(size=nbytes, time_limit=time_limit,
                                                      sketch=Sketch(rank_offset=offset)),
                     progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    solve_s = time.monotonic() - start
    require_valid(schedule, topology)
    bound = lower_bound_us(topology, collective, nbytes)
    meta = schedule.meta.options
    ours = row(spec, collective, "milp", nbytes, solve_s, predict_us(schedule, topology, nbytes), bound,
               chunks=chunks, steps=schedule.nsteps, gap=round(meta["gap"], 4), status=meta["status"])
    name, us, base_s = best_baseline(topology, collective, nbytes)
    return [ours, trees_row(spec, topology, nbytes), row(spec, collective, name, nbytes, base_s, us, bound, chunks=1)]


def trees_row(spec: str, topology, nbytes: int) -> dict:
    """The tree packing's pipeline at the waves the cost model picks for this size (compact form, priced)."""
    start = time.monotonic()
    wave = pipeline(topology, Collective("allgather", topology.nranks))
    waves = wave.best_waves(nbytes)
    us = wave.predict_us(nbytes, waves)
    sized = wave.sized(waves)
    return row(spec, sized, "trees", nbytes, time.monotonic() - start, us, lower_bound_us(topology, sized, nbytes),
               chunks=sized.chunks, waves=waves, trees_per_root=wave.per_root,
               sends=wave.sends_per_wave * waves)


def markdown(doc: dict) -> str:
    """The README's table: milp (solve time, % of bound, status), trees and the best baseline per case."""
    by_case: dict = {}
    for r in doc["rows"]:
        by_case.setdefault((r["topology"], r["size"]), {})[r["method"] if r["method"] in ("milp", "trees")
                                                         else "baseline"] = r
    lines = ["| topology | size | milp solve (s) | milp % of bound | milp status (gap) | trees % of bound (waves) "
             "| best baseline % |", "|---|---|---|---|---|---|---|"]
    for (spec, size), rows in by_case.items():
        m, t, b = rows.get("milp"), rows.get("trees"), rows.get("baseline")
        status = f"{m['status']} ({100 * m['gap']:.1f}%)" if m else "-"
        lines.append(f"| {spec} | {format_bytes(size)} | {m['solve_s']:.0f} | {m['pct_of_bound']:.1f} | {status} | "
                     + (f"{t['pct_of_bound']:.1f} ({t['waves']})" if t else "-") + " | "
                     + (f"{b['pct_of_bound']:.1f} ({b['method']})" if b else "-") + " |")
    return "\n".join(lines) + "\n"


def machine() -> dict:
    return {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "ortools": ortools.__version__,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "milp_allgather.json"))
    parser.add_argument("--only", help="run only cases whose topology contains this text")
    parser.add_argument("--markdown", metavar="FILE", help="print the README table of a results file and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())), end="")
        return
    doc = {"benchmark": "milp_allgather", "collective": "allgather", "time_limit_s": args.time_limit,
           "machine": machine(), "rows": []}
    for spec, nbytes, chunks, offset in CASES:
        if args.only and args.only not in spec:
            continue
        print(f"{spec} {nbytes} bytes, {chunks} chunk(s) per rank", file=sys.stderr, flush=True)
        for r in run_case(spec, nbytes, chunks, offset, args.time_limit):
            doc["rows"].append(r)
            print(json.dumps(r), flush=True)
        doc["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
