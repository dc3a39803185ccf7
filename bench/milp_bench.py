"""Allgather with the MILP synthesizer on multi-node fabrics: predicted time, algbw, % of the cut bound.

    python bench/milp_bench.py [--time-limit 120] [--out bench/results/milp_allgather.json]
    python bench/milp_bench.py --markdown bench/results/milp_allgather.json   # the table in docs/synthesis.md

Each case solves once (CP-SAT, wall-clock time limit) with the solver's defaults, as ``weft synth --method
milp`` does (the inter-/intra-host split along rails at bandwidth-bound sizes, the symmetry found across
hosts), and scores the schedule with ``schedules.cost`` and ``schedules.bounds``; the tree packing's pipeline
and the best baseline on the same fabric and size are scored alongside. Ablations re-solve dgx2:nodes=2 at
1 GB without the split (the model before it) and with the trees' inter-host hops. Every schedule is verified.
The machine's load average is recorded, since CP-SAT's result within a wall-clock limit depends on the cores
it gets.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from schedules.bounds import lower_bound_us
from schedules.collectives import Collective
from schedules.cost import algbw, predict_us
from schedules.verify import require_valid
from synth import baselines
from synth.errors import NotApplicable, Unknown
from synth.milp import MilpOptions, Sketch, solve
from synth.trees import TreeOptions, pipeline
from topologies.catalog import build
from weft.units import format_bytes

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30
# (topology, size, chunks per rank)
CASES = (
    ("ndv2:nodes=2", KB, 1),
    ("ndv2:nodes=2", MB, 1),
    ("ndv2:nodes=2", GB, 4),
    ("hgx_h100:nodes=2", MB, 1),
    ("hgx_h100:nodes=2", GB, 3),
    ("dgx2:nodes=2", MB, 1),
    ("dgx2:nodes=2", GB, 4),
)
# (topology, size, chunks per rank, variant, sketch): the same case with parts of the model changed
ABLATIONS = (
    ("dgx2:nodes=2", GB, 2, "no split (host symmetry, 2 chunks)", Sketch(rank_offset=16, hierarchy="none")),
    ("dgx2:nodes=2", GB, 4, "no split (host symmetry, 4 chunks)", Sketch(rank_offset=16, hierarchy="none")),
    ("dgx2:nodes=2", GB, 4, "split, inter-host hops from the trees", Sketch(hierarchy="trees")),
    ("dgx2:nodes=2", GB, 8, "split along rails, 8 chunks", Sketch(hierarchy="rails")),
)


def row(
    spec: str, collective: Collective, method: str, nbytes: int, solve_s: float, us: float, bound: float, **extra
) -> dict:
    return {
        "topology": spec,
        "collective": collective.name,
        "method": method,
        "size": nbytes,
        "solve_s": round(solve_s, 2),
        "predicted_us": round(us, 3),
        "algbw": round(algbw(collective, nbytes, us), 3),
        "pct_of_bound": round(100.0 * bound / us, 2),
        **extra,
    }


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


def milp_row(
    spec: str, nbytes: int, chunks: int, time_limit: float, variant: str = "default", sketch: Sketch | None = None
) -> dict:
    """One verified CP-SAT solve; solve_s is the wall time of the whole call (model, search, read-back)."""
    topology = build(spec)
    collective = Collective("allgather", topology.nranks, chunks)
    start = time.monotonic()
    try:
        schedule = solve(
            topology,
            collective,
            MilpOptions(size=nbytes, time_limit=time_limit, sketch=sketch),
            progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
        )
    except Unknown as e:  # nothing found (or the model not even built) within the limit
        return {
            "topology": spec,
            "collective": "allgather",
            "method": "milp",
            "size": nbytes,
            "solve_s": round(time.monotonic() - start, 2),
            "predicted_us": None,
            "algbw": None,
            "pct_of_bound": None,
            "chunks": chunks,
            "status": "unknown",
            "gap": None,
            "variant": variant,
            "reason": str(e),
        }
    solve_s = time.monotonic() - start
    require_valid(schedule, topology)
    bound = lower_bound_us(topology, collective, nbytes)
    meta = schedule.meta.options
    return row(
        spec,
        collective,
        "milp",
        nbytes,
        solve_s,
        predict_us(schedule, topology, nbytes),
        bound,
        chunks=chunks,
        steps=schedule.nsteps,
        gap=round(meta["gap"], 4),
        status=meta["status"],
        variant=variant,
        hierarchy=meta["hierarchy"],
        symmetry_offset=meta["symmetry_offset"],
        verified=True,
    )


def run_case(spec: str, nbytes: int, chunks: int, time_limit: float) -> list[dict]:
    topology = build(spec)
    collective = Collective("allgather", topology.nranks, chunks)
    bound = lower_bound_us(topology, collective, nbytes)
    name, us, base_s = best_baseline(topology, collective, nbytes)
    return [
        milp_row(spec, nbytes, chunks, time_limit),
        trees_row(spec, topology, nbytes),
        row(spec, collective, name, nbytes, base_s, us, bound, chunks=chunks),
    ]


def trees_row(spec: str, topology, nbytes: int) -> dict:
    """The tree packing's pipeline at the waves the cost model picks for this size (compact form, priced)."""
    start = time.monotonic()
    wave = pipeline(topology, Collective("allgather", topology.nranks), options=TreeOptions(time_limit=600))
    waves = wave.best_waves(nbytes)
    us = wave.predict_us(nbytes, waves)
    sized = wave.sized(waves)
    return row(
        spec,
        sized,
        "trees",
        nbytes,
        time.monotonic() - start,
        us,
        lower_bound_us(topology, sized, nbytes),
        chunks=sized.chunks,
        waves=waves,
        trees_per_root=wave.per_root,
        sends=wave.sends_per_wave * waves,
    )


