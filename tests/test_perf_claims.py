"""Ranges the README states in prose, recomputed from the results files they link."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readmes_all_to_all_range_is_what_the_2_and_4_gpu_results_hold_up_to_1mb():
    ratios = [
        row["weft_us"] / row["nccl_us"]
        for n in (2, 4)
        for row in json.loads((ROOT / f"bench/results/gpu_alltoall_bf16_graph_{n}xh200.json").read_text())["rows"]
        if row["size"] <= 1 << 20
    ]
    claim = f"all-to-all ({min(ratios):.2f}–{max(ratios):.2f}× NCCL's time up to 1 MB on 2 and 4"
    assert claim in " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
