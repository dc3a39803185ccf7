"""What a Communicator's plan choice costs on the CPU as it starts (``PlanChoice``: every registry entry read and
its plan parsed), with Python's cyclic collector as weft runs it (paused around the parse: weftcore.gcpause) and
left running throughout, alternated, the best of ``--repeat`` a side.

    python bench/load_time.py [--registry bench/registry_h200x4] [--nranks 4] [--repeat 3] [-o OUT.json]

``-o`` defaults to bench/results/load_time_cpu.json. The collector "running throughout" side replaces the pause
with a no-op for the duration of its runs, so both sides run the same code otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.inference.plans import PlanChoice  # noqa: E402
from registry import store  # noqa: E402
from registry.store import Registry  # noqa: E402
from schedules.plan import io as plan_io  # noqa: E402
from topologies.catalog import build  # noqa: E402


@contextlib.contextmanager
def _collector_running():
    yield


def _run(registry: str, nranks: int, paused: bool) -> dict:
    originals = {m: getattr(m, "collector_paused") for m in (plan_io, store)}  # noqa: B009 (swapped below)
    try:
        for module in originals:
            setattr(module, "collector_paused", originals[plan_io] if paused else _collector_running)  # noqa: B010
        fp = build(f"hgx_h200:gpus={nranks}").fingerprints
        start = time.perf_counter()
        choice = PlanChoice(Registry(registry), fp, nranks, deterministic=True, ll128=True, compiled=True)
        return {"load_s": time.perf_counter() - start, "entries_chosen_from": len(choice.entries)}
    finally:
        for module, original in originals.items():
            setattr(module, "collector_paused", original)  # noqa: B010


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", default="bench/registry_h200x4")
    ap.add_argument("--nranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("-o", "--output", default="bench/results/load_time_cpu.json")
    args = ap.parse_args()
    raw: dict[str, list[dict]] = {"paused": [], "running": []}
    for _ in range(args.repeat):
        for side in raw:  # alternated, so that the machine's drift falls on both
            raw[side].append(_run(args.registry, args.nranks, side == "paused"))
    entries = Registry(args.registry).entries()
    ops = sum(len(tb.ops) for e in entries for g in e.plan.gpus for tb in g.threadblocks)
    best = {side: min(r["load_s"] for r in runs) for side, runs in raw.items()}
    doc = {
        "benchmark": "load_time",
        "registry": args.registry,
        "nranks": args.nranks,
        "entries": len(entries),
        "ops": ops,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "host": platform.node(),
        },
        "versions": {"python": platform.python_version()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "best": best,
        "raw": raw,
    }
    Path(args.output).write_text(json.dumps(doc, indent=1) + "\n")
    for side, seconds in best.items():
        per_op = 1e6 * seconds / ops
        print(f"collector {side}: plan choice over {len(entries)} entries {seconds:.2f} s ({per_op:.0f} µs an op)")


if __name__ == "__main__":
    main()
