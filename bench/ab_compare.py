"""Compare the two sides of an A/B written by bench/house_ab.sh: this tree's time over the base's, at every size
(all-reduce bench) and batch (tp_decode).

    python bench/ab_compare.py DIR [--json OUT.json]

DIR holds ab_allreduce_<i>_<side>.json and ab_decode_<i>_<side>.json (side: base or new). For the bench, each side's
time at a size is the median over that side's runs of the fastest plan's median (weft_us), with the plans each side
chose, and that ratio over NCCL's ("norm": NCCL runs the same code on both sides, so its ratio is the drift between
the runs: clocks, load). For tp_decode, every per-step and per-call time that both sides report (the table shows each
backend's step and isolated call; --json keeps them all). A ratio outside 1 +- TOLERANCE is marked.
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


def bench_ratios(base: list[dict], new: list[dict]) -> list[dict]:
    """One row per size: weft_us of each side (median over runs), their ratio, and the plan each side chose."""

    def by_size(runs: list[dict]) -> dict[int, list[dict]]:
        out: dict[int, list[dict]] = {}
        for run in runs:
            for row in run["rows"]:
                out.setdefault(row["size"], []).append(row)
        return out

    b, n = by_size(base), by_size(new)
    rows = []
    for size in sorted(set(b) & set(n)):
        bu = statistics.median(r["weft_us"] for r in b[size])
        nu = statistics.median(r["weft_us"] for r in n[size])
        # NCCL runs the same code on both sides: its ratio is the drift between the runs (clocks, load)
        drift = statistics.median(r["nccl_us"] for r in n[size]) / statistics.median(r["nccl_us"] for r in b[size])
        rows.append(
            {
                "size": size,
                "base_us": bu,
                "new_us": nu,
                "ratio": nu / bu,
                "nccl_ratio": drift,
                "normalized": nu / bu / drift,
                "base_plans": sorted({r["plan"] for r in b[size]}),
                "new_plans": sorted({r["plan"] for r in n[size]}),
                "wrong": sum(r["wrong"] for r in b[size] + n[size]),
            }
        )
    return rows


def decode_ratios(base: list[dict], new: list[dict]) -> list[dict]:
    """One row per (batch, time) that both sides report: the base's and this tree's value and their ratio."""
    rows = []
    for brun, nrun in zip(base, new, strict=False):
        nrows = {r["batch"]: r for r in nrun["rows"]}
        for br in brun["rows"]:
            nr = nrows.get(br["batch"])
            if nr is None:
                continue
            for key, bv in br.items():
                nv = nr.get(key)
                timed = key.endswith(("_ms", "_us_per_call")) and "raw" not in key
                if timed and isinstance(bv, float) and isinstance(nv, float) and bv > 0:
                    rows.append({"batch": br["batch"], "time": key, "base": bv, "new": nv, "ratio": nv / bv})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    bench = bench_ratios(_runs(args.folder, "allreduce", "base"), _runs(args.folder, "allreduce", "new"))
    decode = decode_ratios(_runs(args.folder, "decode", "base"), _runs(args.folder, "decode", "new"))
    print(f"{'size':>10} {'base_us':>9} {'new_us':>9} {'ratio':>7} {'nccl':>7} {'norm':>7}  plan (base | new)")
    for r in bench:
        mark = "" if abs(r["ratio"] - 1) <= TOLERANCE else "  <-- outside +-2%"
        plans = " ".join(r["base_plans"]) + " | " + " ".join(r["new_plans"])
        print(
            f"{r['size']:>10} {r['base_us']:>9.2f} {r['new_us']:>9.2f} {r['ratio']:>7.3f} {r['nccl_ratio']:>7.3f}"
            f" {r['normalized']:>7.3f}"
            f"  {plans}{mark}"
        )
    print(f"{'batch':>5} {'time':<44} {'base':>9} {'new':>9} {'ratio':>7}")
    for r in decode:
        if re.fullmatch(r"(nccl|weft[-a-z]*)_(ms|isolated_us_per_call)", r["time"]):
            mark = "" if abs(r["ratio"] - 1) <= TOLERANCE else "  <-- outside +-2%"
            print(f"{r['batch']:>5} {r['time']:<44} {r['base']:>9.4f} {r['new']:>9.4f} {r['ratio']:>7.3f}{mark}")
    if args.json:
        args.json.write_text(json.dumps({"tolerance": TOLERANCE, "bench": bench, "decode": decode}, indent=1))


if __name__ == "__main__":
    main()
