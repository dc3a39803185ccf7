"""bench/step_profile.py: a decode step's kernels by part on each rank, from tp_decode's per-rank profile."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench/results/pdl_2xh200_s10/tp_decode_2xh200_profile_3_by_rank.json"


def _module() -> SimpleNamespace:
    """The script's functions (run as a file: bench/ is not a package)."""
    return SimpleNamespace(**runpy.run_path(str(ROOT / "bench" / "step_profile.py")))


def test_a_step_splits_into_its_parts_and_the_gaps_between_kernels():
    sp = _module()
    sequence = [
        ["nvjet_sm90_tst_64x8_64x16_2x1_v_bz_NNT", 0.0, 18.0],
        ["weft_compiled_bf16_v16_ab", 18.5, 6.0],
        ["nvjet_sm90_tst_128x8_64x12_2x1_v_bz_NNT", 25.0, 110.0],
        ["void at::native::vectorized_elementwise_kernel<8>", 135.5, 2.0],
        ["void flashinfer::trtllm_allreduce_fusion::x", 138.0, 5.0],
    ]
    got = sp.rank_parts(sequence)
    assert got["us"] == {"collective": 11.0, "gate_up": 110.0, "gemm": 18.0, "other": 2.0}
    assert got["span_us"] == 143.0 and got["gaps_us"] == 2.0
    assert got["collective_calls_us"] == [6.0, 5.0] and got["gate_up_us"] == [110.0]


def test_the_committed_per_rank_profile_shows_the_slower_ranks_gate_up_gemm(capsys):
    """The tenth session's finding (bench/NOTES.md): beside FlashInfer rank 0's gate-up GEMM runs about 106 µs a
    launch and rank 1's about 117, and rank 0 then waits in the next call; the spans of the two ranks agree."""
    sp = _module()
    rows = {(r["backend"], r["rank"]): r for r in sp.report(json.loads(RESULT.read_text()), batch=1)}
    fi0, fi1 = rows[("flashinfer-fused", 0)], rows[("flashinfer-fused", 1)]
    assert max(fi0["gate_up_us"]) < 108 < 115 < min(fi1["gate_up_us"])
    assert sum(fi0["collective_calls_us"]) > 2 * sum(fi1["collective_calls_us"])
    for backend in ("nccl", "weft-fused-norm", "flashinfer-fused"):
        assert abs(rows[(backend, 0)]["span_us"] - rows[(backend, 1)]["span_us"]) < 2.0
    assert sp.main([str(RESULT), "--batch", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 6  # 3 backends x 2 ranks


def test_a_run_without_a_per_rank_profile_is_refused_in_one_line(tmp_path, capsys):
    sp = _module()
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": [{"batch": 1}]}))
    assert sp.main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no per-rank profile" in err[0]
    assert sp.main([str(tmp_path / "missing.json")]) == 2
