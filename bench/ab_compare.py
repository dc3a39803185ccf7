"""Compare the two sides of an A/B written by bench/house_ab.sh: this tree's time over the base's, at every size
(all-reduce bench) and batch (tp_decode).

    python bench/ab_compare.py DIR [--json OUT.json]

DIR holds ab_allreduce_<i>_<side>.json and ab_decode_<i>_<side>.json (side: base or new). For the bench, at each
size, every plan both sides ran (matched by plan hash) gives its ratio this tree / base, each side's time being the
median over its runs; the size's ratio is the median over those plans, and "norm" divides it by the drift between
the runs (the peers' ratio: NCCL and symmetric memory run the same code on both sides). For tp_decode, every
per-step and per-call time that both sides report, the median over each side's runs, and that ratio over NCCL's
for the same time (the table shows each backend's step and isolated call; --json keeps them all). A normalized
ratio outside 1 +- TOLERANCE is marked.

Where each side has two runs or more, the bench rows also carry an A/A reading, the measurement's own noise: each
side's runs split in two (alternate runs, in order) and compared with the same estimator ("aa_base", "aa_new": the
ratio between two halves of the same code, for the raw ratio and the normalized one). A size whose A/A readings
leave 1 +- TOLERANCE is one where the call cannot resolve TOLERANCE.

The verdict reads one estimator for the whole folder: the one whose A/A readings stay closest to 1 (the one this
call resolves better), chosen from the A/A alone, before any A/B ratio is read. The normalization removes a drift
the peers share; where the peers are noisier than weft's plans (NCCL and symmetric memory's one-shot in graphs of
hundreds of calls), it adds their noise instead, and the raw ratio of alternated runs is the tighter one.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

TOLERANCE = 0.02


def _runs(folder: Path, kind: str, side: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"ab_{kind}_*_{side}.json"))]


def _medians(runs: list[dict], size: int) -> dict[str, float]:
    """Every time a side's runs report at a size, each the median over the runs: weft's plans by plan hash
    (plans_us), the peers by name (median_us entries that are not weft's)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for row in run["rows"]:
            if row["size"] != size:
                continue
            times = {h: u for h, u in row.get("plans_us", {}).items()}
            times.update({k: u for k, u in row.get("median_us", {}).items() if not k.startswith("weft:")})
            times.setdefault("nccl", row["nccl_us"])
            times.setdefault("fastest", row["weft_us"])
            for key, us in times.items():
                if us:
                    values.setdefault(key, []).append(us)
    return {key: statistics.median(v) for key, v in values.items()}


def bench_ratios(base: list[dict], new: list[dict]) -> list[dict]:
    """One row per size. Every plan that both sides ran (the same plan hash: the same plan, lowered by each tree)
    gives a ratio this tree / base; "ratio" is their median (one plan's noise, or the choice of the fastest among
    plans a few ns apart, moves it little). The peers run the same code on both sides, so their ratio (the median
    over NCCL and any other peer both sides timed) is the drift between the runs (clocks, load): "normalized" is the
    ratio over it. A median, not a mean: one erratic peer must not carry its noise into every ratio (NCCL in a graph
    of 200 calls took 16-25 µs a call at 1 KB from run to run, where symmetric memory's two-shot held within 3%).
    The fastest plan's time on each side is shown beside, as the bench reports it."""
    rows = []
    sizes = sorted({r["size"] for run in base for r in run["rows"]} & {r["size"] for run in new for r in run["rows"]})
    for size in sizes:
        b, n = _medians(base, size), _medians(new, size)
        peers = sorted(k for k in set(b) & set(n) if k == "nccl" or ":" in k)
        plans = sorted(k for k in set(b) & set(n) if k not in peers and k != "fastest")
        ratio = statistics.median(n[k] / b[k] for k in plans) if plans else n["fastest"] / b["fastest"]
        drift = statistics.median(n[k] / b[k] for k in peers)
        side_rows = [[r for run in runs for r in run["rows"] if r["size"] == size] for runs in (base, new)]
        rows.append(
            {
                "size": size,
                "base_us": b["fastest"],
                "new_us": n["fastest"],
                "plans": len(plans),
                "ratio": ratio,
                "peers": peers,
                "drift": drift,
                "normalized": ratio / drift,
                "base_plans": sorted({r["plan"] for r in side_rows[0]}),
                "new_plans": sorted({r["plan"] for r in side_rows[1]}),
                "wrong": sum(r["wrong"] for r in side_rows[0] + side_rows[1]),
            }
        )
    return rows


def decode_ratios(base: list[dict], new: list[dict]) -> list[dict]:
    """One row per (batch, time) that both sides report: each side's value (the median over its runs), their ratio,
    and that ratio over NCCL's for the same time ("drift": NCCL runs the same code on both sides; 1 where NCCL has
    no such time, and for NCCL's own rows)."""

    def values(runs: list[dict]) -> dict[tuple[int, str], list[float]]:
        out: dict[tuple[int, str], list[float]] = {}
        for run in runs:
            for row in run["rows"]:
                for key, v in row.items():
                    timed = key.endswith(("_ms", "_us_per_call")) and "raw" not in key
                    if timed and isinstance(v, float) and v > 0:
                        out.setdefault((row["batch"], key), []).append(v)
        return out

    b, n = values(base), values(new)
    ratio = {k: statistics.median(n[k]) / statistics.median(b[k]) for k in b.keys() & n.keys()}
    rows = []
    for batch, key in sorted(ratio):
        backend = key.split("_", 1)[0]
        peer = (batch, "nccl" + key[len(backend) :])
        drift = ratio[peer] if backend != "nccl" and peer in ratio else 1.0
        rows.append(
            {
                "batch": batch,
                "time": key,
                "base": statistics.median(b[(batch, key)]),
                "new": statistics.median(n[(batch, key)]),
                "ratio": ratio[(batch, key)],
                "drift": drift,
                "normalized": ratio[(batch, key)] / drift,
                "runs": [len(b[(batch, key)]), len(n[(batch, key)])],
            }
        )
    return rows


ESTIMATORS = ("ratio", "normalized")


def with_verdict(bench: list[dict], base_runs: list[dict], new_runs: list[dict]) -> str:
    """Adds each estimator's A/A readings to the rows ("aa_base_ratio", "aa_new_normalized", ...) and each row's
    "verdict": its value of the estimator whose worst A/A reading over the folder is closest to 1 (normalized
    where a side has fewer than two runs, or on a tie). Returns that estimator's name."""
    chosen = "normalized"
    if len(base_runs) >= 2 and len(new_runs) >= 2:
        worst = dict.fromkeys(ESTIMATORS, 0.0)
        for side, runs in (("base", base_runs), ("new", new_runs)):
            for row, half in zip(bench, bench_ratios(runs[0::2], runs[1::2]), strict=True):
                for key in ESTIMATORS:
                    row[f"aa_{side}_{key}"] = half[key]
                    worst[key] = max(worst[key], abs(half[key] - 1))
        chosen = min(ESTIMATORS, key=lambda k: (worst[k], k != "normalized"))
    for row in bench:
        row["verdict"] = row[chosen]
    return chosen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    base_runs, new_runs = _runs(args.folder, "allreduce", "base"), _runs(args.folder, "allreduce", "new")
    bench = bench_ratios(base_runs, new_runs)
    chosen = with_verdict(bench, base_runs, new_runs)
    decode = decode_ratios(_runs(args.folder, "decode", "base"), _runs(args.folder, "decode", "new"))
    aa = bool(bench) and "aa_base_ratio" in bench[0]
    head = f"{'size':>10} {'base_us':>9} {'new_us':>9} {'plans':>5} {'ratio':>7} {'drift':>7} {'norm':>7}"
    head += " aa_base/new(ratio) aa_base/new(norm)" if aa else ""
    if bench:
        print(f"bench verdict by the {chosen} estimator" + (" (its A/A readings are the closer to 1)" if aa else ""))
    print(f"{head}  fastest (base | new)")
    for r in bench:
        mark = "" if abs(r["verdict"] - 1) <= TOLERANCE else "  <-- outside +-2%"
        plans = " ".join(r["base_plans"]) + " | " + " ".join(r["new_plans"])
        readings = [r[f"aa_{side}_{key}"] for key in ESTIMATORS for side in ("base", "new")] if aa else []
        print(
            f"{r['size']:>10} {r['base_us']:>9.2f} {r['new_us']:>9.2f} {r['plans']:>5} {r['ratio']:>7.3f}"
            f" {r['drift']:>7.3f} {r['normalized']:>7.3f}"
            + (" {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f}".format(*readings) if aa else "")
            + f"  {plans}{mark}"
        )
    print(f"{'batch':>5} {'time':<44} {'base':>9} {'new':>9} {'ratio':>7} {'drift':>7} {'norm':>7}")
    for r in decode:
        if re.fullmatch(r"(nccl|weft[-a-z]*)_(ms|isolated_us_per_call)", r["time"]):
            outside = not r["time"].startswith("nccl") and abs(r["normalized"] - 1) > TOLERANCE  # NCCL's: drift
            mark = "  <-- outside +-2%" if outside else ""
            print(
                f"{r['batch']:>5} {r['time']:<44} {r['base']:>9.4f} {r['new']:>9.4f} {r['ratio']:>7.3f}"
                f" {r['drift']:>7.3f} {r['normalized']:>7.3f}{mark}"
            )
    if args.json:
        args.json.write_text(
            json.dumps({"tolerance": TOLERANCE, "estimator": chosen, "bench": bench, "decode": decode}, indent=1)
        )


if __name__ == "__main__":
    main()
