"""SMT benchmark: the whole (steps, rounds per chunk) Pareto frontier on dgx1, against SCCL's 56 s.

    python bench/smt_dgx1.py [--repeats 3] [--collectives allgather,allreduce] [-o bench/results/smt_dgx1.json]

Times ``synth.smt.pareto`` end to end (LP bound, every instance, unsat proofs included) on this machine,
``--repeats`` times per collective, because z3's run time varies with its seeds. Every frontier schedule is
verified. Writes rows {topology, collective, method, solve_s, predicted_us, pct_of_bound} (one per frontier
point, predicted at 1 GB; solve_s is that point's instance) plus one summary per collective with each
run's frontier time, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import UTC, datetime

from schedules.bounds import lower_bound_us
from schedules.collectives import Collective
from schedules.cost import predict_us
from schedules.verify import require_valid
from synth import smt
from topologies.catalog import build

SIZE = 1 << 30
SCCL_DGX1_ALLGATHER_S = 56.0  # SCCL (PPoPP'21): the whole dgx1 allgather frontier


def machine() -> dict:
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def run(topology, name: str, repeats: int) -> tuple[list[dict], dict]:
    times, frontier = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        frontier = smt.pareto(topology, Collective(name, topology.nranks), smt.SmtOptions(time_limit=300))
        times.append(time.perf_counter() - start)
    assert frontier is not None, "repeats must be at least 1"
    rows = []
    for point in frontier.points:
        require_valid(point.schedule, topology)
        predicted = predict_us(point.schedule, topology, SIZE)
        rows.append(
            {
                "topology": "dgx1",
                "collective": name,
                "method": "smt",
                "steps": point.steps,
                "rounds": point.rounds,
                "chunks": point.chunks,
                "rounds_per_chunk": str(point.rounds_per_chunk),
                "solve_s": round(point.schedule.meta.solve_time, 3),
                "predicted_us": predicted,
                "pct_of_bound": 100 * lower_bound_us(topology, point.schedule.collective, SIZE) / predicted,
                "predicted_us_by_size": point.predicted_us,
            }
        )
    summary = {
        "collective": name,
        "frontier_s": [round(t, 2) for t in times],
        "frontier_s_median": round(statistics.median(times), 2),
        "lp_bound": str(frontier.lp_bound),
        "complete": frontier.complete,
        "points": [[p.steps, p.rounds, p.chunks] for p in frontier.points],
    }
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--collectives", default="allgather,allreduce")
    parser.add_argument("-o", "--output", default="bench/results/smt_dgx1.json")
    args = parser.parse_args()
    topology = build("dgx1")
    rows, summaries = [], []
    for name in args.collectives.split(","):
        r, summary = run(topology, name, args.repeats)
        rows += r
        summaries.append(summary)
        print(
            f"{name}: frontier {summary['points']} (S, R, C), LP bound {summary['lp_bound']}, "
            f"{summary['frontier_s']} s",
            flush=True,
        )
    doc = {
        "benchmark": "smt_dgx1",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "sccl_published_s": {"allgather": SCCL_DGX1_ALLGATHER_S},
        "frontiers": summaries,
        "rows": rows,
    }
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
