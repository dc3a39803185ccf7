"""Where a decode step's time goes on each rank, from a `tp_decode.py --profile N` run (``step_kernels_by_rank``):
per rank and backend, the device time by part of the step (the collective's calls, the gate-up GEMM that follows
the post-attention call, the other GEMMs, everything else) and the gaps between kernels, then each collective call's
duration in launch order. A step goes at its slower rank; a rank that waits longer inside a collective shows a peer
that ran behind (bench/NOTES.md, the tenth session). Torch is not needed.

python bench/step_profile.py bench/results/pdl_2xh200_s10/tp_decode_2xh200_profile_3_by_rank.json [--batch 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLLECTIVES = ("weft_", "void flashinfer", "ncclDev")  # the collectives' kernels, by name prefix
GATE_UP = "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_NNT"  # the step's largest GEMM (tp_decode's gate-up projection)


def part(name: str) -> str:
    """The part of the step a kernel belongs to."""
    if name.startswith(COLLECTIVES):
        return "collective"
    if name.startswith(GATE_UP):
        return "gate_up"
    return "gemm" if name.startswith(("nvjet", "sm90_", "cutlass")) else "other"


def rank_parts(sequence: list[list]) -> dict:
    """One rank's step (``step_kernels``' sequence: [name, start µs, µs]) by part, its span and the gaps between
    kernels, and each collective call's and gate-up GEMM's µs in launch order."""
    totals: dict[str, float] = {}
    for name, _, us in sequence:
        totals[part(name)] = totals.get(part(name), 0.0) + us
    span = sequence[-1][1] + sequence[-1][2] if sequence else 0.0
    return {
        "us": {k: round(v, 1) for k, v in sorted(totals.items())},
        "span_us": round(span, 1),
        "gaps_us": round(span - sum(totals.values()), 1),
        "collective_calls_us": [round(us, 1) for name, _, us in sequence if part(name) == "collective"],
        "gate_up_us": [round(us, 1) for name, _, us in sequence if part(name) == "gate_up"],
    }


def report(doc: dict, batch: int | None = None) -> list[dict]:
    """For each row (batch) with a per-rank profile: {batch, backend, rank, **rank_parts}."""
    out = []
    for row in doc["rows"]:
        if batch is not None and row["batch"] != batch:
            continue
        for rank, kernels in enumerate(row.get("step_kernels_by_rank", [])):
            for backend, table in kernels.items():
                out.append({"batch": row["batch"], "backend": backend, "rank": rank, **rank_parts(table["sequence"])})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a tp_decode.py --profile JSON with step_kernels_by_rank")
    p.add_argument("--batch", type=int, help="this batch only")
    args = p.parse_args(argv)
    try:
        doc = json.loads(Path(args.results).read_text())
        lines = report(doc, args.batch)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        print(f"step_profile: {args.results}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if not lines:
        print(f"step_profile: {args.results}: no per-rank profile (run tp_decode.py with --profile N)", file=sys.stderr)
        return 2
    for line in lines:
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