def markdown(doc: dict) -> str:
    """The README's table: milp (solve time, % of bound, status), trees and the best baseline per case."""
    by_case: dict = {}
    for r in doc["rows"]:
        if r.get("variant", "default") != "default":
            continue
        by_case.setdefault((r["topology"], r["size"]), {})[
            r["method"] if r["method"] in ("milp", "trees") else "baseline"
        ] = r
    lines = [
        "| topology | size | milp chunks | milp solve (s) | milp % of bound | milp status (gap to the model's bound) "
        "| trees % of bound (waves) "
        "| best baseline % (at milp's chunks) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (spec, size), rows in by_case.items():
        m, t, b = rows.get("milp"), rows.get("trees"), rows.get("baseline")
        status = f"{m['status']} ({100 * m['gap']:.1f}%)" if m else "-"
        lines.append(
            f"| {spec} | {format_bytes(size)} | {m['chunks']} | {m['solve_s']:.0f} "
            f"| {m['pct_of_bound']:.1f} | {status} | "
            + (f"{t['pct_of_bound']:.1f} ({t['waves']})" if t else "-")
            + " | "
            + (f"{b['pct_of_bound']:.1f} ({b['method']})" if b else "-")
            + " |"
        )
    ablations = [r for r in doc["rows"] if r.get("variant", "default") != "default"]
    if ablations:
        lines += [
            "",
            "| topology | size | variant | chunks | solve (s) | % of bound | status (gap to the model's bound) |",
            "|---|---|---|---|---|---|---|",
        ]
        default = [r for r in doc["rows"] if r["method"] == "milp" and r.get("variant", "default") == "default"]
        for r in default + ablations:
            if (r["topology"], r["size"]) not in {(a["topology"], a["size"]) for a in ablations}:
                continue
            variant = "default: split along rails" if r.get("variant", "default") == "default" else r["variant"]
            pct = "-" if r["pct_of_bound"] is None else f"{r['pct_of_bound']:.1f}"
            status = r["status"] if r["gap"] is None else f"{r['status']} ({100 * r['gap']:.1f}%)"
            lines.append(
                f"| {r['topology']} | {format_bytes(r['size'])} | {variant} | {r['chunks']} | "
                f"{r['solve_s']:.0f} | {pct} | {status} |"
            )
    return "\n".join(lines) + "\n"


def machine() -> dict:
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ortools": importlib.metadata.version("ortools"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "milp_allgather.json"))
    parser.add_argument("--only", help="run only cases whose topology contains this text")
    parser.add_argument("--no-ablations", action="store_true", help="skip the ablation solves")
    parser.add_argument("--markdown", metavar="FILE", help="print the README table of a results file and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())), end="")
        return
    doc = {
        "benchmark": "milp_allgather",
        "collective": "allgather",
        "time_limit_s": args.time_limit,
        "machine": machine(),
        "rows": [],
    }

    def record(rows: list[dict]) -> None:
        for r in rows:
            doc["rows"].append(r)
            print(json.dumps(r), flush=True)
        doc["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")

    for spec, nbytes, chunks in CASES:
        if args.only and args.only not in spec:
            continue
        print(f"{spec} {nbytes} bytes, {chunks} chunk(s) per rank", file=sys.stderr, flush=True)
        record(run_case(spec, nbytes, chunks, args.time_limit))
    for spec, nbytes, chunks, variant, sketch in () if args.no_ablations else ABLATIONS:
        if args.only and args.only not in spec:
            continue
        print(f"{spec} {nbytes} bytes, {chunks} chunk(s) per rank: {variant}", file=sys.stderr, flush=True)
        record([milp_row(spec, nbytes, chunks, args.time_limit, variant, sketch)])


if __name__ == "__main__":
    main()
