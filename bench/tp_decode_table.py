"""The tables of examples/tp_decode.py runs (docs/performance.md, docs/inference.md), from their JSON (torch is
not needed to print them).

python bench/tp_decode_table.py --markdown bench/results/tp_decode_2xh200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from weft.plots import _short_plan  # noqa: E402  (the bench tables' plan label: 'direct ll-x32-t512')

HEADER = (
    "| batch | step, NCCL → weft / weft-fused (ms) | step speed-up, weft / weft-fused | all-reduce in the step, "
    "weft / NCCL | all-reduce + residual add in the step, weft-fused / NCCL | all-reduce alone, weft / NCCL | "
    "weft plan | step speed-up, weft-fused-norm / flashinfer-fused | all-reduce + add + norm in the step, "
    "weft-fused-norm / flashinfer-fused / NCCL |"
)


def _fused_norm(r: dict) -> tuple[str, str]:
    """The step speed-ups and the in-step fused call of weft-fused-norm and FlashInfer's fused call ('–' where a
    run had no such backend)."""
    names = ("weft-fused-norm", "flashinfer-fused")
    speedups = " / ".join(f"{r[f'{n}_speedup']:.3f}×" if f"{n}_speedup" in r else "–" for n in names)
    calls = [
        f"{r[f'{n}_all_reduce_add_norm_us_per_call']:.1f}" if f"{n}_all_reduce_add_norm_us_per_call" in r else "–"
        for n in (*names, "nccl")
    ]
    return speedups, " / ".join(calls) + " µs"


def markdown(doc: dict) -> str:
    lines = [HEADER, "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        alone = r["weft_isolated_us_per_call"] / r["nccl_isolated_us_per_call"]
        lines.append(
            f"| {r['batch']} | {r['nccl_ms']:.3f} → {r['weft_ms']:.3f} / {r['weft-fused_ms']:.3f} "
            f"| {r['weft_speedup']:.3f}× / {r['weft-fused_speedup']:.3f}× "
            f"| {r['weft_all_reduce_us_per_call']:.1f} / {r['nccl_all_reduce_us_per_call']:.1f} µs = "
            f"{r['weft_all_reduce_ratio']:.2f}× "
            f"| {r['weft-fused_all_reduce_add_us_per_call']:.1f} / {r['nccl_all_reduce_add_us_per_call']:.1f} µs = "
            f"{r['weft-fused_all_reduce_add_ratio']:.2f}× "
            f"| {r['weft_isolated_us_per_call']:.1f} / {r['nccl_isolated_us_per_call']:.1f} µs = {alone:.2f}× "
            f"| {_short_plan(r['weft_plan'])} | {' | '.join(_fused_norm(r))} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", metavar="FILE", required=True, help="print the README table of a results file")
    args = parser.parse_args()
    print(markdown(json.loads(Path(args.markdown).read_text(encoding="utf-8"))), end="")


if __name__ == "__main__":
    main()
