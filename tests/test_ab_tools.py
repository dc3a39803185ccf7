"""The A/B tools of issue 34's evidence: bench/ab_compare.py (two trees' bench and tp_decode results) and
bench/ptx_ab.py (two trees' interpreter PTX, entry by entry)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _bench(path: Path, weft_us: float, nccl_us: float) -> None:
    row = {"size": 1024, "weft_us": weft_us, "nccl_us": nccl_us, "plan": "p", "wrong": 0}
    path.write_text(json.dumps({"rows": [row]}))


def test_the_bench_ratio_is_normalized_by_nccls_drift_between_the_runs(tmp_path):
    ab = _load("ab_compare")
    _bench(tmp_path / "ab_allreduce_1_base.json", 4.0, 10.0)
    _bench(tmp_path / "ab_allreduce_2_new.json", 4.4, 11.0)  # both 10% slower: the machine drifted, not the code
    (row,) = ab.bench_ratios(ab._runs(tmp_path, "allreduce", "base"), ab._runs(tmp_path, "allreduce", "new"))
    assert round(row["ratio"], 6) == 1.1 and round(row["nccl_ratio"], 6) == 1.1 and round(row["normalized"], 6) == 1.0


def test_decode_rows_pair_each_batch_and_time_and_skip_raw_lists():
    ab = _load("ab_compare")
    base = [{"rows": [{"batch": 1, "weft_ms": 2.0, "weft_raw_step_ms": [2.0], "weft_plan": "p"}]}]
    new = [{"rows": [{"batch": 1, "weft_ms": 2.1, "weft_raw_step_ms": [2.1], "weft_plan": "p"}]}]
    (row,) = ab.decode_ratios(base, new)
    assert row["time"] == "weft_ms" and round(row["ratio"], 6) == 1.05


def test_ptx_entries_compare_after_renaming_what_compilation_numbers():
    ptx = _load("ptx_ab")
    body = ".visible .entry k(\n{{\n\t.local .align 8 .b8 \t__local_depot{d}[24];\n\t@%p1 bra \t$L__BB{d}_4;\n}}\n"
    base, same, changed = body.format(d=1), body.format(d=7), body.format(d=1).replace("bra", "brx")

    assert ptx.compare(ptx.renamed_entries(base), ptx.renamed_entries(same))["identical"] == 1
    result = ptx.compare(ptx.renamed_entries(base), ptx.renamed_entries(changed))
    assert result["identical"] == 0 and result["entries"][0]["changed_lines"] == 2
