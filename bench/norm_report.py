"""The fused all-reduce + residual add + RMSNorm's results (issue 23) as the markdown that docs/inference.md and
bench/NOTES.md carry, generated from the committed tp_decode runs (tests/test_norm_report.py checks the docs hold
exactly this text).

    PYTHONPATH=. python bench/norm_report.py bench/results/tp_decode_2xh200_norm_[123].json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEP_GOAL, IN_STEP_GOAL = 1.05, 0.5


def load(paths: list[str]) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def _span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{format(lo, fmt)}–{format(hi, fmt)}"


def _plan(name: str) -> str:
    """``direct-allreduce-hgx_h200:gpus=2-ll-x32-...`` as ``direct ll-x32-...`` (as README's other tables)."""
    return f"{name.split('-')[0]} {name.split(':gpus=')[-1].split('-', 1)[-1]}" if ":gpus=" in name else name


def table(runs: list[dict], paths: list[str]) -> str:
    """One row per batch: every run's values as min–max, and whether the issue's goals hold in every run."""
    batches = [r["batch"] for r in runs[0]["rows"]]
    names = ", ".join(f"`{Path(p).name}`" for p in paths)
    first = runs[0]
    lines = [
        f"weft-fused-norm against NCCL (NCCL all-reduce + torch add + torch rms_norm), {len(runs)} runs of "
        f"{first['machine']['count']}×{first['machine']['gpu']} ({names}; torch {first['versions']['torch']}, "
        f"NCCL {first['versions']['nccl']}), values as min–max over the runs:",
        "",
        "| batch | step, NCCL → weft-fused-norm (ms) | step speed-up | all-reduce + add + norm in the step, "
        "weft-fused-norm / NCCL (µs per call) | ratio | logits rel. err. (bound) | plan |",
        "|---|---|---|---|---|---|---|",
    ]
    step_ok, in_step_ok, logits_ok = {}, {}, True
    for batch in batches:
        rows = [next(r for r in run["rows"] if r["batch"] == batch) for run in runs]
        speed = [r["weft-fused-norm_speedup"] for r in rows]
        ratio = [r["weft-fused-norm_all_reduce_add_norm_ratio"] for r in rows]
        err = [r["weft-fused-norm_logits_rel_err"] for r in rows]
        step_ok[batch] = sum(v >= STEP_GOAL for v in speed)
        in_step_ok[batch] = sum(v <= IN_STEP_GOAL for v in ratio)
        logits_ok &= all(r["weft-fused-norm_logits_agree"] for r in rows)
        lines.append(
            f"| {batch} | {_span([r['nccl_ms'] for r in rows], '.3f')} → "
            f"{_span([r['weft-fused-norm_ms'] for r in rows], '.3f')} | {_span(speed, '.3f')}× | "
            f"{_span([r['weft-fused-norm_all_reduce_add_norm_us_per_call'] for r in rows], '.1f')} / "
            f"{_span([r['nccl_all_reduce_add_norm_us_per_call'] for r in rows], '.1f')} | {_span(ratio, '.3f')}× | "
            f"{_span(err, '.1e')} (< {first['logits_bound']:g}) | {_plan(rows[0]['weft_norm_plan'])} |"
        )
    lines += [
        "",
        f"Goals, runs that met them per batch (of {len(runs)}): step ≥ {STEP_GOAL}× NCCL's: "
        + ", ".join(f"batch {b} {n}" for b, n in step_ok.items())
        + f"; the fused call ≤ {IN_STEP_GOAL}× NCCL's all-reduce + add + norm in the step: "
        + ", ".join(f"batch {b} {n}" for b, n in in_step_ok.items())
        + f"; logits within the bound: {'every run' if logits_ok else 'not every run'}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    paths = sys.argv[1:]
    sys.stdout.write(table(load(paths), paths))


if __name__ == "__main__":
    main()
